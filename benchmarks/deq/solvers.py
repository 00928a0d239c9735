"""Function evaluations fixed-point, Anderson and Broyden need to reach a relative residual (default
1e-4) on the DEQ-GNN layer, for a few random initialisations and, optionally, after a few training
steps (the map a solver faces during training).

Example::

    .venv/bin/python -m benchmarks.deq solvers --nodes 4000 --hidden 64 --seeds 3
"""

from __future__ import annotations

import math
import statistics
import time

from benchmarks.deq.common import build, load_graph, parser, train_steps


def bench_solvers(args) -> None:
    import warnings

    import torch

    from revgnn.deq import DEQConvergenceWarning, get_solver

    warnings.simplefilter("ignore", DEQConvergenceWarning)
    torch.set_num_threads(args.threads)
    data = load_graph(args.nodes)
    configs = [
        ("fixed_point", {}),
        ("fixed_point", {"damping": 0.5}),
        ("anderson", {"m": 5}),
        ("anderson", {"m": 10}),
        ("broyden", {}),
    ]
    print(
        f"graph: {data}\nDEQ-GNN layer width {args.hidden}, eval mode (no dropout), "
        f"stop at rel residual {args.tol:g}, max {args.max_iter} evaluations"
    )
    rows = []
    for seed in range(args.seeds):
        for trained in sorted({0, args.train_steps}):
            torch.manual_seed(seed)
            model = build("deq_gnn", args.hidden, data, max_iter=30)
            if trained:
                warnings.simplefilter("ignore", DEQConvergenceWarning)
                train_steps(model, data, trained)
            model.eval()
            with torch.no_grad():
                h = model.node_encoder(data.x)
                f = lambda z: model.layer(z, h, data.edge_index, data.edge_attr)  # noqa: E731
                for name, opts in configs:
                    t0 = time.perf_counter()
                    res = get_solver(name)(
                        f, torch.zeros_like(h), tol=args.tol, max_iter=args.max_iter, **opts
                    )
                    dt = time.perf_counter() - t0
                    label = name + "".join(f" {k}={v}" for k, v in opts.items())
                    rows.append(
                        (seed, trained, label, res.steps if res.converged else None, res.rel_residual, dt)
                    )
                    print(
                        f"seed {seed} trained_steps {trained:3d} {label:24s} "
                        f"evals {res.steps if res.converged else '>' + str(args.max_iter):>5} "
                        f"rel_res {res.rel_residual:.2e} time {dt:6.2f}s",
                        flush=True,
                    )
    print("\nevaluations to tolerance, median over seeds (inf = not reached within max_iter):")
    labels = list(dict.fromkeys(r[2] for r in rows))
    for trained in sorted({0, args.train_steps}):
        evals = {
            label: [
                r[3] if r[3] is not None else float("inf") for r in rows if r[1] == trained and r[2] == label
            ]
            for label in labels
        }
        ratios = [
            "n/a" if math.isinf(f) or math.isinf(a) else f"{a / f:.2f}"
            for f, a in zip(evals["fixed_point"], evals["anderson m=5"])
        ]
        print(
            f"  after {trained} training steps: "
            + ", ".join(f"{k}: {statistics.median(v)}" for k, v in evals.items())
            + f"  | anderson(m=5) / fixed_point per seed: {', '.join(ratios)}"
        )


def main(argv=None, prog=None) -> None:
    p = parser(
        __doc__,
        prog,
        ["--nodes", "--hidden", "--threads", "--seeds", "--tol", "--max-iter"],
        seeds="random initialisations",
    )
    p.add_argument(
        "--train-steps",
        type=int,
        default=20,
        help="also measure after this many Adam steps (0: untrained only)",
    )
    bench_solvers(p.parse_args(argv))


if __name__ == "__main__":
    main()
