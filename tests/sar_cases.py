"""The SAR test cases (``distributed/test_sar*.py``): a small directed multigraph, its node
assignments, and the float64 comparison of a model on SAR workers with the same model on the full
graph in one process; FactoredGEN, a GENConv max fed factored edge features (the SAR kernels' case,
also run through the Triton kernels); OpCounts (which path a SAR conv took) and edge_sized_saved
(what it saved for backward)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from conftest import rel_err

RTOL = 1e-9
N, E, F_IN, F_EDGE = 48, 260, 8, 6


def make_graph(seed: int = 0, dst_sorted: bool = False):
    """Small directed multigraph with self loops, duplicate edges and one
    node without incoming edges; with ``dst_sorted`` its edges (and their
    features) in destination order, so that an edge's column is its position
    in that order (what the fused GAT attention keys its dropout mask by)."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, N, (2, E), generator=g)
    ei[1][ei[1] == N - 1] = 0  # node N-1: no incoming edges
    ei[:, :4] = torch.tensor([[3, 3, 5, 7], [3, 3, 9, 7]])  # loops, dups
    x = torch.randn(N, F_IN, generator=g, dtype=torch.float64)
    ea = torch.randn(E, F_EDGE, generator=g, dtype=torch.float64)
    if dst_sorted:
        perm = torch.sort(ei[1] * N + ei[0], stable=True).indices
        ei, ea = ei[:, perm], ea[perm]
    return ei, x, ea


#: (world size, node assignment) of the SAR equality tests; at "empty" rank 1 owns no node, so the
#: shards from and to it are empty
WORLDS = [(1, "metis"), (2, "metis"), (3, "unbalanced"), (3, "empty")]


def make_parts(world_size: int, kind: str) -> torch.Tensor:
    """Node assignments: 'metis', 'random', 'unbalanced' (30/12/6 split)
    or 'empty' (part 1 owns no node, so every shard from it is empty)."""
    ei, _, _ = make_graph()
    if kind == "unbalanced":
        parts = torch.zeros(N, dtype=torch.long)
        parts[30:42], parts[42:] = 1, 2
        return parts[torch.randperm(N, generator=torch.Generator().manual_seed(1))]
    if kind == "empty":
        g = torch.Generator().manual_seed(2)
        parts = torch.randint(0, world_size - 1, (N,), generator=g)
        return torch.where(parts >= 1, parts + 1, parts)
    from revgnn.distributed.partition import partition_nodes

    return partition_nodes(ei, N, world_size, method=kind, seed=0)


def worker_graph(
    rank: int,
    world_size: int,
    kind: str,
    timeout_s: float = 60,
    node_x: bool = False,
    dst_sorted: bool = False,
):
    """Worker ``rank``'s part of :func:`make_graph`'s graph (``dst_sorted`` passed on) split by
    ``make_parts(world_size, kind)``, edge features included (and the node features as
    ``node_data["x"]`` with ``node_x``): ``(SARGraph, part, x, edge_attr)``, the last two the full
    graph's."""
    from revgnn.distributed.partition import build_partitions
    from revgnn.distributed.sar import SARGraph

    ei, x, ea = make_graph(dst_sorted=dst_sorted)
    node_data = {"x": x} if node_x else None
    parts = build_partitions(
        ei, N, world_size, parts=make_parts(world_size, kind), edge_attr=ea, node_data=node_data
    )
    return SARGraph(parts[rank], timeout_s=timeout_s), parts[rank], x, ea


def compare_model(
    name, build, uses_edges, graph, part, forward_ref, forward_sar, out_dim_seed=7, dst_sorted=False
):
    """Runs the reference on the full graph (:func:`make_graph` with ``dst_sorted``) and SAR on the
    local part; returns a list of (name, what, rel err)."""
    import torch.distributed as dist

    from revgnn.distributed.comm import all_reduce_gradients

    ei, x_full, ea_full = make_graph(dst_sorted=dst_sorted)
    torch.manual_seed(1234)
    ref = build().double()
    torch.manual_seed(1234)
    sar = build().double()
    sar.load_state_dict(ref.state_dict())
    from revgnn.distributed.convs import convert_to_sar

    convert_to_sar(sar)

    x_ref = x_full.clone().requires_grad_()
    ea_ref = ea_full.clone().requires_grad_()
    out_ref = forward_ref(ref, x_ref, ei, ea_ref if uses_edges else None)
    w = torch.randn(out_ref.shape, generator=torch.Generator().manual_seed(out_dim_seed), dtype=torch.float64)
    (out_ref * w).sum().backward()

    nid, eid = graph.node_ids, graph.edge_ids
    x_loc = x_full[nid].clone().requires_grad_()
    ea_loc = ea_full[eid].clone().requires_grad_()
    out = forward_sar(sar, x_loc, graph, ea_loc if uses_edges else None)
    (out * w[nid]).sum().backward()
    params = list(sar.parameters())
    if dist.is_initialized():
        all_reduce_gradients(params)
    errs = [
        (name, "output", rel_err(out, out_ref[nid])),
        (name, "grad x", rel_err(x_loc.grad, x_ref.grad[nid])),
    ]
    if uses_edges:
        errs.append((name, "grad edge_attr", rel_err(ea_loc.grad, ea_ref.grad[eid])))
    for (pn, p_ref), p in zip(ref.named_parameters(), params):
        g_ref = p_ref.grad if p_ref.grad is not None else torch.zeros_like(p_ref)
        errs.append((name, f"grad {pn}", rel_err(p.grad, g_ref)))
    for (bn, b_ref), b in zip(ref.named_buffers(), sar.buffers()):
        if b.is_floating_point():  # BatchNorm running statistics
            errs.append((name, f"buffer {bn}", rel_err(b, b_ref)))
    return errs


