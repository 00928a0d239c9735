"""Bad graph input is one clear error before any kernel runs, checked once per graph object; the
operators refuse what would make them read out of bounds (issue #31)."""

import pytest
import torch
from conftest import require_kernel
from torch_geometric import EdgeIndex

from revgnn.models import create_model
from revgnn.nn import GENBlock, GroupAddRev, graph_input, ops
from revgnn.nn.graph_input import check_graph, sort_edges

N, E = 50, 200


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, 16, generator=g), torch.randint(0, N, (2, E), generator=g), torch.randn(E, 8)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_model("revgnn_small", in_channels=16, edge_channels=8, out_channels=3, species_channels=0)


def with_id(edge_index, row, value):
    bad = edge_index.clone()
    bad[row, 3] = value
    return bad


@pytest.mark.parametrize(
    "row, value, where",
    [(1, N, "destinations"), (1, -1, "destinations"), (0, N + 1, "sources"), (0, -1, "sources")],
)
def test_a_node_id_out_of_range_is_one_error_naming_it(model, data, impl, row, value, where):
    x, edge_index, edge_attr = data
    with pytest.raises(ValueError, match=rf"node id {value} among its {where}.*\[0, {N}\)"):
        model(x, with_id(edge_index, row, value), edge_attr)
    block = GroupAddRev(GENBlock(8, edge_channels=8, aggr="max"), num_groups=2)
    with pytest.raises(ValueError, match=rf"node id {value} among its {where}"):
        block(torch.randn(N, 16, requires_grad=True), with_id(edge_index, row, value), edge_attr)


def test_edge_attr_rows_dtype_and_shape_are_checked(model, data):
    x, edge_index, edge_attr = data
    with pytest.raises(ValueError, match="200 edges in edge_index, 199 rows in edge_attr"):
        model(x, edge_index, edge_attr[:-1])
    with pytest.raises(TypeError, match=r"x is torch.float64 .* pass x.float\(\), .*model.double\(\)"):
        model(x.double(), edge_index, edge_attr)
    with pytest.raises(TypeError, match=r"edge_attr is torch.float64 .* pass edge_attr.float\(\)"):
        model(x, edge_index, edge_attr.double())
    with pytest.raises(TypeError, match=r"integer node ids.*edge_index.long\(\)"):
        model(x, edge_index.float(), edge_attr)
    with pytest.raises(ValueError, match=r"\[2, E\].*edge_index.t\(\)"):
        model(x, edge_index.t(), edge_attr)
    assert model(x, edge_index, edge_attr).isfinite().all()


def test_a_sorted_edge_index_is_checked_once_and_its_size_must_match(data, monkeypatch):
    x, edge_index, _ = data
    calls = []
    check = graph_input.check_graph
    monkeypatch.setattr(graph_input, "check_graph", lambda *a: calls.append(1) or check(*a))
    sorted_ei, _ = sort_edges(edge_index, None, N)  # checked while sorting
    assert len(calls) == 1
    for _ in range(3):  # every layer of a model sees the sorted object again: no new check, no sync
        assert sort_edges(sorted_ei, None, N)[0] is sorted_ei
    assert len(calls) == 1
    sorted_ei.add_(0)  # modified in place: its version moves on, so it is checked again
    sort_edges(sorted_ei, None, N)
    assert len(calls) == 2
    # so it is when written through its data, which counts its own version, or through the tensor
    # it was built from, which it shares: an id out of range is an error, not an out-of-bounds read
    sorted_ei.as_tensor()[0, 3] = N + 2
    with pytest.raises(ValueError, match=rf"node id {N + 2} among its sources"):
        sort_edges(sorted_ei, None, N)
    ids = sorted_ei.as_tensor().clone()
    ids[0, 3] = 0
    users = EdgeIndex(ids, sparse_size=(N, N), sort_order="col")
    users.get_csc()
    sort_edges(users, None, N)
    ids[1, -1] = -1
    with pytest.raises(ValueError, match=r"node id -1 among its destinations"):
        sort_edges(users, None, N)
    with pytest.raises(ValueError, match=r"one row per edge"):  # the rows are checked every time
        sort_edges(sorted_ei, torch.randn(E + 1, 8), N)
    with pytest.raises(ValueError, match=r"sparse_size \(50, 50\) but the graph has 40 nodes"):
        sort_edges(sorted_ei, None, 40)
    # a user's EdgeIndex whose ids exceed its size is checked before its CSC pointer is built (PyG
    # would write that pointer out of bounds)
    bad = EdgeIndex(with_id(edge_index, 1, N + 5), sparse_size=(N, N)).sort_by("col")[0]
    with pytest.raises(ValueError, match=rf"node id {N + 5} among its destinations"):
        GENBlock(16)(x, bad)


