"""FlatParameters: one buffer for all parameters gives the same model, gradients and updates."""

import copy
import io

import pytest
import torch
from torch import nn

from revgnn.models.registry import create_model
from revgnn.utils.flat import FlatParameters


def _model():
    torch.manual_seed(0)
    model = create_model(
        "revgnn_small",
        num_layers=3,
        hidden_channels=16,
        num_groups=2,
        dropout=0.0,
        in_channels=8,
        out_channels=4,
        edge_channels=8,
    ).double()
    # a parameter that never receives a gradient (unused in forward)
    model.register_parameter("unused", nn.Parameter(torch.randn(5, dtype=torch.float64)))
    return model


def _data(seed=1):
    g = torch.Generator().manual_seed(seed)
    n = 30
    x = torch.randn(n, 8, generator=g, dtype=torch.float64)
    edge_index = torch.randint(0, n, (2, 120), generator=g)
    edge_attr = torch.rand(120, 8, generator=g, dtype=torch.float64)
    y = torch.randn(n, 4, generator=g, dtype=torch.float64)
    return x, edge_index, edge_attr, y


def _loss(model, data):
    x, edge_index, edge_attr, y = data
    return ((model(x, edge_index, edge_attr) - y) ** 2).mean()


def test_flat_model_computes_the_same_values_and_gradients():
    ref, model = _model(), _model()
    flat = FlatParameters(model)
    assert 0 <= flat.numel - sum(p.numel() for p in ref.parameters()) < 8 * len(list(ref.parameters()))
    data = _data()
    _loss(ref, data).backward()
    _loss(model, data).backward()
    flat.sync()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(p, q), name
        expected = q.grad if q.grad is not None else torch.zeros_like(q)
        assert torch.equal(p.grad, expected), name
    # every parameter and gradient is a view into the two buffers
    for p in model.parameters():
        assert p.untyped_storage().data_ptr() == flat.params[0].untyped_storage().data_ptr()
        assert p.grad.untyped_storage().data_ptr() == flat.grad.untyped_storage().data_ptr()


def _assert_flat_steps_equal_per_tensor(make_opt, steps):
    """Trains a model per tensor (zero_grad(set_to_none=False)) and a copy over FlatParameters on
    the same data; asserts bitwise equal parameters; returns the flat model and its optimiser."""
    ref, model = _model(), _model()
    flat = FlatParameters(model)
    opt_ref, opt = make_opt(list(ref.parameters())), make_opt(flat.params)
    for p in ref.parameters():
        p.grad = torch.zeros_like(p)
    for step in range(steps):
        data = _data(seed=step)
        _loss(ref, data).backward()
        opt_ref.step()
        opt_ref.zero_grad(set_to_none=False)
        _loss(model, data).backward()
        flat.sync()
        opt.step()
        flat.zero_grad()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(p, q), name
    return model, opt


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda ps: torch.optim.Adam(ps, lr=1e-2),
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
        lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, weight_decay=1e-3),
    ],
    ids=["adam", "adamw", "sgd-momentum"],
)
def test_flat_updates_are_bitwise_those_of_per_tensor_optimiser(make_opt):
    """Element-wise rules give bitwise the same parameters after several steps; a parameter with
    no gradient is treated as zero gradient, as zero_grad(set_to_none=False) does."""
    model, opt = _assert_flat_steps_equal_per_tensor(make_opt, steps=4)
    if opt.param_groups[0]["weight_decay"] > 0:  # decay moved the parameter that had no gradient
        assert not torch.equal(model.unused, _model().unused)


def test_clipping_the_flat_gradient_matches_per_tensor_clipping():
    ref, model = _model(), _model()
    flat = FlatParameters(model)
    data = _data()
    _loss(ref, data).backward()
    _loss(model, data).backward()
    n_ref = torch.nn.utils.clip_grad_norm_(ref.parameters(), 1e-3)
    n = torch.nn.utils.clip_grad_norm_(flat.params, 1e-3)
    torch.testing.assert_close(n, n_ref, rtol=1e-13, atol=0)
    for p, q in zip(model.parameters(), ref.parameters()):
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-18)


def test_sync_repairs_gradients_that_were_dropped_or_replaced():
    model = _model()
    flat = FlatParameters(model)
    data = _data()
    model.zero_grad()  # sets every .grad to None: the next backward would allocate fresh ones
    _loss(model, data).backward()
    assert flat.grad.abs().sum() == 0  # not seen yet
    flat.sync()
    ref = _model()
    _loss(ref, data).backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad if q.grad is not None else torch.zeros_like(q))
    assert flat.grad.abs().sum() > 0
    # optimizer.zero_grad() drops the chunks' gradients but not the parameters' views, so the next
    # backward adds to the previous step's gradient: sync refuses rather than apply the sum
    torch.optim.Adam(flat.params).zero_grad(set_to_none=True)
    _loss(model, data).backward()
    with pytest.raises(RuntimeError, match="flat gradient was dropped"):
        flat.sync()


