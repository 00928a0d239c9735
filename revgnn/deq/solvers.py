r"""Root solvers for deep equilibrium models.

Every solver looks for a fixed point :math:`\mathbf{z}^* = f(\mathbf{z}^*)` of a map given as a plain
Python callable, starting from :obj:`z0`. The *whole* tensor is one problem: the node-feature matrix
:math:`\mathbf{Z} \in \mathbb{R}^{N \times D}` of a graph is flattened into a single vector of length
:math:`ND` (not :math:`N` problems of length :math:`D`, which is slower and worse conditioned because the
nodes are coupled through the edges).

Residuals are measured on the flattened vector,

.. math::
    r_{\text{abs}}(\mathbf{z}) = \| f(\mathbf{z}) - \mathbf{z} \|_2, \qquad
    r_{\text{rel}}(\mathbf{z}) = \frac{\| f(\mathbf{z}) - \mathbf{z} \|_2}{\| f(\mathbf{z}) \|_2},

and a solver stops as soon as the residual selected by :obj:`stop_mode` is :math:`\le` :obj:`tol`.
It returns the *best* iterate seen (lowest residual; the residual reported is exactly that iterate's), with
the number of function evaluations, the residual trace and a converged flag, as a :class:`SolverResult`.
A non-finite value (NaN/inf) in :math:`f(\mathbf{z})` or in an iterate raises
:class:`SolverDivergenceError` immediately.

Example::

    >>> import torch
    >>> from revgnn.deq import get_solver
    >>> A = 0.5 * torch.eye(3)
    >>> res = get_solver("anderson")(lambda z: z @ A + 1.0, torch.zeros(4, 3), tol=1e-6)
    >>> res.converged, round(res.z[0, 0].item(), 4)
    (True, 2.0)
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List

import torch
from torch import Tensor

__all__ = [
    "SolverResult",
    "SolverDivergenceError",
    "fixed_point",
    "anderson",
    "broyden",
    "SOLVERS",
    "get_solver",
    "solver_options",
    "check_solver_options",
]

MapFn = Callable[[Tensor], Tensor]
STOP_MODES = ("abs", "rel")


class SolverDivergenceError(FloatingPointError):
    r"""Raised when :math:`f(\mathbf{z})` or an iterate contains NaN or inf."""


@dataclass
class SolverResult:
    r"""Outcome of a fixed-point solve.

    Attributes:
        z (Tensor): the best iterate (lowest residual), shaped like :obj:`z0`.
        steps (int): number of evaluations of :math:`f`.
        abs_residual (float): :math:`\|f(\mathbf{z}) - \mathbf{z}\|_2` of the returned :obj:`z`.
        rel_residual (float): :math:`\|f(\mathbf{z}) - \mathbf{z}\|_2 / \|f(\mathbf{z})\|_2` of :obj:`z`.
        trace (List[float]): the :obj:`stop_mode` residual after every evaluation.
        converged (bool): whether the returned :obj:`z` meets the tolerance.
        solver (str), stop_mode (str), tol (float): the settings used.
    """

    z: Tensor
    steps: int
    abs_residual: float
    rel_residual: float
    trace: List[float]
    converged: bool
    solver: str
    stop_mode: str
    tol: float
    fallbacks: int = 0

    @property
    def residual(self) -> float:
        r"""The residual in the solver's :obj:`stop_mode`."""
        return self.rel_residual if self.stop_mode == "rel" else self.abs_residual

    def summary(self, prefix: str = "") -> Dict[str, float]:
        r"""Flat, loggable numbers (no tensors): steps, residuals, converged (as 0/1)."""
        return {
            f"{prefix}steps": self.steps,
            f"{prefix}residual": self.residual,
            f"{prefix}abs_residual": self.abs_residual,
            f"{prefix}rel_residual": self.rel_residual,
            f"{prefix}converged": float(self.converged),
        }

    def __repr__(self) -> str:
        return (
            f"SolverResult(solver={self.solver}, steps={self.steps}, "
            f"{self.stop_mode}_residual={self.residual:.3e}, tol={self.tol:.1e}, "
            f"converged={self.converged})"
        )


