"""SAR GENConv sum / mean / softmax (revgnn.distributed.gen_aggr_sar) and GATConv attention
(revgnn.distributed.gat_sar) through the fused operators shard by shard: equal to PyG's convs on the
full graph in one process at P = 1, 2, 3 and with an empty part, float64, gradients included (the
temperature, attention and edge-feature weights, edge features), alone and inside GroupAddRev; the
operators are the path taken (not sequential_aggregate's PyTorch messages, one call per shard in each
ring); no edge-sized float tensor saved; no allocation near one shard's E_q x C.

One spawn per world size runs every check. Helpers and the graph come from tests/sar_cases.py
(a multigraph with self loops, duplicate edges and a node without in-edges).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import require_kernel
from sar_cases import (
    BIG_C,
    BIG_D,
    F_EDGE,
    F_IN,
    WORLDS,
    OpCounts,
    big_graph,
    check,
    check_allocations,
    check_shard_calls,
    compare_model,
    edge_sized_saved,
    largest_allocations,
    run_sar_case,
    worker_graph,
)


class EncodedEdges(torch.nn.Module):
    """``conv`` fed edge features encoded by a Linear: on a SAR graph in factored form
    (a LinearEdgeFeatures, never expanded), on the full graph expanded for PyG."""

    def __init__(self, conv, width):
        super().__init__()
        self.enc = torch.nn.Linear(F_EDGE, width)
        self.conv = conv

    def forward(self, x, edge_index, edge_attr):
        from revgnn.distributed.sar import SARGraph
        from revgnn.nn import LinearEdgeFeatures

        if isinstance(edge_index, SARGraph):
            edges = LinearEdgeFeatures.from_linear(edge_attr, self.enc)
        else:
            edges = F.linear(edge_attr, self.enc.weight, self.enc.bias)
        return self.conv(x, edge_index, edges)


class DenseEdges(EncodedEdges):
    """The same with the encoded ``[E, C]`` features handed over as a tensor on both sides."""

    def forward(self, x, edge_index, edge_attr):
        return self.conv(x, edge_index, self.enc(edge_attr))


class RevStack(torch.nn.Module):
    """Linear -> 3 x GroupAddRev(block ``conv``, 2 groups) -> Linear, the edge features encoded once
    and shared (factored on SAR graphs): the reversible recompute runs the shard forms again."""

    def __init__(self, conv, hidden=8, **kwargs):
        super().__init__()
        from revgnn.nn import GroupAddRev, make_block

        self.enc = torch.nn.Linear(F_IN, hidden)
        self.edge_enc = torch.nn.Linear(F_EDGE, 4)
        self.layers = torch.nn.ModuleList(
            [
                GroupAddRev(make_block(conv, hidden // 2, edge_channels=4, **kwargs), num_groups=2)
                for _ in range(3)
            ]
        )
        self.head = torch.nn.Linear(hidden, 3)

    def forward(self, x, edge_index, edge_attr):
        from revgnn.distributed.sar import SARGraph
        from revgnn.nn import LinearEdgeFeatures, Shared

        if isinstance(edge_index, SARGraph):
            e = LinearEdgeFeatures.from_linear(edge_attr, self.edge_enc)
        else:
            e = self.edge_enc(edge_attr)
        h = self.enc(x)
        for layer in self.layers:
            h = layer(h, edge_index, Shared(e))
        return self.head(h)


def _gen(aggr, out=F_IN, **kw):
    from torch_geometric.nn import GENConv

    return GENConv(F_IN, out, aggr=aggr, norm="layer", bias=True, **kw)


def _gat(**kw):
    from torch_geometric.nn import GATConv

    return GATConv(F_IN, 5, **kw)


#: (name, constructor, uses edge features, the shard form it takes)
CASES = [
    ("GEN-sum", lambda: _gen("sum"), False, "gen"),
    ("GEN-mean-lin_edge", lambda: _gen("mean", 8, edge_dim=F_EDGE), True, "gen"),
    ("GEN-sum-factored", lambda: EncodedEdges(_gen("sum"), F_IN), True, "gen"),
    ("GEN-mean-dense", lambda: DenseEdges(_gen("mean"), F_IN), True, "gen"),
    ("GEN-softmax-learn_t", lambda: _gen("softmax", 8, learn_t=True, t=0.7, edge_dim=F_EDGE), True, "gen"),
    (
        "GEN-softmax-negative_t",
        lambda: EncodedEdges(_gen("softmax", learn_t=True, t=-1.5), F_IN),
        True,
        "gen",
    ),
    ("GEN-softmax-fixed_t", lambda: _gen("softmax", t=1.3), False, "gen"),
    (
        "GEN-softmax-factored+lin_edge",
        lambda: EncodedEdges(_gen("softmax", 8, learn_t=True, edge_dim=5), 5),
        True,
        "gen",
    ),
    ("GAT", lambda: _gat(heads=3), False, "gat"),
    ("GAT-edges", lambda: _gat(heads=3, edge_dim=F_EDGE), True, "gat"),
    ("GAT-factored", lambda: EncodedEdges(_gat(heads=2, edge_dim=4), 4), True, "gat"),
    (
        "GAT-mean-heads-residual",
        lambda: _gat(heads=2, concat=False, residual=True, edge_dim=F_EDGE),
        True,
        "gat",
    ),
    ("GAT-slope", lambda: _gat(heads=2, negative_slope=0.01), False, "gat"),
    ("RevStack-GEN-softmax", lambda: RevStack("gen", aggr="softmax", learn_t=True), True, "gen"),
    ("RevStack-GEN-mean", lambda: RevStack("gen", aggr="mean"), True, "gen"),
    ("RevStack-GAT", lambda: RevStack("gat", heads=2), True, "gat"),
]


def _call(model, x, edge_index, edge_attr):
    return model(x, edge_index) if edge_attr is None else model(x, edge_index, edge_attr)


def _counts():
    """Counts the shard forms' operator calls and the PyTorch SAR path's."""
    return OpCounts(
        ("gen_aggr_sar", "gat_sar"),
        ("gen_aggr", "gen_aggr_backward", "gat_attention", "gat_attention_backward"),
    )


def _largest_allocations(rank, world_size):
    """:func:`largest_allocations` of a float32 forward + backward of each conv on the big graph."""
    from torch_geometric.nn import GATConv, GENConv

    from revgnn.distributed.convs import convert_to_sar
    from revgnn.nn import GroupAddRev, LinearEdgeFeatures, make_block

    graph, x = big_graph(rank, world_size, edge_features=True)
    raw = graph.edge_attr
    torch.manual_seed(0)
    enc = torch.nn.Linear(BIG_D, BIG_C)
    convs = {
        "GEN-mean": (GENConv(BIG_C, BIG_C, aggr="mean"), True),
        "GEN-softmax": (GENConv(BIG_C, BIG_C, aggr="softmax", learn_t=True), True),
        "GAT": (GATConv(BIG_C, BIG_C // 2, heads=2, edge_dim=BIG_D), False),
        "GroupAddRev-GAT": (
            GroupAddRev(make_block("gat", BIG_C // 2, heads=2, edge_channels=BIG_D), num_groups=2),
            False,
        ),
    }

    def step(conv, encoded):
        def run(xl):
            edges = LinearEdgeFeatures.from_linear(raw, enc) if encoded else raw
            conv(xl, graph, edges).sum().backward()

        return run

    steps = {name: step(convert_to_sar(conv.float()), encoded) for name, (conv, encoded) in convs.items()}
    return largest_allocations(steps, graph, x)


def _worker(rank, world_size, kind):
    torch.set_default_dtype(torch.float64)
    from revgnn.distributed.convs import convert_to_sar

    graph, part, x, ea = worker_graph(rank, world_size, kind)
    errs, calls, bad = [], {}, {}
    for name, build, uses_edges, _ in CASES:
        with _counts() as counts:
            errs += compare_model(name, build, uses_edges, graph, part, _call, _call)
        calls[name] = counts.calls
        torch.manual_seed(3)
        model = convert_to_sar(build())
        xl = x[graph.node_ids].clone().requires_grad_()
        raw = ea[graph.edge_ids].clone().requires_grad_()
        bad[name] = edge_sized_saved(
            lambda: _call(model, xl, graph, raw if uses_edges else None), graph, model, raw
        )
    torch.set_default_dtype(torch.float32)
    return errs, calls, bad, _largest_allocations(rank, world_size)


def _check_all(results, world_size):
    check([type("R", (), {"rank": r.rank, "value": r.value[0]}) for r in results])
    forms = {name: form for name, _, _, form in CASES}
    for r in results:
        _, calls, bad, (largest, shard_min, shard_max, old) = r.value
        for name, c in calls.items():
            fwd = "gen_aggr" if forms[name] == "gen" else "gat_attention"
            check_shard_calls((r.rank, name), c, fwd, world_size, recomputed=name.startswith("RevStack"))
        # (a dense edge term is the caller's [E, C] tensor: the shard form keeps that input, nothing new)
        assert not any(v for name, v in bad.items() if "dense" not in name), (r.rank, bad)
        assert all(shape[1] == F_IN for shape in bad["GEN-mean-dense"]), (r.rank, bad)
        check_allocations(r.rank, largest, shard_min, shard_max, old)


@pytest.mark.parametrize("world_size,kind", WORLDS)
def test_sar_attention_and_gen_aggregations_match_single_process(world_size, kind):
    require_kernel("gen_aggr")
    require_kernel("gat_attention")
    _check_all(run_sar_case(_worker, world_size, kind), world_size)


def _one_part(cases):
    """Each of ``cases`` (name, build, uses edge features, ...) compared with PyG on a single part
    in this process, float64 (the errors checked); each case's operator and PyTorch-path counts."""

    def worker(rank, world_size, kind):
        torch.set_default_dtype(torch.float64)
        graph, part, _, _ = worker_graph(rank, world_size, kind)
        errs, calls = [], {}
        for name, build, uses_edges, *_ in cases:
            with _counts() as counts:
                errs += compare_model(name, build, uses_edges, graph, part, _call, _call)
            calls[name] = counts.calls
        return errs, calls

    (result,) = run_sar_case(worker, 1, "metis")
    check([type("R", (), {"rank": 0, "value": result.value[0]})])
    return result.value[1]


