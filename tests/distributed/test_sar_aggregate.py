"""SAR SAGE (sum/mean/max), GIN and GCN through the fused operators shard by shard
(revgnn.distributed.aggregate_sar): equal to one process (PyG's convs) at P = 1, 2, 3 and with an
empty part, float64, gradients included, alone and inside GroupAddRev; the operators are the path
taken (not sequential_aggregate's PyTorch messages); no edge-sized float tensor saved; no allocation
near one shard's E_q x C, where the old path's messages are one.

One spawn per world size runs every check (starting workers dominates the cost). Helpers and the
graph come from tests/sar_cases.py.
"""

from __future__ import annotations

import pytest
import torch
from conftest import require_kernel
from sar_cases import (
    BIG_C,
    F_IN,
    WORLDS,
    N,
    OpCounts,
    big_graph,
    check,
    check_allocations,
    check_shard_calls,
    compare_model,
    edge_sized_saved,
    largest_allocations,
    make_graph,
    run_sar_case,
    worker_graph,
)

from revgnn.distributed.partition import build_partitions


class TiesSAGE(torch.nn.Module):
    """SAGE max over integer-valued features (straight-through floor): most maxima are ties, also
    across shards, and some are exactly 0 (the divisor PyG's backward adds one to)."""

    def __init__(self):
        super().__init__()
        from torch_geometric.nn import SAGEConv

        self.conv = SAGEConv(F_IN, 8, aggr="max")

    def forward(self, x, edge_index):
        return self.conv(torch.floor(x).clamp(-1, 1) + (x - x.detach()), edge_index)


