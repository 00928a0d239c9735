"""GraphRevGNN and DEQGNN take any registered conv by name, and their GEN defaults are the models
they were before (``gen_models_reference.json``: parameters and float64 outputs computed by this
test's construction, seed and inputs on commit 08c0610, before ``conv=`` came to these models)."""

import json
from pathlib import Path

import pytest
import torch

from revgnn.models import DEQGNN, GraphRevGNN, create_model
from revgnn.nn import conv_spec, list_convs

REFERENCE = json.loads((Path(__file__).parent / "gen_models_reference.json").read_text())
#: The DEQ map's keys before its convs were registry blocks -> now (what its load hook renames).
DEQ_RENAMED = {
    "deq.f.conv_edge_encoders.0.": "deq.f.convs.0.edge_encoder.",
    "deq.f.conv_edge_encoders.1.": "deq.f.convs.1.edge_encoder.",
    "deq.f.convs.0.": "deq.f.convs.0.conv.",
    "deq.f.convs.1.": "deq.f.convs.1.conv.",
}


def _inputs():
    g = torch.Generator().manual_seed(1)
    n, e = 30, 120
    ei = torch.randint(0, n, (2, e), generator=g)
    x9 = torch.randint(0, 2, (n, 9), generator=g)
    ea3 = torch.randint(0, 2, (e, 3), generator=g)
    batch = torch.arange(n) // 10
    x16 = torch.randn(n, 16, generator=g, dtype=torch.float64)
    ea8 = torch.randn(e, 8, generator=g, dtype=torch.float64)
    return ei, x9, ea3, batch, x16, ea8


def _new_key(key: str) -> str:
    for old, new in DEQ_RENAMED.items():
        if key.startswith(old):
            return new + key[len(old) :]
    return key


def _close(a: float, b: float) -> bool:
    # float64 sums of <= 1e4 terms of O(1): rounding (which differs with the CPU's vector width) stays
    # far below 1e-10 relative; a different initialisation or map moves them at order 1
    return abs(a - b) <= 1e-10 * max(1.0, abs(b))


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_default_gen_models_are_the_models_before_conv_was_chosen_by_name(name):
    ref = REFERENCE[name]
    ei, x9, ea3, batch, x16, ea8 = _inputs()
    torch.manual_seed(0)
    model = create_model(name, **ref["overrides"]).double().eval()
    with torch.no_grad():
        out = model(x16, ei, ea8) if name.startswith("deq") else model(x9, ei, ea3, batch)
    state = {k: v for k, v in model.state_dict().items() if v.is_floating_point()}
    expected = {_new_key(k): v for k, v in ref["parameters"].items()}
    assert list(state) == list(expected) if not name.startswith("deq") else sorted(state) == sorted(expected)
    for key, (total, norm) in expected.items():
        assert _close(float(state[key].sum()), total) and _close(float(state[key].norm()), norm), key
    total, norm, first = ref["output"]
    assert _close(float(out.sum()), total) and _close(float(out.norm()), norm)
    assert all(_close(a, b) for a, b in zip(out[0, :4].tolist(), first))


def test_a_deq_checkpoint_from_before_loads():
    """A GEN DEQ-GNN's state_dict with the keys it had before (conv_edge_encoders.k, convs.k.<GENConv>)
    loads into today's model, every tensor where it belongs."""
    torch.manual_seed(0)
    model = create_model("deq_gnn_small", hidden_channels=8)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    old = {}
    for key, value in state.items():
        back = [o for o, n in DEQ_RENAMED.items() if key.startswith(n)]
        old[(back[0] + key[len(DEQ_RENAMED[back[0]]) :]) if back else key] = value.clone() + 1
    assert any(k.startswith("deq.f.conv_edge_encoders.") for k in old)
    model.load_state_dict(old)
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key] + 1) or not value.is_floating_point(), key


def _graph(n=24, e=90, features=6, edge_features=3):
    g = torch.Generator().manual_seed(0)
    return (
        torch.randint(0, n, (2, e), generator=g),
        torch.randn(n, features, generator=g, dtype=torch.float64),
        torch.randn(e, edge_features, generator=g, dtype=torch.float64),
    )