@pytest.mark.parametrize("kernels", ["1", "0"])
def test_pytorch_implementations_take_the_same_shard_forms(monkeypatch, kernels):
    """With the C++ kernels off (``REVGNN_KERNELS=0``: the operators' chunked PyTorch implementations)
    the shard forms still run, and agree with PyG on one part."""
    monkeypatch.setenv("REVGNN_KERNELS", kernels)
    for name, c in _one_part(CASES[:2] + CASES[4:5] + CASES[9:11]).items():
        assert c["torch"] == 0, (name, c)


def test_options_outside_the_shard_forms_take_the_pytorch_path():
    """A per-channel temperature, softmax_sg, GAT without self loops or with a non-positive slope:
    the PyTorch SAR path, still equal to PyG (the shard forms refuse what they cannot compute)."""
    from torch_geometric.nn import GATConv
    from torch_geometric.nn.aggr import SoftmaxAggregation

    from revgnn.distributed.gat_sar import sar_gat_attention
    from revgnn.distributed.gen_aggr_sar import sar_gen_aggregate

    cases = [
        ("GEN-softmax-channels", lambda: _gen(SoftmaxAggregation(t=0.5, learn=True, channels=F_IN)), False),
        ("GEN-softmax_sg", lambda: _gen("softmax_sg", t=0.5), False),
        ("GAT-no-loops", lambda: GATConv(F_IN, 4, heads=2, add_self_loops=False), False),
        ("GAT-relu", lambda: GATConv(F_IN, 4, heads=2, negative_slope=0.0), False),
    ]
    for name, c in _one_part(cases).items():
        assert c["torch"] == 1, (name, c)
        assert c["gen_aggr"] == c["gat_attention"] == 0, (name, c)
    graph, _, x, _ = worker_graph(0, 1, "metis")
    xl = x[graph.node_ids]
    with pytest.raises(ValueError, match="reduce must be one of"):
        sar_gen_aggregate(graph, xl, reduce="max")
    with pytest.raises(ValueError, match="temperature t is given for, and only for"):
        sar_gen_aggregate(graph, xl, reduce="sum", t=1.0)
    with pytest.raises(ValueError, match="local rows"):
        sar_gen_aggregate(graph, xl[1:], reduce="mean")
    with pytest.raises(ValueError, match="edge features must be"):
        sar_gen_aggregate(graph, xl, torch.ones(3, F_IN, dtype=x.dtype), reduce="sum")
    with pytest.raises(ValueError, match="3 channels, x has 8"):
        sar_gen_aggregate(graph, xl, torch.ones(graph.num_edges, 3, dtype=x.dtype), reduce="sum")
    xs = xl.view(-1, 2, 4)
    a = xl[:, :2]
    with pytest.raises(ValueError, match="negative_slope must be positive"):
        sar_gat_attention(graph, xs, a, a, a, negative_slope=0.0)
    with pytest.raises(ValueError, match="a_dst must be"):
        sar_gat_attention(graph, xs, a, a[1:], a)


