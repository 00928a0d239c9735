"""ModelOptimizer: the training step's end (reduce, clip, update, clear) against plain float64 formulas,
and its state, refused for another parameter layout."""

import copy
import math

import pytest
import torch
from torch import nn

from revgnn.utils.optimizer import LayoutMismatch, ModelOptimizer


def _model(width=6):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 3)).double()
    model.register_parameter("unused", nn.Parameter(torch.randn(2, dtype=torch.float64)))  # no gradient
    return model


def _backward(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(7, 4, generator=g, dtype=torch.float64)
    model(x).square().mean().backward()


def _sgd(lr):
    return lambda ps: torch.optim.SGD(ps, lr=lr)


@pytest.mark.parametrize("flat", [False, True])
@pytest.mark.parametrize("max_norm", [0.0, 0.05, 100.0])
def test_step_clips_updates_and_clears_as_the_formula(flat, max_norm):
    """theta - lr * min(1, c / (|g| + 1e-6)) * g (torch's clipping rule; no clipping for c = 0), the
    returned norm |g| of all gradients, and gradients cleared after: freed per tensor, zeroed in place
    in the flat buffer (which then still syncs)."""
    ref, model = _model(), _model()
    _backward(ref)
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in ref.parameters()]
    norm = math.sqrt(sum(float(g.square().sum()) for g in grads))
    coef = min(1.0, max_norm / (norm + 1e-6)) if max_norm > 0 else 1.0
    expected = [p.detach() - 0.5 * coef * g for p, g in zip(ref.parameters(), grads)]

    optimizer = ModelOptimizer(model, _sgd(0.5), flat=flat, max_norm=max_norm)
    _backward(model)
    assert optimizer.step() == pytest.approx(norm, rel=1e-14)
    if max_norm == 0.05:
        assert coef < 0.5  # the case clips
    for (name, p), e in zip(model.named_parameters(), expected):
        torch.testing.assert_close(p.detach(), e, rtol=1e-14, atol=1e-16, msg=name)
        if flat:
            assert p.grad is not None and not p.grad.any(), name
        else:
            assert p.grad is None, name
    if flat:
        optimizer.flat.sync()  # the views survived the clearing


@pytest.mark.parametrize("flat", [False, True])
def test_non_finite_gradient_norm_skips_the_update_and_clears(flat):
    model = _model()
    before = copy.deepcopy(model.state_dict())
    optimizer = ModelOptimizer(model, _sgd(0.5), flat=flat, max_norm=1.0)
    _backward(model)
    model[0].weight.grad[0, 0] = math.inf
    assert not math.isfinite(optimizer.step())
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())


@pytest.mark.parametrize("flat", [False, True])
def test_reduce_gradients_gets_the_flat_gradient_or_the_parameters(flat):
    """What a backend sums over workers: the one flat gradient, or every parameter; the update then
    follows the reduced gradients (here: doubled, as two workers with equal gradients give)."""
    ref, model = _model(), _model()
    _backward(ref)
    expected = [p.detach() - 0.25 * 2 * (p.grad if p.grad is not None else 0) for p in ref.parameters()]
    optimizer = ModelOptimizer(model, _sgd(0.25), flat=flat)
    seen = []

    def reduce(grads):
        seen.append(grads)
        for g in [grads] if flat else [p.grad for p in grads if p.grad is not None]:
            g.mul_(2)

    _backward(model)
    optimizer.step(reduce)
    if flat:
        assert len(seen) == 1 and seen[0] is optimizer.flat.grad
    else:
        assert [id(p) for p in seen[0]] == [id(p) for p in model.parameters()]
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.detach(), e, rtol=1e-15, atol=0)


@pytest.mark.parametrize("flat", [False, True])
def test_zero_grad_is_the_one_clearing(flat):
    model = _model()
    optimizer = ModelOptimizer(model, _sgd(0.1), flat=flat)
    _backward(model)
    optimizer.zero_grad()
    if flat:
        assert not optimizer.flat.grad.any()
        optimizer.flat.sync()
    else:
        assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("flat", [False, True])
def test_state_round_trip_continues_bitwise(flat):
    """Adam's state saved with its layout and loaded into a fresh optimiser over a copy of the model:
    the next steps are bitwise those of the original."""
    adam = lambda ps: torch.optim.Adam(ps, lr=1e-2)  # noqa: E731
    model = _model()
    optimizer = ModelOptimizer(model, adam, flat=flat, max_norm=1.0)
    for seed in (1, 2):
        _backward(model, seed)
        optimizer.step()
    state, layout = copy.deepcopy(optimizer.state_dict()), optimizer.layout
    assert (layout is not None) == flat
    copy_model = _model()
    copy_model.load_state_dict(model.state_dict())
    resumed = ModelOptimizer(copy_model, adam, flat=flat, max_norm=1.0)
    resumed.load_state_dict(state, layout)
    for m, opt in ((model, optimizer), (copy_model, resumed)):
        _backward(m, 3)
        opt.step()
    for (name, p), q in zip(model.named_parameters(), copy_model.parameters()):
        assert torch.equal(p, q), name


def test_state_of_another_layout_is_refused():
    flat = ModelOptimizer(_model(), _sgd(0.1), flat=True)
    per_tensor = ModelOptimizer(_model(), _sgd(0.1), flat=False)
    with pytest.raises(LayoutMismatch, match="per-tensor parameters") as e:
        flat.load_state_dict(per_tensor.state_dict(), per_tensor.layout)
    assert e.value.flat is False
    with pytest.raises(LayoutMismatch, match="flat parameters") as e:
        per_tensor.load_state_dict(flat.state_dict(), flat.layout)
    assert e.value.flat is True
    wider = ModelOptimizer(_model(width=7), _sgd(0.1), flat=True)
    with pytest.raises(LayoutMismatch, match="another parameter layout") as e:
        flat.load_state_dict(wider.state_dict(), wider.layout)
    assert e.value.flat is None


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="max_norm=-1"):
        ModelOptimizer(_model(), _sgd(0.1), max_norm=-1)
    with pytest.raises(ValueError, match="not a known element-wise"):
        ModelOptimizer(_model(), lambda ps: torch.optim.Adafactor(ps), flat=True)
