"""SAGE, GIN and GCN through the fused aggregations (revgnn.nn.linear_aggr, torch.ops.revgnn.aggregate
and segment_max) equal PyG's own convs exactly in float64, outputs and every gradient, on every graph
form, alone and inside GroupAddRev; and no E x C tensor is allocated or saved for backward."""

import pytest
import torch
from conftest import require_kernel
from torch_geometric import EdgeIndex
from torch_geometric.nn import SAGEConv
from torch_geometric.utils import scatter

from revgnn.nn import GCNBlock, GINBlock, GroupAddRev, SAGEBlock, dispatch, linear_aggr, ops
from revgnn.nn.graph_input import segments
from revgnn.utils import SavedTensorBytes
from revgnn.utils.memory import LargestAllocation

BLOCKS = {
    "sage_mean": lambda c: SAGEBlock(c, aggr="mean"),
    "sage_sum": lambda c: SAGEBlock(c, aggr="sum"),
    "sage_max": lambda c: SAGEBlock(c, aggr="max"),
    "gin": lambda c: GINBlock(c),
    "gcn": lambda c: GCNBlock(c),
}


def rel_err(a, b):
    """Largest elementwise error relative to the reference, the denominator floored at 1e-3 of the
    reference's largest entry (so entries that are 0 by cancellation do not divide by 0)."""
    floor = max(b.abs().max().item(), 1e-300) * 1e-3
    return ((a - b).abs() / b.abs().clamp_min(floor)).max().item()


