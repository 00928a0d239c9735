"""The fused GAT attention (revgnn.nn.gat, torch.ops.revgnn.gat_attention) equals PyG's GATConv exactly
(float64: outputs and every gradient), replays its attention dropout exactly without a stored mask,
and forms no E x C tensor, forward or backward, alone or inside GroupAddRev."""

import pytest
import torch
from conftest import gat_operator_case, gat_operator_run, gat_with_keyed_dropout, rel_err
from torch_geometric import EdgeIndex

from revgnn.nn import GATBlock, GroupAddRev, LinearEdgeFeatures, Shared, ops
from revgnn.nn import gat as gat_module
from revgnn.nn.gat import gat_conv
from revgnn.utils import SavedTensorBytes
from revgnn.utils.memory import LargestAllocation


def graph(n=40, e=300, seed=0):
    """Random edges among the first n - 3 nodes (the last 3 are isolated), duplicates, self loops
    (a duplicated one too)."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n - 3, (2, e), generator=g)
    loops = torch.tensor([[4, 5, 5], [4, 5, 5]])
    return torch.cat([ei, ei[:, :7], loops], dim=1)


def sort(ei, n, *edge_tensors):
    perm = (ei[1] * n + ei[0]).argsort()
    return (EdgeIndex(ei[:, perm], sparse_size=(n, n), sort_order="col"), *[t[perm] for t in edge_tensors])


def make_block(c, heads, edge_dim, p=0.0, seed=0):
    torch.manual_seed(seed)
    block = GATBlock(c, heads=heads, edge_channels=edge_dim, attn_dropout=p).double()
    for param in block.conv.parameters():  # PyG zeroes the bias: every parameter non-trivial here
        torch.nn.init.normal_(param, std=0.5)
    return block


def run(fn, x, raw, params):
    """Output and gradients (x, raw edge features, params) of ``(out * out.sin()).sum()``."""
    xx = x.clone().requires_grad_()
    rr = raw.clone().requires_grad_() if raw is not None else None
    out = fn(xx, rr)
    (out * out.sin()).sum().backward()
    grads = [xx.grad] + ([rr.grad] if rr is not None else []) + [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    return out.detach(), grads


@pytest.mark.parametrize("edges", ["none", "dense", "factored", "one_dim"])
@pytest.mark.parametrize("form", ["tensor", "sorted", "sparse_csr"])
@pytest.mark.parametrize("chunk", [2**16, 16])
def test_matches_pyg_gatconv(impl, edges, form, chunk, monkeypatch):
    """Duplicate edges, self loops, isolated nodes; edge chunks that cut destination segments (the
    PyTorch implementation's; the C++ kernel has none)."""
    monkeypatch.setattr(ops, "CHUNK_EDGES", chunk)
    n, c, heads = 40, 8, 2
    ei = graph(n)
    raw_dim = {"none": None, "dense": 5, "factored": 3, "one_dim": 1}[edges]
    edge_dim = 5 if edges == "factored" else raw_dim
    block = make_block(c, heads, edge_dim)
    shared = torch.nn.Linear(3, 5).double()  # the model's shared edge encoder (factored case)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, c, dtype=torch.float64, generator=g)
    raw = torch.randn(ei.size(1), raw_dim, dtype=torch.float64, generator=g) if raw_dim else None
    if edges == "one_dim":
        raw = raw.view(-1)
    if form != "tensor":  # the sparse adj_t's stored order is the sorted one: features follow it
        ei_sorted, *rest = sort(ei, n, *([raw] if raw is not None else []))
        ei, raw = ei_sorted.as_tensor(), (rest[0] if rest else None)
        graph_in = ei_sorted
        if form == "sparse_csr":
            (ptr, _), _ = ei_sorted.get_csc()  # built directly: to_sparse_csr() would sum duplicates
            graph_in = torch.sparse_csr_tensor(ptr, ei[0], torch.ones(ei.size(1)), (n, n))
    else:
        graph_in = ei
    conv = block.conv
    params = [*conv.parameters(), *(shared.parameters() if edges == "factored" else [])]

    def features(rr):
        if rr is None:
            return None
        return LinearEdgeFeatures.from_linear(rr, shared) if edges == "factored" else rr

    def fused(xx, rr):
        return gat_conv(conv, xx, graph_in, features(rr))

    def pyg(xx, rr):
        ea = features(rr)
        return conv(xx, ei, edge_attr=ea.materialize() if isinstance(ea, LinearEdgeFeatures) else ea)

    (o1, g1), (o2, g2) = run(fused, x, raw, params), run(pyg, x, raw, params)
    assert rel_err(o1, o2) <= 1e-12
    assert len(g1) == len(g2)
    for a, b in zip(g1, g2):
        assert rel_err(a, b) <= 1e-12


def test_attention_keep_is_a_fair_counter_based_mask():
    """The same (seed, edge, head) always draws the same bit; rates follow p; seeds, edges and
    heads decorrelate; p outside [0, 1) is refused."""
    edge = torch.arange(200_000)
    seed = torch.tensor(12345)
    keep = ops.attention_keep(seed, edge, 2, 0.3)
    assert keep.shape == (200_000, 2) and keep.dtype == torch.bool
    assert torch.equal(keep, ops.attention_keep(seed.clone(), edge, 2, 0.3))
    assert torch.equal(keep[77:99], ops.attention_keep(seed, edge[77:99], 2, 0.3))
    rate = keep.double().mean().item()
    assert abs(rate - 0.7) < 0.005  # 400k draws: 0.005 is over 6 standard deviations
    other = ops.attention_keep(torch.tensor(12346), edge, 2, 0.3)
    both = (keep & other).double().mean().item()  # independent seeds: 0.49
    assert abs(both - 0.49) < 0.005
    assert abs((keep[:, 0] & keep[:, 1]).double().mean().item() - 0.49) < 0.005
    assert abs((keep[1:, 0] & keep[:-1, 0]).double().mean().item() - 0.49) < 0.005
    assert bool(ops.attention_keep(seed, edge, 2, 0.0).all())
    for p in (-0.1, 1.0):
        with pytest.raises(ValueError, match="attention dropout must be in"):
            ops.attention_keep(seed, edge, 2, p)


@pytest.mark.parametrize("chunk", [2**16, 16])
def test_attention_dropout_equals_pyg_with_the_same_mask(impl, chunk, monkeypatch):
    monkeypatch.setattr(ops, "CHUNK_EDGES", chunk)
    n, c, heads = 40, 8, 2
    block = make_block(c, heads, 5, p=0.4)
    ei, raw = sort(graph(n), n, torch.randn(310, 5, dtype=torch.float64))
    x = torch.randn(n, c, dtype=torch.float64)
    params = list(block.conv.parameters())

    def fused(xx, rr):
        torch.manual_seed(7)
        return gat_conv(block.conv, xx, ei, rr)

    def reference(xx, rr):
        torch.manual_seed(7)
        return gat_with_keyed_dropout(block.conv, xx, ei, rr, gat_module.draw_seed())

    (o1, g1), (o2, g2) = run(fused, x, raw, params), run(reference, x, raw, params)
    assert rel_err(o1, o2) <= 1e-12
    for a, b in zip(g1, g2):
        assert rel_err(a, b) <= 1e-12
    torch.manual_seed(8)  # another seed, another mask
    assert rel_err(gat_conv(block.conv, x, ei, raw), o1) > 1e-3
    block.eval()  # no dropout in evaluation: PyG's conv itself
    assert rel_err(gat_conv(block.conv, x, ei, raw), block.conv(x, ei.as_tensor(), edge_attr=raw)) <= 1e-12


def test_dropout_replayed_in_group_add_rev(impl):
    """GroupAddRev's recompute redraws the seed from the replayed RNG: its gradients equal the
    stored-activation (disable=True) run's, whose masks are those of the forward pass."""
    n, c = 40, 8
    ei, raw = sort(graph(n), n, torch.randn(310, 6, dtype=torch.float64))
    x = torch.randn(n, 2 * c, dtype=torch.float64)
    results = []
    for disable in (False, True):
        torch.manual_seed(3)
        rev = GroupAddRev(
            GATBlock(c, heads=2, edge_channels=6, attn_dropout=0.5), num_groups=2, disable=disable
        )
        rev = rev.double()
        xx, rr = x.clone().requires_grad_(), raw.clone().requires_grad_()
        out = rev(xx, ei, Shared(rr))
        (out * out.sin()).sum().backward()
        results.append([out.detach(), xx.grad, rr.grad, *[p.grad for p in rev.parameters()]])
    for a, b in zip(*results):
        assert rel_err(a, b) <= 1e-12


@pytest.mark.parametrize("path", ["fused", "pyg"])
@pytest.mark.parametrize("reversible", [False, True])
def test_no_edge_by_channel_tensor(impl, path, reversible, monkeypatch):
    """Forward + backward of a GAT block (alone, and as the 2 groups of a GroupAddRev) on a graph
    where E x C dwarfs N x C and the E-sized int64 and E x d arrays: the largest allocation and
    the bytes saved for backward stay below a quarter of one E x C float32 tensor. PyG's conv
    (the "pyg" case, the code before the fused operator) exceeds them (the saved bytes outside
    GroupAddRev, which saves no activations): the guard can fail."""
    monkeypatch.setattr(ops, "CHUNK_EDGES", 1024)
    if path == "pyg":
        monkeypatch.setattr(gat_module, "fused_applies", lambda *args: False)
    n, e, c, d, heads = 300, 30_000, 128, 4, 2
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, n, (2, e), generator=g)
    raw = torch.randn(e, d, generator=g, requires_grad=True)
    x = torch.randn(n, 2 * c if reversible else c, generator=g, requires_grad=True)
    torch.manual_seed(0)
    block = GATBlock(c, heads=heads, edge_channels=d, attn_dropout=0.2)
    if reversible:
        block = GroupAddRev(block, num_groups=2)
    bound = e * c * 4 // 4
    with LargestAllocation() as largest:
        with SavedTensorBytes() as saved:
            out = block(x, ei, Shared(raw) if reversible else raw)
        out.square().sum().backward()
    assert x.grad is not None and raw.grad is not None
    fused = path == "fused"
    assert (largest.bytes < bound) == fused, (largest.bytes, bound)
    if fused:
        assert saved.bytes < bound, (saved.bytes, bound)
    elif not reversible:  # GroupAddRev saves no activations in forward, whatever the conv
        assert saved.bytes > bound, (saved.bytes, bound)


