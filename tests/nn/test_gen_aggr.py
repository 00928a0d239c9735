"""GENConv's sum / mean / softmax aggregations without an E x C tensor (torch.ops.revgnn.gen_aggr,
issue #33 b) equal PyG's GENConv exactly in float64, gradients included (the temperature's too),
through GENBlock and GroupAddRev, in every implementation; and no E x C tensor is allocated."""

import pytest
import torch
from conftest import rel_err, require_kernel
from torch_geometric import EdgeIndex
from torch_geometric.nn import GENConv

import revgnn.nn.gen_max as gen_max
from revgnn.nn import GENBlock, GroupAddRev, LinearEdgeFeatures, dispatch, kernels, ops
from revgnn.nn.gen_max import gen_aggregate
from revgnn.utils import SavedTensorBytes
from revgnn.utils.memory import LargestAllocation

AGGRS = [("sum", False), ("mean", False), ("softmax", False), ("softmax", True)]


def graph(n=40, e=200, seed=0):
    """Random edges among the first n - 3 nodes (the last 3 are isolated), parallel edges, self loops."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n - 3, (2, e), generator=g)
    loops = torch.arange(0, n - 3, 4).repeat(2, 1)
    return torch.cat([ei, ei[:, :7], loops], dim=1)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks far smaller than the test graphs, so the PyTorch implementation's chunking is exercised
    (a node's edges split across chunks)."""
    monkeypatch.setattr(ops, "CHUNK_EDGES", 37)


@pytest.fixture
def pyg_path(monkeypatch):
    """A function that sends GENBlock back to PyG's own GENConv (today's path before issue #33)."""

    def use_pyg():
        monkeypatch.setattr(gen_max, "fused_reduce", lambda conv: None)

    return use_pyg


def edge_input(form, ei, n):
    if form == "tensor":
        return ei, None
    if form == "sorted":
        perm = (ei[1] * n + ei[0]).argsort()
        return EdgeIndex(ei[:, perm], sparse_size=(n, n), sort_order="col"), perm
    # torch.sparse COO adj_t, uncoalesced (keeps the parallel edges), in PyG's adj_t convention
    adj = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.size(1)), (n, n), check_invariants=True)
    return adj, None


def block_grads(block, shared, x, ei_in, ea, factored, fused, monkeypatch):
    with monkeypatch.context() as m:
        if not fused:
            m.setattr(gen_max, "fused_reduce", lambda conv: None)
        xx, ee = x.clone().requires_grad_(), ea.clone().requires_grad_()
        h = block.norm(xx).relu()
        edges = LinearEdgeFeatures.from_linear(ee, shared) if factored else ee
        out = block.conv_forward(h, ei_in, edges)
        (out * out.sin()).sum().backward()
    grads = [out.detach(), xx.grad, ee.grad] + [
        p.grad.clone() for p in [*block.parameters(), *(shared.parameters() if factored else [])]
    ]
    block.zero_grad()
    shared.zero_grad()
    return grads


@pytest.mark.parametrize("form", ["tensor", "sorted", "sparse"])
@pytest.mark.parametrize("factored", [True, False])
@pytest.mark.parametrize("aggr,learn_t", AGGRS)
def test_gen_block_matches_pyg_genconv(impl, small_chunks, aggr, learn_t, factored, form, monkeypatch):
    n, c = 40, 6
    ei = graph(n)
    torch.manual_seed(0)
    block = GENBlock(c, edge_channels=5, aggr=aggr, learn_t=learn_t, t=0.7).double()
    shared = torch.nn.Linear(3, 5).double()  # the model's shared edge encoder (factored case)
    x = torch.randn(n, c, dtype=torch.float64)
    ea = torch.randn(ei.size(1), 3 if factored else 5, dtype=torch.float64)
    ei_in, perm = edge_input(form, ei, n)
    if perm is not None:
        ea = ea[perm]
        ei = ei[:, perm]
    calls = []
    monkeypatch.setattr(ops, "_gen_aggr_torch", lambda *a, f=ops._gen_aggr_torch: calls.append(1) or f(*a))
    ours = block_grads(block, shared, x, ei_in, ea, factored, True, monkeypatch)
    assert bool(calls) == (impl == "torch")  # the C++ kernel ran, or the PyTorch implementation
    theirs = block_grads(block, shared, x, ei, ea, factored, False, monkeypatch)
    assert len(ours) == len(theirs) == 3 + len(list(block.parameters())) + (2 if factored else 0)
    if learn_t:
        assert block.conv.aggr_module.t.requires_grad
    for a, b in zip(ours, theirs):
        assert rel_err(a, b) <= 1e-12


