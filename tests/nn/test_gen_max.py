"""The fused GENConv max aggregation equals PyG's GENConv exactly (float64), in both
implementations: the C++ kernel (revgnn.nn.kernels) and the PyTorch fallback."""

import pytest
import torch
import torch_geometric.typing
from conftest import require_kernel
from torch_geometric import EdgeIndex
from torch_geometric.nn import GENConv

from revgnn.nn import GENBlock, LinearEdgeFeatures, ops
from revgnn.nn.gen_max import gen_max_aggregate
from revgnn.nn.graph_input import csc
from revgnn.utils import SavedTensorBytes


def graph(n=40, e=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n - 3, (2, e), generator=g)  # the last 3 nodes get no edges
    ei = torch.cat([ei, ei[:, :5]], dim=1)  # and some parallel edges
    return ei


def sort(ei, n, *edge_tensors):
    perm = (ei[1] * n + ei[0]).argsort()
    return (EdgeIndex(ei[:, perm], sparse_size=(n, n), sort_order="col"), *[t[perm] for t in edge_tensors])


@pytest.mark.parametrize("scatter", [True, False])
@pytest.mark.parametrize("sorted_input", [True, False])
@pytest.mark.parametrize("factored", [True, False])
def test_gen_block_matches_pyg_genconv(impl, scatter, sorted_input, factored, monkeypatch):
    monkeypatch.setattr(
        torch_geometric.typing, "WITH_TORCH_SCATTER", scatter and torch_geometric.typing.WITH_TORCH_SCATTER
    )
    n, c = 40, 6
    ei = graph(n)
    torch.manual_seed(0)
    block = GENBlock(c, edge_channels=5).double()
    shared = torch.nn.Linear(3, 5).double()  # the model's shared edge encoder (factored case)
    x = torch.randn(n, c, dtype=torch.float64)
    ea = torch.randn(ei.size(1), 3 if factored else 5, dtype=torch.float64)
    if sorted_input:
        ei_in, ea = sort(ei, n, ea)
        ei = ei_in.as_tensor()
    else:
        ei_in = ei
    results = []
    for fused in (True, False):
        xx, ee = x.clone().requires_grad_(), ea.clone().requires_grad_()
        h = block.norm(xx).relu()
        if fused:
            out = block.conv_forward(h, ei_in, LinearEdgeFeatures.from_linear(ee, shared) if factored else ee)
        else:
            out = block.conv(h, ei, block.edge_encoder(shared(ee) if factored else ee))
        (out * out.sin()).sum().backward()
        params = [*block.parameters(), *(shared.parameters() if factored else [])]
        grads = [xx.grad, ee.grad] + [p.grad.clone() for p in params]
        block.zero_grad()
        shared.zero_grad()
        results.append((out.detach(), grads))
    (o1, g1), (o2, g2) = results
    assert torch.allclose(o1, o2, rtol=0, atol=1e-13)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("edges", ["none", "dense", "factored"])
def test_ties_split_the_gradient_like_pyg(impl, edges):
    """Integer-valued features make most maxima ties; the gradient is split evenly among
    them, as scatter_reduce amax (PyG's GENConv) does. Nodes 0..2 have no in-edges."""
    n, c, d = 30, 8, 3
    g = torch.Generator().manual_seed(1)
    ei = torch.randint(3, n, (2, 400), generator=g)
    ei[1] = ei[1] % (n - 3) + 3
    x = torch.randint(-2, 3, (n, c), generator=g).double()
    raw = torch.randint(0, 2, (ei.size(1), d), generator=g).double()
    weight = torch.randint(-1, 2, (c, d), generator=g).double()
    bias = torch.randint(-1, 2, (c,), generator=g).double()
    ei_s, raw_s = sort(ei, n, raw)
    grad = torch.randn(n, c, generator=g, dtype=torch.float64)

    def ours(x, raw, weight, bias):
        if edges == "none":
            term = None
        elif edges == "dense":
            term = torch.nn.functional.linear(raw, weight, bias)
        else:
            term = LinearEdgeFeatures(raw, weight, bias)
        return gen_max_aggregate(x, ei_s, term, eps=1e-7)

    def reference(x, raw, weight, bias):
        msg = x[ei_s.as_tensor()[0]]
        if edges != "none":
            msg = msg + torch.nn.functional.linear(raw, weight, bias)
        msg = msg.relu() + 1e-7
        index = ei_s.as_tensor()[1].view(-1, 1).expand_as(msg)
        return msg.new_zeros(n, c).scatter_reduce(0, index, msg, "amax", include_self=False)

    outs = []
    for fn in (ours, reference):
        inputs = [t.clone().requires_grad_() for t in (x, raw_s, weight, bias)]
        out = fn(*inputs)
        out.backward(grad)
        outs.append([out.detach()] + [t.grad for t in inputs])
    assert (outs[0][0] == outs[1][0]).all()
    for a, b in zip(outs[0][1:], outs[1][1:]):
        if edges == "none" and b is None:
            continue
        assert a is not None and torch.allclose(a, b, rtol=0, atol=1e-13)