@dataclass
class _Tracker:
    """Evaluates residuals, keeps the best iterate, checks finiteness and the stop rule."""

    name: str
    tol: float
    stop_mode: str
    trace: List[float] = field(default_factory=list)
    best_z: Tensor | None = None
    best_abs: float = math.inf
    best_rel: float = math.inf
    fallbacks: int = 0

    def update(self, z: Tensor, fz: Tensor) -> bool:
        """Record ``z`` (flat) with its image ``fz``; return True when the tolerance is met."""
        step = len(self.trace) + 1
        # Norms in float64 so that large-but-finite float32 states do not overflow to inf.
        fz_norm = torch.linalg.vector_norm(fz, dtype=torch.float64).item()
        abs_res = torch.linalg.vector_norm(fz - z, dtype=torch.float64).item()
        if not math.isfinite(fz_norm):
            what = "f(z)" if torch.isfinite(z).all() else "the iterate z"
            raise SolverDivergenceError(
                f"{self.name}: {what} contains NaN/inf at evaluation {step} "
                f"(residual trace so far: {_fmt(self.trace)}). The map is not contractive here: lower "
                "the learning rate, use damping, or enable a contraction guarantee."
            )
        if not math.isfinite(abs_res):
            raise SolverDivergenceError(
                f"{self.name}: the iterate z contains NaN/inf at evaluation {step} "
                f"(residual trace so far: {_fmt(self.trace)})."
            )
        rel_res = abs_res / max(fz_norm, torch.finfo(torch.float64).tiny)
        res = rel_res if self.stop_mode == "rel" else abs_res
        self.trace.append(res)
        if res < (self.best_rel if self.stop_mode == "rel" else self.best_abs):
            self.best_z, self.best_abs, self.best_rel = z, abs_res, rel_res
        return res <= self.tol

    def result(self, shape: torch.Size) -> SolverResult:
        best = self.best_rel if self.stop_mode == "rel" else self.best_abs
        return SolverResult(
            z=self.best_z.reshape(shape),
            steps=len(self.trace),
            abs_residual=self.best_abs,
            rel_residual=self.best_rel,
            trace=self.trace,
            converged=best <= self.tol,
            solver=self.name,
            stop_mode=self.stop_mode,
            tol=self.tol,
            fallbacks=self.fallbacks,
        )


def _fmt(trace: List[float]) -> str:
    shown = trace if len(trace) <= 6 else trace[:3] + trace[-3:]
    body = ", ".join(f"{r:.2e}" for r in shown)
    return f"[{body}{' ...' if len(trace) > 6 else ''}]"


def _check_common(name: str, z0: Tensor, max_iter: int, tol: float, stop_mode: str) -> None:
    if stop_mode not in STOP_MODES:
        raise ValueError(f"{name}: stop_mode must be one of {STOP_MODES}, got {stop_mode!r}")
    if int(max_iter) < 1:
        raise ValueError(f"{name}: max_iter must be >= 1, got {max_iter}")
    if not tol > 0:
        raise ValueError(f"{name}: tol must be > 0, got {tol}")
    if not torch.is_floating_point(z0):
        raise TypeError(f"{name}: z0 must be a floating-point tensor, got {z0.dtype}")
    if not torch.isfinite(z0).all():
        raise SolverDivergenceError(f"{name}: the initial guess z0 contains NaN/inf")


def _flat_map(f: MapFn, shape: torch.Size) -> MapFn:
    def F(x: Tensor) -> Tensor:
        out = f(x.view(shape))
        if out.shape != shape:
            raise ValueError(
                f"f must map a tensor of shape {tuple(shape)} to the same shape, got {tuple(out.shape)}"
            )
        return out.reshape(-1)

    return F


