"""The drop-in contract with PyG's ``GroupAddRev``: the patterns of PyG's own tests
(``test/nn/models/test_rev_gnn.py``: forward/inverse round trip, backward, several backward passes
with ``retain_graph``, ``disable=True``, extra tensor arguments, ``num_groups`` 2-16) and docs, run
against revgnn's block, plus what a drop-in must also keep: ``state_dict`` both ways, second
derivatives (exact or a clear error), every adjacency form, modules without ``reset_parameters``,
outputs that are plain tensors. The documented differences (no storage freed; gradients for tensors
inside containers) are asserted as such, so neither can change unnoticed."""

import copy
import io

import pytest
import torch
import torch_geometric.nn as pyg
from conftest import adjacency_forms, rel_err
from torch import nn
from torch_geometric.nn import GraphConv, SAGEConv

from revgnn.nn import GENBlock, GroupAddRev, WeightTied

GROUPS = [2, 4, 8, 16]
TOL = 1e-12  # float64, a handful of additions per element


@pytest.fixture
def tiny():
    """PyG's test graph: 4 nodes, 4 edges."""
    return torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])


def graph(num_nodes=16, num_edges=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, num_nodes, (2, num_edges), generator=g)


def pair(conv, num_groups, **kw):
    """(revgnn block, disable=True reference with the same weights), float64."""
    torch.manual_seed(0)
    block = GroupAddRev(conv, num_groups=num_groups, **kw).double()
    ref = GroupAddRev(copy.deepcopy(conv), num_groups=num_groups, disable=True).double()
    ref.load_state_dict(block.state_dict())
    return block, ref


def grads_of(block, x, *args, loss=lambda y: (y.sin() * y).sum()):
    x = x.clone().requires_grad_()
    out = block(x, *args)
    leaves = [x, *[a for a in args if isinstance(a, torch.Tensor) and a.requires_grad], *block.parameters()]
    # a copy: PyG's wrapper frees its output's storage in its last backward pass
    return out.detach().clone(), torch.autograd.grad(loss(out), leaves, allow_unused=True)


def assert_close(got, want, tol=TOL):
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            assert rel_err(a, b) <= tol, rel_err(a, b)


# ------------------------------------------------------------------------ PyG's own test patterns


@pytest.mark.parametrize("num_groups", GROUPS)
def test_forward_inverse_round_trip(tiny, num_groups):
    c = 32 // num_groups
    block = GroupAddRev(SAGEConv(c, c), num_groups=num_groups).double()
    assert str(block) == f"GroupAddRev(SAGEConv({c}, {c}, aggr=mean), num_groups={num_groups})"
    h = nn.Linear(32, 32).double()(torch.randn(4, 32, dtype=torch.float64))
    h_o = h.clone().detach()
    out = block(h, tiny)
    # documented difference: PyG frees h's storage here (size 0); revgnn never touches it
    assert h.untyped_storage().size() == 4 * 32 * 8 and torch.equal(h.detach(), h_o)
    assert rel_err(block.inverse(out, tiny), h_o) <= TOL


@pytest.mark.parametrize("num_groups", GROUPS)
def test_backward_equals_the_plain_block(num_groups):
    c = 32 // num_groups
    block, ref = pair(SAGEConv(c, c), num_groups)
    x, ei = torch.randn(16, 32, dtype=torch.float64), graph()
    out, grads = grads_of(block, x, ei)
    out_ref, grads_ref = grads_of(ref, x, ei)
    assert rel_err(out, out_ref) <= TOL
    assert_close(grads, grads_ref)


@pytest.mark.parametrize("num_groups", GROUPS)
def test_several_backward_passes_with_retain_graph(tiny, num_groups):
    c = 32 // num_groups
    block, ref = pair(SAGEConv(c, c), num_groups, num_bwd_passes=4)
    x = torch.randn(4, 32, dtype=torch.float64)
    results = []
    for b in (block, ref):
        h = x.clone().requires_grad_()
        target = b(h, tiny).square().mean()
        leaves = [h, *b.parameters()]
        target.backward(retain_graph=True)
        first = [t.grad.clone() for t in leaves]
        target.backward(retain_graph=True)
        assert_close([t.grad for t in leaves], [2 * g for g in first])
        g3 = torch.autograd.grad(target, leaves, retain_graph=True)
        g4 = torch.autograd.grad(target, leaves, retain_graph=True)
        results.append((first, g3, g4))
        if b is block:  # a fifth pass through a block built for four: the error's advice is true
            with pytest.raises(RuntimeError, match="num_bwd_passes=4 times.*larger `num_bwd_passes`"):
                torch.autograd.grad(target, leaves)
    for got, want in zip(results[0], results[1]):
        assert_close(got, want)


