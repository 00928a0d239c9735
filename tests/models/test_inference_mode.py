"""Evaluation under ``torch.inference_mode`` (as PyG's examples evaluate): every zoo model and every
registered conv, alone, in a ``GroupAddRev`` and weight-tied, with every graph form, gives exactly what
it gives under ``no_grad`` (the same kernels run: float32 bitwise, float64 within 1e-12), and the graph
is checked once per forward pass there too, as the layers find it checked."""

import pytest
import torch
from conftest import adjacency_forms, rel_err
from torch_geometric import EdgeIndex
from zoo_cases import ZOO, zoo_case

from revgnn.nn import GroupAddRev, WeightTied, conv_spec, graph_input, list_convs, make_block

#: The keys of ``adjacency_forms`` (SparseTensor where ``torch_sparse`` is installed).
FORMS = [
    "edge_index",
    "EdgeIndex",
    "EdgeIndex_sorted",
    "EdgeIndex_csc",
    "sparse_coo",
    "sparse_csr",
    "SparseTensor",
]
#: Every registered conv, with each option that takes another code path.
CONV_CASES = [
    ("gen", {"aggr": "max"}),
    ("gen", {"aggr": "softmax", "learn_t": True}),
    ("gen", {"aggr": "mean"}),
    ("gen", {"aggr": "sum"}),
    ("gen", {"aggr": "powermean"}),
    ("gat", {"heads": 2, "attn_dropout": 0.25}),
    ("gcn", {}),
    ("gin", {}),
    ("sage", {"aggr": "mean"}),
    ("sage", {"aggr": "max"}),
    ("sage", {"aggr": "sum"}),
]
N, C, F_EDGE = 16, 8, 3


def run_both(fn):
    """``[no_grad's, inference_mode's]`` result of ``fn()``, each from the same random state
    (dropout in training mode), an output or the error it raised."""
    results = []
    for mode in (torch.no_grad, torch.inference_mode):
        torch.manual_seed(0)
        try:
            with mode():
                results.append(fn())
        except (ValueError, TypeError) as e:  # an input a model refuses: refused alike in both modes
            results.append(e)
    return results


def assert_same(got, want, form):
    if isinstance(want, Exception):
        assert form == "SparseTensor", want  # revgnn's own blocks take PyG's SparseTensor in no mode
        assert type(got) is type(want) and str(got) == str(want), got
        return
    assert not isinstance(got, Exception), got
    assert got.is_inference() and not want.is_inference()
    if want.dtype == torch.float64:
        assert rel_err(got, want) <= 1e-12
    else:  # no_grad and inference_mode run the same kernels on the same values
        assert torch.equal(got, want)


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", ZOO)
def test_every_model_under_inference_mode_equals_no_grad(name, form, dtype, training):
    model, args = zoo_case(name, dtype, n=N, e=64)
    edge_index, forms = adjacency_forms(args[1], N)
    if form not in forms:
        pytest.skip("torch_sparse is not installed")
    edge_attr = args[2][: edge_index.size(1)]  # one row per distinct edge
    model.train(training)
    want, got = run_both(lambda: model(args[0], forms[form], edge_attr, *args[3:]))
    assert_same(got, want, form)


def conv_module(conv, options, wrapper):
    """The block of ``conv`` (``C`` channels), or two of them as a ``GroupAddRev``, or that applied
    twice with tied weights, in float64, and its input width."""
    torch.manual_seed(0)
    edges = {"edge_channels": F_EDGE} if conv_spec(conv).uses_edges else {}
    block = make_block(conv, C, **options, **edges)
    if wrapper == "block":
        return block.double(), C
    rev = GroupAddRev(torch.nn.ModuleList([block, make_block(conv, C, **options, **edges)]))
    return (rev if wrapper == "GroupAddRev" else WeightTied(rev, 2)).double(), 2 * C


def test_the_conv_cases_cover_the_registry():
    assert {conv for conv, _ in CONV_CASES} == set(list_convs())


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("wrapper", ["block", "GroupAddRev", "WeightTied"])
@pytest.mark.parametrize(
    "conv, options", CONV_CASES, ids=[f"{c}-{'-'.join(map(str, o.values()))}" for c, o in CONV_CASES]
)
def test_every_conv_under_inference_mode_equals_no_grad(conv, options, wrapper, form, training):
    module, width = conv_module(conv, options, wrapper)
    g = torch.Generator().manual_seed(1)
    edge_index, forms = adjacency_forms(torch.randint(0, N, (2, 64), generator=g), N)
    if form not in forms:
        pytest.skip("torch_sparse is not installed")
    x = torch.randn(N, width, generator=g, dtype=torch.float64)
    edge_attr = torch.randn(edge_index.size(1), F_EDGE, generator=g, dtype=torch.float64)
    args = (edge_attr,) if conv_spec(conv).uses_edges else ()
    module.train(training)
    want, got = run_both(lambda: module(x, forms[form], *args))
    assert_same(got, want, form)


@pytest.mark.parametrize("name", ["revgnn_small", "revgat_arxiv", "deq_gnn_small", "wt_revgnn"])
@pytest.mark.parametrize("made", ["outside", "inside"])
def test_the_graph_is_checked_once_per_forward_as_under_no_grad(name, made, monkeypatch):
    """Sorted under inference_mode, the graph is built as a normal tensor, whose version the layers
    (and a DEQ's solver iterations) can read: they find it checked, as under no_grad, instead of
    checking the whole graph again, with a host sync, every time; whether the user's graph was
    made outside inference_mode or inside it."""
    calls = []
    check = graph_input.check_graph
    monkeypatch.setattr(graph_input, "check_graph", lambda *a: calls.append(1) or check(*a))
    model, (x, edge_index, edge_attr, *rest) = zoo_case(name, n=N, e=64)
    model.eval()
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            graph = edge_index.clone() if made == "inside" else edge_index
            calls.clear()
            model(x, graph, edge_attr, *rest)
            assert len(calls) == 1, (mode, len(calls))
            graph = EdgeIndex(graph, sparse_size=(N, N))
            calls.clear()
            model(x, graph, edge_attr, *rest)
            assert len(calls) == 1, (mode, len(calls))


def test_a_users_graph_made_under_inference_mode_is_checked_wherever_read():
    """A sorted ``EdgeIndex`` made under inference_mode counts no versions, and may be written in
    place there: it is never taken as checked, so an id written out of range is an error, never an
    out-of-bounds read."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 2 * C, generator=g, dtype=torch.float64)
    model, _ = conv_module("sage", {"aggr": "max"}, "GroupAddRev")
    model.eval()
    with torch.inference_mode():
        graph = EdgeIndex(torch.randint(0, N, (2, 64), generator=g), sparse_size=(N, N))
        graph = graph.sort_by("col")[0]
        graph.get_csc()
        assert graph.is_inference()
        model(x, graph)
        graph.as_tensor()[0, 5] = N + 3
        with pytest.raises(ValueError, match=rf"node id {N + 3} among its sources"):
            model(x, graph)


def test_inference_mode_outputs_are_the_models_not_the_graphs():
    """Only the outputs are inference tensors: the graph a model sorted is not kept, and the user's
    graph and features are left as they were (normal tensors, usable for training after)."""
    model, (x, edge_index, edge_attr) = zoo_case("revgnn_small", n=N, e=64)
    with torch.inference_mode():
        out = model(x, edge_index, edge_attr)
    assert out.is_inference() and not edge_index.is_inference() and not x.is_inference()
    model.train()
    model(x, edge_index, edge_attr).sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