def test_kernel_gradcheck():
    torch.manual_seed(0)
    n, c, d = 12, 5, 3
    (ei,) = sort(graph(n, 60), n)
    src, _, ptr, _ = csc(ei, None, n)
    raw = torch.randn(ei.size(1), d, dtype=torch.float64, requires_grad=True)
    x = torch.randn(n, c, dtype=torch.float64, requires_grad=True)
    w = torch.randn(c, d, dtype=torch.float64, requires_grad=True)
    b = torch.randn(c, dtype=torch.float64, requires_grad=True)
    require_kernel()
    assert torch.autograd.gradcheck(
        lambda x, raw, w, b: ops.gen_max(x, ptr, src, raw, w, b, 1e-7)[0], (x, raw, w, b)
    )
    dense = torch.randn(ei.size(1), c, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, e: ops.gen_max(a, ptr, src, e, None, None, 1e-7)[0], (x, dense))


def test_kernel_threads_are_deterministic():
    """Forward and backward are bitwise independent of the thread count (set in this process; a
    fresh process per count: test_kernel_threads.py): the backward is parallel over channels, so no
    sum is split by thread."""
    require_kernel()
    n, c = 3000, 24
    g = torch.Generator().manual_seed(0)
    ei, raw = sort(torch.randint(0, n, (2, 60_000), generator=g), n, torch.rand(60_000, 8, generator=g))
    lin = torch.nn.Linear(8, c)
    x = torch.randn(n, c, generator=g)
    results = []
    threads = torch.get_num_threads()
    try:
        for t in (1, 2, 2, 4):
            torch.set_num_threads(t)
            xx = x.clone().requires_grad_()
            out = gen_max_aggregate(xx, ei, LinearEdgeFeatures.from_linear(raw, lin))
            grads = torch.autograd.grad(out, [xx, lin.weight, lin.bias], torch.ones_like(out))
            results.append((out, *grads))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        for u, v in zip(results[0], other):
            assert torch.equal(u, v)


def test_noncontiguous_group_input_and_nan(impl):
    """A group of a GroupAddRev is a column slice (non-contiguous); a NaN message propagates."""
    n, c = 20, 4
    (ei,) = sort(graph(n, 80), n)
    full = torch.randn(n, 2 * c, dtype=torch.float64)
    x = full[:, :c]
    ref = gen_max_aggregate(x.contiguous(), ei)
    assert torch.equal(gen_max_aggregate(x, ei), ref)
    x = x.contiguous()
    x[ei.as_tensor()[0, 0], 1] = float("nan")
    out = gen_max_aggregate(x, ei)
    assert out[ei.as_tensor()[1, 0], 1].isnan()
    assert not out[:, 0].isnan().any()


def test_fused_aggregation_saves_less_than_pyg(impl):
    """Both implementations keep an int32 winner per (node, channel) and a tie flag per node, no
    edge-sized float tensor (the raw features are the caller's). PyG's GENConv path keeps more."""
    n, e, c, d = 50, 2000, 8, 3
    ei = EdgeIndex(graph(n, e), sparse_size=(n, n)).sort_by("col")[0]
    E = ei.size(1)
    x = torch.randn(n, c, requires_grad=True)
    raw = torch.randn(E, d)
    lin = torch.nn.Linear(d, c)
    with SavedTensorBytes() as ours:
        gen_max_aggregate(x, ei, LinearEdgeFeatures.from_linear(raw, lin))
    index = 2 * E * 8 + (n + 1) * 8  # the caller's edge index and its CSC pointer
    # x and raw are the caller's; new: winners, tie flags (W and b are Parameters)
    assert ours.bytes == n * c * 4 + E * d * 4 + index + n * c * 4 + n
    ea = lin(raw)
    conv = GENConv(c, c, aggr="max")
    with SavedTensorBytes() as pyg:
        conv.propagate(ei, x=(x, x), edge_attr=ea)
    assert ours.bytes < pyg.bytes