@pytest.mark.parametrize("num_groups", GROUPS)
def test_disable_runs_the_plain_block(tiny, num_groups):
    c = 32 // num_groups
    block = GroupAddRev(SAGEConv(c, c), num_groups=num_groups, disable=True)
    h = nn.Linear(32, 32)(torch.randn(4, 32))
    out = block(h, tiny)
    assert out.grad_fn is not None and "InvertibleFunction" not in type(out.grad_fn).__name__
    out.mean().backward()
    assert h.untyped_storage().size() == 4 * 4 * 32  # PyG's assertion: nothing freed


@pytest.mark.parametrize("num_groups", GROUPS)
def test_extra_tensor_arguments_get_their_gradient(num_groups):
    """PyG's GraphConv with ``edge_weight`` (a plain tensor argument, here requiring grad): revgnn's
    gradients equal the plain block's, and PyG's wrapper's too."""
    c = 32 // num_groups
    block, ref = pair(GraphConv(c, c), num_groups)
    theirs = pyg.GroupAddRev(GraphConv(c, c), num_groups=num_groups).double()
    theirs.load_state_dict(block.state_dict())
    x, ei = torch.randn(16, 32, dtype=torch.float64), graph()
    weight = torch.rand(ei.size(1), dtype=torch.float64, requires_grad=True)
    _, grads = grads_of(block, x, ei, weight)
    _, grads_ref = grads_of(ref, x, ei, weight)
    _, grads_pyg = grads_of(theirs, x.clone(), ei, weight)
    assert_close(grads, grads_ref)
    assert_close(grads_pyg, grads_ref, 1e-10)


def test_a_tensor_inside_a_container_gets_its_gradient_where_pygs_gets_none():
    """The documented difference (docs/guides/blocks.md): PyG differentiates only tensors passed
    directly; a tensor inside a tuple gets no gradient from its wrapper."""

    class TupleConv(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x, edge_index, pair):
            (weight,) = pair
            agg = torch.zeros_like(x).index_add_(0, edge_index[1], x[edge_index[0]] * weight.view(-1, 1))
            return self.lin(agg).tanh()

    block, ref = pair(TupleConv(), 2)
    theirs = pyg.GroupAddRev(TupleConv(), num_groups=2).double()
    theirs.load_state_dict(block.state_dict())
    x, ei = torch.randn(16, 8, dtype=torch.float64), graph()
    norms, values = [], torch.rand(ei.size(1), dtype=torch.float64)
    for b in (block, ref, theirs):
        weight = values.clone().requires_grad_()
        b(x.clone().requires_grad_(), ei, (weight,)).square().sum().backward()
        norms.append(torch.zeros(()) if weight.grad is None else weight.grad.norm())
    assert norms[0] > 0 and abs(norms[0] - norms[1]) <= TOL * norms[1] and norms[2] == 0


# ------------------------------------------------------------------------------ state_dict, init


def test_state_dict_loads_both_ways_with_equal_outputs_and_gradients():
    x, ei = torch.randn(16, 16, dtype=torch.float64), graph()
    torch.manual_seed(0)
    theirs = pyg.GroupAddRev(SAGEConv(4, 4), num_groups=4).double()
    ours = GroupAddRev(SAGEConv(4, 4), num_groups=4).double()
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    ours.load_state_dict(theirs.state_dict())
    _, ref = grads_of(GroupAddRev(SAGEConv(4, 4), num_groups=4, disable=True).double(), x, ei)  # shape only
    out_a, grads_a = grads_of(ours, x, ei)
    out_b, grads_b = grads_of(theirs, x.clone(), ei)
    assert rel_err(out_a, out_b) <= TOL and len(grads_a) == len(ref)
    assert_close(grads_a, grads_b, 1e-10)
    torch.manual_seed(1)
    ours2 = GroupAddRev(SAGEConv(4, 4), num_groups=4).double()
    theirs.load_state_dict(ours2.state_dict())
    with torch.no_grad():
        assert rel_err(theirs(x.clone(), ei), ours2(x, ei)) <= TOL