def graph(n=30, e=160, seed=0):
    """Edges among nodes 0..n-4 (the last 3 have none), with parallel edges, self loops and a
    duplicated self loop."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n - 3, (2, e), generator=g)
    loops = torch.tensor([[1, 2, 2, 5], [1, 2, 2, 5]])
    return torch.cat([ei, ei[:, :7], loops], dim=1)


def forms(ei, n):
    """The graph forms a block takes, with the plain [2, E] edge list in the same edge order."""
    perm = (ei[1] * n + ei[0]).argsort()
    s = ei[:, perm]
    ones = torch.ones(s.size(1))
    coo = torch.sparse_coo_tensor(s.flip(0), ones, (n, n))  # uncoalesced: keeps the duplicates
    csr = torch.sparse_csr_tensor(
        torch.searchsorted(s[1], torch.arange(n + 1)), s[0], torch.ones(s.size(1)), (n, n)
    )
    return {
        "tensor": (ei, ei),
        "edge_index": (EdgeIndex(s, sparse_size=(n, n), sort_order="col"), s),
        "coo": (coo, s),
        "csr": (csr, s),
    }


def run(block, x, graph, grad, fused, monkeypatch):
    """Output and gradients (x, then every parameter) of the block's conv on ``x``; ``fused=False``
    takes PyG's conv (the fused path's graph test patched to refuse)."""
    with monkeypatch.context() as m:
        if not fused:
            m.setattr(linear_aggr, "_graph", lambda x, edge_index: None)
        xx = x.clone().requires_grad_()
        out = block.conv_forward(xx, graph, None)
        out.backward(grad)
    grads = [xx.grad] + [p.grad.clone() for p in block.conv.parameters()]
    block.zero_grad()
    return out.detach(), grads


@pytest.mark.parametrize("kind", BLOCKS)
@pytest.mark.parametrize("form", ["tensor", "edge_index", "coo", "csr"])
def test_block_equals_pyg_conv_in_float64(impl, kind, form, monkeypatch):
    n, c = 30, 6
    ei = graph(n)
    torch.manual_seed(0)
    block = BLOCKS[kind](c).double()
    ours_graph, plain = forms(ei, n)[form]
    x = torch.randn(n, c, dtype=torch.float64)
    grad = torch.randn(n, c, dtype=torch.float64)
    out, grads = run(block, x, ours_graph, grad, True, monkeypatch)
    ref, ref_grads = run(block, x, plain, grad, False, monkeypatch)
    assert rel_err(out, ref) <= 1e-12
    assert len(grads) == len(ref_grads)
    for g, r in zip(grads, ref_grads):
        assert g is not None and rel_err(g, r) <= 1e-12
    if kind == "gin":  # the trainable eps got a gradient
        assert block.conv.eps.requires_grad and ref_grads[1].abs().item() > 0


@pytest.mark.parametrize("kind", BLOCKS)
def test_inside_group_add_rev(impl, kind, monkeypatch):
    """The reversible recompute re-runs the fused path; gradients equal those of the PyG path."""
    n, c = 30, 8
    ei = graph(n)
    torch.manual_seed(0)
    rev = GroupAddRev(BLOCKS[kind](c // 2), num_groups=2).double()
    x = torch.randn(n, c, dtype=torch.float64)
    grad = torch.randn(n, c, dtype=torch.float64)
    results = []
    for fused in (True, False):
        with monkeypatch.context() as m:
            if not fused:
                m.setattr(linear_aggr, "_graph", lambda x, edge_index: None)
            xx = x.clone().requires_grad_()
            out = rev(xx, ei)
            out.backward(grad)
        results.append([out.detach(), xx.grad] + [p.grad.clone() for p in rev.parameters()])
        rev.zero_grad()
    for a, b in zip(*results):
        assert rel_err(a, b) <= 1e-12


def test_sage_max_ties_split_the_gradient_like_pyg(impl, monkeypatch):
    """Integer-valued features make most maxima ties, many of them 0 (where torch's scatter_reduce
    backward counts the initial zero as one more tie); the gradients equal PyG's exactly."""
    n, c = 24, 5
    g = torch.Generator().manual_seed(3)
    ei = torch.randint(3, n, (2, 300), generator=g)
    x = torch.randint(-2, 2, (n, c), generator=g).double()
    conv = SAGEConv(c, c, aggr="max").double()
    grad = torch.randn(n, c, generator=g, dtype=torch.float64)
    results = []
    for fused in (True, False):
        with monkeypatch.context() as m:
            if not fused:
                m.setattr(linear_aggr, "_graph", lambda x, edge_index: None)
            xx = x.clone().requires_grad_()
            out = linear_aggr.sage_conv(conv, xx, ei)
            out.backward(grad)
        results.append([out.detach(), xx.grad] + [p.grad.clone() for p in conv.parameters()])
        conv.zero_grad()
    for a, b in zip(*results):
        assert rel_err(a, b) <= 1e-12
    # the case is what it claims: ties at a maximum of 0 and above
    top = scatter(x[ei[0]], ei[1], dim_size=n, reduce="max")
    ties = scatter((x[ei[0]] == top[ei[1]]).long(), ei[1], dim_size=n, reduce="sum")
    assert ((ties > 1) & (top == 0)).any() and ((ties > 1) & (top > 0)).any()


@pytest.mark.parametrize("mean", [False, True])
def test_weighted_aggregate_gradients(impl, mean):
    """The weighted sum / mean with its gradient to the edge weights, against PyG's scatter and by
    gradcheck."""
    n, c = 20, 4
    ei = graph(n, 80)
    torch.manual_seed(1)
    x = torch.randn(n, c, dtype=torch.float64, requires_grad=True)
    w = torch.randn(ei.size(1), dtype=torch.float64, requires_grad=True)
    grad = torch.randn(n, c, dtype=torch.float64)
    out = linear_aggr.aggregate(x, ei, w, "mean" if mean else "sum")
    ours = [out.detach(), *torch.autograd.grad(out, (x, w), grad)]
    ref_out = scatter(w.view(-1, 1) * x[ei[0]], ei[1], dim_size=n, reduce="mean" if mean else "sum")
    ref = [ref_out.detach(), *torch.autograd.grad(ref_out, (x, w), grad)]
    for a, b in zip(ours, ref):
        assert rel_err(a, b) <= 1e-12
    g = segments(ei, n)
    weight = w.detach()[(ei[1] * n + ei[0]).argsort(stable=True)].requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x, w: ops.aggregate(x, g.ptr, g.src, w, mean, g.sptr, g.sdst, g.sperm), (x, weight)
    )
    assert torch.autograd.gradcheck(lambda x: ops.segment_max(x, g.ptr, g.src, g.sptr, g.sdst)[0], (x,))