@torch.no_grad()
def fixed_point(
    f: MapFn,
    z0: Tensor,
    *,
    max_iter: int = 50,
    tol: float = 1e-4,
    stop_mode: str = "rel",
    damping: float = 1.0,
) -> SolverResult:
    r"""(Damped) fixed-point iteration,

    .. math::
        \mathbf{z}_{k+1} = (1 - \beta)\, \mathbf{z}_k + \beta f(\mathbf{z}_k).

    Converges linearly when :math:`f` is a contraction.

    Args:
        f (callable): the map; takes and returns tensors shaped like :obj:`z0`.
        z0 (Tensor): initial guess.
        max_iter (int, optional): maximum number of evaluations of :obj:`f`. (default: :obj:`50`)
        tol (float, optional): stop when the residual is :math:`\le` :obj:`tol`. (default: :obj:`1e-4`)
        stop_mode (str, optional): :obj:`"rel"` or :obj:`"abs"` residual. (default: :obj:`"rel"`)
        damping (float, optional): :math:`\beta \in (0, 1]`. (default: :obj:`1.0`)

    Example::

        >>> res = fixed_point(lambda z: 0.5 * z + 1.0, torch.zeros(3), tol=1e-6)
        >>> res.converged
        True
    """
    _check_common("fixed_point", z0, max_iter, tol, stop_mode)
    if not 0.0 < damping <= 1.0:
        raise ValueError(f"fixed_point: damping must be in (0, 1], got {damping}")
    shape, F = z0.shape, _flat_map(f, z0.shape)
    tracker = _Tracker("fixed_point", tol, stop_mode)
    x = z0.reshape(-1)
    for _ in range(int(max_iter)):
        fx = F(x)
        if tracker.update(x, fx):
            break
        x = fx if damping == 1.0 else torch.lerp(x, fx, damping)
    return tracker.result(shape)


