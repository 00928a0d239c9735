"""SAR GENConv max through the C++ kernel (revgnn.distributed.gen_max_sar):
equal to one process (PyG's GENConv, our models' kernel path) at P = 1, 2, 3,
float64, gradients included; no edge-sized float tensor saved; the kernel path
is the one taken; the PyTorch fallback is today's path unchanged.

One spawn per world size runs every check (starting workers dominates the
cost on small machines). Helpers and the graph come from tests/sar_cases.py.
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import rel_err, require_kernel
from sar_cases import (
    F_EDGE,
    F_IN,
    WORLDS,
    FactoredGEN,
    N,
    OpCounts,
    check,
    compare_model,
    edge_sized_saved,
    make_graph,
    run_sar_case,
    worker_graph,
)

from revgnn.distributed.partition import build_partitions


class PlainGEN(torch.nn.Module):
    """GENConv max with a dense edge term (``dense``), GENConv's own edge
    encoder on raw features (``lin_edge``), or no edge features."""

    def __init__(self, mode):
        super().__init__()
        from torch_geometric.nn import GENConv

        self.mode = mode
        self.enc = torch.nn.Linear(F_EDGE, F_IN) if mode == "dense" else None
        self.conv = GENConv(
            F_IN,
            8 if mode == "lin_edge" else F_IN,
            aggr="max",
            norm="layer",
            bias=True,
            edge_dim=F_EDGE if mode == "lin_edge" else None,
        )

    def forward(self, x, edge_index, edge_attr=None):
        if self.mode == "none":
            return self.conv(x, edge_index)
        if self.mode == "dense":
            edge_attr = self.enc(edge_attr)
        return self.conv(x, edge_index, edge_attr)


def _conv_cases():
    return [
        ("factored", lambda: FactoredGEN(), True),
        ("factored+lin_edge", lambda: FactoredGEN(8, lin_edge=True), True),
        ("factored-ties", lambda: FactoredGEN(ties=True), True),
        ("lin_edge", lambda: PlainGEN("lin_edge"), True),
        ("dense", lambda: PlainGEN("dense"), True),
        ("no-edges", lambda: PlainGEN("none"), False),
    ]


def _model_cases():
    from revgnn.models import create_model

    common = dict(in_channels=F_IN, out_channels=3, edge_channels=F_EDGE, species_channels=0, dropout=0.0)
    return [
        (
            "revgnn_small",
            lambda: create_model("revgnn_small", num_layers=3, hidden_channels=8, **common),
            True,
        ),
        ("revgnn_deep", lambda: create_model("revgnn_deep", num_layers=6, hidden_channels=8, **common), True),
        ("wt_revgnn", lambda: create_model("wt_revgnn", num_layers=4, hidden_channels=8, **common), True),
    ]


def _call(model, x, edge_index, edge_attr):
    return model(x, edge_index) if edge_attr is None else model(x, edge_index, edge_attr)


def _counts():
    """Counts the kernel's shard calls (the shard operators) and the PyTorch SAR path's calls."""
    return OpCounts(("gen_max_sar",), ("gen_max_shard", "gen_max_shard_backward"))


def _fallback_is_todays_path(graph):
    """With the kernel off (REVGNN_KERNELS=0, no compiler, CUDA) the SAR
    GENConv expands the factored features and runs the PyTorch path: the
    same bits as handing it the expanded tensor (today's path)."""
    from revgnn.distributed.convs import convert_to_sar
    from revgnn.nn import LinearEdgeFeatures

    _, x, ea = make_graph()
    torch.manual_seed(5)
    model = convert_to_sar(FactoredGEN())
    x_loc, raw = x[graph.node_ids], ea[graph.edge_ids]
    w = torch.randn(graph.num_local, F_IN, generator=torch.Generator().manual_seed(graph.rank))
    results = []
    before = os.environ.get("REVGNN_KERNELS")
    os.environ["REVGNN_KERNELS"] = "0"  # the PyTorch SAR path (read on every dispatch)
    try:
        for factored in (True, False):
            xx, rr = x_loc.clone().requires_grad_(), raw.clone().requires_grad_()
            edges = LinearEdgeFeatures.from_linear(rr, model.enc)
            with _counts() as counts:
                out = model.conv(xx, graph, edges if factored else edges.materialize())
            (out * w).sum().backward()
            results.append([out.detach(), xx.grad, rr.grad] + [p.grad.clone() for p in model.parameters()])
            assert counts.calls["gen_max_shard"] == 0 and counts.calls["torch"] == 1
            model.zero_grad()
    finally:
        if before is None:
            del os.environ["REVGNN_KERNELS"]
        else:
            os.environ["REVGNN_KERNELS"] = before
    return all(torch.equal(a, b) for a, b in zip(*results))


def _worker(rank, world_size, kind):
    torch.set_default_dtype(torch.float64)
    graph, part, x, _ = worker_graph(rank, world_size, kind, node_x=True)
    errs, calls = [], {}
    for name, build, uses_edges in _conv_cases() + _model_cases():
        with _counts() as counts:
            errs += compare_model(name, build, uses_edges, graph, part, _call, _call)
        c = counts.calls
        calls[name] = (c["gen_max_shard"], c["gen_max_shard_backward"], c["torch"])

    # no edge-sized float tensor saved, on this worker's shards
    from revgnn.distributed.convs import convert_to_sar
    from revgnn.nn import LinearEdgeFeatures

    torch.manual_seed(3)
    conv = convert_to_sar(FactoredGEN())
    model = convert_to_sar(_model_cases()[0][1]())
    raw = graph.edge_attr.clone().requires_grad_()
    xl = x[graph.node_ids].clone().requires_grad_()
    bad = {}
    bad["conv"] = edge_sized_saved(
        lambda: conv.conv(xl, graph, LinearEdgeFeatures.from_linear(raw, conv.enc)), graph, conv, raw
    )
    bad["model"] = edge_sized_saved(lambda: model(xl, graph, raw), graph, model, raw)
    bad["winners"] = _node_sized_winners(conv, xl, graph, raw) if graph.num_local else 1
    return errs, calls, bad, _fallback_is_todays_path(graph)


def _node_sized_winners(conv, xl, graph, raw):
    """How many int32 ``[N, C]`` tensors of winners one SAR GENConv max saves for backward: one,
    whatever the number of shards (the per-shard winners are rebuilt from it in backward)."""
    from revgnn.nn import LinearEdgeFeatures

    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = conv.conv(xl, graph, LinearEdgeFeatures.from_linear(raw, conv.enc))
    return sum(t.dtype == torch.int32 and tuple(t.shape) == tuple(out.shape) for t in saved)


def _check_all(results, world_size):
    check([type("R", (), {"rank": r.rank, "value": r.value[0]}) for r in results])
    for r in results:
        _, calls, bad, fallback_ok = r.value
        for name, (kernel, backward, torch_path) in calls.items():
            # forward and backward rings: one kernel call per shard each
            assert kernel >= world_size and kernel % world_size == 0, (r.rank, name, kernel)
            assert backward >= world_size and backward % world_size == 0, (r.rank, name, backward)
            assert torch_path == 0, (r.rank, name, torch_path)
        assert calls["factored"] == (world_size, world_size, 0)
        assert not bad["conv"] and not bad["model"] and bad["winners"] == 1, (r.rank, bad)
        assert fallback_ok, r.rank


@pytest.mark.parametrize("world_size,kind", WORLDS[:3] + [(2, "empty")])  # "empty" on 2 workers
def test_sar_gen_max_kernel_matches_single_process(world_size, kind):
    require_kernel()
    _check_all(run_sar_case(_worker, world_size, kind), world_size)


def test_unsorted_shards_and_raw_gradient():
    """A hand-made part whose shards are not sorted by destination (the
    kernel sorts them once, and scatters the raw features' gradient back)."""
    require_kernel()
    from revgnn.distributed.convs import convert_to_sar
    from revgnn.distributed.gen_max_sar import _ShardCSC
    from revgnn.distributed.sar import SARGraph
    from revgnn.nn import LinearEdgeFeatures

    ei, x, ea = make_graph()
    x, ea = x.double(), ea.double()
    part = build_partitions(ei, N, 1, edge_attr=ea)[0]
    perm = torch.randperm(part["dst"].numel(), generator=torch.Generator().manual_seed(0))
    for key in ("src", "dst", "edge_ids", "edge_attr"):
        part[key] = part[key][perm]
    graph = SARGraph(part)
    torch.manual_seed(0)
    ref = FactoredGEN().double()
    sar = convert_to_sar(FactoredGEN().double())
    sar.load_state_dict(ref.state_dict())
    xr, er = x.clone().requires_grad_(), ea.clone().requires_grad_()
    out_ref = ref(xr, ei, er)
    w = torch.randn(out_ref.shape, dtype=torch.float64)
    (out_ref * w).sum().backward()
    nid, eid = graph.node_ids, graph.edge_ids
    xl, el = x[nid].clone().requires_grad_(), ea[eid].clone().requires_grad_()
    out = sar.conv(xl, graph, LinearEdgeFeatures.from_linear(el, sar.enc))
    (out * w[nid]).sum().backward()
    assert _ShardCSC.of(graph).shards[0][4] is not None  # the sorting path
    assert rel_err(out, out_ref[nid]) <= 1e-12
    assert rel_err(xl.grad, xr.grad[nid]) <= 1e-12
    assert rel_err(el.grad, er.grad[eid]) <= 1e-12
    for p, q in zip(sar.parameters(), ref.parameters()):
        assert rel_err(p.grad, q.grad) <= 1e-12


def test_kernel_result_is_bitwise_the_one_process_kernel():
    """At P = 1 the SAR output is bitwise the one-process kernel's
    (gen_max_aggregate): same maxima, eps added the same way; nodes without
    in-edges give 0."""
    require_kernel()
    from revgnn.distributed.gen_max_sar import sar_gen_max
    from revgnn.distributed.sar import SARGraph
    from revgnn.nn import LinearEdgeFeatures
    from revgnn.nn.gen_max import gen_max_aggregate

    ei, x, ea = make_graph()
    for dtype in (torch.float32, torch.float64):
        part = build_partitions(ei, N, 1, edge_attr=ea.to(dtype))[0]
        graph = SARGraph(part)
        lin = torch.nn.Linear(F_EDGE, F_IN).to(dtype)
        xl = x[graph.node_ids].to(dtype)
        term = LinearEdgeFeatures.from_linear(graph.edge_attr, lin)
        ours = sar_gen_max(graph, xl, term)
        local = torch.stack([graph.src, graph.dst])
        assert torch.equal(ours, gen_max_aggregate(xl, local, term))
        assert (ours[graph.in_degree == 0] == 0).all()
