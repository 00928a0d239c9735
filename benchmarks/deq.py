#!/usr/bin/env python
"""DEQ benchmarks on a generated proteins-like graph.

1. ``solvers``: function evaluations for fixed-point, Anderson and Broyden to reach a relative residual
   (default 1e-4) on the DEQ-GNN layer, for a few random initialisations and, optionally, after a few
   training steps (the map a solver faces during training).
2. ``step``: one training step (forward, backward, Adam) of DEQ-GNN vs WT-RevGNN vs RevGNN at equal width:
   bytes saved for backward (deterministic), peak-RSS growth during the step and median step time. Each
   model runs in its own process so that peak RSS is its own.
3. ``peer``: revgnn against torchdeq 0.1.0 (``pip install -e .[bench]``) on the same float64 maps, a
   held-out contractive graph map and ``deq_gnn_small`` on ``proteins_like``: function evaluations to a
   relative residual of 1e-4 and 1e-6 for each solver, the implicit gradient's error against a dense
   float64 reference, and the bytes saved for backward at 10 vs 100 forward iterations. Counts, not
   timings.
4. ``train``: DEQ-GNN trained on ``proteins_like`` through the training loop, arms (``--arms``, model
   overrides such as ``jac_reg_weight=0.5`` or ``spectral_reg_weight=10,spectral_reg_target=0.5``;
   ``none`` unregularised) x seeds, optionally after unrolled pretraining (``--pretrain-epochs``,
   every arm): per run the epochs whose every training solve reached the tolerance within 30
   evaluations, the max evaluations and residual, the best validation score and the test score at it;
   per arm their mean ± std over the seeds, and the per-seed difference of each arm to the
   unregularised one; ``--record FILE`` keeps each run's per-epoch max evaluations as JSON.
5. ``broyden-memory``: evaluations Broyden needs to 1e-4 and 1e-6 against its memory (5 to 80, and
   every update kept, the default) on held-out linear (normal and non-normal), graph and DEQ-GNN maps.
6. ``jacobian``: for the last checkpoint of each ``train`` run in ``--out-dir``, what a training solve
   faces on ``--seeds`` training batches: the model's own solve's evaluations, and at the fixed point
   ||J||_F^2 / d, the spectral radius and how many nodes the dominant eigenvector lives on.

Examples::

    .venv/bin/python -m benchmarks.deq solvers --nodes 4000 --hidden 64 --seeds 3
    .venv/bin/python -m benchmarks.deq step --nodes 4000 --hidden 64 --steps 3
    .venv/bin/python -m benchmarks.deq peer --nodes 2000 --max-iter 100
    .venv/bin/python -m benchmarks.deq train --nodes 2000 --epochs 50 --seeds-list 0 1 \
        --arms none jac_reg_weight=0.1
    .venv/bin/python -m benchmarks.deq train --nodes 2000 --epochs 300 --max-iter 100 --seeds-list 0 1 \
        --arms none spectral_reg_weight=10,spectral_reg_target=0.5 --pretrain-epochs 5 \
        --spectral-radius-every 0
    .venv/bin/python -m benchmarks.deq broyden-memory --nodes 2000 --max-iter 300 --threads 1
    .venv/bin/python -m benchmarks.deq jacobian --out-dir RUNS --arms none jac_reg_weight=0.5 \
        --seeds-list 0 1 --seeds 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

from benchmarks.common import markdown_table


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


# ---- peer: revgnn vs torchdeq on the same maps ------------------------------------------------------

#: (row label, revgnn solver, options, torchdeq solver, options) run side by side. The second Anderson
#: row matches torchdeq to revgnn rather than copying the numbers: torchdeq's ridge is absolute (added
#: to G G^T, whose entries shrink with the residual, so 1e-4 dominates it near convergence) where
#: revgnn's is relative, and torchdeq's m counts stored iterates whose weights sum to 1, m - 1 degrees of
#: freedom, where revgnn's m counts differences.
PEER_SOLVERS = [
    ("fixed_point", "fixed_point", {}, "fixed_point_iter", {}),
    ("anderson", "anderson", {"m": 5, "lam": 1e-4}, "anderson", {"m": 5, "lam": 1e-4}),
    (
        "anderson, torchdeq m=6 lam=1e-10",
        "anderson",
        {"m": 5, "lam": 1e-4},
        "anderson",
        {"m": 6, "lam": 1e-10},
    ),
    ("broyden", "broyden", {}, "broyden", {}),
]


def contractive_graph_map(nodes: int, d: int = 16, kappa: float = 0.9, seed: int = 1234):
    """z -> tanh(A z W + b) with a symmetric-normalised random graph A (self loops) and ||W||_2 = kappa:
    a kappa-contraction in the 2-norm; float64. The seed is not one the tests use (held out)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, nodes, (8 * nodes,), generator=g)
    dst = torch.randint(0, nodes, (8 * nodes,), generator=g)
    loops = torch.arange(nodes)
    ei = torch.cat([torch.stack([src, dst]), torch.stack([dst, src]), torch.stack([loops, loops])], 1)
    ei = torch.unique(ei, dim=1)
    deg = torch.zeros(nodes, dtype=torch.float64).index_add_(
        0, ei[1], torch.ones(ei.size(1), dtype=torch.float64)
    )
    val = deg[ei[0]].rsqrt() * deg[ei[1]].rsqrt()
    A = torch.sparse_coo_tensor(ei.flip(0), val, (nodes, nodes)).coalesce().to_sparse_csr()
    W = torch.randn(d, d, generator=g, dtype=torch.float64)
    W = torch.nn.Parameter(kappa * W / torch.linalg.matrix_norm(W, 2))
    b = torch.nn.Parameter(torch.randn(nodes, d, generator=g, dtype=torch.float64))

    def f(z):
        return torch.tanh(A @ (z @ W) + b)

    return f, torch.zeros(nodes, d, dtype=torch.float64), [W, b]