@torch.no_grad()
def anderson(
    f: MapFn,
    z0: Tensor,
    *,
    max_iter: int = 50,
    tol: float = 1e-4,
    stop_mode: str = "rel",
    m: int = 5,
    lam: float = 1e-4,
    beta: float = 1.0,
) -> SolverResult:
    r"""Anderson acceleration (Walker & Ni, 2011; difference form).

    With residuals :math:`\mathbf{g}_k = f(\mathbf{z}_k) - \mathbf{z}_k` and the last :math:`m`
    differences :math:`\Delta\mathbf{Z} = [\mathbf{z}_{i+1} - \mathbf{z}_i]`,
    :math:`\Delta\mathbf{G} = [\mathbf{g}_{i+1} - \mathbf{g}_i]`,

    .. math::
        \boldsymbol{\gamma} &= \left(\Delta\mathbf{G}^\top \Delta\mathbf{G} + \lambda' \mathbf{I}\right)^{-1}
        \Delta\mathbf{G}^\top \mathbf{g}_k, \qquad
        \lambda' = \lambda \cdot \tfrac{1}{m_k} \operatorname{tr}(\Delta\mathbf{G}^\top \Delta\mathbf{G}),

        \mathbf{z}_{k+1} &= \mathbf{z}_k + \beta \mathbf{g}_k - (\Delta\mathbf{Z} + \beta\,\Delta\mathbf{G})
        \boldsymbol{\gamma}.

    The ridge :math:`\lambda'` is scaled to the problem (the Gram matrix shrinks with the residual, so a
    fixed ridge would either do nothing early or dominate late). If the small :math:`m \times m` system is
    still singular or yields NaN/inf, the history is dropped and a plain damped fixed-point step is taken
    (counted in :obj:`SolverResult.fallbacks`).

    Args:
        f (callable): the map; takes and returns tensors shaped like :obj:`z0`.
        z0 (Tensor): initial guess.
        max_iter (int, optional): maximum number of evaluations of :obj:`f`. (default: :obj:`50`)
        tol (float, optional): residual tolerance. (default: :obj:`1e-4`)
        stop_mode (str, optional): :obj:`"rel"` or :obj:`"abs"`. (default: :obj:`"rel"`)
        m (int, optional): history size. (default: :obj:`5`)
        lam (float, optional): relative ridge :math:`\lambda \ge 0`. (default: :obj:`1e-4`)
        beta (float, optional): mixing/damping :math:`\beta > 0`. (default: :obj:`1.0`)

    Example::

        >>> res = anderson(lambda z: torch.cos(z), torch.zeros(3), tol=1e-8)
        >>> round(res.z[0].item(), 6)
        0.739085
    """
    _check_common("anderson", z0, max_iter, tol, stop_mode)
    if int(m) < 1:
        raise ValueError(f"anderson: m must be >= 1, got {m}")
    if lam < 0:
        raise ValueError(f"anderson: lam must be >= 0, got {lam}")
    if not beta > 0:
        raise ValueError(f"anderson: beta must be > 0, got {beta}")
    m = int(m)
    shape, F = z0.shape, _flat_map(f, z0.shape)
    tracker = _Tracker("anderson", tol, stop_mode)
    x = z0.reshape(-1)
    n = x.numel()
    dX = x.new_zeros(n, m)  # circular buffers; column order is irrelevant to the least squares
    dG = x.new_zeros(n, m)
    count = 0
    x_prev = g_prev = None
    for _ in range(int(max_iter)):
        fx = F(x)
        g = fx - x
        if tracker.update(x, fx):
            break
        if g_prev is not None:
            slot = count % m
            dX[:, slot] = x - x_prev
            dG[:, slot] = g - g_prev
            count += 1
        x_prev, g_prev = x, g
        k = min(count, m)
        step = None
        if k > 0:
            DG, DX = dG[:, :k], dX[:, :k]
            gram = (DG.T @ DG).double()
            rhs = (DG.T @ g).double()
            ridge = lam * gram.diagonal().mean() + torch.finfo(torch.float64).tiny
            try:
                gamma = torch.linalg.solve(
                    gram + ridge * torch.eye(k, dtype=gram.dtype, device=gram.device), rhs
                )
            except RuntimeError:  # singular despite the ridge (e.g. lam == 0, zero differences)
                gamma = None
            if gamma is not None and torch.isfinite(gamma).all():
                gamma = gamma.to(x.dtype)
                step = beta * g - (DX + beta * DG) @ gamma
                if not torch.isfinite(step).all():
                    step = None
        if step is None:
            if k > 0:
                tracker.fallbacks += 1
                count = 0  # drop the history: it produced nothing usable
            step = beta * g
        x = x + step
    return tracker.result(shape)


