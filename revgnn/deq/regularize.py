r"""Keeping an equilibrium model solvable while it trains: Jacobian estimates at the fixed point.

The solvers converge fast when :math:`\mathbf{J} = \partial f/\partial\mathbf{z}` at
:math:`\mathbf{z}^*` is small: fixed-point iteration contracts by the spectral radius
:math:`\rho(\mathbf{J})` per step, and the adjoint equation of the implicit gradient has the same
Jacobian. Bai et al. ("Stabilizing Equilibrium Models by Jacobian Regularization", ICML 2021) add
:math:`\gamma \|\mathbf{J}\|_F^2 / d` to the training loss (:math:`d` the size of the state), estimated
without forming :math:`\mathbf{J}` by Hutchinson's trace estimator,

.. math::
    \|\mathbf{J}\|_F^2 = \operatorname{tr}(\mathbf{J}\mathbf{J}^\top)
    = \mathbb{E}_{\mathbf{v}}\left[\|\mathbf{v}^\top \mathbf{J}\|_2^2\right]
    \approx \frac{1}{K} \sum_{k=1}^{K} \|\mathbf{v}_k^\top \mathbf{J}\|_2^2,
    \qquad \mathbb{E}[\mathbf{v}\mathbf{v}^\top] = \mathbf{I},

one vector-Jacobian product per probe :math:`\mathbf{v}_k` (Rademacher :math:`\pm 1` or standard
Gaussian entries). :func:`spectral_radius` estimates :math:`\rho(\mathbf{J})` by power iteration with the
same products, for monitoring (:func:`power_iteration` also returns the dominant eigenvector), and
:func:`spectral_radius_penalty` turns it into a loss term that acts only above a target,
:math:`\gamma_\rho \max(0, \hat\rho - \rho_0)^2`.

Example::

    >>> import torch
    >>> A = torch.tensor([[0.5, 0.2], [0.0, 0.3]], dtype=torch.float64)
    >>> z = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    >>> fz = A @ z                                   # J = A, ||A||_F^2 = 0.38, rho(A) = 0.5
    >>> round(spectral_radius(fz, z, iters=100), 6)
    0.5
    >>> v, rho = power_iteration(fz, z, iters=100)  # v: the dominant eigenvector of A^T, (1, 1) / sqrt(2)
    >>> [round(x, 6) for x in v.abs().tolist()], round(rho, 6)
    ([0.707107, 0.707107], 0.5)
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

__all__ = ["PROBES", "jacobian_frobenius", "power_iteration", "spectral_radius", "spectral_radius_penalty"]

PROBES = ("rademacher", "gaussian")


def _probe(like: Tensor, distribution: str, generator: Optional[torch.Generator]) -> Tensor:
    if distribution == "rademacher":
        bits = torch.randint(0, 2, like.shape, generator=generator, device=like.device)
        return (2 * bits - 1).to(like.dtype)
    return torch.randn(like.shape, generator=generator, dtype=like.dtype, device=like.device)


def _vjp(fz: Tensor, z: Tensor, v: Tensor, create_graph: bool) -> Tensor:
    (g,) = torch.autograd.grad(fz, z, v, retain_graph=True, create_graph=create_graph)
    return g


def jacobian_frobenius(
    fz: Tensor,
    z: Tensor,
    probes: int = 1,
    distribution: str = "rademacher",
    generator: Optional[torch.Generator] = None,
    create_graph: bool = True,
) -> Tensor:
    r"""Hutchinson estimate :math:`\frac{1}{K}\sum_k \|\mathbf{v}_k^\top \mathbf{J}\|_2^2` of
    :math:`\|\partial f/\partial\mathbf{z}\|_F^2` (unbiased for any :math:`K \ge 1`).

    Args:
        fz (Tensor): :math:`f(\mathbf{z})`, computed with autograd from :obj:`z`.
        z (Tensor): the point (requires grad), shaped like :obj:`fz`.
        probes (int, optional): number of probes :math:`K`. (default: :obj:`1`)
        distribution (str, optional): :obj:`"rademacher"` or :obj:`"gaussian"` probe entries; Rademacher
            has the lower variance, :math:`2(\|\mathbf{J}\mathbf{J}^\top\|_F^2 - \sum_i
            (\mathbf{J}\mathbf{J}^\top)_{ii}^2)/K` against :math:`2\|\mathbf{J}\mathbf{J}^\top\|_F^2/K`.
            (default: :obj:`"rademacher"`)
        generator (torch.Generator, optional): source of the probes. (default: :obj:`None`)
        create_graph (bool, optional): keep the graph so that the estimate can be differentiated
            (needed to use it as a loss term). (default: :obj:`True`)

    Returns:
        A scalar tensor.
    """
    if distribution not in PROBES:
        raise ValueError(f"jacobian_frobenius: distribution must be one of {PROBES}, got {distribution!r}")
    if int(probes) < 1:
        raise ValueError(f"jacobian_frobenius: probes must be >= 1, got {probes}")
    if fz.shape != z.shape:
        raise ValueError(
            f"jacobian_frobenius: f(z) {tuple(fz.shape)} and z {tuple(z.shape)} must have the same shape"
        )
    total = fz.new_zeros(())
    for _ in range(int(probes)):
        g = _vjp(fz, z, _probe(fz, distribution, generator), create_graph)
        total = total + g.square().sum()
    return total / int(probes)


def _power_iteration(fz: Tensor, z: Tensor, iters: int, generator: Optional[torch.Generator]):
    """``iters`` normalised products ``v <- J^T v / ||J^T v||`` from a Gaussian start (no graph kept);
    returns the last ``v`` and the log of each growth factor, or ``(None, logs)`` when ``J^T v = 0``."""
    v = _probe(fz, "gaussian", generator)
    v = v / torch.linalg.vector_norm(v)
    log_growth = []
    for _ in range(iters):
        w = _vjp(fz, z, v, create_graph=False)
        norm = torch.linalg.vector_norm(w, dtype=torch.float64).item()
        if not math.isfinite(norm):
            raise FloatingPointError("spectral_radius: the vector-Jacobian product is not finite")
        if norm == 0.0:
            return None, log_growth  # v is in the null space of J^T; ||J^T v_k|| cannot grow again
        log_growth.append(math.log(norm))
        v = w / norm
    return v, log_growth


def _tail_mean(log_growth) -> float:
    tail = log_growth[len(log_growth) // 2 :]
    return math.exp(sum(tail) / len(tail))


def _check_iters(iters, where: str) -> int:
    if int(iters) < 1:
        raise ValueError(f"{where}: iters must be >= 1, got {iters}")
    return int(iters)


def power_iteration(
    fz: Tensor, z: Tensor, iters: int = 20, generator: Optional[torch.Generator] = None
) -> Tuple[Optional[Tensor], float]:
    r"""The dominant eigenvector of :math:`\mathbf{J}^\top = (\partial f/\partial\mathbf{z})^\top` and
    the :func:`spectral_radius` estimate, from the same :math:`K` power iterations.

    :func:`spectral_radius` returns the estimate alone; this also returns the unit vector
    :math:`\mathbf{v}_K` (shaped like :obj:`z`), which converges to the dominant eigenvector of
    :math:`\mathbf{J}^\top` (a left eigenvector of :math:`\mathbf{J}`) when one real eigenvalue dominates:
    where it lives, e.g. on how many nodes of a graph map, is where the solver's slowest direction lives.

    Args:
        fz (Tensor): :math:`f(\mathbf{z})`, computed with autograd from :obj:`z`.
        z (Tensor): the point (requires grad).
        iters (int, optional): number of products :math:`K \ge 1`. (default: :obj:`20`)
        generator (torch.Generator, optional): source of the start vector. (default: :obj:`None`)

    Returns:
        :math:`\mathbf{v}_K` (no graph) and the estimate of :math:`\rho` (float), or ``(None, 0.0)``
        when some :math:`\mathbf{J}^\top\mathbf{v}_k` is exactly zero (:math:`\mathbf{v}_k` in its null
        space).
    """
    return _power_iteration_estimate(fz, z, _check_iters(iters, "power_iteration"), generator)


def _power_iteration_estimate(fz: Tensor, z: Tensor, iters: int, generator: Optional[torch.Generator]):
    with torch.enable_grad():
        v, log_growth = _power_iteration(fz, z, iters, generator)
    return v, (0.0 if v is None else _tail_mean(log_growth))


def spectral_radius(
    fz: Tensor, z: Tensor, iters: int = 20, generator: Optional[torch.Generator] = None
) -> float:
    r"""Power-iteration estimate of the spectral radius :math:`\rho(\partial f/\partial\mathbf{z})`.

    Iterates :math:`\mathbf{v}_{k+1} = \mathbf{J}^\top \mathbf{v}_k / \|\mathbf{J}^\top \mathbf{v}_k\|`
    (vector-Jacobian products; :math:`\mathbf{J}^\top` has the spectrum of :math:`\mathbf{J}`) from a
    Gaussian start and returns the geometric mean of the growth factors
    :math:`\|\mathbf{J}^\top \mathbf{v}_k\|` over the second half of the iterations,
    :math:`\big(\prod_{k > K/2} \|\mathbf{J}^\top\mathbf{v}_k\|\big)^{1/(K - \lfloor K/2 \rfloor)}`:
    the last factor alone converges to :math:`\rho` when one real eigenvalue dominates; the mean also
    when the dominant pair is complex (the factors then oscillate around :math:`\rho`). The error falls
    like :math:`(|\lambda_2|/\rho)^{K/2}`.

    Args:
        fz (Tensor): :math:`f(\mathbf{z})`, computed with autograd from :obj:`z`.
        z (Tensor): the point (requires grad).
        iters (int, optional): number of products :math:`K \ge 1`. (default: :obj:`20`)
        generator (torch.Generator, optional): source of the start vector. (default: :obj:`None`)
    """
    return _power_iteration_estimate(fz, z, _check_iters(iters, "spectral_radius"), generator)[1]


def spectral_radius_penalty(
    fz: Tensor,
    z: Tensor,
    target: float,
    iters: int = 20,
    generator: Optional[torch.Generator] = None,
    fz_graph: Optional[Tensor] = None,
) -> Tuple[Tensor, float]:
    r"""Differentiable hinge on the spectral radius, :math:`\max(0, \hat\rho - \rho_0)^2` with
    :math:`\hat\rho = \|\mathbf{J}^\top \mathbf{v}_K\|_2` and :math:`\mathbf{v}_K` the unit vector
    after :math:`K` power iterations (as in :func:`spectral_radius`, held constant in the gradient).

    Why besides the Frobenius norm: convergence is set by the worst direction, and in a graph map that
    direction can live on a handful of nodes, where :math:`\|\mathbf{J}\|_F^2/d`, an average over all
    :math:`d` entries, hardly sees it (measured on DEQ-GNN in ``docs/bench/deq.md``). The hinge leaves
    the map free while :math:`\hat\rho \le \rho_0`.

    Args:
        fz (Tensor): :math:`f(\mathbf{z})`, computed with autograd from :obj:`z` (used for the power
            iterations, differentiated once).
        z (Tensor): the point (requires grad).
        target (float): :math:`\rho_0 \ge 0`.
        iters (int, optional): power iterations :math:`K \ge 1`. (default: :obj:`20`)
        generator (torch.Generator, optional): source of the start vector. (default: :obj:`None`)
        fz_graph (Tensor, optional): the same :math:`f(\mathbf{z})` through operations that can be
            differentiated twice, for the last product (default: :obj:`fz`).

    Returns:
        The penalty (a scalar tensor with a graph) and the power-iteration estimate of :math:`\rho`
        (float, the :func:`spectral_radius` estimate including the last product).
    """
    iters = _check_iters(iters, "spectral_radius_penalty")
    if target < 0:
        raise ValueError(f"spectral_radius_penalty: target must be >= 0, got {target}")
    with torch.enable_grad():
        v, log_growth = _power_iteration(fz, z, iters, generator)
        if v is None:
            return fz.new_zeros(()), 0.0
        rho_hat = torch.linalg.vector_norm(_vjp(fz if fz_graph is None else fz_graph, z, v, True))
    log_growth.append(math.log(max(rho_hat.item(), 1e-300)))
    return torch.relu(rho_hat - target).square(), _tail_mean(log_growth)