@pytest.mark.parametrize("aggr,learn_t", AGGRS)
def test_group_add_rev_matches_pyg(impl, small_chunks, aggr, learn_t, monkeypatch):
    """Two reversible GENBlocks (2 groups each; backward recomputes each block's forward) with the
    model's shared factored edge embedding: the same loss gradients as on PyG's GENConv."""
    n, c = 40, 8
    ei, _ = edge_input("sorted", graph(n), n)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, 2 * c, generator=g, dtype=torch.float64)
    raw = torch.randn(ei.size(1), 3, generator=g, dtype=torch.float64)
    torch.manual_seed(0)
    stack = torch.nn.ModuleList(
        GroupAddRev(GENBlock(c, edge_channels=5, aggr=aggr, learn_t=learn_t, t=0.7), num_groups=2)
        for _ in range(2)
    ).double()
    shared = torch.nn.Linear(3, 5).double()
    results, calls = [], []
    for fused in (True, False):
        with monkeypatch.context() as m:
            if not fused:
                m.setattr(gen_max, "fused_reduce", lambda conv: None)
            m.setattr(ops, "gen_aggr", lambda *a, f=ops.gen_aggr: calls.append(fused) or f(*a))
            xx, rr = x.clone().requires_grad_(), raw.clone().requires_grad_()
            h = xx
            for block in stack:
                h = block(h, ei, LinearEdgeFeatures.from_linear(rr, shared))
            (h * h.cos()).sum().backward()
        params = [*stack.parameters(), *shared.parameters()]
        results.append([h.detach(), xx.grad, rr.grad] + [p.grad.clone() for p in params])
        stack.zero_grad()
        shared.zero_grad()
    assert calls == [True] * 2 * 2 * 2  # 2 blocks x 2 groups x (forward, recompute in backward)
    for a, b in zip(*results):
        assert rel_err(a, b) <= 1e-12


@pytest.mark.parametrize("c", [5, 20])
@pytest.mark.parametrize("edges", ["none", "dense", "factored"])
@pytest.mark.parametrize("aggr,learn_t", AGGRS)
def test_aggregation_matches_pyg_aggregation(impl, small_chunks, aggr, learn_t, edges, c):
    """The aggregation alone against PyG's GENConv's propagate (its MLP an identity), the
    temperature negative to exercise a softmax that favours the smallest messages. The C++
    kernel's channel blocks: c = 5 runs one channel at a time, c = 20 (float64) in five blocks
    of 4 lanes, half its widest, in one pass."""
    n, d = 30, 3
    ei = graph(n, 150, seed=2)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, c, generator=g, dtype=torch.float64)
    raw = torch.randn(ei.size(1), d, generator=g, dtype=torch.float64)
    weight = torch.randn(c, d, generator=g, dtype=torch.float64)
    bias = torch.randn(c, generator=g, dtype=torch.float64)
    grad = torch.randn(n, c, generator=g, dtype=torch.float64)
    conv = GENConv(c, c, aggr=aggr, t=-1.3, learn_t=learn_t).double()
    t = conv.aggr_module.t if aggr == "softmax" else None

    def term(raw, weight, bias):
        if edges == "none":
            return None
        if edges == "dense":
            return torch.nn.functional.linear(raw, weight, bias)
        return LinearEdgeFeatures(raw, weight, bias)

    results = []
    for ours in (True, False):
        inputs = [v.clone().requires_grad_() for v in (x, raw, weight, bias)]
        e = term(*inputs[1:])
        if ours:
            out = gen_aggregate(inputs[0], ei, e, conv.eps, aggr, t)
        else:
            e = e.materialize() if isinstance(e, LinearEdgeFeatures) else e
            out = conv.propagate(ei, x=(inputs[0], inputs[0]), edge_attr=e)
        out.backward(grad)
        tg = t.grad.clone() if learn_t else None
        if learn_t:
            t.grad = None
        results.append([out.detach(), *(v.grad for v in inputs), tg])
    for a, b in zip(*results):
        if b is None:  # no edge term, or a fixed temperature: no gradient on either side
            assert a is None
            continue
        assert rel_err(a, b) <= 1e-12


