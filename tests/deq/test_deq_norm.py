"""Weight / spectral normalisation helpers for any map: apply, reset after a step, remove."""

import pytest
import torch

from revgnn.deq import DEQ, apply_norm, remove_norm, reset_norm
from revgnn.deq.norm import SpectralBound


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 6), torch.nn.LayerNorm(6)
    ).double()


def spectral(w):
    return torch.linalg.matrix_norm(w.detach(), 2).item()


def test_spectral_bound_holds_and_leaves_small_weights_alone():
    f = mlp()
    with torch.no_grad():
        f[2].weight.mul_(0.05 / spectral(f[2].weight))  # below the bound: untouched
    small = f[2].weight.detach().clone()
    assert apply_norm(f, "spectral", bound=0.5) == ["0.weight", "2.weight"]  # not LayerNorm's gain
    assert spectral(f[0].weight) == pytest.approx(0.5, rel=1e-9)
    assert torch.equal(f[2].weight, small)


def test_map_is_fixed_between_resets_and_tracks_the_parameters_after_steps():
    f = mlp()
    apply_norm(f, "spectral", bound=0.5)
    f.train()
    x = torch.randn(4, 6, dtype=torch.float64)
    assert torch.equal(f(x), f(x))  # the same function at every evaluation of a solve
    opt = torch.optim.SGD(f.parameters(), lr=0.05)
    sb = f[0].parametrizations.weight[0]
    for _ in range(20):
        u = sb.u.clone()
        f(x).square().sum().backward()
        opt.step()
        opt.zero_grad()
        assert torch.equal(sb.u, u)  # no update without reset
        reset_norm(f)
        assert spectral(f[0].weight) <= 0.5 * (1 + 1e-4)
    assert not torch.equal(sb.u, u)


def test_spectral_gradient_matches_finite_differences_float64():
    f = mlp()
    apply_norm(f, "spectral", bound=0.3)
    sb = f[0].parametrizations.weight[0]
    V = f[0].parametrizations.weight.original.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda v: sb(v), (V,))
    # and the parametrized module's gradient is that of the formula V / max(1, u^T V v / c)
    x = torch.randn(3, 6, dtype=torch.float64)
    f[0](x).sum().backward()
    ref = V / torch.clamp(sb.u @ V @ sb.v / 0.3, min=1.0)
    (g_ref,) = torch.autograd.grad(torch.nn.functional.linear(x, ref, f[0].bias).sum(), V)
    assert torch.allclose(f[0].parametrizations.weight.original.grad, g_ref, rtol=1e-12, atol=1e-14)


def test_weight_norm_keeps_the_map_then_remove_leaves_plain_parameters():
    f = mlp()
    x = torch.randn(4, 6, dtype=torch.float64)
    before = f(x).detach()
    apply_norm(f, "weight")
    assert torch.allclose(f(x), before, rtol=0, atol=1e-14)
    names = {n for n, _ in f.named_parameters()}
    assert "0.parametrizations.weight.original0" in names  # magnitudes g
    f(x).sum().backward()
    assert f[0].parametrizations.weight.original0.grad is not None
    reset_norm(f)  # nothing to do for weight norm
    assert remove_norm(f) == ["0.weight", "2.weight"]
    assert {n for n, _ in f.named_parameters()} == {
        "0.weight",
        "0.bias",
        "2.weight",
        "2.bias",
        "3.weight",
        "3.bias",
    }
    assert torch.allclose(f(x), before, rtol=0, atol=1e-14)


def test_normalised_map_in_a_deq_and_errors():
    class Map(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 6).double()

        def forward(self, z, x):
            return torch.tanh(self.lin(z) + x)

    torch.manual_seed(0)
    f = Map()
    with torch.no_grad():
        f.lin.weight.mul_(3.0)  # not contractive as initialised
    apply_norm(f, "spectral", bound=0.7)  # tanh is 1-Lipschitz: f is a 0.7-contraction
    deq = DEQ(f, solver="fixed_point", tol=1e-10, max_iter=200)
    x = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    deq(x).sum().backward()
    assert deq.stats["forward_converged"] == 1.0 and deq.stats["forward_steps"] <= 80
    with pytest.raises(ValueError, match="kind"):
        apply_norm(f, "batch")
    with pytest.raises(ValueError, match="no parameter"):
        apply_norm(f, "spectral", names=("wieght",))
    with pytest.raises(ValueError, match="no parameter"):
        apply_norm(f, "spectral")  # normalised already
    assert isinstance(f.lin.parametrizations.weight[0], SpectralBound)
    assert "bound=0.7" in repr(f)


def test_norm_docstring_example():
    import doctest

    import revgnn.deq.norm as mod

    assert doctest.testmod(mod).failed == 0