@pytest.mark.parametrize("conv, options", [("sage", {}), ("gcn", {}), ("gat", {"heads": 2})])
def test_a_graph_written_in_place_gets_a_new_source_order(conv, options):
    """The source order kept with a sorted graph (for the backward pass) is built again after the
    graph is written in place: the gradients are those of the graph as it is now."""
    from revgnn.nn import make_block

    g = torch.Generator().manual_seed(0)
    ids = EdgeIndex(torch.randint(0, N, (2, E), generator=g), sparse_size=(N, N)).sort_by("col")[0]
    ids = ids.as_tensor().clone()
    graph = EdgeIndex(ids, sparse_size=(N, N), sort_order="col")
    graph.get_csc()
    torch.manual_seed(0)
    block = make_block(conv, 4, **options).double()
    x = torch.randn(N, 4, generator=g, dtype=torch.float64, requires_grad=True)

    def grad(edge_index):
        (out,) = torch.autograd.grad(block(x, edge_index).square().sum(), x)
        return out

    grad(graph)  # its source order is built and kept
    ids[0, :5] = ids[0, :5].flip(0)  # other sources, the same destinations: still sorted by them
    fresh = EdgeIndex(ids.clone(), sparse_size=(N, N), sort_order="col")
    assert torch.equal(grad(graph), grad(fresh))


def test_sparse_adj_t_with_a_broken_pointer_is_an_error(data):
    x, edge_index, _ = data
    ptr = torch.tensor([0, 2, 1] + [3] * (N - 2))
    adj_t = torch.sparse_csr_tensor(ptr, torch.tensor([0, 1, 2]), torch.ones(3), (N, N))
    with pytest.raises(ValueError, match="crow_indices starting at 0, non-decreasing"):
        sort_edges(adj_t, None, N)


def test_torch_func_checks_the_graph_too(data):
    x, edge_index, _ = data
    block = GENBlock(16)
    params = dict(block.named_parameters())

    def loss(p):
        return torch.func.functional_call(block, p, (x, with_id(edge_index, 0, -3))).sum()

    with pytest.raises(ValueError, match="node id -3 among its sources"):
        torch.func.grad(loss)(params)


def test_check_graph_accepts_empty_graphs():
    check_graph(torch.empty(2, 0, dtype=torch.long), torch.empty(0, 3), 0)


# ----------------------------------------------------------------------------- the operators


def csc_inputs(C=4, d=3):
    g = torch.Generator().manual_seed(1)
    edge_index = torch.randint(0, N, (2, E), generator=g)
    src, _, ptr, attr = graph_input.csc(edge_index, torch.randn(E, d, generator=g), N)
    x = torch.randn(N, C, dtype=torch.float64, generator=g)
    w = torch.randn(C, d, dtype=torch.float64, generator=g)
    return x, ptr.clone(), src.clone(), attr.double(), w, torch.randn(C, dtype=torch.float64, generator=g)


def broken(which):
    x, ptr, src, attr, w, b = csc_inputs()
    if which == "src_high":
        src[7] = N
    elif which == "src_negative":
        src[7] = -1
    elif which == "ptr_start":
        ptr[0] = 1
    elif which == "ptr_end":
        ptr[-1] = E + 3
    elif which == "ptr_decreasing":
        ptr[5] = int(ptr[7]) + 1  # above the pointers after it
    return x, ptr, src, attr, w, b


CASES = ["src_high", "src_negative", "ptr_start", "ptr_end", "ptr_decreasing"]