#: the cases run through Triton's interpreter (a softmax with factored edges and a negative
#: temperature, a mean with GENConv's own edge encoder, GAT with raw and with factored edge features)
TRITON_CASES = ("GEN-mean-lin_edge", "GEN-softmax-negative_t", "GAT-edges", "GAT-factored")


def _triton_worker(rank, world_size, kind):
    from revgnn.nn import triton_kernels as tk

    assert tk.INTERPRETED  # TRITON_INTERPRET=1 reached this fresh process before Triton's import
    torch.set_default_dtype(torch.float64)
    graph, part, _, _ = worker_graph(rank, world_size, kind, timeout_s=120)
    errs, calls = [], {}
    for name, build, uses_edges, _ in CASES:
        if name in TRITON_CASES:
            with _counts() as counts:
                errs += compare_model(name, build, uses_edges, graph, part, _call, _call)
            calls[name] = counts.calls
    # attention dropout: the Triton kernels draw the mask of the shards' global ids
    graph, part, _, _ = worker_graph(rank, world_size, kind, timeout_s=120, dst_sorted=True)
    name, build, uses_edges = DROP_CASES[1]
    with _counts() as counts:
        errs += compare_model(name, build, uses_edges, graph, part, _drop_ref, _drop_sar, dst_sorted=True)
    calls[name] = counts.calls
    return errs, calls


