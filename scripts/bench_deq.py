#!/usr/bin/env python
"""DEQ benchmarks on a generated proteins-like graph.

1. ``solvers``: function evaluations for fixed-point, Anderson and Broyden to reach a relative residual
   (default 1e-4) on the DEQ-GNN layer, for a few random initialisations and, optionally, after a few
   training steps (the map a solver faces during training).
2. ``step``: one training step (forward, backward, Adam) of DEQ-GNN vs WT-RevGNN vs RevGNN at equal width:
   bytes saved for backward (deterministic), peak-RSS growth during the step and median step time. Each
   model runs in its own process so that peak RSS is its own.

Examples::

    .venv/bin/python scripts/bench_deq.py solvers --nodes 4000 --hidden 64 --seeds 3
    .venv/bin/python scripts/bench_deq.py step --nodes 4000 --hidden 64 --steps 3
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time


def load_graph(nodes: int, seed: int = 0):
    from revgnn.data.synthetic import proteins_like

    return proteins_like(num_nodes=nodes, seed=seed)


def build(name: str, hidden: int, data, **extra):
    import revgnn.models.deq_gnn  # noqa: F401  (registers deq_gnn if models/__init__ does not yet)
    from revgnn.models import create_model

    return create_model(
        name,
        hidden_channels=hidden,
        in_channels=data.x.size(1),
        out_channels=data.num_classes,
        edge_channels=data.edge_attr.size(1),
        species_channels=data.species_channels,
        **extra,
    )


def train_steps(model, data, steps: int, lr: float = 1e-3) -> None:
    import torch

    opt = torch.optim.Adam(model.parameters(), lr=lr)
    idx = data.split_idx["train"]
    for _ in range(steps):
        opt.zero_grad()
        out = model(data.x, data.edge_index, data.edge_attr)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(out[idx], data.y[idx])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()


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
        ("broyden", {"memory": 20}),
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


MODELS = {
    # name -> (registered factory, overrides)
    "deq_gnn": ("deq_gnn", {}),
    "wt_revgnn": ("wt_revgnn", {}),
    "revgnn_small": ("revgnn_small", {}),
    "revgnn_112": ("revgnn_112", {}),
}


def bench_one(args) -> None:
    import warnings

    import torch

    from revgnn.deq import DEQConvergenceWarning
    from revgnn.models import count_parameters
    from revgnn.utils.memory import SavedTensorBytes, peak_rss_bytes

    warnings.simplefilter("ignore", DEQConvergenceWarning)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    data = load_graph(args.nodes)
    factory, extra = MODELS[args.one]
    model = build(factory, args.hidden, data, **extra)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    idx = data.split_idx["train"]

    def step(measure: bool):
        opt.zero_grad()
        with SavedTensorBytes() as saved:
            out = model(data.x, data.edge_index, data.edge_attr)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(out[idx], data.y[idx])
        loss.backward()
        opt.step()
        return saved.bytes

    rss0 = peak_rss_bytes()
    times, saved = [], 0
    for i in range(args.steps + 1):  # the first step warms up (allocations, Adam state)
        t0 = time.perf_counter()
        saved = step(True)
        if i:
            times.append(time.perf_counter() - t0)
    stats = getattr(model, "deq_stats", lambda: {})()
    print(
        json.dumps(
            {
                "model": args.one,
                "params": count_parameters(model),
                "saved_MB": saved / 2**20,
                "peak_rss_growth_MB": (peak_rss_bytes() - rss0) / 2**20,
                "step_s": statistics.median(times),
                "deq": {
                    k: stats[k]
                    for k in ("forward_steps", "forward_residual", "backward_steps", "backward_residual")
                    if k in stats
                },
            }
        )
    )


def bench_step(args) -> None:
    env = dict(os.environ)
    print(
        f"training step on proteins_like({args.nodes} nodes), width {args.hidden}, "
        f"{args.threads} threads, median of {args.steps} steps after 1 warm-up"
    )
    for name in args.models:
        cmd = [
            sys.executable,
            __file__,
            "one",
            "--one",
            name,
            "--nodes",
            str(args.nodes),
            "--hidden",
            str(args.hidden),
            "--steps",
            str(args.steps),
            "--threads",
            str(args.threads),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode:
            print(f"{name}: failed\n{proc.stderr[-2000:]}")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        print(
            f"{r['model']:14s} params {r['params']:>9,d}  saved-for-backward {r['saved_MB']:8.1f} MB  "
            f"peak-RSS growth {r['peak_rss_growth_MB']:8.1f} MB  step {r['step_s']:6.2f} s  {r['deq']}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=["solvers", "step", "one"])
    parser.add_argument("--nodes", type=int, default=4000)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--max-iter", type=int, default=300)
    parser.add_argument(
        "--train-steps",
        type=int,
        default=20,
        help="also measure after this many Adam steps (0: untrained only)",
    )
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--models", nargs="+", default=["deq_gnn", "wt_revgnn", "revgnn_small"], choices=sorted(MODELS)
    )
    parser.add_argument("--one", choices=sorted(MODELS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    {"solvers": bench_solvers, "step": bench_step, "one": bench_one}[args.part](args)


if __name__ == "__main__":
    main()