def test_gradcheck():
    torch.manual_seed(0)
    n, c, d = 9, 3, 2
    ei = graph(n, 30)
    for aggr in ("sum", "mean", "softmax"):
        x = torch.randn(n, c, dtype=torch.float64, requires_grad=True)
        raw = torch.randn(ei.size(1), d, dtype=torch.float64, requires_grad=True)
        w = torch.randn(c, d, dtype=torch.float64, requires_grad=True)
        b = torch.randn(c, dtype=torch.float64, requires_grad=True)
        t = torch.tensor([0.8], dtype=torch.float64, requires_grad=aggr == "softmax")

        def fn(x, raw, w, b, t, aggr=aggr):
            return gen_aggregate(
                x, ei, LinearEdgeFeatures(raw, w, b), 1e-7, aggr, t if aggr == "softmax" else None
            )

        assert torch.autograd.gradcheck(fn, (x, raw, w, b, t))


def test_bad_input_is_refused():
    x, ei = torch.randn(4, 3), torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="reduce must be"):
        gen_aggregate(x, ei, reduce="powermean")
    with pytest.raises(ValueError, match="temperature t"):
        gen_aggregate(x, ei, reduce="softmax")
    with pytest.raises(ValueError, match="temperature t"):
        gen_aggregate(x, ei, reduce="mean", t=1.0)
    with pytest.raises(ValueError, match=r"\[E, 3\]"):
        gen_aggregate(x, ei, torch.randn(2, 4), reduce="sum")
    with pytest.raises(ValueError, match="one-element"):
        ops.gen_aggr(x, *[torch.tensor([0, 0, 1, 2, 2])] * 1, ei[0], ei[1], torch.tensor([0, 1, 2, 2, 2]),
                     torch.tensor([1, 2]), torch.arange(2), None, None, None, torch.ones(2), 1e-7,
                     "softmax")  # fmt: skip


def test_empty_graph_and_isolated_nodes(impl):
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([2.0], dtype=torch.float64, requires_grad=True)
    ei = torch.zeros(2, 0, dtype=torch.long)
    out = gen_aggregate(x, ei, reduce="softmax", t=t)
    assert (out == 0).all()
    out.sum().backward()
    assert (x.grad == 0).all() and (t.grad == 0).all()