def check(results):
    bad = []
    for r in results:
        for name, what, err in r.value:
            if not err <= RTOL:
                bad.append(f"rank {r.rank} {name} {what}: rel err {err:.3e}")
    assert not bad, "\n".join(bad)


class FactoredGEN(torch.nn.Module):
    """GENConv max fed the factored edge encoding ``raw W^T + b``: on a SAR
    graph as a LinearEdgeFeatures (the kernel's factored mode), on the full
    graph expanded for PyG. ``lin_edge``: the conv has its own edge encoder
    (composed into the factored map). ``ties``: integer-valued node and edge
    features and weights (straight-through floor), so most maxima are exact
    ties, also across shards."""

    def __init__(self, out_channels=F_IN, lin_edge=False, ties=False):
        super().__init__()
        from torch_geometric.nn import GENConv

        width = 5 if lin_edge else out_channels
        self.enc = torch.nn.Linear(F_EDGE, width)
        self.conv = GENConv(
            F_IN, out_channels, aggr="max", norm="layer", bias=True, edge_dim=width if lin_edge else None
        )
        self.ties = ties
        if ties:
            with torch.no_grad():
                self.enc.weight.copy_(torch.randint(-1, 2, self.enc.weight.shape))
                self.enc.bias.copy_(torch.randint(-1, 2, self.enc.bias.shape))

    @staticmethod
    def _int(t):
        return torch.floor(2 * t) + (t - t.detach())

    def forward(self, x, edge_index, edge_attr):
        from revgnn.distributed.sar import SARGraph
        from revgnn.nn import LinearEdgeFeatures

        if self.ties:
            x, edge_attr = self._int(x), self._int(edge_attr).clamp(0, 1)
        if isinstance(edge_index, SARGraph):
            edges = LinearEdgeFeatures.from_linear(edge_attr, self.enc)
        else:
            edges = F.linear(edge_attr, self.enc.weight, self.enc.bias)
        return self.conv(x, edge_index, edges)