def test_sync_refuses_a_model_moved_after_flattening():
    model = _model()
    flat = FlatParameters(model)
    model.float()
    with pytest.raises(RuntimeError, match="no longer lives in the flat buffer"):
        flat.sync()


@pytest.mark.parametrize("change", ["assign", "freeze", "unfreeze", "submodule"])
def test_sync_refuses_parameters_replaced_or_refrozen(change):
    """New Parameter objects (load_state_dict(assign=True), a replaced submodule) or a changed
    requires_grad would leave the optimiser updating a buffer the model no longer reads (or not
    updating a parameter)."""
    model = _model()
    if change == "unfreeze":
        model.head.lin.bias.requires_grad_(False)
    flat = FlatParameters(model)
    if change == "assign":
        model.load_state_dict(_model().state_dict(), assign=True)
    elif change == "freeze":
        model.head.lin.weight.requires_grad_(False)
    elif change == "submodule":
        model.head.lin = nn.Linear(model.head.lin.in_features, model.head.lin.out_features).double()
    else:
        model.head.lin.bias.requires_grad_(True)
    with pytest.raises(RuntimeError, match="trainable parameters changed"):
        flat.sync()


def test_saved_tensor_count_ignores_flattened_parameters():
    """SavedTensorBytes leaves parameters out; views of the flat buffer saved by ops (weight.t())
    are parameters too, so flattening does not change the count."""
    from revgnn.utils import SavedTensorBytes

    counts = []
    for flatten in (False, True):
        model = _model()
        if flatten:
            FlatParameters(model)
        with SavedTensorBytes() as saved:
            _loss(model, _data())
        counts.append(saved.bytes)
    assert counts[0] == counts[1] > 0


def test_bad_inputs_have_clear_errors():
    model = _model()
    model.extra = nn.Linear(2, 2)  # float32 next to float64
    with pytest.raises(ValueError, match="one dtype and device"):
        FlatParameters(model)
    with pytest.raises(ValueError, match="no trainable parameters"):
        FlatParameters(nn.ReLU())
    flattened = _model()
    FlatParameters(flattened)
    with pytest.raises(ValueError, match="share storage"):
        FlatParameters(flattened)
    flat = FlatParameters(_model())
    with pytest.raises(ValueError, match="not a known element-wise"):
        FlatParameters.check_optimizer(torch.optim.Adafactor(flat.params))
    FlatParameters.check_optimizer(torch.optim.Adam(flat.params))


def test_state_dict_of_a_flat_model_loads_into_a_plain_one():
    model = _model()
    FlatParameters(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    plain = _model()
    plain.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    for p, q in zip(plain.parameters(), model.parameters()):
        assert torch.equal(p, q)
    # and back: loading copies into the buffer, which stays the parameters' storage
    fresh = _model()
    flat = FlatParameters(fresh)
    fresh.load_state_dict(copy.deepcopy(plain.state_dict()))
    flat.sync()
    for p, q in zip(fresh.parameters(), plain.parameters()):
        assert torch.equal(p, q)
        assert p.untyped_storage().data_ptr() == flat.params[0].untyped_storage().data_ptr()


def test_optimiser_state_is_one_tensor_per_kind():
    """The memory claim, counted: Adam keeps step, exp_avg and exp_avg_sq for the one flat tensor
    (a small model is one chunk), against three per parameter tensor without flattening."""
    model = _model()
    flat = FlatParameters(model)
    opt = torch.optim.Adam(flat.params)
    _loss(model, _data()).backward()
    flat.sync()
    opt.step()
    state = opt.state_dict()["state"]
    assert len(flat.params) == 1 and len(state) == 1 and state[0]["exp_avg"].shape == (flat.numel,)
    ref = _model()
    opt_ref = torch.optim.Adam(ref.parameters())
    _loss(ref, _data()).backward()
    opt_ref.step()
    assert len(opt_ref.state_dict()["state"]) == sum(1 for p in ref.parameters() if p.grad is not None) > 20


def test_large_models_are_chunked_for_the_optimiser(monkeypatch):
    """The optimiser sees chunks of at most CHUNK_BYTES (its temporaries stay that small), which
    tile the buffer; the update is still bitwise the per-tensor one."""
    import revgnn.utils.flat as flat_module

    monkeypatch.setattr(flat_module, "CHUNK_BYTES", 1024)
    model, opt = _assert_flat_steps_equal_per_tensor(lambda ps: torch.optim.Adam(ps, lr=1e-2), steps=3)
    params = opt.param_groups[0]["params"]
    assert len(params) > 5 and all(p.numel() * 8 <= 1024 for p in params)
    assert sum(p.numel() for p in params) == sum(-(-p.numel() // 8) * 8 for p in model.parameters())