@pytest.mark.parametrize("aggr,learn_t", AGGRS)
def test_float32_within_pytorch_float32_deviation(impl, aggr, learn_t):
    """float32 against float64: within a few times PyG's own float32 deviation on the same case."""
    n, c = 60, 16
    ei = graph(n, 600, seed=5)
    torch.manual_seed(1)
    conv = GENConv(c, c, aggr=aggr, t=1.5, learn_t=learn_t).double()
    x = torch.randn(n, c, dtype=torch.float64)
    ea = torch.randn(ei.size(1), c, dtype=torch.float64)
    grad = torch.randn(n, c, dtype=torch.float64)

    def run(dtype, ours):
        xx, ee = x.to(dtype, copy=True).requires_grad_(), ea.to(dtype, copy=True).requires_grad_()
        conv.to(dtype)
        t = conv.aggr_module.t if aggr == "softmax" else None
        out = (
            gen_aggregate(xx, ei, ee, conv.eps, aggr, t)
            if ours
            else conv.propagate(ei, x=(xx, xx), edge_attr=ee)
        )
        out.backward(grad.to(dtype))
        res = [out.detach(), xx.grad, ee.grad]
        if learn_t:
            res.append(t.grad.clone())
            t.grad = None
        conv.double()
        return [r.double() for r in res]

    exact = run(torch.float64, False)
    pyg32, ours32 = run(torch.float32, False), run(torch.float32, True)
    for o, p, e in zip(ours32, pyg32, exact):
        bound = max(4 * (p - e).abs().max().item(), 8 * torch.finfo(torch.float32).eps * e.abs().max().item())
        assert (o - e).abs().max().item() <= bound


@pytest.mark.parametrize("aggr", ["mean", "softmax"])
def test_kernel_threads_are_deterministic(aggr):
    """The C++ kernel's forward and backward are bitwise independent of the thread count: forward
    is parallel over destinations, backward over fixed blocks of destinations (two here), each
    block's gradients of x and of the parameters its own, added block by block in order."""
    require_kernel("gen_aggr")
    n, c = 3000, 24
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, n, (2, 60_000), generator=g)
    raw = torch.rand(60_000, 8, generator=g)
    lin = torch.nn.Linear(8, c)
    x = torch.randn(n, c, generator=g)
    t = torch.tensor([1.3], requires_grad=True) if aggr == "softmax" else None
    wanted = [lin.weight, lin.bias] + ([t] if t is not None else [])
    results = []
    threads = torch.get_num_threads()
    try:
        for k in (1, 2, 2, 4):
            torch.set_num_threads(k)
            xx, rr = x.clone().requires_grad_(), raw.clone().requires_grad_()
            out = gen_aggregate(xx, ei, LinearEdgeFeatures.from_linear(rr, lin), reduce=aggr, t=t)
            results.append((out, *torch.autograd.grad(out, [xx, rr, *wanted], torch.ones_like(out))))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        for u, v in zip(results[0], other):
            assert torch.equal(u, v)


def test_kernel_refuses_bad_indices():
    """Node ids out of range are errors rather than reads and writes outside the tensors."""
    require_kernel("gen_aggr")
    kernel = kernels.load("gen_aggr")
    x, ptr = torch.randn(3, 2), torch.tensor([0, 1, 2, 2])
    src = torch.tensor([1, 0])
    with pytest.raises(RuntimeError, match="src holds values outside"):
        kernel.forward(x, ptr, torch.tensor([1, 3]), None, None, None, None, 1e-7, "sum")
    with pytest.raises(RuntimeError, match="ptr must rise"):
        kernel.forward(x, torch.tensor([0, 2, 1, 2]), src, None, None, None, None, 1e-7, "sum")
    with pytest.raises(RuntimeError, match="reduce must be"):
        kernel.forward(x, ptr, src, None, None, None, None, 1e-7, "max")
    out, top, denom = kernel.forward(x, ptr, src, None, None, None, None, 1e-7, "sum")
    sptr, sdst, sperm = torch.tensor([0, 1, 2, 2]), torch.tensor([1, 0]), torch.tensor([1, 0])
    flags = (True, False, False, False, False)  # the gradient of x alone, "sum", no edge features

    def backward(src):
        args = (out, out, top, denom, x, ptr, src, sptr, sdst, sperm, None, None, None, None)
        return kernel.backward(*args, 1e-7, "sum", *flags)[0]

    gx = backward(src)
    assert torch.equal(gx, torch.stack([out[1], out[0], torch.zeros(2)]) * (x > 0))  # grad = out here
    with pytest.raises(RuntimeError, match="src holds values outside"):
        backward(torch.tensor([1, 3]))