def test_factored_edges_under_bf16_autocast(impl):
    """The GPU recipe trains under bf16 autocast. The factored edge encoding (composed weights
    become bf16 there) must run forward and backward in either implementation, with gradients
    close to the float32 ones."""
    n, c = 40, 8
    ei, raw = sort(graph(n), n, torch.rand(205, 4))
    torch.manual_seed(0)
    block = GENBlock(c, edge_channels=6)
    shared = torch.nn.Linear(4, 6)
    x = torch.randn(n, c)
    grads = []
    for enabled in (False, True):
        xx = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            out = block(xx, ei, LinearEdgeFeatures.from_linear(raw, shared))
        out.float().square().sum().backward()
        grads.append([xx.grad] + [p.grad.clone() for p in [*block.parameters(), *shared.parameters()]])
        block.zero_grad()
        shared.zero_grad()
    for a, b in zip(*grads):
        assert a.dtype == b.dtype == torch.float32
        assert (a - b).norm() <= 0.05 * b.norm() + 1e-6


def test_winner_offsets_beyond_float32_integers():
    """The winning edge's offset in its node's segment is kept in integer lanes: a node whose
    winner sits past 2^24 edges (where a float32 lane would round the offset) still gets its
    gradient on the right edge."""
    require_kernel()
    deg = 2**24 + 2  # last offset 2^24 + 1: odd, not a float32 value
    x = torch.zeros(2, 1)
    x[1, 0] = 1.0  # node 1 sends the largest message
    src = torch.zeros(deg, dtype=torch.long)
    src[-1] = 1  # ... over the segment's last edge
    ei = EdgeIndex(torch.stack([src, torch.zeros_like(src)]), sparse_size=(2, 2), sort_order="col")
    xx = x.clone().requires_grad_()
    out = gen_max_aggregate(xx, ei)
    out.sum().backward()
    assert out[0, 0] == 1.0 + 1e-7 and xx.grad[1, 0] == 1.0 and xx.grad[0, 0] == 0.0


def test_int32_and_strided_edge_index(impl):
    """An int32 edge index, or one that is a transposed [E, 2] view, gives the same result."""
    n, c = 30, 5
    ei = graph(n, 120)
    x = torch.randn(n, c, dtype=torch.float64)
    ref = gen_max_aggregate(x, ei)
    assert torch.equal(gen_max_aggregate(x, ei.int()), ref)
    assert torch.equal(gen_max_aggregate(x, ei.t().contiguous().t()), ref)


@pytest.mark.parametrize("edges", ["none", "factored"])
def test_torch_path_streams_edge_chunks(edges, monkeypatch):
    """GEN max's PyTorch implementation (no compiler, other dtypes) over chunks of 64 edges: the same
    outputs and winners as one chunk, gradients to float64 summation order, on integer-valued
    features (ties within and across chunks), and no E x C tensor in forward or backward: its largest
    allocation stays below a quarter of one (one chunk of messages is 64 x C)."""
    from revgnn.utils.memory import LargestAllocation

    monkeypatch.setenv("REVGNN_KERNELS", "0")
    n, c, d, e = 60, 32, 3, 6000
    g = torch.Generator().manual_seed(4)
    ei_s, raw_s = sort(
        torch.randint(0, n - 2, (2, e), generator=g), n, torch.randint(0, 2, (e, d), generator=g)
    )
    x = torch.randint(-2, 3, (n, c), generator=g).double()
    raw_s = raw_s.double()
    weight = torch.randint(-1, 2, (c, d), generator=g).double()
    bias = torch.randint(-1, 2, (c,), generator=g).double()
    grad = torch.randn(n, c, generator=g, dtype=torch.float64)
    results = []
    for chunk in (2**20, 64):
        monkeypatch.setattr(ops, "CHUNK_EDGES", chunk)
        inputs = [t.clone().requires_grad_() for t in (x, raw_s, weight, bias)]
        term = LinearEdgeFeatures(*inputs[1:]) if edges == "factored" else None
        with LargestAllocation() as largest:
            out = gen_max_aggregate(inputs[0], ei_s, term)
            out.backward(grad)
        results.append([out.detach()] + [t.grad for t in inputs])
    assert largest.bytes < e * c * 8 / 4, largest.bytes
    (one, *g1), (many, *g2) = results
    assert torch.equal(one, many)
    for a, b in zip(g1, g2):
        if a is not None or b is not None:
            assert ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item() <= 1e-12