def test_bad_inputs_are_clear_errors():
    x = torch.randn(5, 3)
    ei = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="reduce must be 'sum', 'add' or 'mean', got 'max'"):
        linear_aggr.aggregate(x, ei, reduce="max")
    with pytest.raises(ValueError, match=r"edge_weight must be \[E\] = \[2\], got \[3\]"):
        linear_aggr.aggregate(x, ei, torch.ones(3))
    g = segments(ei, 5)
    with pytest.raises(ValueError, match=r"revgnn.aggregate: weight must be \[E\] = \[2\]"):
        ops.aggregate(x, g.ptr, g.src, torch.ones(2, 1), False, g.sptr, g.sdst, g.sperm)
    bad = g.src.clone()
    bad[1] = 5  # a node id past N would read or write out of bounds
    with pytest.raises(ValueError, match=r"every source id must be in \[0, 5\)"):
        ops.segment_max(x, g.ptr, bad, g.sptr, g.sdst)
    with pytest.raises(ValueError, match=r"ptr must be \[N \+ 1\] = \[6\], got \[5\]"):
        ops.aggregate(x, g.ptr[:-1], g.src, None, False, g.sptr, g.sdst, g.sperm)


def test_the_kernel_runs_where_it_should(impl):
    x = torch.zeros(4, 3)
    want = "cpp" if impl == "kernel" else "torch"
    assert dispatch.implementation("aggregate", x) == want
    assert dispatch.implementation("segment_max", x.double()) == want
    assert dispatch.implementation("aggregate", x.half()) == "torch"


@pytest.mark.parametrize("op", ["sum", "mean", "weighted", "max"])
def test_float32_within_float32_rounding(impl, op):
    """float32 against float64: within 4x PyTorch's own float32 deviation on the same case (PyG's
    scatter), plus a few float32 units of the tensor's scale (the kernels sum in another order)."""
    n, c = 40, 16
    ei = graph(n, 400)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(n, c, generator=g, dtype=torch.float64)
    w = torch.randn(ei.size(1), generator=g, dtype=torch.float64)
    grad = torch.randn(n, c, generator=g, dtype=torch.float64)

    def ours(x, w):
        if op == "max":
            return linear_aggr.max_aggregate(x, ei)
        return linear_aggr.aggregate(
            x, ei, w if op == "weighted" else None, "mean" if op == "mean" else "sum"
        )

    def pyg(x, w):
        msg = x[ei[0]] * w.view(-1, 1) if op == "weighted" else x[ei[0]]
        return scatter(msg, ei[1], dim_size=n, reduce={"sum": "sum", "weighted": "sum"}.get(op, op))

    def run(fn, dtype):
        xx, ww = x.to(dtype).requires_grad_(), w.to(dtype).requires_grad_()
        out = fn(xx, ww)
        gx, gw = torch.autograd.grad(out, (xx, ww), grad.to(dtype), allow_unused=True)
        return [t.double() for t in (out, gx, gw) if t is not None]

    unit = torch.finfo(torch.float32).eps
    for mine, theirs, ref in zip(run(ours, torch.float32), run(pyg, torch.float32), run(pyg, torch.float64)):
        scale = ref.abs().max().item()
        err, err_torch = (mine - ref).abs().max().item(), (theirs - ref).abs().max().item()
        assert err <= 4 * err_torch + 8 * unit * scale, (err, err_torch, scale)