# ------------------------------------------------------------------ no E x C tensor (issue #33)

N_BIG, E_BIG, C_BIG = 300, 30_000, 32


def big_case(aggr, learn_t, rev):
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, N_BIG, (2, E_BIG), generator=g)
    perm = (ei[1] * N_BIG + ei[0]).argsort()
    ei = EdgeIndex(ei[:, perm], sparse_size=(N_BIG, N_BIG), sort_order="col")
    torch.manual_seed(0)
    channels = C_BIG * (2 if rev else 1)
    block = GENBlock(C_BIG, edge_channels=16, aggr=aggr, learn_t=learn_t)
    model = GroupAddRev(block, num_groups=2) if rev else block
    x = torch.randn(N_BIG, channels, requires_grad=True)
    raw = torch.randn(E_BIG, 8)
    edges = LinearEdgeFeatures.from_linear(raw, torch.nn.Linear(8, 16))
    ei.get_csc()
    ei.get_csr()  # the graph's sorted forms exist before the measure, as in a model after layer 1
    return model, x, ei, edges


def measure(model, x, ei, edges):
    with LargestAllocation() as largest, SavedTensorBytes() as saved:
        out = model(x, ei, edges)
        out.square().sum().backward()
    return largest.bytes, saved.bytes


@pytest.mark.parametrize("rev", [False, True])
@pytest.mark.parametrize("aggr,learn_t", [("mean", False), ("sum", False), ("softmax", True)])
def test_no_edge_by_channel_tensor(impl, aggr, learn_t, rev, monkeypatch):
    """One E x C float32 tensor is 3.84 MB here; N x C is 38 kB and an E-sized int64 array 240 kB.
    Forward + backward of a GENBlock (and of one inside GroupAddRev, which recomputes it in
    backward) allocates nothing above a quarter of E x C, and saves for backward only the graph (the
    edge index, its source order's destinations and permutation, the raw E x 8 features) and less
    than a quarter of E x C besides. On PyG's path (checked at the end) both are at least one E x C tensor."""
    monkeypatch.setattr(ops, "CHUNK_EDGES", 2**12)  # chunk x C = 0.5 MB
    e_by_c = E_BIG * C_BIG * 4
    graph_bytes = E_BIG * 8 * 4 + 4 * E_BIG * 8  # raw features; edge_index, sdst, sperm (int64)
    largest, saved = measure(*big_case(aggr, learn_t, rev))
    assert largest < e_by_c / 4
    assert saved - graph_bytes < e_by_c / 4
    monkeypatch.setattr(gen_max, "fused_reduce", lambda conv: None)
    largest_pyg, saved_pyg = measure(*big_case(aggr, learn_t, rev))
    assert largest_pyg >= e_by_c and saved_pyg - graph_bytes >= e_by_c


@pytest.mark.parametrize("rev", [False, True])
@pytest.mark.parametrize("aggr,learn_t", [("mean", False), ("softmax", True)])
def test_kernel_step_builds_no_source_order(aggr, learn_t, rev, monkeypatch):
    """The C++ backward walks the destination order, so a training step through it builds no source
    order (two E-long int64 arrays and a sort, 240 kB each here): no allocation reaches E x 8 bytes,
    where building the order would make several (checked by asking for it through the dispatch table)."""
    require_kernel("gen_aggr")
    monkeypatch.delenv("REVGNN_KERNELS", raising=False)
    model, x, ei, edges = big_case(aggr, learn_t, rev)
    assert dispatch.implementation("gen_aggr", x, num_edges=E_BIG) == "cpp"
    largest, _ = measure(model, x, ei, edges)
    assert largest < E_BIG * 8
    monkeypatch.setattr(gen_max, "reads_source_order", lambda *args, **kwargs: True)
    largest_built, _ = measure(*big_case(aggr, learn_t, rev))
    assert largest_built >= E_BIG * 8