class _CountingOps:
    """``ops`` (revgnn.nn.ops) with the calls of the operators named in ``calls`` counted there."""

    def __init__(self, ops, calls):
        self._ops, self._calls = ops, calls

    def __getattr__(self, name):
        fn, calls = getattr(self._ops, name), self._calls
        if name not in calls:
            return fn

        def counted(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return counted


class OpCounts:
    """While active, counts the calls of the operators ``names`` made by the SAR modules ``modules``
    (names in revgnn.distributed, e.g. ``"gen_aggr_sar"``, each calling them as ``ops.<name>``) and,
    under ``"torch"``, the calls of the PyTorch SAR path (``convs.sequential_aggregate``): which path
    a conv took, and how many shard calls it made. ``calls``: name -> count."""

    def __init__(self, modules, names):
        import importlib

        self._modules = [importlib.import_module(f"revgnn.distributed.{m}") for m in modules]
        self.calls = dict.fromkeys((*names, "torch"), 0)

    def __enter__(self):
        from revgnn.distributed import convs

        calls, real_seq = self.calls, convs.sequential_aggregate
        self._real = [(m, m.ops) for m in self._modules]

        def seq(*args, **kwargs):
            calls["torch"] += 1
            return real_seq(*args, **kwargs)

        for m, ops in self._real:
            m.ops = _CountingOps(ops, calls)
        convs.sequential_aggregate = seq
        self._real_seq = real_seq
        return self

    def __exit__(self, *exc):
        from revgnn.distributed import convs

        for m, ops in self._real:
            m.ops = ops
        convs.sequential_aggregate = self._real_seq


def edge_sized_saved(fn, graph, module, raw=None, self_loops=False):
    """Runs ``fn().sum().backward()`` under saved_tensors_hooks (reversible blocks save in backward,
    when they re-run their forward) and returns the shapes of the float tensors saved whose first dim
    is an edge count: all local edges or one shard's (also those of ``graph.with_self_loops()`` with
    ``self_loops``), unless that count is also a node count or a dim of ``module``'s parameters. The
    caller's raw edge features ``raw`` (kept as an input, nothing new) are left out."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn().sum().backward()
    sizes = set()
    for g in (graph, graph.with_self_loops()) if self_loops else (graph,):
        sizes |= {g.num_edges} | {b - a for a, b in (g.shard(q) for q in range(g.world_size))}
    sizes -= {graph.num_local, *graph.num_needed, 0} | {d for p in module.parameters() for d in p.shape}
    assert graph.num_edges in sizes or graph.num_edges == 0, (
        "the local edge count is also a node or parameter size"
    )
    return [
        tuple(t.shape)
        for t in saved
        if t.is_floating_point()
        and t.dim()
        and t.size(0) in sizes
        and (raw is None or t.data_ptr() != raw.data_ptr())
    ]


def check_shard_calls(where, c, fwd, world_size, recomputed=False):
    """Operator counts ``c`` (:class:`OpCounts` ``calls``) of a conv run through the shard operator
    ``fwd`` on ``world_size`` workers: no PyTorch-path call, and one ``fwd`` call per shard in the
    forward ring and one ``fwd + "_backward"`` in the backward ring; with ``recomputed`` (reversible
    blocks, whose forward runs again in backward) whole rings, more forward than backward ones."""
    assert c["torch"] == 0, (where, c)
    bwd = fwd + "_backward"
    if recomputed:
        assert c[fwd] > c[bwd] > 0, (where, c)
        assert c[fwd] % world_size == 0 and c[bwd] % world_size == 0, (where, c)
    else:
        assert c[fwd] == world_size and c[bwd] == world_size, (where, c)


#: the allocation guards' graph: E x C dwarfs N x C, the E-sized int64 arrays and E x D features
BIG_N, BIG_E, BIG_C, BIG_D = 300, 30_000, 32, 2


def big_graph(rank, world_size, edge_features=False):
    """Worker ``rank``'s SARGraph of the allocation guards' random graph (``BIG_N`` nodes, ``BIG_E``
    edges, random parts, ``BIG_D`` edge features with ``edge_features``) and its float32
    ``[num_local, BIG_C]`` node features."""
    from revgnn.distributed.partition import build_partitions
    from revgnn.distributed.sar import SARGraph

    g = torch.Generator().manual_seed(11)
    ei = torch.randint(0, BIG_N, (2, BIG_E), generator=g)
    parts = torch.randint(0, world_size, (BIG_N,), generator=g)
    ea = torch.randn(BIG_E, BIG_D, generator=g, dtype=torch.float32) if edge_features else None
    graph = SARGraph(build_partitions(ei, BIG_N, world_size, parts=parts, edge_attr=ea)[rank], timeout_s=60)
    return graph, torch.randn(graph.num_local, BIG_C, generator=g, dtype=torch.float32)


def largest_allocations(steps, graph, x):
    """The largest single allocation (bytes) of each of ``steps`` (name -> ``step(x)``, a forward and
    backward on ``graph``; run once before, so the shard caches are built as by any earlier layer);
    the smallest and the largest shard's ``E_q x C`` bytes at ``x``'s channels and dtype; and the
    largest allocation of the PyTorch SAR path (sequential_aggregate of a plain sum), which forms a
    shard's messages and so shows that the measure sees them: ``(largest, shard_min, shard_max, old)``."""
    from revgnn.distributed.sar import EdgeOp, sequential_aggregate
    from revgnn.utils.memory import LargestAllocation

    out = {}
    for name, step in steps.items():
        step(x.clone().requires_grad_())
        xl = x.clone().requires_grad_()
        with LargestAllocation() as largest:
            step(xl)
        out[name] = largest.bytes
    edges = [b - a for a, b in (graph.shard(q) for q in range(graph.world_size))]

    class Sum(EdgeOp):
        linear = True

    xl = x.clone().requires_grad_()
    with LargestAllocation() as old:
        sequential_aggregate(Sum(), graph, xl).sum().backward()
    row = x.size(1) * x.element_size()
    return out, min(edges) * row, max(edges) * row, old.bytes


def check_allocations(rank, largest, shard_min, shard_max, old):
    """:func:`largest_allocations`' result: the old path's messages are seen (at least the largest
    shard's ``E_q x C``), and no shard form allocates a quarter of the smallest shard's."""
    assert old >= shard_max, (rank, old, shard_max)
    for name, size in largest.items():
        assert size < shard_min / 4, (rank, name, size, shard_min)


class _Local:
    """A worker's result as run_workers returns one, for a run in this process."""

    def __init__(self, value):
        self.rank, self.value = 0, value


def run_sar_case(worker, world_size: int, kind: str) -> list:
    """``worker(rank, world_size, kind)`` on every rank: in this process at one worker (no process
    group needed; the default dtype the worker sets is put back), else in ``world_size`` worker
    processes; their results (``rank``, ``value``)."""
    from revgnn.testing.workers import run_workers

    if world_size == 1:
        dtype = torch.get_default_dtype()
        try:
            return [_Local(worker(0, 1, kind))]
        finally:
            torch.set_default_dtype(dtype)
    return run_workers(worker, world_size, kind, timeout_s=60, wall_s=300, threads=1)