def _conv_options(conv):
    return {"heads": 2} if "heads" in conv_spec(conv).options else {}


@pytest.mark.parametrize("conv", list_convs())
def test_graph_revgnn_takes_every_registered_conv(conv):
    ei, x, ea = _graph()
    torch.manual_seed(0)
    model = GraphRevGNN(
        6, 8, 2, num_layers=2, edge_channels=3, encoder="linear", conv=conv, **_conv_options(conv)
    )
    model = model.double()
    block = model.layers[0].convs[0]
    assert type(block) is conv_spec(conv).block
    assert (model.edge_encoder is not None) == conv_spec(conv).uses_edges  # no unused bond encoder
    out = model(x, ei, ea, torch.arange(24) // 8)
    assert out.shape == (3, 2)
    out.square().sum().backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())


@pytest.mark.parametrize("conv", list_convs())
def test_deq_gnn_takes_every_registered_conv(conv):
    ei, x, ea = _graph()
    torch.manual_seed(0)
    model = DEQGNN(6, 8, 2, edge_channels=3, conv=conv, max_iter=30, tol=1e-8, **_conv_options(conv)).double()
    assert all(type(b) is conv_spec(conv).block and not b.preact for b in model.layer.convs)
    assert (model.layer.edge_encoder is not None) == conv_spec(conv).uses_edges
    model(x, ei, ea).square().sum().backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())


def test_conv_options_are_checked_against_the_conv_of_each_model():
    with pytest.raises(ValueError, match="conv='sage' has no option.*learn_t"):
        GraphRevGNN(9, 8, 1, num_layers=2, conv="sage", learn_t=True)
    with pytest.raises(ValueError, match="aggr must be one of"):
        GraphRevGNN(9, 8, 1, num_layers=2, aggr="median")
    with pytest.raises(ValueError, match="^heads=3 must divide hidden_channels=8$"):
        DEQGNN(6, 8, 2, conv="gat", heads=3)
    with pytest.raises(ValueError, match="contraction is derived for conv='gen' only"):
        DEQGNN(6, 8, 2, conv="sage", contraction=0.5)
    with pytest.raises(ValueError, match="mlp_norm is set by the model"):
        DEQGNN(6, 8, 2, contraction=0.5, mlp_norm=True)
    # GraphRevGNN's own defaults for gen, the block's for any other conv
    gen = GraphRevGNN(9, 8, 1, num_layers=1).layers[0].convs[0].conv
    assert (gen.aggr, gen.aggr_module.learn, len(gen.mlp)) == ("softmax", True, 1)  # one Linear
    sage = GraphRevGNN(9, 8, 1, num_layers=1, conv="sage").layers[0].convs[0].conv
    assert sage.aggr == "mean"
    assert GraphRevGNN.forwarded_options({})[0]["aggr"].default == "softmax"
    assert GraphRevGNN.forwarded_options({"conv": "sage"})[0]["aggr"].default == "mean"


@pytest.mark.parametrize("conv", list_convs())
def test_deq_map_twice_differentiable_form_is_the_same_map_for_every_conv(conv):
    """The Jacobian penalties' path (plain operators, differentiable twice) computes the map of the
    fused path, whatever the conv: value and vector-Jacobian product to float64 rounding."""
    from revgnn.models.deq_gnn import DEQGNNLayer
    from revgnn.nn.graph_input import sort_edges

    ei, x, ea = _graph(features=8)
    edge_index, edge_attr = sort_edges(ei, ea, x.size(0))
    torch.manual_seed(0)
    layer = DEQGNNLayer(8, edge_channels=3, conv=conv, **_conv_options(conv)).double()
    z = torch.randn_like(x, requires_grad=True)
    fast = layer(z, x, edge_index, edge_attr)
    slow = layer.twice_differentiable(z, x, edge_index, edge_attr)
    assert (fast - slow).abs().max() <= 1e-12 * fast.abs().max()
    v = torch.randn_like(fast)
    (g_fast,) = torch.autograd.grad(fast, z, v)
    (g_slow,) = torch.autograd.grad(slow, z, v, create_graph=True)
    assert (g_fast - g_slow).abs().max() <= 1e-12 * g_fast.abs().max()
    g_slow.square().sum().backward()  # the second derivative exists
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())