def test_shards_through_the_triton_kernels(monkeypatch):
    """Under ``REVGNN_KERNELS=triton`` (as on CUDA tensors; ``select`` raises there rather than fall
    back) two workers run the shard forms through the Triton kernels, in Triton's interpreter, own
    and remote shards, and equal PyG on the full graph in float64 (attention dropout too)."""
    pytest.importorskip("triton")
    from revgnn.testing.workers import run_workers

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the spawned workers import Triton afresh
    monkeypatch.setenv("REVGNN_KERNELS", "triton")
    results = run_workers(_triton_worker, 2, "metis", timeout_s=120, wall_s=500, threads=1)
    check([type("R", (), {"rank": r.rank, "value": r.value[0]}) for r in results])
    for r in results:
        for name, c in r.value[1].items():
            fwd = "gen_aggr" if name.startswith("GEN") else "gat_attention"
            assert c["torch"] == 0 and c[fwd] == 2 and c[fwd + "_backward"] == 2, (r.rank, name, c)


#: attention dropout under SAR (training mode): the PyG convs against PyG's GATConv with the same
#: keyed mask (any edge order), the reversible stack against the one-process fused conv
#: (revgnn.nn.gat.gat_conv) on the destination-sorted graph, whose columns are its positions
P_DROP = 0.4
DROP_SEED = 21
DROP_CASES = [
    ("GAT-drop", lambda: _gat(heads=3, dropout=P_DROP), False),
    ("GAT-drop-edges", lambda: _gat(heads=3, edge_dim=F_EDGE, dropout=P_DROP), True),
    ("GAT-drop-factored", lambda: EncodedEdges(_gat(heads=2, edge_dim=4, dropout=P_DROP), 4), True),
    ("RevStack-GAT-drop", lambda: RevStack("gat", heads=2, attn_dropout=P_DROP), True),
]


