"""Evaluations Broyden needs to 1e-4 and 1e-6 against its memory (5 to 80, and every update kept, the
default) on held-out linear (normal and non-normal), graph and DEQ-GNN maps.

Example::

    .venv/bin/python -m benchmarks.deq broyden-memory --nodes 2000 --max-iter 300 --threads 1
"""

from __future__ import annotations

from benchmarks.common import markdown_table
from benchmarks.deq.common import contractive_graph_map, deq_gnn_map, parser

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


def main(argv=None, prog=None) -> None:
    bench_broyden_memory(parser(__doc__, prog, ["--nodes", "--threads", "--max-iter"]).parse_args(argv))


if __name__ == "__main__":
    main()
