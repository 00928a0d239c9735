"""The model zoo: registry, exact parameter counts, exactness of whole models."""

import pytest
import torch

from revgnn.models import RevGNN, count_parameters, create_model, list_models, model_info
from revgnn.utils import SavedTensorBytes


def proteins_batch(n=30, e=120, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    species = torch.nn.functional.one_hot(torch.randint(0, 8, (n,), generator=g), 8)
    x = torch.cat([torch.rand(n, 8, generator=g), species.float()], dim=-1).to(dtype)
    edge_index = torch.randint(0, n, (2, e), generator=g)
    edge_attr = torch.rand(e, 8, generator=g).to(dtype)
    return x, edge_index, edge_attr


def test_weight_tied_parameters_do_not_depend_on_depth():
    a = count_parameters(create_model("wt_revgnn", num_layers=2))
    b = count_parameters(create_model("wt_revgnn", num_layers=500))
    assert a == b == model_info("wt_revgnn").num_parameters


def test_every_registered_model_builds_and_runs():
    from revgnn.models.registry import MODELS

    x, ei, ea = proteins_batch()
    for name in list_models():
        if not MODELS[name].__module__.startswith("revgnn."):
            continue  # registered by another test
        if MODELS[name].__module__ == "revgnn.models.graph_revgnn":
            continue  # graph-level (batches of graphs): tests/nn/test_graph_norms.py
        small = {"in_channels": 16, "out_channels": 5} if name in ("revgnn_products", "revgat_arxiv") else {}
        try:  # deep variants are built shallow here
            model = create_model(name, num_layers=2, **small)
        except TypeError as err:  # models without a depth (e.g. equilibrium models)
            assert "'num_layers'" in str(err)
            model = create_model(name, **small)
        out = model(x, ei, ea)
        assert out.shape == (30, 5 if small else 112), name
        out.float().mean().backward()
        model.reset_parameters()
        assert type(model).__name__ in repr(model)


def test_registry_errors():
    with pytest.raises(ValueError, match="did you mean 'revgnn_deep'"):
        create_model("revgnn_dep")
    with pytest.raises(TypeError, match="no argument.*'hiden_channels'.*valid overrides"):
        create_model("revgnn_small", hiden_channels=32)
    with pytest.raises(TypeError, match="no argument.*'aggr'.*; conv 'gcn' takes no options"):
        create_model("revgnn_small", conv="gcn", aggr="max")
    with pytest.raises(ValueError, match="divisible by num_groups"):
        create_model("revgnn_small", hidden_channels=63)
    with pytest.raises(ValueError, match="'revgnn_small': dropout must be >= 0 and < 1, got 1.5"):
        create_model("revgnn_small", dropout=1.5)
    with pytest.raises(ValueError, match="'deq_gnn': tol must be > 0, got 0"):
        create_model("deq_gnn", tol=0)
    assert list_models("revgnn_*")[:2] == ["revgnn_112", "revgnn_deep"]


@pytest.mark.parametrize(
    "conv,extra",
    [
        ("gen", {}),
        ("gen", {"aggr": "softmax", "learn_t": True}),
        ("gat", {"heads": 2, "attn_dropout": 0.2}),
        ("sage", {}),
        ("gcn", {}),
        ("gin", {}),
    ],
)
@pytest.mark.parametrize("tied", [False, True])
def test_revgnn_equals_plain_stack(conv, extra, tied):
    """The whole model, reversible vs the same blocks stored normally, float64."""
    x, ei, ea = proteins_batch(dtype=torch.float64)
    grads = []
    for reversible in (True, False):
        torch.manual_seed(0)
        model = RevGNN(
            16,
            16,
            5,
            num_layers=12,
            conv=conv,
            edge_channels=8,
            species_channels=8,
            dropout=0.3,
            weight_tied=tied,
            reversible=reversible,
            **extra,
        ).double()
        torch.manual_seed(1)
        model(x, ei, ea).square().mean().backward()
        grads.append([p.grad for p in model.parameters()])
    # relative to each tensor's own scale, floored at 1e-4 of the largest gradient:
    # GAT's att_dst gradient is mathematically zero (softmax is invariant to a
    # per-destination shift), so both runs hold rounding noise of ~1e-19 there
    floor = 1e-4 * max(b.abs().max() for b in grads[1])
    for a, b in zip(*grads):
        assert ((a - b).abs().max() / b.abs().max().clamp_min(floor)) <= 1e-10


def test_model_saved_bytes_flat_in_depth():
    x, ei, ea = proteins_batch()

    def saved(depth):
        model = create_model("revgnn_small", num_layers=depth, hidden_channels=32)
        with SavedTensorBytes() as s:
            loss = model(x, ei, ea).sum()
        loss.backward()
        return s.bytes

    assert saved(200) <= 1.05 * saved(4)


def test_wrong_feature_width_is_a_clear_error():
    x, ei, ea = proteins_batch()
    with pytest.raises(ValueError, match="expects 16 node features, got 12"):
        create_model("revgnn_small", num_layers=1)(x[:, :12], ei, ea)


def test_factored_edge_encoding_equals_materialised():
    """GEN blocks see the shared edge embedding in factored form; same function."""
    from revgnn.nn import GENBlock, LinearEdgeFeatures

    x, ei, ea = proteins_batch(dtype=torch.float64)
    torch.manual_seed(0)
    shared = torch.nn.Linear(8, 16).double()
    block = GENBlock(8, edge_channels=16).double()
    h = torch.randn(30, 8, dtype=torch.float64)
    grads = []
    for factored in (True, False):
        block.zero_grad(), shared.zero_grad()
        e = LinearEdgeFeatures.from_linear(ea, shared) if factored else shared(ea)
        out = block(h, ei, e)
        out.square().sum().backward()
        grads.append([out.detach()] + [p.grad.clone() for p in (*block.parameters(), *shared.parameters())])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


def test_tall_linear_matches_linear():
    from revgnn.nn.edge_features import TallLinear

    x = torch.randn(500, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    g = torch.randn(500, 6, dtype=torch.float64)
    ours = torch.autograd.grad(TallLinear.apply(x, w, b), (x, w, b), g)
    ref = torch.autograd.grad(torch.nn.functional.linear(x, w, b), (x, w, b), g)
    for a, r in zip(ours, ref):
        assert torch.allclose(a, r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "conv,options",
    [
        ("gen", {"aggr": "max"}),
        ("gen", {"aggr": "mean"}),
        ("gen", {"aggr": "softmax", "learn_t": True}),
        ("sage", {}),
        ("sage", {"aggr": "max"}),
        ("gcn", {}),
        ("gin", {}),
        ("gat", {"heads": 2}),
    ],
)
def test_no_edge_by_channel_tensor_in_a_whole_model(conv, options):
    """A whole RevGNN of every recipe (encoders, shared edge embedding, 2 reversible layers, head),
    forward and backward, on a graph where E x C dwarfs N x C: its largest single allocation stays
    below a quarter of one E x hidden float32 tensor (the GAT recipe materialised the shared edge
    embedding, E x hidden, until its conv took it factored)."""
    from revgnn.models import RevGNN
    from revgnn.nn import conv_spec
    from revgnn.utils.memory import LargestAllocation

    n, e, hidden = 300, 30_000, 64  # E x hidden / 4 is twice the raw E x 8 features (sorted: a copy)
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, n, (2, e), generator=g)
    x, ea = torch.randn(n, 16, generator=g), torch.rand(e, 8, generator=g)
    uses_edges = conv_spec(conv).uses_edges
    torch.manual_seed(0)
    model = RevGNN(
        16, hidden, 4, 2, conv=conv, edge_channels=8 if uses_edges else None, dropout=0.1, **options
    )
    with LargestAllocation() as largest:
        out = model(x, ei, ea if uses_edges else None)
        out.square().mean().backward()
    assert largest.bytes < e * hidden * 4 / 4, (conv, options, largest.bytes)


@pytest.mark.parametrize(
    "conv,options", [("sage", {}), ("gen", {"aggr": "softmax", "learn_t": True}), ("gat", {"heads": 2})]
)
def test_compact_dropout_mask_is_bitwise_the_float_mask(conv, options, monkeypatch):
    """RevGNN hands its blocks the shared dropout mask as bool with its scale (a quarter of the
    float mask's bytes, held through the whole step): outputs and every gradient equal those of
    the float mask bit for bit; a block whose forward takes no dropout_scale gets the float mask."""
    from revgnn.nn import conv_spec
    from revgnn.nn.conv_registry import ConvSpec

    assert conv_spec(conv).compact_mask
    g = torch.Generator().manual_seed(0)
    x, edge_index = torch.randn(200, 12, generator=g), torch.randint(0, 200, (2, 1500), generator=g)
    y = torch.randint(0, 5, (200,), generator=g)
    results, masks = [], []
    for compact in (True, False):
        if not compact:
            monkeypatch.setattr(ConvSpec, "compact_mask", property(lambda self: False))
        torch.manual_seed(1)
        model = RevGNN(12, 32, 5, 3, conv=conv, dropout=0.3, **options)
        masks.append(model._dropout_mask(torch.empty(200, 32))[0].dtype)
        torch.manual_seed(2)
        out = model(x, edge_index)
        torch.nn.functional.cross_entropy(out, y).backward()
        results.append([out.detach(), *(p.grad for p in model.parameters())])
    assert masks == [torch.bool, torch.float32]
    assert all(torch.equal(a, b) for a, b in zip(*results))