def _drop_ref(model, x, edge_index, edge_attr):
    """The one-process reference: PyG's GATConv with the keyed mask of the seed the SAR conv draws
    (:func:`conftest.keyed_gat_dropout`), or the reversible stack through the fused conv on the
    destination-sorted ``EdgeIndex`` (not sorted again: its columns are the positions)."""
    from conftest import keyed_gat_dropout
    from torch_geometric import EdgeIndex

    from revgnn.nn.gat import draw_seed

    torch.manual_seed(DROP_SEED)
    if isinstance(model, RevStack):
        sorted_ei = EdgeIndex(edge_index, sparse_size=(x.size(0),) * 2, sort_order="col")
        return _call(model, x, sorted_ei, edge_attr)
    conv = model.conv if isinstance(model, EncodedEdges) else model
    with keyed_gat_dropout(edge_index, x.size(0), conv.heads, conv.dropout, draw_seed()) as calls:
        out = _call(model, x, edge_index, edge_attr)
    assert len(calls) == 1, calls
    return out


def _drop_sar(model, x, graph, edge_attr, seed=DROP_SEED):
    torch.manual_seed(seed)
    return _call(model, x, graph, edge_attr)


def _drop_worker(rank, world_size, kind):
    torch.set_default_dtype(torch.float64)
    from revgnn.distributed.convs import convert_to_sar

    graph, part, x, ea = worker_graph(rank, world_size, kind, dst_sorted=True)
    errs, calls = [], {}
    for name, build, uses_edges in DROP_CASES:
        with _counts() as counts:
            errs += compare_model(name, build, uses_edges, graph, part, _drop_ref, _drop_sar, dst_sorted=True)
        calls[name] = counts.calls
    # the shards' edge ids are views of the part's edge_ids (no copy), the loops' ids one per node
    from revgnn.distributed.gat_sar import _GatShards

    edge_key, loop_key = _GatShards.of(graph).dropout_ids(graph)
    base = graph.edge_ids.untyped_storage().data_ptr()
    views = all(k.untyped_storage().data_ptr() == base for k in edge_key) and loop_key.shape == (
        graph.num_local,
    )
    # the mask matters: another seed gives another output, evaluation none (PyG's conv itself)
    torch.manual_seed(1234)
    model = convert_to_sar(DROP_CASES[1][1]())
    xl, el = x[graph.node_ids], ea[graph.edge_ids]
    outs = [_drop_sar(model, xl, graph, el, seed).detach() for seed in (DROP_SEED, DROP_SEED + 1)]
    model.eval()
    outs.append(model(xl, graph, el).detach())
    torch.set_default_dtype(torch.float32)
    # plain floats: a worker's tensors would go back through shared memory after it has exited
    one, other, evaluated = outs
    changes = [
        float((one - o).abs().max()) / float(one.abs().max()) if one.numel() else 1.0
        for o in (other, evaluated)
    ]
    return errs, calls, changes, views


