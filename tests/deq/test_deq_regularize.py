"""Jacobian regularisation and spectral radius: Hutchinson is unbiased, power iteration finds rho, the
spectral-radius penalty has the gradient of the dominant eigenvalue, the DEQ adds the terms to the loss
through the training loop's one auxiliary-loss mechanism."""

import csv
import math

import pytest
import torch
from conftest import TanhMap

from revgnn.deq import DEQ, jacobian_frobenius, spectral_radius, spectral_radius_penalty


def small_map(seed=0, shape=(3, 2)):
    g = torch.Generator().manual_seed(seed)
    n = shape[0] * shape[1]
    A = torch.randn(n, n, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(n, generator=g, dtype=torch.float64)

    def f(z):
        return torch.tanh(A @ z.reshape(-1) * 0.7 + b).reshape(shape)

    z = torch.randn(shape, generator=g, dtype=torch.float64)
    return f, z, A


def exact_jacobian(f, z, create_graph=False):
    J = torch.autograd.functional.jacobian(f, z, create_graph=create_graph)
    return J.reshape(z.numel(), z.numel())


@pytest.mark.parametrize("distribution", ["rademacher", "gaussian"])
def test_hutchinson_is_unbiased_against_the_exact_frobenius_norm(distribution):
    f, z, _ = small_map()
    J = exact_jacobian(f, z).detach()
    exact = J.square().sum().item()
    M = J @ J.T
    var = 2 * (M.square().sum() - (M.diagonal().square().sum() if distribution == "rademacher" else 0))
    probes = 1000
    zz = z.clone().requires_grad_()
    est = jacobian_frobenius(
        f(zz), zz, probes, distribution, torch.Generator().manual_seed(1), create_graph=False
    ).item()
    # fixed seed: deterministic; the bound is 5 standard deviations of the mean of `probes` probes
    assert abs(est - exact) <= 5 * math.sqrt(var.item() / probes)
    assert abs(est - exact) > 0  # an estimate, not the exact value


def test_hutchinson_gradient_matches_explicit_jacobian_float64():
    f, z, A = small_map()
    zz = z.clone().requires_grad_()
    est = jacobian_frobenius(f(zz), zz, 3, generator=torch.Generator().manual_seed(2))
    (g_est,) = torch.autograd.grad(est, A)
    # reference: the same probes, v^T J J^T v with J formed explicitly (differentiable in A)
    gen = torch.Generator().manual_seed(2)
    V = [(2 * torch.randint(0, 2, z.shape, generator=gen) - 1).double().reshape(-1) for _ in range(3)]
    J = exact_jacobian(f, z, create_graph=True)
    ref = sum((v @ J).square().sum() for v in V) / 3
    (g_ref,) = torch.autograd.grad(ref, A)
    assert est.item() == pytest.approx(ref.item(), rel=1e-12)
    assert torch.allclose(g_est, g_ref, rtol=1e-10, atol=1e-12 * g_ref.norm().item())


def _linear(A):
    z = torch.zeros(A.size(0), dtype=torch.float64, requires_grad=True)
    return A @ z, z


def test_power_iteration_finds_the_spectral_radius_of_a_known_matrix():
    g = torch.Generator().manual_seed(0)
    Q = torch.randn(6, 6, generator=g, dtype=torch.float64) + 3 * torch.eye(6, dtype=torch.float64)
    A = (
        Q
        @ torch.diag(torch.tensor([0.9, -0.6, 0.45, 0.3, -0.2, 0.1], dtype=torch.float64))
        @ torch.linalg.inv(Q)
    )
    fz, z = _linear(A)
    assert spectral_radius(fz, z, iters=200, generator=g) == pytest.approx(0.9, rel=1e-6)
    # a dominant complex pair 0.8 e^{+-i 0.7}: the growth factors oscillate, their mean does not
    R = 0.8 * torch.tensor(
        [[math.cos(0.7), -math.sin(0.7)], [math.sin(0.7), math.cos(0.7)]], dtype=torch.float64
    )
    B = torch.block_diag(R, torch.diag(torch.tensor([0.5, -0.3, 0.1, 0.05], dtype=torch.float64)))
    fz, z = _linear(Q @ B @ torch.linalg.inv(Q))
    assert spectral_radius(fz, z, iters=400, generator=g) == pytest.approx(0.8, rel=2e-2)
    fz, z = _linear(torch.zeros(3, 3, dtype=torch.float64))
    assert spectral_radius(fz, z) == 0.0


def _eigenpair_matrix(eigenvalues, seed=0, orthogonal=False):
    """A = Q diag(eigenvalues) Q^-1 and the unit dominant eigenvector w of A^T (the vector the power
    iteration on J^T converges to)."""
    g = torch.Generator().manual_seed(seed)
    n = len(eigenvalues)
    Q = torch.randn(n, n, generator=g, dtype=torch.float64) + 3 * torch.eye(n, dtype=torch.float64)
    if orthogonal:
        Q = torch.linalg.qr(Q).Q
    D = torch.diag(torch.tensor(eigenvalues, dtype=torch.float64))
    Qinv = torch.linalg.inv(Q)
    A = Q @ D @ Qinv
    w = Qinv[0]  # row 0 of Q^-1: A^T w = lambda_0 w
    return A, w / w.norm()


@pytest.mark.parametrize("orthogonal", [True, False])
@pytest.mark.parametrize("lead", [0.9, -0.9])
def test_spectral_penalty_value_and_gradient_are_the_dominant_eigenvalues_float64(orthogonal, lead):
    """(rho_hat - t)^2 with rho_hat = ||A^T w||: value (|lambda| - t)^2 and, v held fixed, gradient
    2 (|lambda| - t) sign(lambda) w w^T with respect to A (symmetric and non-normal A)."""
    A0, w = _eigenpair_matrix([lead, -0.6, 0.45, 0.3, -0.2, 0.1], orthogonal=orthogonal)
    A = A0.clone().requires_grad_()
    z = torch.zeros(6, dtype=torch.float64, requires_grad=True)
    fz = A @ z
    term, estimate = spectral_radius_penalty(
        fz, z, 0.5, iters=200, generator=torch.Generator().manual_seed(1)
    )
    assert estimate == pytest.approx(0.9, rel=1e-10)
    assert term.item() == pytest.approx(0.4**2, rel=1e-10)
    (grad,) = torch.autograd.grad(term, A)
    ref = 2 * 0.4 * math.copysign(1.0, lead) * torch.outer(w, w)
    assert torch.allclose(grad, ref, rtol=1e-9, atol=1e-12 * ref.norm().item())


def test_spectral_penalty_is_zero_below_its_target_and_drives_rho_to_it():
    A0, _ = _eigenpair_matrix([0.9, -0.6, 0.45, 0.3, -0.2, 0.1])
    z = torch.zeros(6, dtype=torch.float64, requires_grad=True)
    A = A0.clone().requires_grad_()
    term, estimate = spectral_radius_penalty(A @ z, z, 0.95, iters=100)
    assert term.item() == 0.0 and estimate == pytest.approx(0.9, rel=1e-8)
    (grad,) = torch.autograd.grad(term, A)
    assert grad.abs().max().item() == 0.0
    # gradient descent on the penalty alone (symmetric: the step w w^T moves only the dominant
    # eigenvalue): rho falls from 1.3 to the target, not below
    S, _ = _eigenpair_matrix([1.3, -0.9, 0.7, 0.3, -0.2, 0.1], orthogonal=True)
    B = S.clone().requires_grad_()
    opt = torch.optim.SGD([B], lr=0.2)
    g = torch.Generator().manual_seed(2)
    for _ in range(300):
        opt.zero_grad()
        term, _ = spectral_radius_penalty(B @ z, z, 0.6, iters=60, generator=g)
        term.backward()
        opt.step()
    rho = torch.linalg.eigvals(B.detach()).abs().max().item()
    assert 0.595 <= rho <= 0.61


def test_spectral_penalty_uses_the_twice_differentiable_map_for_its_gradient():
    """The power iterations run on fz, the last (differentiated) product on fz_graph."""
    A0, _ = _eigenpair_matrix([0.9, -0.6, 0.45, 0.3, -0.2, 0.1], orthogonal=True)
    A = A0.clone().requires_grad_()
    z = torch.zeros(6, dtype=torch.float64, requires_grad=True)
    once = A.detach() @ z  # no path to A: differentiating it gives nothing
    term, _ = spectral_radius_penalty(once, z, 0.0, iters=200, fz_graph=A @ z)
    (grad,) = torch.autograd.grad(term, A)
    assert term.item() == pytest.approx(0.81, rel=1e-10) and grad.norm().item() > 1.0


def test_estimator_argument_errors():
    fz, z = _linear(torch.eye(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="distribution"):
        jacobian_frobenius(fz, z, distribution="uniform")
    with pytest.raises(ValueError, match="probes"):
        jacobian_frobenius(fz, z, probes=0)
    with pytest.raises(ValueError, match="iters"):
        spectral_radius(fz, z, iters=0)
    with pytest.raises(ValueError, match="spectral_radius_penalty: iters"):
        spectral_radius_penalty(fz, z, 0.5, iters=0)
    with pytest.raises(ValueError, match="target"):
        spectral_radius_penalty(fz, z, -0.1)


def tight_deq(**options):
    """A DEQ on :class:`TanhMap` solved to 1e-12, with 300 power iterations per spectral estimate."""
    return DEQ(TanhMap(), tol=1e-12, max_iter=200, spectral_radius_iters=300, **options)


def test_deq_adds_the_jacobian_term_every_k_training_forwards():
    torch.manual_seed(0)
    deq = tight_deq(jac_reg_weight=0.5, jac_reg_every=2, spectral_radius_every=1)
    x = torch.randn(4, 5, dtype=torch.float64)
    torch.manual_seed(3)
    deq(x)
    term = deq.auxiliary_loss()
    # the same probe, drawn from the same global stream, on the exact Jacobian at z*
    z_star = deq.solve(x).z
    J = exact_jacobian(lambda z: deq.f(z, x), z_star)
    torch.manual_seed(3)
    v = (2 * torch.randint(0, 2, z_star.shape) - 1).double().reshape(-1)
    assert term.item() == pytest.approx(0.5 * (v @ J).square().sum().item() / 20, rel=1e-8)
    term.backward()
    assert deq.f.lin.weight.grad is not None and deq.auxiliary_loss() is None  # consumed
    deq(x)
    assert deq.auxiliary_loss() is None  # second forward: not due (every 2)
    deq.eval()
    with torch.no_grad():
        deq(x)
    assert deq.auxiliary_loss() is None  # never in evaluation
    stats = deq.epoch_stats()
    rho = torch.linalg.eigvals(J).abs().max().item()
    assert stats["spectral_radius_max"] == pytest.approx(rho, rel=1e-4)  # both training forwards
    assert stats["jac_frobenius_mean"] == pytest.approx(term.item() / 0.5, rel=1e-12)
    assert "spectral_radius_mean" not in deq.epoch_stats()  # forgotten
    with pytest.raises(ValueError, match="jac_reg"):
        DEQ(TanhMap(), jac_reg_weight=-1.0)


def test_deq_adds_the_spectral_penalty_and_logs_its_estimate():
    torch.manual_seed(0)
    deq = tight_deq(spectral_reg_weight=2.0, spectral_reg_target=0.0)
    x = torch.randn(4, 5, dtype=torch.float64)
    deq(x)
    term = deq.auxiliary_loss()
    z_star = deq.solve(x).z
    J = exact_jacobian(lambda z: deq.f(z, x), z_star)
    rho = torch.linalg.eigvals(J).abs().max().item()
    assert term.item() == pytest.approx(2.0 * rho**2, rel=1e-6)
    term.backward()
    assert deq.f.lin.weight.grad.norm().item() > 0
    assert deq.epoch_stats()["spectral_radius_max"] == pytest.approx(rho, rel=1e-4)
    above = tight_deq(spectral_reg_weight=2.0, spectral_reg_target=rho + 0.1)
    above.load_state_dict(deq.state_dict())
    above(x)
    assert above.auxiliary_loss().item() == 0.0
    assert "spectral_reg_target=0" in repr(deq)
    for bad in ({"spectral_reg_weight": -1.0}, {"spectral_reg_target": -0.5}):
        with pytest.raises(ValueError, match="spectral_reg"):
            DEQ(TanhMap(), **bad)


def test_training_loop_adds_the_auxiliary_loss_and_logs_jacobian_stats(tmp_path):
    """revgnn-train composition, local backend, DEQ-GNN: the loss of a step is the task loss plus the
    Jacobian term (batch share), and metrics.csv carries the per-epoch Jacobian statistics."""
    from conftest import compose_train

    from revgnn.engine.loop import train

    base = [
        "data.num_nodes=300",
        "data.window=5",
        "data.avg_degree=6",
        "data.max_hops=2",
        "trainer.epochs=1",
        "trainer.train_parts=2",
        "trainer.eval_every=1",
        "model=deq_gnn",
        "model.hidden_channels=8",
        "model.max_iter=40",
        "seed=3",
    ]
    reg = train(
        compose_train(
            tmp_path,
            *base,
            "model.jac_reg_weight=1000.0",
            "model.spectral_radius_every=1",
            "model.spectral_radius_iters=5",
        )
    )
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    jac = float(rows[0]["deq_jac_frobenius_mean"])
    assert jac > 0 and float(rows[0]["deq_spectral_radius_max"]) > 0
    assert reg["deq_jac_frobenius_mean"] == jac
    # the epoch's loss is the task loss plus 1000 * ||J||_F^2/d (averaged over its steps)
    assert float(rows[0]["loss"]) > 500 * jac


def test_deq_gnn_layer_twice_differentiable_map_is_the_same_map():
    """The plain path used for the Jacobian term computes the fused kernels' function and Jacobian."""
    from revgnn.models.deq_gnn import DEQGNNLayer
    from revgnn.nn.graph_input import sort_edges

    torch.manual_seed(0)
    layer = DEQGNNLayer(6, edge_channels=3).double()
    n = 15
    edge_index, edge_attr = sort_edges(
        torch.randint(0, n, (2, 50)), torch.rand(50, 3, dtype=torch.float64), n
    )
    x = torch.randn(n, 6, dtype=torch.float64)
    mask = (torch.rand(n, 6) > 0.3).double() / 0.7
    z = torch.randn(n, 6, dtype=torch.float64, requires_grad=True)
    fast = layer(z, x, edge_index, edge_attr, mask)
    slow = layer.twice_differentiable(z, x, edge_index, edge_attr, mask)
    assert torch.allclose(fast, slow, rtol=0, atol=1e-12)
    v = torch.randn_like(fast)
    (g_fast,) = torch.autograd.grad(fast, z, v)
    (g_slow,) = torch.autograd.grad(slow, z, v, create_graph=True)
    assert torch.allclose(g_fast, g_slow, rtol=0, atol=1e-12)
    g_slow.square().sum().backward()  # the second derivative exists
    assert layer.convs[0].conv.mlp[0].weight.grad is not None
    with pytest.raises(TypeError, match="second derivative"):  # e.g. a distributed SAR graph
        layer.twice_differentiable(z, x, object(), edge_attr, mask)


def test_train_step_adds_each_batch_share_of_the_auxiliary_loss():
    """The loop's one mechanism, exactly: loss = sum over batches of task share + aux * count / total,
    and the gradients are those of that sum (SGD with lr 1 exposes them)."""
    from types import SimpleNamespace

    from revgnn.engine.loop import train_step
    from revgnn.engine.run import Run
    from revgnn.engine.tasks import Batch, Step
    from revgnn.utils.optimizer import ModelOptimizer

    class Aux(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor([0.5, -1.0], dtype=torch.float64))
            self.calls = 0

        def auxiliary_loss(self, output_loss):
            self.calls += 1
            return self.w.square().sum() * self.calls + output_loss(
                torch.full((1,), 2.0, dtype=torch.float64)
            )

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.aux = Aux()

        def forward(self, x):
            return x @ self.aux.w

    model = Model()
    task = SimpleNamespace(loss=lambda logits, batch, total: logits.sum() / total)
    from revgnn.engine.tasks import OneWorker

    backend = OneWorker()  # one worker's collectives; no gradient reduction
    backend.reduce_gradients = None
    xs = [
        torch.tensor([[1.0, 2.0]], dtype=torch.float64),
        torch.tensor([[3.0, 1.0], [1.0, 1.0]], dtype=torch.float64),
    ]
    batches = [Batch((x,), None, None, x.size(0)) for x in xs]
    w0 = model.aux.w.detach().clone()
    opt = ModelOptimizer(model, lambda ps: torch.optim.SGD(ps, lr=1.0), flat=False)
    loss, _ = train_step(Run(model, task, opt, backend), Step(0, iter(batches), 3))
    # batch b (count c_b of 3): sum(x_b w)/3 + (b * |w|^2 + 2/c_b) * c_b/3
    expected = sum(
        (x @ w0).sum().item() / 3 + ((b + 1) * w0.square().sum().item() + 2.0 / x.size(0)) * x.size(0) / 3
        for b, x in enumerate(xs)
    )
    assert loss == pytest.approx(expected, rel=1e-14)
    grad = sum(x.sum(0) / 3 + (b + 1) * 2 * w0 * x.size(0) / 3 for b, x in enumerate(xs))
    assert torch.allclose(model.aux.w.detach(), w0 - grad, rtol=0, atol=1e-15)