@pytest.mark.parametrize("which", CASES)
def test_the_cpp_kernel_refuses_a_graph_it_would_read_out_of_bounds_with(which):
    """Always on in C++: one O(N + E) pass (forward 0.98-1.01x the time without it, measured in the
    commit that added it)."""
    require_kernel()
    from revgnn.nn import kernels

    kernel = kernels.load("gen_max")
    x, ptr, src, attr, w, b = broken(which)
    with pytest.raises(RuntimeError, match="gen_max: (ptr must|every source id)"):
        kernel.forward(x, ptr, src, attr, w.t().contiguous(), b, 1e-7)
    with pytest.raises(RuntimeError, match="gen_max: (ptr must|every source id)"):
        kernel.shard_forward(x, ptr, src, attr, w.t().contiguous(), b)


def test_the_cpp_backward_refuses_winner_offsets_outside_their_segment():
    require_kernel()
    from revgnn.nn import kernels

    kernel = kernels.load("gen_max")
    x, ptr, src, attr, w, b = csc_inputs()
    wt = w.t().contiguous()
    out, arg, tied = kernel.forward(x, ptr, src, attr, wt, b, 1e-7)
    grad = torch.ones_like(out)
    kernel.backward(grad, arg, tied, x, ptr, src, attr, wt, b, True, True, True, True)  # valid: runs
    for value in (int(ptr.diff().max()) + 1, -2):
        bad = arg.clone()
        bad[int(ptr.diff().argmax()), 0] = value
        with pytest.raises(RuntimeError, match="arg must hold winner offsets"):
            kernel.backward(grad, bad, tied, x, ptr, src, attr, wt, b, True, True, True, True)


@pytest.mark.parametrize("which", CASES)
def test_kernel_checks_mode_guards_every_implementation(which, impl, monkeypatch):
    """REVGNN_KERNEL_CHECKS=1 (the test suite's setting, tests/conftest.py) checks the graph in the
    operator, before the C++, Triton or PyTorch implementation runs."""
    monkeypatch.setenv("REVGNN_KERNEL_CHECKS", "1")
    x, ptr, src, attr, w, b = broken(which)
    with pytest.raises((ValueError, RuntimeError), match="(ptr must|source id)"):
        ops.gen_max(x, ptr, src, attr, w, b, 1e-7)
    monkeypatch.setenv("REVGNN_KERNEL_CHECKS", "0")
    if impl == "torch" and which in ("src_high", "ptr_end"):  # PyTorch's own index checks raise
        with pytest.raises((IndexError, RuntimeError)):
            ops.gen_max(x, ptr, src, attr, w, b, 1e-7)


def test_kernel_checks_mode_checks_backward_winners(impl, monkeypatch):
    monkeypatch.setenv("REVGNN_KERNEL_CHECKS", "1")
    x, ptr, src, attr, w, b = csc_inputs()
    out, arg, tied = ops.gen_max(x, ptr, src, attr, w, b, 1e-7)
    bad = arg.clone()
    bad[int(ptr.diff().argmax()), 0] = int(ptr.diff().max()) + 1
    with pytest.raises((ValueError, RuntimeError), match="arg must hold winner offsets"):
        ops.gen_max_backward(torch.ones_like(out), bad, tied, x, ptr, src, attr, w, b, True, True, True, True)


def test_a_compiled_model_refuses_bad_ids_through_the_kernels_checks(data, monkeypatch):
    """Under torch.compile a plain edge_index is sorted inside the graph, unchecked (a host sync would
    break it); the C++ kernel's own checks then refuse the pointer or ids it leads to: an error, never
    corrupted memory or NaN."""
    require_kernel()
    monkeypatch.setenv("REVGNN_KERNEL_CHECKS", "0")  # the C++ kernel's own, always-on checks
    x, edge_index, edge_attr = data
    torch.manual_seed(0)
    model = create_model(
        "revgnn_small", in_channels=16, edge_channels=8, out_channels=3, species_channels=0, num_layers=1
    ).eval()
    compiled = torch.compile(model)
    with torch.no_grad():
        assert compiled(x, edge_index, edge_attr).isfinite().all()
        for row, value in ((1, N), (0, N + 1), (0, -1), (1, -1)):
            with pytest.raises(RuntimeError, match="gen_max: (ptr must|every source id)"):
                compiled(x, with_id(edge_index, row, value), edge_attr)