@pytest.mark.parametrize("world_size,kind", WORLDS)
def test_sar_gat_attention_dropout_matches_single_process(world_size, kind):
    """Attention dropout p > 0 in training mode under SAR: every worker's shards key the mask by the
    edges' global ids (and the self loops' E + node id), so outputs and all gradients equal the
    one-process conv's with the same mask, float64, at P = 1, 2, 3 (unbalanced, one part empty);
    inside GroupAddRev too, whose recompute replays the seed. Through the shard operator (one call
    per shard and ring), not the PyTorch path."""
    require_kernel("gat_attention")
    results = run_sar_case(_drop_worker, world_size, kind)
    check([type("R", (), {"rank": r.rank, "value": r.value[0]}) for r in results])
    for r in results:
        _, calls, changes, views = r.value
        assert views, r.rank
        for name, c in calls.items():
            recomputed = name.startswith("RevStack")
            check_shard_calls((r.rank, name), c, "gat_attention", world_size, recomputed=recomputed)
        assert min(changes) > 1e-3, (r.rank, changes)  # another seed's output, evaluation's


def test_sar_gat_dropout_refusals():
    """Attention dropout in training needs the shard form (the PyTorch path refuses it, clearly);
    sar_gat_attention refuses a rate outside [0, 1) and a missing seed; in evaluation the PyTorch
    path runs as before."""
    from torch_geometric.nn import GATConv

    from revgnn.distributed.convs import convert_to_sar
    from revgnn.distributed.gat_sar import sar_gat_attention

    graph, _, x, _ = worker_graph(0, 1, "metis")
    xl = x[graph.node_ids].float()
    conv = convert_to_sar(GATConv(F_IN, 4, heads=2, add_self_loops=False, dropout=0.3))
    with pytest.raises(NotImplementedError, match="needs the fused shard form"):
        conv(xl, graph)
    conv.eval()
    assert conv(xl, graph).shape == (graph.num_local, 8)
    xs, a = xl.view(-1, 2, 4), xl[:, :2]
    with pytest.raises(ValueError, match="attention dropout must be in"):
        sar_gat_attention(graph, xs, a, a, a, dropout=1.0, seed=torch.tensor(3))
    with pytest.raises(ValueError, match="needs a 0-d int64 seed"):
        sar_gat_attention(graph, xs, a, a, a, dropout=0.3)


def test_sar_gat_dropout_through_the_pytorch_implementation(monkeypatch):
    """With the C++ kernels off (the operator's chunked PyTorch implementation) the shards draw
    the same mask: equal to the one-process reference on one part."""
    monkeypatch.setenv("REVGNN_KERNELS", "0")
    (result,) = run_sar_case(_drop_worker, 1, "metis")
    check([type("R", (), {"rank": 0, "value": result.value[0]})])
    for name, c in result.value[1].items():
        assert c["torch"] == 0 and c["gat_attention"] > 0, (name, c)


def test_gen_shards_build_no_source_order_on_the_cpp_kernel(monkeypatch):
    """The C++ gen_aggr backward walks each shard's destination order: a GEN mean / softmax step on
    one part builds no shard's source order (built on first use), which the sum aggregation's C++
    backward, reducing over the sources, then builds."""
    require_kernel("gen_aggr")
    require_kernel("aggregate")
    monkeypatch.delenv("REVGNN_KERNELS", raising=False)
    from revgnn.distributed.aggregate_sar import ShardSegments, sar_aggregate
    from revgnn.distributed.gen_aggr_sar import sar_gen_aggregate

    graph, _, x, _ = worker_graph(0, 1, "metis")
    xl = x[graph.node_ids].double().requires_grad_()
    t = torch.tensor([0.7], dtype=xl.dtype, requires_grad=True)
    sar_gen_aggregate(graph, xl, reduce="mean").sum().backward()
    sar_gen_aggregate(graph, xl, reduce="softmax", t=t).sum().backward()
    shards = ShardSegments.of(graph).shards
    assert all(s._source_order is None for s in shards)
    sar_aggregate(graph, xl, "sum").sum().backward()
    assert all(s._source_order is not None for s in shards)