def test_a_module_without_reset_parameters_is_accepted_and_its_layers_reset():
    """PyG accepts any module; revgnn's re-initialises each copy through the submodules that can be
    reset (here the Linear), recursively."""
    torch.manual_seed(0)
    block = GroupAddRev(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), num_groups=2)
    first, second = (conv[0].weight.detach().clone() for conv in block.convs)
    assert not torch.equal(first, second)
    x = torch.randn(5, 16, requires_grad=True)
    block(x).sum().backward()
    assert x.grad is not None
    block.reset_parameters()  # the whole block too
    assert not torch.equal(block.convs[0][0].weight, first)


# --------------------------------------------------------------------------- second derivatives


@pytest.mark.parametrize("wrap", ["block", "weight_tied"])
def test_create_graph_through_a_reversible_block_is_a_clear_error(wrap):
    """A second derivative through the reconstructing backward would be silently wrong (it was:
    ||dP/dx|| 149.92 for 325.35); it raises, naming the two ways that are exact."""
    block = GroupAddRev(SAGEConv(4, 4), num_groups=2, num_bwd_passes=2).double()
    model = WeightTied(block, 3) if wrap == "weight_tied" else block
    x = torch.randn(16, 8, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="create_graph=True.*disable=True.*torch.func"):
        torch.autograd.grad(model(x, graph()).square().sum(), x, create_graph=True)


def test_the_ways_the_error_names_give_exact_second_derivatives():
    ei = graph()
    block, ref = pair(SAGEConv(4, 4), 2)
    x = torch.randn(16, 8, dtype=torch.float64, requires_grad=True)
    # disable=True: plain autograd, second derivatives checked numerically
    assert torch.autograd.gradgradcheck(lambda t: ref(t, ei), (x,))
    tied = WeightTied(GroupAddRev(SAGEConv(4, 4), num_groups=2, disable=True).double(), 2)
    assert torch.autograd.gradgradcheck(lambda t: tied(t, ei), (x,))

    # torch.func on the reversible block equals autograd's double backward of the plain one
    def penalty(f):
        return lambda t: torch.func.grad(lambda u: f(u, ei).square().sum())(t).square().sum()

    got = torch.func.grad(penalty(block))(x.detach())
    (g,) = torch.autograd.grad(ref(x, ei).square().sum(), x, create_graph=True)
    (want,) = torch.autograd.grad(g.square().sum(), x)
    assert rel_err(got, want) <= 1e-10


# ------------------------------------------------------------------------------ adjacency forms


@pytest.mark.parametrize(
    "form", ["EdgeIndex", "EdgeIndex_sorted", "sparse_coo", "sparse_csr", "SparseTensor"]
)
@pytest.mark.parametrize("conv", ["SAGEConv", "GENBlock"])
def test_every_adjacency_form_gives_the_edge_index_result(form, conv):
    """N = C = 16: a sparse or EdgeIndex adjacency as wide as the features is the graph, shared by the
    groups, never split like a feature (a torch.sparse adj_t crashed the block there)."""
    n = 16
    edge_index, forms = adjacency_forms(graph(n, 64), n)
    if form not in forms:
        pytest.skip("torch_sparse is not installed")
    if conv == "GENBlock" and form == "SparseTensor":
        pytest.skip(
            "revgnn's own blocks take edge_index, EdgeIndex and torch.sparse (SparseTensor: PyG convs)"
        )
    make = (lambda: SAGEConv(8, 8)) if conv == "SAGEConv" else (lambda: GENBlock(8, aggr="max"))
    block, ref = pair(make(), 2)
    x = torch.randn(n, 16, dtype=torch.float64)
    out, grads = grads_of(block, x, forms[form])
    out_ref, grads_ref = grads_of(ref, x, edge_index)
    assert rel_err(out, out_ref) <= TOL
    assert_close(grads, grads_ref)


# ------------------------------------------------------------------------------------ outputs


def test_outputs_are_plain_tensors_that_torch_load_reads_by_default():
    block = GroupAddRev(SAGEConv(4, 4), num_groups=2)
    x = torch.randn(16, 8, requires_grad=True)
    y = block(x, graph())
    assert type(y) is torch.Tensor and not y.__dict__
    buffer = io.BytesIO()
    torch.save({"y": y.detach(), "raw": y}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)  # weights_only=True, the default
    assert torch.equal(loaded["y"], y.detach()) and torch.equal(loaded["raw"], y.detach())
    # the hand-off between blocks still works: a second block consumes y and backward reconstructs it
    second = GroupAddRev(SAGEConv(4, 4), num_groups=2)
    second(y, graph()).sum().backward()
    assert x.grad is not None and x.grad.isfinite().all()