def big_case(dtype, p=0.3, seed=0):
    n, e, c, d = 300, 30_000, 64, 4
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    raw = torch.randn(e, d, generator=g, dtype=dtype)
    x = torch.randn(n, c, generator=g, dtype=dtype)
    torch.manual_seed(seed)
    block = GATBlock(c, heads=2, edge_channels=d, attn_dropout=p).to(dtype)
    for param in block.conv.parameters():
        torch.nn.init.normal_(param, std=0.3)
    return block, x, ei, raw


def block_run(block, x, ei, raw, seed=4):
    torch.manual_seed(seed)
    return run(lambda xx, rr: block(xx, ei, rr), x, raw, list(block.parameters()))


def test_kernel_is_thread_count_independent():
    """Bitwise the same outputs and gradients on 1 and 2 threads (no sum is split by thread), on a
    graph large enough for several tasks."""
    from conftest import require_kernel

    require_kernel("gat_attention")
    block, x, ei, raw = big_case(torch.float32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = block_run(block, x, ei, raw)
        torch.set_num_threads(2)
        two = block_run(block, x, ei, raw)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip([one[0], *one[1]], [two[0], *two[1]]):
        assert torch.equal(a, b)


def test_kernel_float32_is_as_close_as_pytorchs(monkeypatch):
    """float32 C++ kernel against float64: within a few times PyTorch float32's own deviation on the
    same case (dropout on: both draw the same mask)."""
    from conftest import require_kernel

    require_kernel("gat_attention")
    block, x, ei, raw = big_case(torch.float64)
    ref = block_run(block, x, ei, raw)
    block32 = block.float()
    kernel = block_run(block32, x.float(), ei, raw.float())
    monkeypatch.setenv("REVGNN_KERNELS", "0")
    torch32 = block_run(block32, x.float(), ei, raw.float())
    for k, t, r in zip([kernel[0], *kernel[1]], [torch32[0], *torch32[1]], [ref[0], *ref[1]]):
        own = rel_err(t.double(), r)
        assert own < 1e-4
        assert rel_err(k.double(), r) <= 4 * own + 1e-6


def test_node_ids_out_of_range_are_refused(impl):
    n, c = 10, 4
    block = GATBlock(c, heads=2).double()
    x = torch.randn(n, c, dtype=torch.float64)
    for bad in (n, -1):
        ei = torch.tensor([[0, 1, 2, bad], [1, 2, 3, 4]])
        with pytest.raises((IndexError, RuntimeError, ValueError)):
            block(x, ei)


@pytest.mark.parametrize("edge_dim", [None, 3])
def test_graph_of_self_loops_only_and_no_edges(impl, edge_dim):
    """Edges that are all self loops, and no edges at all: every node attends to its own loop only
    (edge feature 0), as PyG's GATConv."""
    n, c = 6, 4
    block = make_block(c, 2, edge_dim)
    x = torch.randn(n, c, dtype=torch.float64)
    for ei in (torch.tensor([[1, 2, 2], [1, 2, 2]]), torch.zeros(2, 0, dtype=torch.long)):
        raw = torch.randn(ei.size(1), edge_dim, dtype=torch.float64) if edge_dim else None
        params = list(block.conv.parameters())
        fused = run(lambda xx, rr: gat_conv(block.conv, xx, ei, rr), x, raw, params)
        pyg = run(lambda xx, rr: block.conv(xx, ei, edge_attr=rr), x, raw, params)
        for a, b in zip([fused[0], *fused[1]], [pyg[0], *pyg[1]]):
            assert rel_err(a, b) <= 1e-12


@pytest.mark.parametrize("p", [-0.1, 1.0])
def test_attention_dropout_outside_the_unit_interval_is_refused(p):
    with pytest.raises(ValueError, match=r"attn_dropout=.* must be in \[0, 1\)"):
        GATBlock(8, heads=2, attn_dropout=p)


def test_source_order_of_both_sorted_forms():
    """graph_input.source_order: the same (rowptr, col, perm) from a sorted EdgeIndex (cached with
    it) and from SortedEdges (computed in the graph): perm lists each source's out-edges by their
    positions in the destination order, ascending (a stable sort: thread-count independent), col
    their destinations."""
    from revgnn.nn.graph_input import SortedEdges, csc, sort_edges, source_order

    n = 40
    ei = graph(n)
    sorted_ei, _ = sort_edges(ei, None, n)
    src, dst, ptr, _ = csc(sorted_ei, None, n)
    order = source_order(sorted_ei, n)
    traced = source_order(SortedEdges(torch.stack([src, dst]), ptr), n)
    for a, b in zip(order, traced):
        assert torch.equal(a, b)
    rowptr, col, perm = order
    assert torch.equal(rowptr, torch.searchsorted(src.sort().values, torch.arange(n + 1)))
    assert torch.equal(src[perm], torch.repeat_interleave(torch.arange(n), rowptr.diff()))
    assert bool((perm.diff() > 0)[(src[perm].diff() == 0)].all())  # ascending within a source
    assert torch.equal(dst[perm], col)
    assert source_order(sorted_ei, n)[2].data_ptr() == perm.data_ptr()  # cached with the graph
    with pytest.raises(TypeError, match="source_order takes the graph sort_edges returns"):
        source_order(ei, n)


def test_dropout_ids_replace_the_positions(impl):
    """``edge_key`` / ``loop_key`` are the ids the dropout mask is drawn for: the default ids
    (positions, E + i) passed explicitly give bitwise the result without them; other ids give the
    result of the mask of those ids (the PyTorch reference of attention_keep's scale, float64, to
    1e-12); without dropout the ids change nothing; ids of the wrong size or dtype are refused."""
    case = gat_operator_case()
    e, n = case["src"].numel(), case["xp"].size(0)
    plain = gat_operator_run(case, 0.4)
    default = gat_operator_run(case, 0.4, torch.arange(e), e + torch.arange(n))
    for a, b in zip(plain, default):
        assert torch.equal(a, b)
    keyed = gat_operator_run(case, 0.4, case["key"], case["loop_key"])
    assert rel_err(keyed[0], plain[0]) > 1e-3  # another mask
    with pytest.MonkeyPatch.context() as m:
        m.setenv("REVGNN_KERNELS", "0")  # the chunked PyTorch implementation, as the reference
        m.setattr(ops, "CHUNK_EDGES", 16)
        reference = gat_operator_run(case, 0.4, case["key"], case["loop_key"])
    for a, b in zip(keyed, reference):
        assert rel_err(a, b) <= 1e-12
    no_dropout = gat_operator_run(case, 0.0, case["key"], case["loop_key"])
    for a, b in zip(no_dropout, gat_operator_run(case, 0.0)):
        assert torch.equal(a, b)
    for bad in (case["key"][1:], case["key"].int()):
        with pytest.raises(ValueError, match="edge_key must be an int64 vector"):
            gat_operator_run(case, 0.4, bad, None)
    with pytest.raises(ValueError, match="loop_key must be an int64 vector"):
        gat_operator_run(case, 0.4, None, case["loop_key"][:-1])