def deq_gnn_map(nodes: int, seed: int = 0):
    """deq_gnn_small's equilibrium map on proteins_like, untrained, float64, evaluation mode."""
    import torch

    from revgnn.nn.gen_max import sort_edges

    data = load_graph(nodes)
    torch.manual_seed(seed)
    model = build("deq_gnn_small", 32, data).double().eval()
    ei, ea = sort_edges(data.edge_index, data.edge_attr.double(), data.x.size(0))
    with torch.no_grad():
        h = model.node_encoder(data.x.double())

    def f(z):
        return model.layer(z, h, ei, ea)

    return f, torch.zeros_like(h), list(model.layer.parameters())


def _counted(f):
    calls = [0]

    def g(z):
        calls[0] += 1
        return f(z)

    return g, calls


def _rel_residual(f, z) -> float:
    import torch

    with torch.no_grad():
        fz = f(z)
        return ((fz - z).norm() / fz.norm()).item()


def peer_evaluations(f, z0, tol: float, max_iter: int):
    """Evaluations each solver of each library needs to reach relative residual ``tol``; the residual is
    re-measured independently on the returned iterate."""
    import torch
    from torchdeq.solver import get_solver as td_solver

    from revgnn.deq import get_solver

    rows = []
    for label, ours, ours_opts, theirs, their_opts in PEER_SOLVERS:
        g, calls = _counted(f)
        res = get_solver(ours)(g, z0, tol=tol, max_iter=max_iter, stop_mode="rel", **ours_opts)
        r_ours = _rel_residual(f, res.z)
        n_ours = calls[0]
        g, calls = _counted(lambda z: f(z.view_as(z0)).view(1, *z0.shape))
        with torch.no_grad():
            z_td, _, info = td_solver(theirs)(
                g, z0.unsqueeze(0), max_iter=max_iter, tol=tol, stop_mode="rel", **their_opts
            )
        r_td = _rel_residual(f, z_td.view_as(z0))
        rows.append((label, n_ours, r_ours, calls[0], r_td))
    return rows


def _param_map(f, params):
    """``f(z)`` as a DEQ map module ``(z, x) -> f(z)`` that owns ``params`` (so the DEQ's implicit
    backward reaches them)."""
    import torch

    class ParamMap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.params = torch.nn.ParameterList(params)

        def forward(self, z, _x):
            return f(z)

    return ParamMap()


