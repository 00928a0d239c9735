"""Root solvers: agreement, independent residual check, options, non-convergence, NaN, fallbacks."""

import math

import pytest
import torch

from benchmarks.deq.broyden_memory import linear_map  # the maps the Broyden default was chosen on
from revgnn.deq import (
    SOLVERS,
    SolverDivergenceError,
    anderson,
    broyden,
    check_solver_options,
    fixed_point,
    get_solver,
)


def graph_map(n=30, d=6, kappa=0.9, seed=0, dtype=torch.float64):
    """A contractive graph map z -> tanh(A z W + b) with ||A||_2 <= 1 and ||W||_2 = kappa."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (4 * n,), generator=g)
    dst = torch.randint(0, n, (4 * n,), generator=g)
    A = torch.eye(n, dtype=dtype)
    A[dst, src] = 1.0
    A = torch.maximum(A, A.T)
    deg = A.sum(1).rsqrt()
    A = deg[:, None] * A * deg[None, :]
    W = torch.randn(d, d, generator=g, dtype=dtype)
    W = kappa * W / torch.linalg.matrix_norm(W, 2)
    b = torch.randn(n, d, generator=g, dtype=dtype)
    return lambda z: torch.tanh(A @ z @ W + b), torch.zeros(n, d, dtype=dtype)


def rel_residual(f, z):
    fz = f(z)
    return ((fz - z).norm() / fz.norm()).item()


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_residual_at_exit_checked_independently(name):
    f, z0 = graph_map(dtype=torch.float32)
    res = get_solver(name)(f, z0, tol=1e-4, max_iter=200)
    assert res.converged
    independent = rel_residual(f, res.z)
    assert independent <= 1e-4
    assert math.isclose(independent, res.rel_residual, rel_tol=1e-3, abs_tol=1e-7)
    assert res.steps == len(res.trace) and res.trace[-1] == res.residual


def test_abs_stop_mode():
    f, z0 = graph_map()
    res = anderson(f, z0, tol=1e-9, stop_mode="abs", max_iter=200)
    assert res.converged and (f(res.z) - res.z).norm().item() <= 1e-9


def test_three_solvers_agree():
    f, z0 = graph_map()
    zs = {name: get_solver(name)(f, z0, tol=1e-12, max_iter=500) for name in SOLVERS}
    assert all(r.converged for r in zs.values())
    ref = zs["fixed_point"].z
    for name, r in zs.items():
        assert (r.z - ref).abs().max().item() < 1e-9, name


def test_anderson_needs_fewer_evaluations_than_fixed_point():
    f, z0 = graph_map(kappa=0.99)
    fp = fixed_point(f, z0, tol=1e-8, max_iter=1000)
    aa = anderson(f, z0, tol=1e-8, max_iter=1000)
    assert fp.converged and aa.converged
    assert aa.steps < fp.steps


def indefinite_map(n=100, seed=1):
    """f(z) = a * z + b with the Jacobian spectrum measured where Anderson used to stall on the untrained
    DEQ-GNN map: two eigenvalues just above 1 (I - J nearly singular), ten below -1, the rest in
    (-0.9, 0.9). Not contractive (plain iteration gets nowhere); diagonal, since Anderson is invariant under
    an orthogonal change of basis."""
    g = torch.Generator().manual_seed(seed)
    a = torch.cat(
        [
            torch.tensor([1.0035, 1.04], dtype=torch.float64),
            -1.0 - 0.17 * torch.rand(10, generator=g, dtype=torch.float64),
            1.8 * torch.rand(n - 12, generator=g, dtype=torch.float64) - 0.9,
        ]
    )
    b = torch.randn(n, 1, generator=g, dtype=torch.float64)
    return lambda z: a[:, None] * z + b, torch.zeros(n, 1, dtype=torch.float64)


def test_anderson_does_not_stall_when_the_map_is_not_contractive():
    # The minimal-residual (Type II) step alone creeps along at 3e-5 to 5e-5 for ~70 evaluations and
    # reaches 1e-6 only at 282 (4e-5 after 150); switching to Type I coefficients while the residual
    # stalls gets there in 91.
    f, z0 = indefinite_map()
    res = anderson(f, z0, tol=1e-6, max_iter=150)
    assert res.converged and rel_residual(f, res.z) <= 1e-6
    assert fixed_point(f, z0, tol=1e-6, max_iter=150).rel_residual > 0.1  # plain iteration stalls


def test_anderson_switch_is_per_graph():
    # Three such problems in one batch: each graph stalls and switches at its own steps, and its
    # iterates are those of solving it alone.
    maps = [indefinite_map(100, 1), indefinite_map(40, 3), indefinite_map(60, 5)]
    sizes = [z.size(0) for _, z in maps]
    batch = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])

    def f(z):
        return torch.cat([fi(zi) for (fi, _), zi in zip(maps, z.split(sizes))])

    together = anderson(
        f, torch.zeros(sum(sizes), 1, dtype=torch.float64), tol=1e-6, max_iter=150, batch=batch
    )
    assert together.converged
    for i, ((fi, z0), zi) in enumerate(zip(maps, together.z.split(sizes))):
        alone = anderson(fi, z0, tol=1e-6, max_iter=150)
        assert alone.converged and int(together.graph_steps[i]) == alone.steps
        assert torch.allclose(zi, alone.z, rtol=0, atol=1e-9 * alone.z.abs().max().item())


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_non_convergence_returns_best_iterate(name):
    f, z0 = graph_map()
    res = get_solver(name)(f, z0, tol=1e-30, max_iter=4)
    assert not res.converged and res.steps == 4
    assert res.residual == min(res.trace)
    assert math.isclose(rel_residual(f, res.z), res.rel_residual, rel_tol=1e-9)


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_nan_is_a_clear_error(name):
    f, z0 = graph_map()
    calls = {"n": 0}

    def bad(z):
        calls["n"] += 1
        out = f(z)
        return out * float("nan") if calls["n"] == 3 else out

    with pytest.raises(SolverDivergenceError, match="evaluation 3"):
        get_solver(name)(bad, z0, tol=1e-30, max_iter=10)
    with pytest.raises(SolverDivergenceError, match="z0"):
        get_solver(name)(f, z0 + float("inf"))


@pytest.mark.parametrize("name", ["anderson", "broyden"])
def test_no_fixed_point_degrades_gracefully(name):
    # f(z) = z + 1 has no fixed point and makes every difference of residuals zero: the Anderson
    # Gram matrix is exactly singular (lam=0), the Broyden update denominator vanishes.
    opts = {"lam": 0.0} if name == "anderson" else {}
    res = get_solver(name)(lambda z: z + 1.0, torch.zeros(5, 3), max_iter=8, **opts)
    assert not res.converged and torch.isfinite(res.z).all()


def test_broyden_history_is_capped():
    f, z0 = graph_map(kappa=0.99)
    res = broyden(f, z0, tol=1e-8, max_iter=300, memory=3)
    assert res.converged


def test_broyden_default_keeps_every_update_on_a_non_normal_map():
    # The reason for the default (docs/bench/deq.md, broyden-memory): with its whole history Broyden's
    # method ends on a linear map in at most 2n steps (Gay 1979); restarting every 20 updates throws the
    # secant information away. On this non-normal map (eigenvalues of modulus <= 0.94, ||J||_2 = 3.3)
    # all kept reaches 1e-6 in 74 evaluations, memory 20 needs 264-279 (it varies with the last bits),
    # more than plain iteration's 167.
    f, z0 = linear_map(100, 23, 2.0)
    full = broyden(f, z0, tol=1e-6, max_iter=150)
    assert full.converged and full.steps <= 90 and rel_residual(f, full.z) <= 1e-6
    assert not broyden(f, z0, tol=1e-6, max_iter=150, memory=20).converged
    assert not fixed_point(f, z0, tol=1e-6, max_iter=150).converged
    # "every update" is a memory no history reaches: max_iter evaluations make max_iter - 1 updates
    same = broyden(f, z0, tol=1e-6, max_iter=60, memory=10**6)
    assert torch.equal(broyden(f, z0, tol=1e-6, max_iter=60).z, same.z)
    with pytest.raises(ValueError, match="^broyden: memory must be >= 1, got 0$"):
        broyden(f, z0, memory=0)


def test_unknown_options_are_errors():
    with pytest.raises(TypeError, match="unknown option"):
        check_solver_options("anderson", {"stop_mod": "abs"})
    with pytest.raises(TypeError):
        anderson(lambda z: z, torch.zeros(2), history=3)
    with pytest.raises(ValueError, match="unknown solver"):
        get_solver("newton")
    with pytest.raises(ValueError, match="stop_mode"):
        fixed_point(lambda z: z, torch.zeros(2), stop_mode="relative")
    check_solver_options("broyden", {"memory": 4, "tol": 1e-3})


def test_docstring_examples():
    import doctest

    import revgnn.deq.solvers as mod

    assert doctest.testmod(mod).failed == 0