class RevStack(torch.nn.Module):
    """Linear -> 3 x GroupAddRev(block of ``conv``, 2 groups) -> Linear: the reversible recompute
    runs the shard operators again in backward."""

    def __init__(self, conv, hidden=8, **kwargs):
        super().__init__()
        from revgnn.nn import GroupAddRev, make_block

        self.enc = torch.nn.Linear(F_IN, hidden)
        self.layers = torch.nn.ModuleList(
            [GroupAddRev(make_block(conv, hidden // 2, **kwargs), num_groups=2) for _ in range(3)]
        )
        self.head = torch.nn.Linear(hidden, 3)

    def forward(self, x, edge_index):
        h = self.enc(x)
        for layer in self.layers:
            h = layer(h, edge_index)
        return self.head(h)


def _cases():
    from torch.nn import Linear, ReLU, Sequential
    from torch_geometric.nn import GCNConv, GINConv, SAGEConv

    return [
        ("SAGE-mean", lambda: SAGEConv(F_IN, 8, aggr="mean")),
        ("SAGE-sum", lambda: SAGEConv(F_IN, 8, aggr="sum")),
        ("SAGE-max", lambda: SAGEConv(F_IN, 8, aggr="max")),
        ("SAGE-max-ties", TiesSAGE),
        ("SAGE-mean-project-normalize", lambda: SAGEConv(F_IN, 8, aggr="mean", project=True, normalize=True)),
        ("GIN", lambda: GINConv(Sequential(Linear(F_IN, 16), ReLU(), Linear(16, 8)), train_eps=True)),
        ("GIN-mean", lambda: GINConv(Linear(F_IN, 8), aggr="mean")),
        ("GCN", lambda: GCNConv(F_IN, 8)),
        ("GCN-improved", lambda: GCNConv(F_IN, 8, improved=True)),
        ("RevStack-SAGE-max", lambda: RevStack("sage", aggr="max")),
        ("RevStack-GIN", lambda: RevStack("gin")),
        ("RevStack-GCN", lambda: RevStack("gcn")),
    ]


def _call(model, x, edge_index, edge_attr):
    return model(x, edge_index)


def _counts():
    """Counts the shard operators' calls and the PyTorch SAR path's."""
    return OpCounts(
        ("aggregate_sar",), ("aggregate", "aggregate_backward", "segment_max", "segment_max_backward")
    )


def _largest_allocations(rank, world_size):
    """:func:`largest_allocations` of a float32 forward + backward of each conv on the big graph."""
    from torch_geometric.nn import GCNConv, GINConv, SAGEConv

    from revgnn.distributed.convs import convert_to_sar
    from revgnn.nn import GroupAddRev, make_block

    graph, x = big_graph(rank, world_size)
    torch.manual_seed(0)
    convs = {
        "SAGE-mean": SAGEConv(BIG_C, BIG_C, aggr="mean"),
        "SAGE-max": SAGEConv(BIG_C, BIG_C, aggr="max"),
        "GIN": GINConv(torch.nn.Linear(BIG_C, BIG_C)),
        "GCN": GCNConv(BIG_C, BIG_C),
        "GroupAddRev-SAGE-max": GroupAddRev(make_block("sage", BIG_C // 2, aggr="max"), num_groups=2),
    }

    def step(conv):
        return lambda xl: conv(xl, graph).sum().backward()

    return largest_allocations({name: step(convert_to_sar(c.float())) for name, c in convs.items()}, graph, x)


def _worker(rank, world_size, kind):
    torch.set_default_dtype(torch.float64)
    from revgnn.distributed.convs import convert_to_sar

    graph, part, x, _ = worker_graph(rank, world_size, kind)
    errs, calls, bad = [], {}, {}
    for name, build in _cases():
        with _counts() as counts:
            errs += compare_model(name, build, False, graph, part, _call, _call)
        calls[name] = counts.calls
        torch.manual_seed(3)
        model = convert_to_sar(build())
        xl = x[graph.node_ids].clone().requires_grad_()
        bad[name] = edge_sized_saved(lambda: model(xl, graph), graph, model, self_loops=True)
    torch.set_default_dtype(torch.float32)
    return errs, calls, bad, _largest_allocations(rank, world_size)


def _check_all(results, world_size):
    check([type("R", (), {"rank": r.rank, "value": r.value[0]}) for r in results])
    for r in results:
        _, calls, bad, (largest, shard_min, shard_max, old) = r.value
        for name, c in calls.items():
            fwd = "segment_max" if "max" in name else "aggregate"
            check_shard_calls((r.rank, name), c, fwd, world_size, recomputed=name.startswith("RevStack"))
        assert not any(bad.values()), (r.rank, bad)
        check_allocations(r.rank, largest, shard_min, shard_max, old)


@pytest.mark.parametrize("world_size,kind", WORLDS)
def test_sar_aggregations_match_single_process(world_size, kind):
    require_kernel("aggregate")
    require_kernel("segment_max")
    _check_all(run_sar_case(_worker, world_size, kind), world_size)


def test_bad_input_is_a_clear_error():
    from revgnn.distributed.aggregate_sar import sar_aggregate
    from revgnn.distributed.sar import SARGraph

    ei, x, _ = make_graph()
    graph = SARGraph(build_partitions(ei, N, 1)[0])
    xl = x[graph.node_ids]
    with pytest.raises(ValueError, match="unknown aggregation"):
        sar_aggregate(graph, xl, "softmax")
    with pytest.raises(ValueError, match="local rows"):
        sar_aggregate(graph, xl[1:], "sum")
    with pytest.raises(ValueError, match="kind='sum'"):
        sar_aggregate(graph, xl, "mean", torch.ones(graph.num_edges, dtype=x.dtype))
    with pytest.raises(ValueError, match="constants"):
        sar_aggregate(graph, xl, "sum", torch.ones(graph.num_edges, dtype=x.dtype, requires_grad=True))
    with pytest.raises(ValueError, match=r"weight must be \["):
        sar_aggregate(graph, xl, "sum", torch.ones(3, dtype=x.dtype))


def test_unsorted_shards_and_weights_follow_the_edges():
    """A hand-made part whose edges are not sorted by destination: the shard is sorted once, the
    edge weights follow it; equal to PyG's sum with those weights."""
    from torch_geometric.utils import scatter

    from revgnn.distributed.aggregate_sar import ShardSegments, sar_aggregate
    from revgnn.distributed.sar import SARGraph

    ei, x, _ = make_graph()
    part = build_partitions(ei, N, 1)[0]
    perm = torch.randperm(part["dst"].numel(), generator=torch.Generator().manual_seed(0))
    for key in ("src", "dst", "edge_ids"):
        part[key] = part[key][perm]
    graph = SARGraph(part)
    w = torch.rand(graph.num_edges, dtype=torch.float64)
    xl = x[graph.node_ids].clone().requires_grad_()
    out = sar_aggregate(graph, xl, "sum", w)
    xr = xl.detach().clone().requires_grad_()
    ref = scatter(xr[graph.src] * w.view(-1, 1), graph.dst, 0, graph.num_local, reduce="sum")
    g = torch.randn(ref.shape, dtype=torch.float64)
    out.backward(g)
    ref.backward(g)
    assert ShardSegments.of(graph).shards[0].perm is not None  # the sorting path
    assert torch.allclose(out, ref, rtol=0, atol=1e-12 * ref.abs().max().item())
    assert torch.allclose(xl.grad, xr.grad, rtol=0, atol=1e-12 * xr.grad.abs().max().item())