def peer_gradient_error(nodes: int, tol: float):
    """Relative error of the implicit gradient d(sum(c * z*))/d(W, b) of the contractive map, against a
    dense float64 reference (z* to 1e-15, (I - J^T) u = c solved directly)."""
    import torch
    from torchdeq import get_deq

    from revgnn.deq import DEQ, get_solver

    f, z0, params = contractive_graph_map(nodes, d=8)
    c = torch.randn(z0.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    z_ref = get_solver("anderson")(f, z0, tol=1e-15, max_iter=500).z
    J = torch.autograd.functional.jacobian(f, z_ref).reshape(z0.numel(), z0.numel())
    u = torch.linalg.solve(torch.eye(z0.numel(), dtype=torch.float64) - J.T, c.reshape(-1)).view_as(z0)
    z = z_ref.clone().requires_grad_()
    ref = torch.autograd.grad(f(z), params, u)
    ref = torch.cat([r.flatten() for r in ref])

    def error():
        got = torch.cat([p.grad.flatten() for p in params])
        for p in params:
            p.grad = None
        return ((got - ref).norm() / ref.norm()).item()

    out = {}
    for solver in ("anderson", "broyden", "fixed_point"):
        deq = DEQ(_param_map(f, params), solver=solver, tol=tol, max_iter=500)
        (deq(z0) * c).sum().backward()
        out[("revgnn", solver)] = error()
        td = "fixed_point_iter" if solver == "fixed_point" else solver
        tdeq = get_deq(
            ift=True,
            f_solver=td,
            b_solver=td,
            f_max_iter=500,
            b_max_iter=500,
            f_tol=tol,
            b_tol=tol,
            f_stop_mode="rel",
            b_stop_mode="rel",
        )
        tdeq.train()
        z_out, _ = tdeq(lambda z: f(z.view_as(z0)).view_as(z), z0.unsqueeze(0))
        (z_out[-1].view_as(z0) * c).sum().backward()
        out[("torchdeq", solver)] = error()
    return out


def peer_saved_bytes(nodes: int):
    """Bytes autograd keeps for backward in one training forward of the DEQ-GNN map with exactly 10 and
    100 forward iterations (tolerance unreachable), implicit differentiation in both libraries."""
    import warnings

    from torchdeq import get_deq

    from revgnn.deq import DEQ, DEQConvergenceWarning
    from revgnn.utils.memory import SavedTensorBytes

    warnings.simplefilter("ignore", DEQConvergenceWarning)
    f, z0, params = deq_gnn_map(nodes)
    for p in params:
        p.requires_grad_(True)

    out = {}
    for iters in (10, 100):
        deq = DEQ(_param_map(f, params), solver="anderson", tol=1e-30, max_iter=iters).train()
        with SavedTensorBytes() as saved:
            deq(z0).sum()
        out[("revgnn", iters)] = saved.bytes
        tdeq = get_deq(ift=True, f_solver="anderson", f_max_iter=iters, f_tol=1e-30, f_stop_mode="rel")
        tdeq.train()
        with SavedTensorBytes() as saved:
            z_out, _ = tdeq(lambda z: f(z.view_as(z0)).view_as(z), z0.unsqueeze(0))
            z_out[-1].sum()
        out[("torchdeq", iters)] = saved.bytes
    return out


def bench_peer(args) -> None:
    import warnings

    import torch

    try:
        import torchdeq
    except ImportError:
        raise SystemExit(
            "benchmarks.deq peer compares revgnn with torchdeq, which is not installed: it comes with "
            'revgnn\'s bench extra, pip install -e ".[bench]" (torchdeq==0.1.0)'
        ) from None

    warnings.filterwarnings("ignore", message="Sparse")
    from revgnn.deq import DEQConvergenceWarning

    warnings.simplefilter("ignore", DEQConvergenceWarning)
    torch.set_num_threads(args.threads)
    version = getattr(torchdeq, "__version__", "0.1.0")
    print(f"revgnn vs torchdeq {version}, float64, max {args.max_iter} evaluations")
    maps = {
        f"contractive graph map ({args.nodes} nodes x 16, kappa 0.9)": contractive_graph_map(args.nodes)[:2],
        f"deq_gnn_small on proteins_like({args.nodes}), untrained": deq_gnn_map(args.nodes)[:2],
    }
    print(
        "\n| map | tol | solver | revgnn evals | revgnn rel. residual | torchdeq evals "
        "| torchdeq rel. residual |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, (f, z0) in maps.items():
        for tol in (1e-4, 1e-6):
            for solver, n_ours, r_ours, n_td, r_td in peer_evaluations(f, z0, tol, args.max_iter):
                fmt = lambda n, r: (f"{n}", f"{r:.2e}") if r <= tol else (f">{n} (not reached)", f"{r:.2e}")  # noqa: E731
                print(
                    f"| {label} | {tol:g} | {solver} | "
                    + " | ".join(fmt(n_ours, r_ours) + fmt(n_td, r_td))
                    + " |",
                    flush=True,
                )
    grad_nodes = 200
    errors = peer_gradient_error(grad_nodes, 1e-10)
    print(
        "\nimplicit gradient, relative error vs dense float64 reference "
        f"(contractive map, {grad_nodes} x 8, tol 1e-10):"
    )
    print("\n| solver | revgnn | torchdeq |\n|---|---|---|")
    for solver in ("anderson", "broyden", "fixed_point"):
        print(f"| {solver} | {errors[('revgnn', solver)]:.1e} | {errors[('torchdeq', solver)]:.1e} |")
    saved = peer_saved_bytes(args.nodes)
    print(
        "\nbytes saved for backward, one training forward of the deq_gnn_small map "
        f"({args.nodes} nodes), Anderson:"
    )
    print("\n| library | 10 iterations | 100 iterations |\n|---|---|---|")
    for lib in ("revgnn", "torchdeq"):
        print(f"| {lib} | {saved[(lib, 10)] / 2**20:.2f} MiB | {saved[(lib, 100)] / 2**20:.2f} MiB |")


# ---- broyden-memory: evaluations to tolerance against Broyden's memory ------------------------------

#: Memories ``broyden-memory`` compares; None is the solver's default (every update kept).
BROYDEN_MEMORIES = (5, 10, 20, 40, 80, None)


def linear_map(n: int, seed: int, nonnormal: float, rho: float = 0.95):
    """``z -> J z + b`` on ``[n, 1]``, float64, ``J = Q (diag(lam) + nonnormal / sqrt(n) * U) Q^T`` with
    ``lam ~ U(-rho, rho)``, ``U`` strictly upper triangular with standard normal entries and ``Q`` a
    random orthogonal matrix. ``nonnormal=0``: ``J`` symmetric (normal). Otherwise the same eigenvalues
    (spectral radius ``< rho``, so plain iteration converges in the end) with a non-normal part that
    grows ``||J||_2`` past 1, the case where a solver's transient matters."""
    import torch

    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    T = torch.diag(rho * (2 * torch.rand(n, generator=g, dtype=torch.float64) - 1))
    if nonnormal:
        T = T + nonnormal / n**0.5 * torch.triu(torch.randn(n, n, generator=g, dtype=torch.float64), 1)
    J = Q @ T @ Q.T
    b = torch.randn(n, 1, generator=g, dtype=torch.float64)
    return (lambda z: J @ z + b), torch.zeros(n, 1, dtype=torch.float64)


def broyden_memory_maps(nodes: int):
    """The held-out maps of ``broyden-memory`` (seeds no test uses): label -> (map, z0, kind)."""
    maps = {}
    for seed in (11, 12):
        maps[f"linear, symmetric J, n 500, seed {seed}"] = (*linear_map(500, seed, 0.0), "normal")
        for a in (1.0, 2.0):
            maps[f"linear, non-normal part {a:g}, n 500, seed {seed}"] = (
                *linear_map(500, seed, a),
                "non-normal",
            )
    for seed in (1235, 1236):
        f, z0, _ = contractive_graph_map(500, kappa=0.99, seed=seed)
        maps[f"tanh(A z W + b), 500 nodes x 16, kappa 0.99, seed {seed}"] = (f, z0, "non-normal")
    for seed in (1, 2):
        f, z0, _ = deq_gnn_map(nodes, seed=seed)
        maps[f"deq_gnn_small untrained, proteins_like({nodes}), init seed {seed}"] = (f, z0, "non-normal")
    return maps


def evaluations_to(trace, tol: float):
    """The evaluation at which a solve with tolerance ``tol`` stops: the first whose residual is
    ``<= tol`` (the iterates do not depend on the tolerance, so one solve to the smallest tolerance
    gives the count for every larger one), or None."""
    return next((k for k, r in enumerate(trace, 1) if r <= tol), None)


def bench_broyden_memory(args) -> None:
    """Evaluations Broyden needs to relative residuals 1e-4 and 1e-6 (budget ``--max-iter``) for each
    memory of :data:`BROYDEN_MEMORIES` on :func:`broyden_memory_maps`, and per memory over all of them:
    in how many it needs at most 2 evaluations more than the best memory and its worst excess."""
    import warnings

    import torch

    from revgnn.deq import broyden

    warnings.filterwarnings("ignore", message="Sparse")
    torch.set_num_threads(args.threads)
    tols = (1e-4, 1e-6)
    names = [f"{m}" if m else "default (all kept)" for m in BROYDEN_MEMORIES]
    table, counts = [], []
    for label, (f, z0, kind) in broyden_memory_maps(args.nodes).items():
        traces = [
            broyden(f, z0, tol=min(tols), max_iter=args.max_iter, memory=m).trace for m in BROYDEN_MEMORIES
        ]
        for tol in tols:
            n = [evaluations_to(t, tol) for t in traces]
            counts.append(n)
            table.append([label, kind, f"{tol:g}", *(f"{k}" if k else f">{args.max_iter}" for k in n)])
            print(f"{label} {tol:g}: {dict(zip(names, n))}", flush=True)
    print(f"\nBroyden, evaluations to a relative residual, float64, budget {args.max_iter}:\n")
    print(
        "\n".join(
            markdown_table(
                ["map", "kind", "tol", *(f"memory {m}" for m in names)], table, "lll" + "r" * len(names)
            )
        )
    )

    def excess(n, k):  # evaluations over the best memory of that row; a miss counts as the budget + 1
        best = min(x or args.max_iter + 1 for x in n)
        return (k or args.max_iter + 1) - best

    summary = [
        [
            name,
            f"{sum(excess(n, n[i]) <= 2 for n in counts)} / {len(counts)}",
            f"{sum(n[i] is None for n in counts)}",
            f"{max(excess(n, n[i]) for n in counts)}",
        ]
        for i, name in enumerate(names)
    ]
    print(f"\nPer memory over the {len(counts)} rows (a solve not reached counts as {args.max_iter + 1}):\n")
    header = ["memory", "rows within 2 of the best", "rows not reached", "most evaluations over the best"]
    print("\n".join(markdown_table(header, summary, "lrrr")))


# ---- train: DEQ-GNN on proteins_like with and without Jacobian regularisation -----------------------

#: The issue's budget: every training solve of an epoch within this many evaluations.
EVAL_BUDGET = 30
#: Evaluations at the end of a run whose validation scores ``train`` averages.
TAIL = 10


def _mean_std(values, signed: bool = False) -> str:
    """``mean ± std`` over the seeds (sample std; the value alone for one seed)."""
    values = list(values)
    fmt = "+.4f" if signed else ".4f"
    if len(values) < 2:
        return format(values[0], fmt) if values else "n/a"
    return f"{format(statistics.mean(values), fmt)} ± {statistics.stdev(values):.4f}"


#: Short names of the model keys an arm sets, for its folder name (``w0.5_s3``, ``rw10_rt0.6_s3``).
_ARM_KEYS = {"jac_reg_weight": "w", "spectral_reg_weight": "rw", "spectral_reg_target": "rt"}
_REGULARISERS = ("jac_reg_weight", "spectral_reg_weight")


class Arm:
    """One arm of ``train``: model overrides ``key=value[,key=value]``, e.g. ``jac_reg_weight=0.5`` or
    ``spectral_reg_weight=10,spectral_reg_target=0.6``; ``none`` is the unregularised model."""

    def __init__(self, spec: str):
        self.label = spec
        self.model = {}
        for item in [] if spec == "none" else spec.split(","):
            key, sep, value = item.partition("=")
            if not sep or not key or not value:
                raise argparse.ArgumentTypeError(f"arm {spec!r}: expected key=value[,key=value] or none")
            self.model[key.strip()] = value.strip()
        for key in _REGULARISERS:
            if key in self.model:
                try:
                    float(self.model[key])
                except ValueError:
                    raise argparse.ArgumentTypeError(f"arm {spec!r}: {key} must be a number") from None

    @property
    def regularised(self) -> bool:
        return any(float(self.model.get(k, 0)) > 0 for k in _REGULARISERS)

    @property
    def folder(self) -> str:
        if not self.model:
            return "w0"
        return "_".join(f"{_ARM_KEYS.get(k, k)}{v}" for k, v in self.model.items())

    def overrides(self, jac_every: int):
        out = [f"model.jac_reg_weight={self.model.get('jac_reg_weight', 0.0)}"]
        # it acts only with a weight: the unregularised arm's configuration is one for every --jac-every
        out.append(f"model.jac_reg_every={jac_every if self.regularised else 1}")
        out += [f"model.{k}={v}" for k, v in self.model.items() if k != "jac_reg_weight"]
        return out


def train_run(args, seed: int, arm: Arm, out_dir: str):
    """One run of the training loop; returns its metrics.csv rows and summary, and whether it was
    reused (``--reuse``: ``out_dir`` holds a completed run of the same length whose checkpoint has the
    same configuration, compared as a resume compares it; the runs are deterministic per seed; an
    interrupted run there is trained again from the start)."""
    import csv

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import revgnn.config  # noqa: F401  (registers the schemas)
    from revgnn.engine.checkpoint import check_resume_config, load_trained
    from revgnn.engine.loop import train
    from revgnn.engine.reports import Summary

    config_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "revgnn", "configs")
    overrides = [
        "logger.plot=false",
        "logger.progress_bar=false",
        "data=proteins_like",
        f"data.num_nodes={args.nodes}",
        "model=deq_gnn",
        f"model.hidden_channels={args.hidden}",
        f"model.max_iter={args.max_iter}",
        f"model.tol={args.tol:g}",
        f"model.pretrain_epochs={args.pretrain_epochs}",
        *arm.overrides(args.jac_every),
        f"model.spectral_radius_every={args.spectral_radius_every}",
        *([] if "spectral_radius_iters" in arm.model else ["model.spectral_radius_iters=10"]),
        f"trainer.epochs={args.epochs}",
        f"trainer.eval_every={args.eval_every}",
        f"seed={seed}",
        f"name=deq_{arm.folder}_seed{seed}",
    ]
    with initialize_config_dir(config_dir=os.path.abspath(config_dir), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    cfg.output_dir = out_dir
    cfg.overwrite = True  # a run that is not reused is trained again from the start, over the old one
    summary_path = os.path.join(out_dir, "summary.json")
    previous = Summary.read(summary_path) if args.reuse and os.path.exists(summary_path) else None
    if (
        previous is not None and previous.status == "completed"
    ):  # an interrupted or failed run is trained again
        if previous.epochs != args.epochs:
            raise SystemExit(f"--reuse: {out_dir} holds a run of {previous.epochs} epochs")
        try:
            saved = load_trained(os.path.join(out_dir, "last.pt")).config
            check_resume_config(OmegaConf.to_container(saved), cfg, out_dir)
        except ValueError as e:
            raise SystemExit(f"--reuse: {e}\ngive --out-dir another folder") from None
        summary, reused = previous.to_dict(), True
    else:
        summary, reused = train(cfg), False
    rows = list(csv.DictReader(open(os.path.join(out_dir, "metrics.csv"))))
    return rows, summary, overrides, reused


def epoch_report(rows, pretrain_epochs: int) -> dict:
    """Per run: which epochs kept every training solve within :data:`EVAL_BUDGET` evaluations and at
    the tolerance (a pretraining epoch counts as its unrolled applications: it solves nothing), the
    max evaluations over all epochs, the max final residual over the solving (DEQ) epochs, and the
    validation score at the last evaluation and averaged over the last :data:`TAIL` evaluations (less
    noisy than the best, a max over every evaluation)."""
    steps = [float(r["deq_forward_steps_max"]) for r in rows]
    pre = [int(r["epoch"]) <= pretrain_epochs for r in rows]
    ok = [
        s <= EVAL_BUDGET if p else s <= EVAL_BUDGET and float(r["deq_forward_converged"]) == 1.0
        for r, s, p in zip(rows, steps, pre)
    ]
    residuals = [float(r["deq_forward_residual_max"]) for r, p in zip(rows, pre) if not p]
    valid = [float(r["valid"]) for r in rows if r.get("valid")]
    return {
        "valid_final": valid[-1] if valid else float("nan"),
        "valid_tail": statistics.mean(valid[-TAIL:]) if valid else float("nan"),
        "valid_tail_sd": statistics.stdev(valid[-TAIL:]) if len(valid) > 1 else float("nan"),
        "steps": steps,
        "ok": sum(ok),
        "failed": [(int(r["epoch"]), int(s)) for r, s, o in zip(rows, steps, ok) if not o],
        "unconverged": sum(float(r["deq_forward_converged"]) < 1.0 for r, p in zip(rows, pre) if not p),
        "unconverged_epochs": [
            int(r["epoch"]) for r, p in zip(rows, pre) if not p and float(r["deq_forward_converged"]) < 1.0
        ],
        "max_steps": max(steps),
        "max_residual": max(residuals) if residuals else float("nan"),
        "spectral_last": rows[-1].get("deq_spectral_radius_mean", ""),
    }


def write_record(args, results) -> None:
    """``--record``: per arm and seed the max forward evaluations of each epoch's training solves and
    the solving epochs whose solve did not converge, as JSON with the command that made them (the
    published figures are checked against this file by ``tests/benchmarks/test_deq_figures.py``)."""
    runs = {}
    for (label, seed), (_, _, rep) in results.items():
        runs.setdefault(label, {})[str(seed)] = {
            "max_evaluations": [int(s) for s in rep["steps"]],
            "unconverged_epochs": rep["unconverged_epochs"],
        }
    record = {
        "command": " ".join(["benchmarks/deq.py", *sys.argv[1:]]),
        "epochs": args.epochs,
        "tol": args.tol,
        "max_iter": args.max_iter,
        "pretrain_epochs": args.pretrain_epochs,
        "threads": args.threads,
        "runs": runs,
    }
    text = json.dumps(record, indent=1)
    # one line per list of numbers, so that a run is one line of the file and of its diffs
    text = re.sub(r"\[[\d\s,]*\]", lambda m: json.dumps(json.loads(m.group(0))), text)
    with open(args.record, "w") as fh:
        fh.write(text + "\n")
    print(f"record written to {args.record}:\n")
    print("\n".join(record_table(record)))
    print(f"\n{record_statement(record)}")


#: The bound published for seeds 0-9 (docs/bench/deq.md); ``record_table`` counts the epochs above it.
PUBLISHED_BOUND = 16


def record_table(record) -> list:
    """A ``--record`` file as a markdown table, one row per run: the most evaluations any training solve
    took and its first epoch (the unrolled pretraining epochs count as their applications), the
    solving epochs above :data:`PUBLISHED_BOUND` and above :data:`EVAL_BUDGET` evaluations, and
    those whose solve did not reach the tolerance."""
    rows = []
    for label, seeds in record["runs"].items():
        for seed, run in seeds.items():
            steps = run["max_evaluations"]
            deq = steps[record["pretrain_epochs"] :]
            worst = max(steps)
            rows.append(
                [
                    label,
                    seed,
                    len(steps),
                    f"{worst} ({steps.index(worst) + 1})",
                    sum(s > PUBLISHED_BOUND for s in deq),
                    sum(s > EVAL_BUDGET for s in deq),
                    len(run["unconverged_epochs"]),
                ]
            )
    header = [
        "arm",
        "seed",
        "epochs",
        "max evaluations (epoch)",
        f"epochs over {PUBLISHED_BOUND}",
        f"epochs over {EVAL_BUDGET}",
        "epochs unconverged",
    ]
    return markdown_table(header, rows, "llrrrrr")


def _tol_text(x: float) -> str:
    """``1e-4`` rather than ``0.0001`` (as the pages write tolerances), where that is exact."""
    mantissa, exponent = f"{x:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}" if float(f"{mantissa}e{exponent}") == x else f"{x:g}"


def record_statement(record) -> str:
    """The sentence the docs publish for a ``--record`` file (tests/benchmarks/test_deq_figures.py
    looks for it)."""
    runs = [run for seeds in record["runs"].values() for run in seeds.values()]
    seeds = sorted(int(s) for arm in record["runs"].values() for s in arm)
    worst = max(max(run["max_evaluations"]) for run in runs)
    missed = sum(len(run["unconverged_epochs"]) for run in runs)
    seeds_text = (
        f"{seeds[0]}-{seeds[-1]}"
        if seeds == list(range(seeds[0], seeds[-1] + 1))
        else ", ".join(map(str, seeds))
    )
    if missed:
        return (
            f"in {missed} epochs of {len(runs) * record['epochs']} a training solve missed "
            f"{_tol_text(record['tol'])} (budget {record['max_iter']}); held-out seeds {seeds_text}"
        )
    return (
        f"every training solve met {_tol_text(record['tol'])} within {worst} evaluations in all "
        f"{record['epochs']} epochs of held-out seeds {seeds_text}"
    )


def bench_train(args) -> None:
    import tempfile
    import warnings

    import torch

    from revgnn.deq import DEQConvergenceWarning

    warnings.simplefilter("ignore", DEQConvergenceWarning)
    torch.set_num_threads(args.threads)
    root = args.out_dir or tempfile.mkdtemp(prefix="bench_deq_train_")
    results = {}
    arms = args.arms
    for seed in args.seeds_list:
        for arm in arms:
            rows, summary, overrides, reused = train_run(
                args, seed, arm, os.path.join(root, f"{arm.folder}_s{seed}")
            )
            results[(arm.label, seed)] = (rows, summary, epoch_report(rows, args.pretrain_epochs))
            print(
                f"{arm.label} seed {seed}{' (reused)' if reused else ''}: "
                "forward evaluations per solve, max over each epoch: "
                f"{[int(s) for s in results[(arm.label, seed)][2]['steps']]}",
                flush=True,
            )
    if args.record:
        write_record(args, results)
    own = {o for arm in arms for o in arm.overrides(args.jac_every)}
    shown = [o for o in overrides if o not in own and not o.startswith(("seed=", "name="))]
    print(
        f"\nruns in {root}\noverrides (besides the arm's and the seed): {' '.join(shown)}"
        f"; regularised arms: model.jac_reg_every={args.jac_every}"
    )
    metric = summary.get("metric", "score")
    epochs = len(rows)
    pre = args.pretrain_epochs
    note = f"; epochs 1-{pre} are unrolled pretraining, counted as their unrolled applications" if pre else ""
    print(
        f"\nEpochs whose every training forward solve reached rel. residual {args.tol:g} within "
        f"{EVAL_BUDGET} evaluations (budget {args.max_iter}){note}; residual over the solving epochs:\n"
    )
    spectral = args.spectral_radius_every > 0
    header = [
        "arm",
        "seed",
        f"epochs ≤ {EVAL_BUDGET} evaluations",
        "epochs over (their max evaluations)",
        "max evaluations, all epochs",
        "max rel. residual, DEQ epochs",
        *(["spectral radius, last epoch"] if spectral else []),
        f"best valid {metric} (epoch)",
        "test at best valid",
        "final valid",
        f"valid, last {TAIL} evaluations: mean (sd)",
    ]
    table = []
    for (label, seed), (_, summary, rep) in results.items():
        failed = ", ".join(f"{e} ({s})" for e, s in rep["failed"][:8])
        failed += f", ... ({len(rep['failed'])} in all)" if len(rep["failed"]) > 8 else ""
        table.append(
            [
                label,
                seed,
                f"{rep['ok']} / {epochs}",
                failed or "none",
                f"{rep['max_steps']:.0f}",
                f"{rep['max_residual']:.1e}",
                *([f"{float(rep['spectral_last']):.3f}"] if spectral else []),
                f"{summary['highest_valid']:.4f} ({summary['best_epoch']})",
                f"{summary['final_test']:.4f}",
                f"{rep['valid_final']:.4f}",
                f"{rep['valid_tail']:.4f} ({rep['valid_tail_sd']:.4f})",
            ]
        )
    print("\n".join(markdown_table(header, table, align="llrlrrrrrrr")), flush=True)

    seeds = args.seeds_list
    print(f"\nPer arm over seeds {', '.join(map(str, seeds))} (mean ± sample std):\n")
    summary_rows = []
    for arm in arms:
        reps = [results[(arm.label, s)][2] for s in seeds]
        sums = [results[(arm.label, s)][1] for s in seeds]
        first = sorted(r["failed"][0][0] for r in reps if r["failed"])
        summary_rows.append(
            [
                arm.label,
                f"{sum(r['ok'] == epochs for r in reps)} / {len(seeds)}",
                f"{sum(r['ok'] for r in reps)} / {epochs * len(seeds)}",
                f"{sum(r['unconverged'] for r in reps)}",
                f"{first[0]}-{first[-1]}" if first else "none",
                f"{max(r['max_steps'] for r in reps):.0f}",
                _mean_std(s["highest_valid"] for s in sums),
                _mean_std(s["final_test"] for s in sums),
                _mean_std(r["valid_final"] for r in reps),
                _mean_std(r["valid_tail"] for r in reps),
                f"{statistics.mean(r['valid_tail_sd'] for r in reps):.4f}",
            ]
        )
    print(
        "\n".join(
            markdown_table(
                [
                    "arm",
                    f"runs with every epoch ≤ {EVAL_BUDGET}",
                    f"epochs ≤ {EVAL_BUDGET}",
                    f"epochs with a solve stopped at {args.max_iter}",
                    "first epoch over, earliest-latest seed",
                    "max evaluations",
                    f"best valid {metric}",
                    "test at best valid",
                    "final valid",
                    f"valid, mean of last {TAIL} evaluations",
                    f"sd of a run's last {TAIL} evaluations, mean",
                ],
                summary_rows,
                align="lrrrrrrrrrr",
            )
        )
    )
    block = max(10, math.ceil(epochs / 60) * 10)
    starts = range(1, epochs + 1, block)
    print(
        f"\nEpochs over {EVAL_BUDGET} evaluations or unconverged, per {block} epochs, sum over the seeds:\n"
    )
    print(
        "\n".join(
            markdown_table(
                ["arm"] + [f"{a}-{min(a + block - 1, epochs)}" for a in starts],
                [
                    [arm.label]
                    + [
                        sum(
                            a <= e < a + block for s in seeds for e, _ in results[(arm.label, s)][2]["failed"]
                        )
                        for a in starts
                    ]
                    for arm in arms
                ],
                align="l" + "r" * len(starts),
            )
        )
    )

    ref = next((a.label for a in arms if not a.regularised), arms[0].label)
    others = [a.label for a in arms if a.label != ref]
    if not others:
        return
    print(
        f"\nPaired by seed, arm − {ref} (best valid / test at best valid / final valid / valid, mean of "
        f"the last {TAIL} evaluations):\n"
    )
    diffs = {w: [] for w in others}
    paired = []
    for s in seeds:
        cells = [s]
        for w in others:
            (a, ra), (b, rb) = (results[(w, s)][1:], results[(ref, s)][1:])
            d = (
                a["highest_valid"] - b["highest_valid"],
                a["final_test"] - b["final_test"],
                ra["valid_final"] - rb["valid_final"],
                ra["valid_tail"] - rb["valid_tail"],
            )
            diffs[w].append(d)
            cells.append(" / ".join(f"{x:+.4f}" for x in d))
        paired.append(cells)
    paired.append(
        ["mean ± std"]
        + [" / ".join(_mean_std((d[i] for d in diffs[w]), True) for i in range(4)) for w in others]
    )
    paired.append(
        ["seeds ≥ 0"] + [" / ".join(f"{sum(d[i] >= 0 for d in diffs[w])}" for i in range(4)) for w in others]
    )
    header = ["seed"] + [f"{w} − {ref}" for w in others]
    print("\n".join(markdown_table(header, paired, align="l" + "r" * len(others))), flush=True)


def jacobian_at_equilibrium(model, task, part_seed: int) -> dict:
    """One training solve of a trained DEQ-GNN: the first batch ``task`` draws from a generator seeded
    with ``part_seed`` (as the trainer draws its batches), one forward in training mode (one dropout
    mask, the model's own solver, tolerance and budget; no gradient, so no loss term). Returns that
    solve's evaluations, and at the fixed point (Anderson to 1e-9) ||J||_F^2 / d (20 Rademacher
    probes), the spectral radius (200 power iterations) and the participation ratio of the dominant
    eigenvector's per-node mass from the same iterations, 1 / sum_i m_i^2 (the number of nodes it
    effectively lives on)."""
    import torch

    from revgnn.deq import get_solver, jacobian_frobenius
    from revgnn.deq.regularize import _power_iteration, _tail_mean

    batch = next(next(task.train_steps(torch.Generator().manual_seed(part_seed), "cpu")).batches)
    captured = []  # the map's inputs, as DEQGNN.forward hands them to its DEQ
    hook = model.deq.register_forward_pre_hook(lambda _module, args: captured.append(args))
    model.train()
    torch.manual_seed(part_seed)  # the dropout mask
    try:
        with torch.no_grad():
            model(*batch.inputs)
    finally:
        hook.remove()
    inputs, solve = captured[0], dict(model.deq.stats)

    def f(z):
        return model.layer(z, *inputs)

    with torch.no_grad():
        z_star = get_solver("anderson")(f, torch.zeros_like(inputs[0]), max_iter=400, tol=1e-9).z
    z = z_star.requires_grad_()
    fz = f(z)
    gen = torch.Generator().manual_seed(part_seed)
    frobenius = jacobian_frobenius(fz, z, 20, generator=gen, create_graph=False).item() / z.numel()
    v, log_growth = _power_iteration(fz, z, 200, gen)
    mass = v.square().sum(1)
    mass = mass / mass.sum()
    return {
        "evals": int(solve["forward_steps"]),
        "converged": bool(solve["forward_converged"]),
        "frobenius": frobenius,
        "rho": _tail_mean(log_growth),
        "participation": 1.0 / mass.square().sum().item(),
        "nodes": z.size(0),
    }


def bench_jacobian(args) -> None:
    """For the last checkpoint of each run ``train`` left in ``--out-dir`` (arms x seeds): what the
    solver faces at the end of training (:func:`jacobian_at_equilibrium`, ``--seeds`` batches)."""
    import warnings

    import torch
    from hydra.utils import instantiate

    import revgnn.config  # noqa: F401  (registers the schemas)
    from revgnn.deq import DEQConvergenceWarning
    from revgnn.engine.checkpoint import load_trained
    from revgnn.engine.loop import build_model
    from revgnn.engine.tasks import make_task, shapes

    if not args.out_dir:
        raise SystemExit("jacobian: give --out-dir, the folder of a train run")
    warnings.simplefilter("ignore", DEQConvergenceWarning)  # the table says which solves did not converge
    torch.set_num_threads(args.threads)
    table = []
    for arm in args.arms:
        for seed in args.seeds_list:
            trained = load_trained(os.path.join(args.out_dir, f"{arm.folder}_s{seed}", "last.pt"))
            cfg = trained.config
            ds = instantiate(cfg.data)
            model = build_model(cfg.model, shapes(ds))
            model.load_state_dict(trained.model_state)
            model.set_epoch(trained.epoch)  # the equilibrium phase, after any unrolled pretraining
            task = make_task(ds, cfg.trainer)
            for part_seed in range(args.seeds):
                r = jacobian_at_equilibrium(model, task, part_seed)
                budget = f"{model.deq.solver} to {model.deq.tol:g}, budget {model.deq.max_iter}"
                evals = f"{r['evals']}" if r["converged"] else f">{r['evals']} (not reached)"
                table.append(
                    [
                        arm.label,
                        seed,
                        trained.epoch,
                        part_seed,
                        f"{evals} ({budget})",
                        f"{r['frobenius']:.4f}",
                        f"{r['rho']:.3f}",
                        f"{r['participation']:.1f} of {r['nodes']}",
                    ]
                )
    header = [
        "arm",
        "seed",
        "epoch",
        "batch",
        "evaluations of the training solve",
        "‖J‖²_F / d",
        "spectral radius",
        "dominant eigenvector: participation ratio (nodes)",
    ]
    print("\n".join(markdown_table(header, table, align="llrrrrrr")), flush=True)


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
            "-m",
            __spec__.name,
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
    parser.add_argument(
        "part", choices=["solvers", "step", "one", "peer", "broyden-memory", "train", "jacobian"]
    )
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
    parser.add_argument("--epochs", type=int, default=30, help="train: epochs per run")
    parser.add_argument("--eval-every", type=int, default=5, help="train: evaluate every this many epochs")
    parser.add_argument(
        "--arms",
        type=Arm,
        nargs="+",
        default=[Arm("none"), Arm("jac_reg_weight=1")],
        help="train: model overrides of each arm, key=value[,key=value] (e.g. jac_reg_weight=0.5 or "
        "spectral_reg_weight=10,spectral_reg_target=0.6), or none",
    )
    parser.add_argument("--seeds-list", type=int, nargs="+", default=[0, 1], help="train: run seeds")
    parser.add_argument(
        "--pretrain-epochs",
        type=int,
        default=0,
        help="train: epochs of unrolled weight-tied pretraining first (model.pretrain_epochs), every arm",
    )
    parser.add_argument(
        "--jac-every", type=int, default=1, help="train: model.jac_reg_every of the regularised arms"
    )
    parser.add_argument(
        "--spectral-radius-every",
        type=int,
        default=1,
        help="train: model.spectral_radius_every (0: off; the estimate draws from the global RNG, so it "
        "changes the run's dropout masks)",
    )
    parser.add_argument(
        "--out-dir", help="train: keep each run's output under this folder (default: a temp dir)"
    )
    parser.add_argument(
        "--record",
        help="train: write each run's per-epoch max evaluations to this JSON file (with the command)",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="train: take a run --out-dir already holds, completed with the same configuration, instead "
        "of training it again (same --threads assumed)",
    )
    parser.add_argument(
        "--models", nargs="+", default=["deq_gnn", "wt_revgnn", "revgnn_small"], choices=sorted(MODELS)
    )
    parser.add_argument("--one", choices=sorted(MODELS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    {
        "solvers": bench_solvers,
        "step": bench_step,
        "one": bench_one,
        "peer": bench_peer,
        "broyden-memory": bench_broyden_memory,
        "train": bench_train,
        "jacobian": bench_jacobian,
    }[args.part](args)


if __name__ == "__main__":
    main()
