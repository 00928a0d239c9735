"""Graph-aware solves: a batch of graphs is solved together but judged and mixed per graph, and each
graph's result is the one of solving it alone (float64)."""

import pytest
import torch

from revgnn.deq import DEQ, SOLVERS, get_solver

OPTIONS = {"fixed_point": {"damping": 0.9}, "anderson": {"m": 4}, "broyden": {"memory": 6}}


def molecules(sizes=(7, 12, 5, 9), d=4, seed=0):
    """Disjoint graphs with their own contraction factor (the last one is slow), one map for all."""
    g = torch.Generator().manual_seed(seed)
    blocks, kappas = [], (0.3, 0.6, 0.95, 0.5)
    for n, kappa in zip(sizes, kappas):
        A = (torch.rand(n, n, generator=g, dtype=torch.float64) < 0.4).double() + torch.eye(
            n, dtype=torch.float64
        )
        A = A + A.T
        blocks.append(kappa * A / torch.linalg.matrix_norm(A, 2))
    A = torch.block_diag(*blocks)
    W = torch.randn(d, d, generator=g, dtype=torch.float64)
    W = W / torch.linalg.matrix_norm(W, 2)
    b = torch.randn(A.size(0), d, generator=g, dtype=torch.float64)
    batch = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])

    def f(z, rows=slice(None)):
        return torch.tanh(A[rows, rows] @ z @ W + b[rows])

    return f, batch, sizes


@pytest.mark.parametrize("name", sorted(SOLVERS))
@pytest.mark.parametrize("stop_mode", ["rel", "abs"])
def test_batched_solve_equals_solving_each_graph_alone(name, stop_mode):
    f, batch, sizes = molecules()
    solver = get_solver(name)
    z0 = torch.zeros(batch.numel(), 4, dtype=torch.float64)
    together = solver(f, z0, tol=1e-10, max_iter=400, stop_mode=stop_mode, batch=batch, **OPTIONS[name])
    assert together.converged and together.graph_steps.shape == (len(sizes),)
    start, alone_steps = 0, []
    for i, n in enumerate(sizes):
        rows = slice(start, start + n)
        alone = solver(
            lambda z: f(z, rows), z0[rows], tol=1e-10, max_iter=400, stop_mode=stop_mode, **OPTIONS[name]
        )
        assert alone.converged
        assert int(together.graph_steps[i]) == alone.steps
        assert torch.allclose(together.z[rows], alone.z, rtol=0, atol=1e-13 * alone.z.abs().max().item())
        assert together.graph_residual[i].item() == pytest.approx(alone.residual, rel=1e-6, abs=1e-300)
        alone_steps.append(alone.steps)
        start += n
    # one evaluation of the batch per step of its slowest graph; the fast graphs stopped early
    assert together.steps == max(alone_steps) and min(alone_steps) < max(alone_steps)
    assert together.residual == max(together.graph_residual.tolist())


def test_converged_graph_is_frozen_and_slow_graph_does_not_hold_others_hostage():
    f, batch, sizes = molecules()
    z0 = torch.zeros(batch.numel(), 4, dtype=torch.float64)
    whole = get_solver("fixed_point")(f, z0, tol=1e-8, max_iter=500)  # one problem: judged as a whole
    per_graph = get_solver("fixed_point")(f, z0, tol=1e-8, max_iter=500, batch=batch)
    assert per_graph.converged and whole.converged
    # the fastest graph stops after far fewer evaluations than the batch needs
    assert int(per_graph.graph_steps.min()) < per_graph.steps // 2
    # a frozen graph's rows are its iterate at convergence, not iterated further: f moves them a bit
    first = int(per_graph.graph_steps.argmin())
    rows = batch == first
    moved = (f(per_graph.z)[rows] - per_graph.z[rows]).norm() / f(per_graph.z)[rows].norm()
    assert 0 < moved.item() <= 1e-8


def test_batch_validation_errors():
    f, batch, _ = molecules()
    z0 = torch.zeros(batch.numel(), 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="one graph id per row"):
        get_solver("anderson")(f, z0, batch=batch[:-1])
    with pytest.raises(TypeError, match="integer tensor"):
        get_solver("anderson")(f, z0, batch=batch.double())


def test_deq_batch_forward_and_implicit_gradient_per_graph():
    """DEQ(batch=...) solves the forward and the adjoint per graph; gradients match solving alone."""

    class Map(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4).double()

        def forward(self, z, x, adj):
            return torch.tanh(adj @ self.lin(z) * 0.5 + x)

    torch.manual_seed(0)
    f, batch, sizes = molecules()
    n = batch.numel()
    adj = torch.block_diag(*[torch.full((k, k), 1.0 / k, dtype=torch.float64) for k in sizes])
    x = torch.randn(n, 4, dtype=torch.float64, requires_grad=True)
    deq = DEQ(Map(), solver="anderson", tol=1e-11, max_iter=200)
    deq(x, adj, batch=batch).square().sum().backward()
    grad_together = [x.grad.clone(), deq.f.lin.weight.grad.clone()]
    assert deq.stats["forward_converged"] == 1.0 and deq.stats["backward_converged"] == 1.0
    x.grad = None
    deq.f.lin.weight.grad = None
    start = 0
    for k in sizes:
        rows = slice(start, start + k)
        deq(x[rows], adj[rows, rows]).square().sum().backward()
        start += k
    assert torch.allclose(x.grad, grad_together[0], rtol=0, atol=1e-9)
    assert torch.allclose(deq.f.lin.weight.grad, grad_together[1], rtol=1e-9, atol=1e-12)