def test_kernel_threads_are_deterministic():
    """Forward and backward are bitwise independent of the thread count: every output row is
    reduced by one task."""
    require_kernel("aggregate")
    require_kernel("segment_max")
    n, c = 2000, 16
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, n, (2, 40_000), generator=g)
    x = torch.randn(n, c, generator=g)
    w = torch.rand(ei.size(1), generator=g)
    results = []
    threads = torch.get_num_threads()
    try:
        for t in (1, 2, 4):
            torch.set_num_threads(t)
            xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
            out = linear_aggr.aggregate(xx, ei, ww, "mean") + linear_aggr.max_aggregate(xx, ei)
            results.append((out, *torch.autograd.grad(out, (xx, ww), torch.ones_like(out))))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        for u, v in zip(results[0], other):
            assert torch.equal(u, v)


def test_operators_pass_opcheck():
    """Schema, fake implementation and registered autograd of the four operators
    (torch.library.opcheck), on both implementations where the kernels build."""
    n, c = 12, 3
    g = segments(graph(n, 40), n)
    x = torch.randn(n, c, dtype=torch.float64, requires_grad=True)
    w = torch.randn(g.src.numel(), dtype=torch.float64, requires_grad=True)
    for mean in (False, True):
        torch.library.opcheck(ops.aggregate, (x, g.ptr, g.src, w, mean, g.sptr, g.sdst, g.sperm))
        torch.library.opcheck(ops.aggregate, (x, g.ptr, g.src, None, mean, g.sptr, g.sdst, g.sperm))
    torch.library.opcheck(ops.segment_max, (x, g.ptr, g.src, g.sptr, g.sdst))


@pytest.mark.parametrize("kind", ["sage_max", "gin", "gcn"])
def test_compiled_block_equals_eager(kind):
    """Under torch.compile the graph travels as SortedEdges (source order sorted inside the graph)
    and the operators trace as single ops: output and gradients equal eager's (float64)."""
    torch._dynamo.reset()
    n, c = 30, 6
    ei = graph(n)
    torch.manual_seed(0)
    block = BLOCKS[kind](c).double()
    x = torch.randn(n, c, dtype=torch.float64)
    seen = set()

    def backend(gm, inputs):  # records the revgnn operators in the captured graphs
        seen.update(str(node.target) for node in gm.graph.nodes if "revgnn" in str(node.target))
        return torch._dynamo.backends.debugging.aot_eager(gm, inputs)

    compiled = torch.compile(block, backend=backend)
    results = []
    for fn in (block, compiled):
        xx = x.clone().requires_grad_()
        out = fn(xx, ei)
        out.backward(torch.ones_like(out))
        results.append([out.detach(), xx.grad] + [p.grad.clone() for p in block.parameters()])
        block.zero_grad()
    for a, b in zip(*results):
        assert rel_err(a, b) <= 1e-12
    assert f"revgnn.{'segment_max' if kind == 'sage_max' else 'aggregate'}.default" in seen, seen


# ---- no E x C tensor: N = 300, E = 30,000, C = 32 (E x C float32 = 3.84 MB; E int64 = 240 kB)
N, E, C = 300, 30_000, 32
BOUND = E * C * 4 // 4


def big_graph():
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, N, (2, E), generator=g)
    perm = (ei[1] * N + ei[0]).argsort()
    return EdgeIndex(ei[:, perm], sparse_size=(N, N), sort_order="col")


def measure(module, x, ei):
    """Largest single allocation and bytes saved for backward during forward + backward (which
    holds GroupAddRev's recompute)."""
    xx = x.clone().requires_grad_()
    with LargestAllocation() as largest, SavedTensorBytes() as saved:
        out = module(xx, ei)
        out.backward(torch.ones_like(out))
    return largest.bytes, saved.bytes


@pytest.fixture
def small_chunks(monkeypatch):
    # the PyTorch implementation's chunk must be well below E for the guard to mean anything here
    monkeypatch.setattr(ops, "CHUNK_EDGES", 2**12)


