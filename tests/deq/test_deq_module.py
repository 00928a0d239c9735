"""DEQ module: implicit gradient exactness, unroll convergence, memory, warm start, errors."""

import warnings

import pytest
import torch
from torch import nn

from revgnn.deq import DEQ, DEQConvergenceWarning, SolverDivergenceError


class GraphMap(nn.Module):
    """z -> tanh(A z W + x U + b): a contraction for ||A||_2 <= 1 and ||W||_2 < 1."""

    def __init__(self, d_in=3, d=5, kappa=0.6, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        W = torch.randn(d, d, generator=g, dtype=torch.float64)
        self.W = nn.Parameter(kappa * W / torch.linalg.matrix_norm(W, 2))
        self.U = nn.Parameter(torch.randn(d_in, d, generator=g, dtype=torch.float64))
        self.b = nn.Parameter(0.1 * torch.randn(d, generator=g, dtype=torch.float64))

    def forward(self, z, x, A):
        return torch.tanh(A @ z @ self.W + x @ self.U + self.b)


def make_graph(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = torch.eye(n, dtype=torch.float64)
    idx = torch.randint(0, n, (2, 3 * n), generator=g)
    A[idx[0], idx[1]] = 1.0
    A = torch.maximum(A, A.T)
    deg = A.sum(1).rsqrt()
    return deg[:, None] * A * deg[None, :]


def inject(n, d_in=3, z_dim=5, seed=1):
    """The state has its own width, so DEQ needs an explicit z0."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d_in, generator=g, dtype=torch.float64), torch.zeros(n, z_dim, dtype=torch.float64)


def loss_fn(z):
    w = torch.linspace(-1, 1, z.numel(), dtype=z.dtype).view_as(z)
    return (w * z).sum() + 0.5 * (z**2).sum()


def grads(model, x, A, z0):
    model.zero_grad()
    x = x.clone().requires_grad_()
    loss_fn(model(x, A, z0=z0)).backward()
    return torch.cat([p.grad.flatten() for p in model.f.parameters()] + [x.grad.flatten()])


def test_implicit_gradient_matches_finite_differences():
    A = make_graph()
    x, z0 = inject(A.shape[0])
    deq = DEQ(GraphMap(), solver="anderson", tol=1e-13, max_iter=300)
    g_impl = grads(deq, x, A, z0)
    assert deq.stats["backward_converged"] == 1.0 and deq.stats["backward_steps"] > 1

    # central differences along every coordinate of the map's parameters and of the input
    params = list(deq.f.parameters()) + [x]
    eps, fd = 1e-6, []
    with torch.no_grad():
        for p in params:
            flat = p.view(-1)
            for i in range(flat.numel()):
                old = flat[i].item()
                flat[i] = old + eps
                up = loss_fn(deq(x, A, z0=z0))
                flat[i] = old - eps
                down = loss_fn(deq(x, A, z0=z0))
                flat[i] = old
                fd.append(((up - down) / (2 * eps)).item())
    g_fd = torch.tensor(fd, dtype=torch.float64)
    rel = ((g_impl - g_fd).norm() / g_fd.norm()).item()
    assert rel <= 1e-6, rel


def test_implicit_gradient_with_each_adjoint_solver():
    A = make_graph()
    x, z0 = inject(A.shape[0])
    ref = grads(DEQ(GraphMap(), tol=1e-12, max_iter=300), x, A, z0)
    for solver in ("fixed_point", "broyden"):
        g = grads(DEQ(GraphMap(), tol=1e-12, max_iter=300, backward_solver=solver), x, A, z0)
        assert ((g - ref).norm() / ref.norm()).item() < 1e-8, solver


def test_unrolled_gradient_converges_to_implicit():
    A = make_graph()
    x, z0 = inject(A.shape[0])
    g_impl = grads(DEQ(GraphMap(), tol=1e-13, max_iter=300), x, A, z0)
    errors = []
    for k in (2, 4, 8, 16, 32):
        g_k = grads(DEQ(GraphMap(), backward="unroll", unroll_steps=k), x, A, z0)
        errors.append(((g_k - g_impl).norm() / g_impl.norm()).item())
    assert all(b < a for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 1e-8 and errors[0] > 1e-2, errors


def test_phantom_gradient_is_close_to_implicit():
    A = make_graph()
    x, z0 = inject(A.shape[0])
    g_impl = grads(DEQ(GraphMap(), tol=1e-12, max_iter=300), x, A, z0)
    g_ph = grads(
        DEQ(GraphMap(), tol=1e-12, max_iter=300, backward="phantom", phantom_steps=8, phantom_damping=1.0),
        x,
        A,
        z0,
    )
    cos = torch.nn.functional.cosine_similarity(g_impl, g_ph, dim=0).item()
    assert cos > 0.99, cos


def saved_bytes(fn):
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return total[0], out


def slow_map():
    """A GraphMap that contracts at rate 0.97 (W = 0.97 I, the input scaled so tanh stays near its
    linear part): after 50 fixed-point steps the residual is still ~1e-2 of the state, so no rounding
    on any CPU can land on an exact fixed point and stop the solve early."""
    f = GraphMap()
    with torch.no_grad():
        f.W.copy_(0.97 * torch.eye(f.W.size(0), dtype=f.W.dtype))
        f.U.mul_(0.01)
        f.b.mul_(0.01)
    return f


@pytest.mark.parametrize("backward", ["implicit", "phantom"])
def test_saved_bytes_do_not_depend_on_iterations(backward):
    A = make_graph(n=40)
    x, z0 = inject(40)
    sizes = []
    for iters in (5, 50):
        deq = DEQ(slow_map(), solver="fixed_point", tol=1e-30, max_iter=iters, backward=backward)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DEQConvergenceWarning)
            nbytes, out = saved_bytes(lambda: deq(x, A, z0=z0))
            loss_fn(out).backward()
        assert deq.stats["forward_steps"] == iters
        assert deq.stats["forward_residual"] > 1e-4  # far from any floating-point fixed point
        sizes.append(nbytes)
    assert sizes[0] == sizes[1] > 0
    if backward == "implicit":  # only z* and the inputs: less than one evaluation of f with autograd
        one_eval = saved_bytes(lambda: GraphMap()(z0.requires_grad_(), x, A))[0]
        assert sizes[0] < one_eval
    # the measure itself sees depth: unrolling saves more for more steps
    unrolled = [
        saved_bytes(lambda: DEQ(GraphMap(), backward="unroll", unroll_steps=k)(x, A, z0=z0))[0]
        for k in (5, 50)
    ]
    assert unrolled[1] > 5 * unrolled[0]


def test_non_convergence_warns_and_records_stats():
    A = make_graph()
    x, z0 = inject(A.shape[0])
    deq = DEQ(GraphMap(), tol=1e-30, max_iter=3)
    with pytest.warns(DEQConvergenceWarning, match="forward solve did not converge"):
        out = deq(x, A, z0=z0)
    assert deq.stats["forward_converged"] == 0.0 and deq.stats["forward_steps"] == 3
    assert len(deq.traces["forward"]) == 3
    with pytest.warns(DEQConvergenceWarning, match="backward solve did not converge"):
        loss_fn(out).backward()
    assert deq.stats["backward_converged"] == 0.0


def test_nan_in_map_raises():
    A = make_graph()
    x, z0 = inject(A.shape[0])
    deq = DEQ(GraphMap())
    with torch.no_grad():
        deq.f.b[0] = float("nan")
    with pytest.raises(SolverDivergenceError, match="NaN"):
        deq(x, A, z0=z0)
    deq.backward = "unroll"
    with pytest.raises(SolverDivergenceError, match="NaN"):
        deq(x, A, z0=z0)


def test_warm_start_saves_iterations():
    A = make_graph()
    x, z0 = inject(A.shape[0])
    deq = DEQ(GraphMap(), solver="fixed_point", tol=1e-8, max_iter=200, warm_start=True)
    with torch.no_grad():
        cold = deq(x, A, z0=z0)
        steps_cold = deq.stats["forward_steps"]
        warm = deq(x, A, z0=z0)  # z0 is the cold start; the stored equilibrium wins
    assert deq.stats["forward_steps"] <= 2 < steps_cold
    assert torch.allclose(warm, cold, atol=1e-6)


def test_warm_start_uses_previous_equilibrium_when_shapes_match():
    class SameWidth(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, z, x):
            return torch.tanh(0.5 * self.lin(z) + x)

    deq = DEQ(SameWidth(), solver="fixed_point", tol=1e-6, max_iter=100, warm_start=True)
    x = torch.randn(10, 4)
    with torch.no_grad():
        deq(x)
        first = deq.stats["forward_steps"]
        deq(x)
        assert deq.stats["forward_steps"] < first
        deq(torch.randn(7, 4))  # a different shape falls back to zeros
        deq.reset_state()
        assert deq._z_prev is None or deq._z_prev.shape == (7, 4)


def test_output_can_be_modified_in_place():
    A = make_graph()
    x, z0 = inject(A.shape[0])
    deq = DEQ(GraphMap(), tol=1e-10, max_iter=200)
    ref = grads(deq, x, A, z0)
    deq.zero_grad()
    out = deq(x, A, z0=z0)
    out.mul_(1.0)
    loss_fn(out).backward()
    assert torch.allclose(torch.cat([p.grad.flatten() for p in deq.f.parameters()]), ref[: -x.numel()])


def test_configuration_errors():
    f = GraphMap()
    with pytest.raises(TypeError, match="unknown option"):
        DEQ(f, solver_options={"stop_mod": "abs"})
    with pytest.raises(TypeError, match="unknown option"):
        DEQ(f, backward_solver="broyden", backward_solver_options={"m": 3})
    with pytest.raises(ValueError, match="backward"):
        DEQ(f, backward="ift")
    with pytest.raises(ValueError, match="solver must be one of the registered solvers anderson"):
        DEQ(f, solver="newton")
    deq = DEQ(f, solver="broyden", solver_options={"memory": 4})
    assert "broyden" in repr(deq)


def test_module_docstring_example():
    import doctest

    import revgnn.deq as mod

    assert doctest.testmod(mod).failed == 0
