"""revgnn against torchdeq 0.1.0 (``pip install -e .[bench]``) on the same float64 maps, a held-out
contractive graph map and ``deq_gnn_small`` on ``proteins_like``: function evaluations to a relative
residual of 1e-4 and 1e-6 for each solver, the implicit gradient's error against a dense float64
reference, and the bytes saved for backward at 10 vs 100 forward iterations. Counts, not timings.

Example::

    .venv/bin/python -m benchmarks.deq peer --nodes 2000 --max-iter 100
"""

from __future__ import annotations

from benchmarks.deq.common import contractive_graph_map, deq_gnn_map, parser

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
    grad_nodes = args.grad_nodes
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


def main(argv=None, prog=None) -> None:
    p = parser(__doc__, prog, ["--nodes", "--threads", "--max-iter"])
    p.add_argument(
        "--grad-nodes", type=int, default=200, help="nodes of the contractive map of the gradient check"
    )
    bench_peer(p.parse_args(argv))


if __name__ == "__main__":
    main()