@pytest.mark.parametrize("kind", BLOCKS)
@pytest.mark.parametrize("rev", [False, True])
def test_no_edge_by_channel_tensor(impl, kind, rev, small_chunks):
    torch.manual_seed(0)
    ei = big_graph()
    ei.get_csr()  # the graph's cached forms are the graph's, made once before the layers
    module = GroupAddRev(BLOCKS[kind](C), num_groups=2) if rev else BLOCKS[kind](C)
    x = torch.randn(N, 2 * C if rev else C)
    largest, saved = measure(module, x, ei)
    assert largest < BOUND, (largest, BOUND)
    # the operators save the graph's own index arrays (cached with it, shared by every layer) and
    # node-sized tensors
    graph_bytes = sum(
        {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in segments(ei, N)}.values()
    )
    assert saved < graph_bytes + BOUND, (saved, graph_bytes, BOUND)


@pytest.mark.parametrize("kind", BLOCKS)
def test_the_guard_catches_pyg_path(kind, monkeypatch):
    """The same measure on PyG's conv (the fused path refused) sees its E x C tensors: the guard
    above can fail."""
    monkeypatch.setattr(linear_aggr, "_graph", lambda x, edge_index: None)
    torch.manual_seed(0)
    largest, _ = measure(BLOCKS[kind](C), torch.randn(N, C), big_graph())
    assert largest >= E * C * 4


@pytest.mark.parametrize("improved", [False, True])
def test_gcn_conv_equals_pyg_improved_too(improved):
    """gcn_conv on a GCNConv of any ``improved`` equals the conv itself in float64: without edge
    weights PyG gives the added self loops weight 1 either way (its gcn_norm, PyG 2.8)."""
    from torch_geometric.nn import GCNConv

    g = torch.Generator().manual_seed(3)
    n = 30
    ei = torch.randint(0, n, (2, 200), generator=g)
    ei = torch.cat([ei, torch.tensor([[4, 4, 7], [4, 4, 7]])], 1)  # self loops, one duplicated
    torch.manual_seed(0)
    conv = GCNConv(6, 5, improved=improved).double()
    x = torch.randn(n, 6, generator=g, dtype=torch.float64)
    ref = conv(x, ei)
    out = linear_aggr.gcn_conv(conv, x, ei)
    assert ((out - ref).abs().max() / ref.abs().max()).item() <= 1e-12


@pytest.mark.parametrize(
    "conv, options",
    [("sage", {"aggr": "mean"}), ("sage", {"aggr": "max"}), ("gcn", {}), ("gin", {})]
    + [("gat", {"heads": 2}), ("gen", {"aggr": "mean"}), ("gen", {"aggr": "softmax", "learn_t": True})],
)
def test_source_order_built_only_for_a_backward(conv, options):
    """The edges' source order (two E-long int64 arrays and their sort) is built where a backward
    pass may follow only: a model's inference under no_grad allocates nothing E-long of 8 bytes
    (the destination-sorted graph is the caller's), and a training step builds it once, kept with
    the graph, as the reversible backward recomputes with grad; for GEN sum / mean / softmax only
    where the implementation's backward reads it (Triton's; not C++'s, nor PyTorch's)."""
    from revgnn.models import RevGNN
    from revgnn.nn.graph_input import _SOURCE_ORDERS

    torch.manual_seed(0)
    ei = big_graph()
    ei.get_csc()
    model = RevGNN(8, 2 * C, 3, 2, conv=conv, dropout=0.1, **options)
    x = torch.randn(N, 8)
    model.eval()
    with torch.no_grad(), LargestAllocation() as largest:
        model(x, ei)
    assert ei not in _SOURCE_ORDERS
    assert largest.bytes < E * 8, largest.bytes
    model.train()
    model(x, ei).sum().backward()
    reads = conv != "gen" or dispatch.reads_source_order("gen_aggr", x)
    assert (ei in _SOURCE_ORDERS) == reads