@torch.no_grad()
def broyden(
    f: MapFn, z0: Tensor, *, max_iter: int = 50, tol: float = 1e-4, stop_mode: str = "rel", memory: int = 20
) -> SolverResult:
    r"""Limited-memory ("good") Broyden's method on :math:`\mathbf{g}(\mathbf{z}) = f(\mathbf{z}) -
    \mathbf{z} = \mathbf{0}`.

    An approximation :math:`\mathbf{B}_k \approx \mathbf{J}_g^{-1}` starts at :math:`-\mathbf{I}` (so the
    first step is a fixed-point step) and receives rank-one updates

    .. math::
        \mathbf{z}_{k+1} &= \mathbf{z}_k - \mathbf{B}_k \mathbf{g}_k,

        \mathbf{B}_{k+1} &= \mathbf{B}_k + \frac{(\Delta\mathbf{z} - \mathbf{B}_k \Delta\mathbf{g})\,
        \Delta\mathbf{z}^\top \mathbf{B}_k}{\Delta\mathbf{z}^\top \mathbf{B}_k \Delta\mathbf{g}},

    stored as :math:`\mathbf{B}_k = -\mathbf{I} + \mathbf{U}\mathbf{V}^\top`. At most :obj:`memory` rank-one
    terms are kept; when the history is full the method restarts from :math:`-\mathbf{I}` (each term was
    built on top of the earlier ones, so overwriting only the oldest would leave an inconsistent
    :math:`\mathbf{B}` that can diverge). Cost per step and memory stay bounded by
    :math:`O(\text{memory} \cdot N D)` however many iterations run. An update whose denominator vanishes
    is skipped; a step that is not finite drops the history and falls back to a fixed-point step.

    Args:
        f (callable): the map; takes and returns tensors shaped like :obj:`z0`.
        z0 (Tensor): initial guess.
        max_iter (int, optional): maximum number of evaluations of :obj:`f`. (default: :obj:`50`)
        tol (float, optional): residual tolerance. (default: :obj:`1e-4`)
        stop_mode (str, optional): :obj:`"rel"` or :obj:`"abs"`. (default: :obj:`"rel"`)
        memory (int, optional): maximum number of stored rank-one updates. (default: :obj:`20`)

    Example::

        >>> res = broyden(lambda z: torch.cos(z), torch.zeros(3), tol=1e-8)
        >>> round(res.z[0].item(), 6)
        0.739085
    """
    _check_common("broyden", z0, max_iter, tol, stop_mode)
    if int(memory) < 1:
        raise ValueError(f"broyden: memory must be >= 1, got {memory}")
    memory = int(memory)
    shape, F = z0.shape, _flat_map(f, z0.shape)
    tracker = _Tracker("broyden", tol, stop_mode)
    x = z0.reshape(-1)
    n = x.numel()
    U = x.new_zeros(n, memory)
    V = x.new_zeros(n, memory)
    count = 0

    def B(v: Tensor) -> Tensor:  # B v
        return -v if count == 0 else -v + U[:, :count] @ (V[:, :count].T @ v)

    def Bt(v: Tensor) -> Tensor:  # B^T v
        return -v if count == 0 else -v + V[:, :count] @ (U[:, :count].T @ v)

    g = dx = None
    for _ in range(int(max_iter)):
        if g is not None:
            x_new = x + dx
        else:
            x_new = x
        fx = F(x_new)
        g_new = fx - x_new
        if tracker.update(x_new, fx):
            break
        if g is not None:
            dg = g_new - g
            Bdg = B(dg)
            den = torch.dot(dx, Bdg)
            scale = torch.linalg.vector_norm(dx) * torch.linalg.vector_norm(Bdg)
            if den.abs() > 1e-10 * scale and torch.isfinite(den):
                if count == memory:  # restart: dropping only the oldest term would corrupt B
                    count = 0
                U[:, count] = (dx - Bdg) / den
                V[:, count] = Bt(dx)
                count += 1
        x, g = x_new, g_new
        dx = -B(g)
        if not torch.isfinite(dx).all():
            tracker.fallbacks += 1
            count = 0
            dx = g
    return tracker.result(shape)


SOLVERS: Dict[str, Callable[..., SolverResult]] = {
    "fixed_point": fixed_point,
    "anderson": anderson,
    "broyden": broyden,
}


def get_solver(name: str) -> Callable[..., SolverResult]:
    r"""Return the solver registered as :obj:`name` (one of :obj:`SOLVERS`)."""
    try:
        return SOLVERS[name]
    except KeyError:
        raise ValueError(f"unknown solver {name!r}; available: {sorted(SOLVERS)}") from None


def solver_options(name: str) -> List[str]:
    r"""Keyword options accepted by solver :obj:`name`."""
    sig = inspect.signature(get_solver(name))
    return [p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]


def check_solver_options(name: str, options: Dict[str, object]) -> None:
    r"""Raise :class:`TypeError` if :obj:`options` holds a key that solver :obj:`name` does not accept.

    Unknown keys are never ignored silently: a misspelt option would otherwise change nothing.
    """
    valid = solver_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise TypeError(f"unknown option(s) {unknown} for solver {name!r}; valid options: {valid}")
