r"""Root solvers for deep equilibrium models.

Every solver looks for a fixed point :math:`\mathbf{z}^* = f(\mathbf{z}^*)` of a map given as a plain
Python callable, starting from :obj:`z0`. By default the *whole* tensor is one problem: the node-feature
matrix :math:`\mathbf{Z} \in \mathbb{R}^{N \times D}` of a graph is flattened into a single vector of
length :math:`ND` (not :math:`N` problems of length :math:`D`, which is slower and worse conditioned
because the nodes are coupled through the edges).

Residuals are measured on the flattened vector,

.. math::
    r_{\text{abs}}(\mathbf{z}) = \| f(\mathbf{z}) - \mathbf{z} \|_2, \qquad
    r_{\text{rel}}(\mathbf{z}) = \frac{\| f(\mathbf{z}) - \mathbf{z} \|_2}{\| f(\mathbf{z}) \|_2},

and a solver stops as soon as the residual selected by :obj:`stop_mode` is :math:`\le` :obj:`tol`.
It returns the *best* iterate seen (lowest residual; the residual reported is exactly that iterate's), with
the number of function evaluations, the residual trace and a converged flag, as a :class:`SolverResult`.
A non-finite value (NaN/inf) in :math:`f(\mathbf{z})` or in an iterate raises
:class:`SolverDivergenceError` immediately.

**Many graphs in one batch.** With :obj:`batch` (the graph id :math:`b_i \in \{0, \ldots, G-1\}` of each
row :math:`i` of :obj:`z0`, as in PyG), the rows of graph :math:`g` form their own problem
:math:`\mathbf{z}_g`: residuals, the best iterate, the stop rule and the solver's mixing (Anderson's
coefficients :math:`\boldsymbol{\gamma}_g`, Broyden's rank-one updates) are per graph, and a graph that
has met its tolerance is frozen (its rows are not iterated further) while the others go on. The map is
still evaluated on the whole batch at once. For a map that does not couple the graphs (a GNN on disjoint
graphs), each graph's iterates are those of solving it alone; the result reports the number of
evaluations each graph needed (:attr:`SolverResult.graph_steps`) and its residual.

New solvers join the registry with :func:`register_solver`.

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
from typing import Annotated, Callable, Dict, List, Literal, Optional, Sequence, Tuple

import torch
from torch import Tensor

from revgnn.utils.ranges import Range
from revgnn.utils.registry import Registry
from revgnn.utils.signature import check_call, check_types, keyword_parameters

__all__ = [
    "SolverResult",
    "SolverDivergenceError",
    "fixed_point",
    "anderson",
    "broyden",
    "SOLVERS",
    "get_solver",
    "register_solver",
    "solver_options",
    "check_solver_options",
]

MapFn = Callable[[Tensor], Tensor]
#: Keyword-only options every registered solver must accept.
REQUIRED_OPTIONS = ("max_iter", "tol", "stop_mode")
#: Anderson switches a graph to its Type I coefficients while its last step left the residual norm above
#: this fraction of the one before (see :func:`anderson`).
_STALL = 0.9


class SolverDivergenceError(FloatingPointError):
    r"""Raised when :math:`f(\mathbf{z})` or an iterate contains NaN or inf."""


@dataclass
class SolverResult:
    r"""Outcome of a fixed-point solve.

    Attributes:
        z (Tensor): the best iterate (lowest residual; per graph with :obj:`batch`), shaped like :obj:`z0`.
        steps (int): number of evaluations of :math:`f`.
        abs_residual (float): :math:`\|f(\mathbf{z}) - \mathbf{z}\|_2` of the returned :obj:`z` (with
            :obj:`batch`: the largest over graphs).
        rel_residual (float): :math:`\|f(\mathbf{z}) - \mathbf{z}\|_2 / \|f(\mathbf{z})\|_2` of :obj:`z`
            (with :obj:`batch`: the largest over graphs).
        trace (List[float]): the :obj:`stop_mode` residual after every evaluation (the largest over
            graphs).
        converged (bool): whether the returned :obj:`z` meets the tolerance (every graph).
        solver (str), stop_mode (str), tol (float): the settings used.
        fallbacks (int): steps where the accelerated update was unusable and a plain step was taken.
        graph_steps (Tensor, optional): ``[G]`` evaluations each graph took until it converged (or
            :obj:`steps`); :obj:`None` without :obj:`batch`.
        graph_residual (Tensor, optional): ``[G]`` float64 :obj:`stop_mode` residual of each graph's
            returned iterate; :obj:`None` without :obj:`batch`.
        iterates (Dict[int, Tensor]): the iterates :math:`\mathbf{z}_k` at the evaluations :math:`k` asked
            for by :obj:`keep` (1-based, shaped like :obj:`z0`), for fixed-point correction.
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
    graph_steps: Optional[Tensor] = None
    graph_residual: Optional[Tensor] = None
    iterates: Dict[int, Tensor] = field(default_factory=dict)

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
        graphs = "" if self.graph_steps is None else f", graphs={self.graph_steps.numel()}"
        return (
            f"SolverResult(solver={self.solver}, steps={self.steps}, "
            f"{self.stop_mode}_residual={self.residual:.3e}, tol={self.tol:.1e}, "
            f"converged={self.converged}{graphs})"
        )


class _Problem:
    """The state as rows ``[N, R]`` grouped into graphs (one row and one graph without ``batch``):
    per-graph sums, residuals, the best iterate, the stop rule, frozen graphs and kept iterates."""

    def __init__(self, name: str, z0: Tensor, batch: Optional[Tensor], tol: float, stop_mode: str, keep):
        self.name, self.tol, self.stop_mode, self.shape = name, tol, stop_mode, z0.shape
        if batch is None:
            self.rows = z0.reshape(1, -1)
            self.batch = torch.zeros(1, dtype=torch.long, device=z0.device)
            self.num_graphs, self.batched = 1, False
        else:
            if batch.dim() != 1 or batch.dtype not in (torch.int32, torch.int64):
                raise TypeError(f"{name}: batch must be a 1-D integer tensor of graph ids, got {batch.dtype}")
            if z0.dim() < 1 or batch.numel() != z0.size(0):
                raise ValueError(
                    f"{name}: batch has {batch.numel()} entries but z0 has {z0.size(0) if z0.dim() else 0} "
                    "rows: give one graph id per row (dim 0) of z0"
                )
            if batch.numel() and int(batch.min()) < 0:
                raise ValueError(f"{name}: batch holds negative graph ids")
            self.rows = z0.reshape(z0.size(0), -1)
            self.batch = batch.to(device=z0.device, dtype=torch.long)
            self.num_graphs, self.batched = (int(self.batch.max()) + 1 if batch.numel() else 0), True
        G = self.num_graphs
        self.active = torch.ones(G, dtype=torch.bool, device=z0.device)
        self.graph_steps = torch.zeros(G, dtype=torch.long)
        self.best_abs = torch.full((G,), math.inf, dtype=torch.float64, device=z0.device)
        self.best_rel = torch.full((G,), math.inf, dtype=torch.float64, device=z0.device)
        self.abs_res = torch.full((G,), math.inf, dtype=torch.float64, device=z0.device)  # latest update's
        self.best_z = self.rows.clone()
        self.trace: List[float] = []
        self.fallbacks = 0
        self.keep = set(int(k) for k in keep)
        self.iterates: Dict[int, Tensor] = {}

    # ---- per-graph reductions ---------------------------------------------------------------
    def graph_sum(self, per_row: Tensor) -> Tensor:
        """``[N, ...]`` -> ``[G, ...]``: the sum over each graph's rows."""
        out = per_row.new_zeros((self.num_graphs, *per_row.shape[1:]))
        return out.index_add_(0, self.batch, per_row)

    def dot(self, a: Tensor, b: Tensor) -> Tensor:
        """Per-graph inner products of row tensors ``[N, R]`` -> ``[G]``."""
        return self.graph_sum((a * b).sum(1))

    def rows_of(self, per_graph: Tensor) -> Tensor:
        """``[G, ...]`` -> ``[N, ...]``: each row gets its graph's entry."""
        return per_graph[self.batch]

    def active_rows(self) -> Tensor:
        return self.rows_of(self.active).unsqueeze(1)

    def frozen(self, new: Tensor, old: Tensor) -> Tensor:
        """``new`` on the rows of graphs still iterating, ``old`` on the converged ones."""
        return new if bool(self.active.all()) else torch.where(self.active_rows(), new, old)

    # ---- residuals, best iterate, stop rule -----------------------------------------------------
    def update(self, z: Tensor, fz: Tensor) -> bool:
        """Record iterate rows ``z`` with their image ``fz``; return True when every graph has met the
        tolerance."""
        step = len(self.trace) + 1
        if step in self.keep:
            self.iterates[step] = z.reshape(self.shape).clone()
        # Norms in float64 so that large-but-finite float32 states do not overflow to inf.
        fz_sq = self.graph_sum(torch.linalg.vector_norm(fz, dim=1, dtype=torch.float64).square())
        abs_res = self.graph_sum(torch.linalg.vector_norm(fz - z, dim=1, dtype=torch.float64).square()).sqrt()
        fz_norm = fz_sq.sqrt()
        if not bool(torch.isfinite(fz_norm).all()):
            what = "f(z)" if torch.isfinite(z).all() else "the iterate z"
            raise SolverDivergenceError(
                f"{self.name}: {what} contains NaN/inf at evaluation {step} "
                f"(residual trace so far: {_fmt(self.trace)}). The map is not contractive here: lower "
                "the learning rate, use damping, or enable a contraction guarantee."
            )
        if not bool(torch.isfinite(abs_res).all()):
            raise SolverDivergenceError(
                f"{self.name}: the iterate z contains NaN/inf at evaluation {step} "
                f"(residual trace so far: {_fmt(self.trace)})."
            )
        self.abs_res = abs_res
        rel_res = abs_res / fz_norm.clamp_min(torch.finfo(torch.float64).tiny)
        res = rel_res if self.stop_mode == "rel" else abs_res
        best = self.best_rel if self.stop_mode == "rel" else self.best_abs
        better = self.active & (res < best)
        if bool(better.all()):
            self.best_z.copy_(z)
        elif bool(better.any()):
            rows = self.rows_of(better)
            self.best_z[rows] = z[rows]
        self.best_abs = torch.where(better, abs_res, self.best_abs)
        self.best_rel = torch.where(better, rel_res, self.best_rel)
        self.trace.append(float(res.max()) if self.num_graphs else 0.0)
        self.graph_steps[self.active.cpu()] = step  # every graph still iterating took this evaluation
        self.active = self.active & (res > self.tol)
        return not bool(self.active.any())

    def result(self) -> SolverResult:
        best = self.best_rel if self.stop_mode == "rel" else self.best_abs
        G = self.num_graphs
        return SolverResult(
            z=self.best_z.reshape(self.shape),
            steps=len(self.trace),
            abs_residual=float(self.best_abs.max()) if G else 0.0,
            rel_residual=float(self.best_rel.max()) if G else 0.0,
            trace=self.trace,
            converged=bool((best <= self.tol).all()),
            solver=self.name,
            stop_mode=self.stop_mode,
            tol=self.tol,
            fallbacks=self.fallbacks,
            graph_steps=self.graph_steps if self.batched else None,
            graph_residual=best.cpu() if self.batched else None,
            iterates=self.iterates,
        )


def _fmt(trace: List[float]) -> str:
    shown = trace if len(trace) <= 6 else trace[:3] + trace[-3:]
    body = ", ".join(f"{r:.2e}" for r in shown)
    return f"[{body}{' ...' if len(trace) > 6 else ''}]"


def _check_common(solver: Callable[..., SolverResult], arguments: Dict[str, object], z0: Tensor) -> None:
    """The solver's own arguments against its signature (types, choices, ranges: the path the DEQ's
    and the config's checks take too), then what no annotation says about ``z0``."""
    name = solver.__name__
    check_call(solver, arguments, prefix=f"{name}: ")
    if not torch.is_floating_point(z0):
        raise TypeError(f"{name}: z0 must be a floating-point tensor, got {z0.dtype}")
    if not torch.isfinite(z0).all():
        raise SolverDivergenceError(f"{name}: the initial guess z0 contains NaN/inf")


def _row_map(f: MapFn, prob: _Problem) -> MapFn:
    shape, rows = prob.shape, prob.rows.shape

    def F(x: Tensor) -> Tensor:
        out = f(x.view(shape))
        if out.shape != shape:
            raise ValueError(
                f"f must map a tensor of shape {tuple(shape)} to the same shape, got {tuple(out.shape)}"
            )
        return out.reshape(rows)

    return F


@torch.no_grad()
def fixed_point(
    f: MapFn,
    z0: Tensor,
    *,
    max_iter: Annotated[int, Range(1)] = 50,
    tol: Annotated[float, Range(0, low_open=True)] = 1e-4,
    stop_mode: Literal["abs", "rel"] = "rel",
    damping: Annotated[float, Range(0, 1, low_open=True)] = 1.0,
    batch: Optional[Tensor] = None,
    keep: Sequence[int] = (),
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
        batch (LongTensor, optional): graph id of each row of :obj:`z0`: one problem per graph (see
            the module docstring). (default: :obj:`None`)
        keep (sequence of int, optional): evaluations :math:`k` whose iterate :math:`\mathbf{z}_k` to
            return in :attr:`SolverResult.iterates`. (default: :obj:`()`)

    Example::

        >>> res = fixed_point(lambda z: 0.5 * z + 1.0, torch.zeros(3), tol=1e-6)
        >>> res.converged
        True
    """
    _check_common(fixed_point, locals(), z0)
    prob = _Problem("fixed_point", z0, batch, tol, stop_mode, keep)
    F = _row_map(f, prob)
    x = prob.rows
    for _ in range(int(max_iter)):
        fx = F(x)
        if prob.update(x, fx):
            break
        x = prob.frozen(fx if damping == 1.0 else torch.lerp(x, fx, damping), x)
    return prob.result()


@torch.no_grad()
def _anderson_coefficients(
    prob, dX: Tensor, dG: Tensor, g: Tensor, k: Tensor, valid: Tensor, eye: Tensor, lam: float, stalled
) -> Tuple[Tensor, Tensor]:
    r""":func:`anderson`'s coefficients :math:`\boldsymbol{\gamma}_g` per graph (float64, zero where a
    graph's system is unusable) and whether each graph's Type II system was usable. ``k``: the
    differences each graph holds (columns ``valid``); ``stalled``: the graphs whose last step cut the
    residual by less than 10 % (Type I coefficients where their system is usable), or None."""
    mask = (valid[:, :, None] & valid[:, None, :]).double()
    unused = eye * (~valid)[:, :, None]  # identity rows, zero right-hand side -> coefficient 0
    tiny = torch.finfo(torch.float64).tiny
    # Type II (minimal residual): ridge-regularised least squares on the residual differences.
    gram = prob.graph_sum(torch.einsum("nri,nrj->nij", dG, dG)).double() * mask
    rhs = prob.graph_sum(torch.einsum("nri,nr->ni", dG, g)).double() * valid
    ridge = lam * gram.diagonal(dim1=1, dim2=2).sum(1) / k.clamp(min=1) + tiny
    gamma, info = torch.linalg.solve_ex(gram + eye * ridge[:, None, None] * valid[:, :, None] + unused, rhs)
    ok = (k > 0) & (info == 0) & torch.isfinite(gamma).all(1)
    gamma = torch.where(ok[:, None], gamma, 0.0)
    stalled = ok & stalled if stalled is not None else torch.zeros_like(ok)
    if bool(stalled.any()):
        cross = prob.graph_sum(torch.einsum("nri,nrj->nij", dX, dG)).double() * mask
        rhs1 = prob.graph_sum(torch.einsum("nri,nr->ni", dX, g)).double() * valid
        normal = cross.transpose(1, 2) @ cross
        ridge1 = lam * normal.diagonal(dim1=1, dim2=2).sum(1) / k.clamp(min=1) + tiny
        system1 = normal + eye * ridge1[:, None, None] * valid[:, :, None] + unused
        gamma1, info1 = torch.linalg.solve_ex(system1, (cross.transpose(1, 2) @ rhs1[:, :, None])[..., 0])
        use1 = stalled & (info1 == 0) & torch.isfinite(gamma1).all(1)
        gamma = torch.where(use1[:, None], gamma1, gamma)
    return gamma, ok


def anderson(
    f: MapFn,
    z0: Tensor,
    *,
    max_iter: Annotated[int, Range(1)] = 50,
    tol: Annotated[float, Range(0, low_open=True)] = 1e-4,
    stop_mode: Literal["abs", "rel"] = "rel",
    m: Annotated[int, Range(1)] = 5,
    lam: Annotated[float, Range(0)] = 1e-4,
    beta: Annotated[float, Range(0, low_open=True)] = 1.0,
    batch: Optional[Tensor] = None,
    keep: Sequence[int] = (),
) -> SolverResult:
    r"""Anderson acceleration (Walker & Ni, 2011; difference form), Type II with a switch to Type I
    (Fang & Saad, 2009) while it stagnates.

    With residuals :math:`\mathbf{g}_k = f(\mathbf{z}_k) - \mathbf{z}_k` and the last :math:`m`
    differences :math:`\Delta\mathbf{Z} = [\mathbf{z}_{i+1} - \mathbf{z}_i]`,
    :math:`\Delta\mathbf{G} = [\mathbf{g}_{i+1} - \mathbf{g}_i]`,

    .. math::
        \mathbf{z}_{k+1} &= \mathbf{z}_k + \beta \mathbf{g}_k - (\Delta\mathbf{Z} + \beta\,\Delta\mathbf{G})
        \boldsymbol{\gamma}_k, \qquad
        \boldsymbol{\gamma}_k = \begin{cases}
            \boldsymbol{\gamma}^{\mathrm{I}} & \text{if } \|\mathbf{g}_k\|_2 > 0.9\,
                \|\mathbf{g}_{k-1}\|_2, \\
            \boldsymbol{\gamma}^{\mathrm{II}} & \text{otherwise,}
        \end{cases}

        \boldsymbol{\gamma}^{\mathrm{II}} &= \left(\Delta\mathbf{G}^\top \Delta\mathbf{G} + \lambda'
        \mathbf{I}\right)^{-1} \Delta\mathbf{G}^\top \mathbf{g}_k, \qquad
        \lambda' = \lambda \cdot \tfrac{1}{m_k} \operatorname{tr}(\Delta\mathbf{G}^\top \Delta\mathbf{G}),

        \boldsymbol{\gamma}^{\mathrm{I}} &= \left(\mathbf{A}^\top \mathbf{A} + \lambda'' \mathbf{I}
        \right)^{-1} \mathbf{A}^\top \Delta\mathbf{Z}^\top \mathbf{g}_k, \qquad
        \mathbf{A} = \Delta\mathbf{Z}^\top \Delta\mathbf{G}, \qquad
        \lambda'' = \lambda \cdot \tfrac{1}{m_k} \operatorname{tr}(\mathbf{A}^\top \mathbf{A}).

    :math:`\boldsymbol{\gamma}^{\mathrm{II}}` minimises the linearised residual
    :math:`\|\mathbf{g}_k - \Delta\mathbf{G}\boldsymbol{\gamma}\|_2` (ridge-regularised); it is the
    usual choice and is kept as long as each step cuts the residual norm by at least 10%.
    A minimal-residual projection with a short history stalls, however, when the Jacobian
    :math:`\mathbf{J}_f` has eigenvalues on both sides of 1 (a map that is not contractive, e.g. an
    untrained DEQ-GNN layer): the residual that survives lies along the directions where
    :math:`\mathbf{I} - \mathbf{J}_f` is nearly singular, almost orthogonal to :math:`\Delta\mathbf{G}`,
    so :math:`\boldsymbol{\gamma}^{\mathrm{II}} \approx \mathbf{0}` and the step is close to a plain
    fixed-point step. While the residual stagnates, the Galerkin condition
    :math:`\Delta\mathbf{Z}^\top(\mathbf{g}_k - \Delta\mathbf{G}\boldsymbol{\gamma}) = \mathbf{0}` of the
    "good" multisecant (Broyden-like) update is used instead, which takes the large quasi-Newton steps
    those directions need (its small system is regularised through its normal equations, since
    :math:`\mathbf{A}` is not symmetric). Both use the same history and no extra evaluation of :math:`f`.

    The ridges are scaled to the problem (the small systems shrink with the residual, so a fixed ridge
    would either do nothing early or dominate late). If the Type II system is singular or yields NaN/inf,
    the history is dropped and a plain damped fixed-point step is taken (counted in
    :obj:`SolverResult.fallbacks`); an unusable Type I system keeps the Type II coefficients. With
    :obj:`batch`, every graph has its own history, small systems, ridges, switch and
    :math:`\boldsymbol{\gamma}_g` (and its own fallbacks).

    Args:
        f (callable): the map; takes and returns tensors shaped like :obj:`z0`.
        z0 (Tensor): initial guess.
        max_iter (int, optional): maximum number of evaluations of :obj:`f`. (default: :obj:`50`)
        tol (float, optional): residual tolerance. (default: :obj:`1e-4`)
        stop_mode (str, optional): :obj:`"rel"` or :obj:`"abs"`. (default: :obj:`"rel"`)
        m (int, optional): history size. (default: :obj:`5`)
        lam (float, optional): relative ridge :math:`\lambda \ge 0`. (default: :obj:`1e-4`)
        beta (float, optional): mixing/damping :math:`\beta > 0`. (default: :obj:`1.0`)
        batch (LongTensor, optional): graph id of each row of :obj:`z0`. (default: :obj:`None`)
        keep (sequence of int, optional): evaluations whose iterate to return. (default: :obj:`()`)

    Example::

        >>> res = anderson(lambda z: torch.cos(z), torch.zeros(3), tol=1e-8)
        >>> round(res.z[0].item(), 6)
        0.739085
    """
    _check_common(anderson, locals(), z0)
    prob = _Problem("anderson", z0, batch, tol, stop_mode, keep)
    F = _row_map(f, prob)
    x = prob.rows
    G, dev = prob.num_graphs, x.device
    dX = x.new_zeros(*x.shape, m)  # circular buffers; column order is irrelevant to the least squares
    dG = x.new_zeros(*x.shape, m)
    count = torch.zeros(G, dtype=torch.long, device=dev)  # differences stored per graph
    cols = torch.arange(m, device=dev)
    eye = torch.eye(m, dtype=torch.float64, device=dev)
    x_prev = g_prev = res_prev = None
    for _ in range(int(max_iter)):
        fx = F(x)
        g = fx - x
        if prob.update(x, fx):
            break
        res = prob.abs_res  # [G] ||g_k||_2
        if g_prev is not None:
            rows = prob.rows_of(prob.active).nonzero().squeeze(1)
            slot = prob.rows_of(count % m)[rows]
            dX[rows, :, slot] = (x - x_prev)[rows]
            dG[rows, :, slot] = (g - g_prev)[rows]
            count = torch.where(prob.active, count + 1, count)
        x_prev, g_prev = x, g
        k = count.clamp(max=m)
        valid = cols[None, :] < k[:, None]  # [G, m]: the columns each graph's history occupies
        ok = torch.zeros(G, dtype=torch.bool, device=dev)
        step = beta * g
        if bool((k > 0).any()):
            stalled = None if res_prev is None else res > _STALL * res_prev
            gamma, ok = _anderson_coefficients(prob, dX, dG, g, k, valid, eye, lam, stalled)
            gamma = gamma.to(x.dtype)
            accel = beta * g - torch.einsum("nrm,nm->nr", dX + beta * dG, prob.rows_of(gamma))
            ok = ok & ~prob.graph_sum((~torch.isfinite(accel)).any(1).to(torch.long)).bool()
            step = torch.where(prob.rows_of(ok)[:, None], accel, step)
        failed = prob.active & (k > 0) & ~ok
        if bool(failed.any()):
            prob.fallbacks += int(failed.sum())
            count = torch.where(failed, 0, count)  # drop the history: it produced nothing usable
        res_prev = res
        x = prob.frozen(x + step, x)
    return prob.result()


@torch.no_grad()
def broyden(
    f: MapFn,
    z0: Tensor,
    *,
    max_iter: Annotated[int, Range(1)] = 50,
    tol: Annotated[float, Range(0, low_open=True)] = 1e-4,
    stop_mode: Literal["abs", "rel"] = "rel",
    memory: Annotated[Optional[int], Range(1)] = None,
    batch: Optional[Tensor] = None,
    keep: Sequence[int] = (),
) -> SolverResult:
    r"""Broyden's ("good") method, optionally limited-memory, on
    :math:`\mathbf{g}(\mathbf{z}) = f(\mathbf{z}) - \mathbf{z} = \mathbf{0}`.

    An approximation :math:`\mathbf{B}_k \approx \mathbf{J}_g^{-1}` starts at :math:`-\mathbf{I}` (so the
    first step is a fixed-point step) and receives rank-one updates

    .. math::
        \mathbf{z}_{k+1} &= \mathbf{z}_k - \mathbf{B}_k \mathbf{g}_k,

        \mathbf{B}_{k+1} &= \mathbf{B}_k + \frac{(\Delta\mathbf{z} - \mathbf{B}_k \Delta\mathbf{g})\,
        \Delta\mathbf{z}^\top \mathbf{B}_k}{\Delta\mathbf{z}^\top \mathbf{B}_k \Delta\mathbf{g}},

    stored as :math:`\mathbf{B}_k = -\mathbf{I} + \mathbf{U}\mathbf{V}^\top`. By default every rank-one
    term is kept (at most :obj:`max_iter` - 1, so :math:`2\,\text{max\_iter}` vectors of the state's
    size): on a linear map :math:`f(\mathbf{z}) = \mathbf{J}\mathbf{z} + \mathbf{b}` the full history
    is what gives Broyden's finite termination (at most :math:`2n` steps, Gay 1979), and on a
    non-normal :math:`\mathbf{J}` a capped one loses most of that: each restart starts the secant
    information over. With :obj:`memory`, at most that many terms are kept and a full history restarts
    from :math:`-\mathbf{I}` (each term was built on top of the earlier ones, so overwriting only the
    oldest would leave an inconsistent :math:`\mathbf{B}` that can diverge); cost per step and storage
    are then bounded by :math:`O(\text{memory} \cdot N D)` however many iterations run. The default
    comes from ``python -m benchmarks.deq broyden-memory`` (docs/bench/deq.md): on 10 held-out maps at two
    tolerances each, keeping every term needed at most 2 evaluations more than the best of memories 5-80
    on each, while each of those memories needed 180 or more over the best on some, or did not
    converge in 300. An update whose denominator vanishes is skipped; a step that is not finite drops
    the history and falls back to a fixed-point step. With
    :obj:`batch`, :math:`\mathbf{B}` is block-diagonal: every graph has its own updates, denominators,
    restarts and fallbacks.

    Args:
        f (callable): the map; takes and returns tensors shaped like :obj:`z0`.
        z0 (Tensor): initial guess.
        max_iter (int, optional): maximum number of evaluations of :obj:`f`. (default: :obj:`50`)
        tol (float, optional): residual tolerance. (default: :obj:`1e-4`)
        stop_mode (str, optional): :obj:`"rel"` or :obj:`"abs"`. (default: :obj:`"rel"`)
        memory (int, optional): maximum number of stored rank-one updates; :obj:`None` keeps every
            one (at most :obj:`max_iter` - 1). (default: :obj:`None`)
        batch (LongTensor, optional): graph id of each row of :obj:`z0`. (default: :obj:`None`)
        keep (sequence of int, optional): evaluations whose iterate to return. (default: :obj:`()`)

    Example::

        >>> res = broyden(lambda z: torch.cos(z), torch.zeros(3), tol=1e-8)
        >>> round(res.z[0].item(), 6)
        0.739085
    """
    _check_common(broyden, locals(), z0)
    # max_iter evaluations make at most max_iter - 1 updates: a history that long never restarts
    memory = int(max_iter) if memory is None else min(int(memory), int(max_iter))
    prob = _Problem("broyden", z0, batch, tol, stop_mode, keep)
    F = _row_map(f, prob)
    x = prob.rows
    G, dev = prob.num_graphs, x.device
    U = x.new_zeros(*x.shape, memory)
    V = x.new_zeros(*x.shape, memory)
    count = torch.zeros(G, dtype=torch.long, device=dev)  # rank-one terms stored per graph
    cols = torch.arange(memory, device=dev)

    def apply(P: Tensor, Q: Tensor, v: Tensor) -> Tensor:  # (-I + P Q^T) v, each graph its own terms
        if not bool((count > 0).any()):
            return -v
        coef = prob.graph_sum(torch.einsum("nrc,nr->nc", Q, v))
        coef = torch.where(cols[None, :] < count[:, None], coef, 0.0)
        return -v + torch.einsum("nrc,nc->nr", P, prob.rows_of(coef))

    g = dx = None
    for _ in range(int(max_iter)):
        x_new = x if g is None else prob.frozen(x + dx, x)
        fx = F(x_new)
        g_new = fx - x_new
        if prob.update(x_new, fx):
            break
        if g is not None:
            dg = g_new - g
            Bdg = apply(U, V, dg)
            den = prob.dot(dx, Bdg)
            scale = (prob.dot(dx, dx) * prob.dot(Bdg, Bdg)).sqrt()
            accept = prob.active & (den.abs() > 1e-10 * scale) & torch.isfinite(den)
            if bool(accept.any()):
                count = torch.where(accept & (count == memory), 0, count)  # restart a full history
                Btdx = apply(V, U, dx)
                rows = prob.rows_of(accept).nonzero().squeeze(1)
                slot = prob.rows_of(count)[rows]
                U[rows, :, slot] = ((dx - Bdg) / prob.rows_of(torch.where(accept, den, 1.0))[:, None])[rows]
                V[rows, :, slot] = Btdx[rows]
                count = torch.where(accept, count + 1, count)
        x, g = x_new, g_new
        dx = -apply(U, V, g)
        bad = prob.active & prob.graph_sum((~torch.isfinite(dx)).any(1).to(torch.long)).bool()
        if bool(bad.any()):
            prob.fallbacks += int(bad.sum())
            count = torch.where(bad, 0, count)
            dx = torch.where(prob.rows_of(bad)[:, None], g, dx)
    return prob.result()


def _check_solver(name: str, solver: Callable[..., SolverResult]) -> Callable[..., SolverResult]:
    """The registry's entry for ``solver``: itself, once its signature fits (see :func:`register_solver`)."""
    if not callable(solver):
        raise TypeError(f"register_solver: {name!r} must be callable, got {type(solver).__name__}")
    expected = "solver(f, z0, *, max_iter, tol, stop_mode, **options) -> SolverResult"
    try:
        params = list(inspect.signature(solver).parameters.values())
    except (TypeError, ValueError):
        raise TypeError(
            f"register_solver: cannot read the signature of {name!r}; expected {expected}"
        ) from None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keyword = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
    missing = [o for o in REQUIRED_OPTIONS if o not in keyword]
    problems = []
    if len(positional) != 2:
        problems.append(f"{len(positional)} positional parameter(s) instead of 2 (f, z0)")
    if missing:
        problems.append(f"no keyword-only {', '.join(missing)}")
    if any(p.kind is p.VAR_KEYWORD for p in params):
        problems.append("**kwargs (options must be named, so that a misspelt one is an error)")
    if problems:
        raise TypeError(f"register_solver: {name!r} has {'; '.join(problems)}; expected {expected}")
    return solver


#: name -> solver of every registered solver (:func:`register_solver` adds one).
SOLVERS: Registry = Registry("solver", _check_solver, how_to_add="add your own with register_solver")
SOLVERS.register("fixed_point", fixed_point)
SOLVERS.register("anderson", anderson)
SOLVERS.register("broyden", broyden)


def register_solver(name: str, solver: Callable[..., SolverResult]) -> Callable[..., SolverResult]:
    r"""Add a user's solver to :obj:`SOLVERS` under :obj:`name` (usable as :obj:`DEQ(solver=name)`).

    The solver must look like the built-in ones: :obj:`solver(f, z0, *, max_iter, tol, stop_mode,
    **options) -> SolverResult`, i.e. two positional parameters (the map and the initial guess) and the
    keyword-only options :obj:`max_iter`, :obj:`tol` and :obj:`stop_mode`; its other keyword-only
    parameters become its :func:`solver_options`. Accepting :obj:`batch` and :obj:`keep` (see
    :func:`anderson`) is optional; a :class:`~revgnn.deq.DEQ` that needs them checks for them.

    Raises:
        ValueError: :obj:`name` is taken or not a non-empty string.
        TypeError: the signature does not fit.
    """
    return SOLVERS.register(name, solver)


def get_solver(name: str) -> Callable[..., SolverResult]:
    r"""Return the solver registered as :obj:`name` (one of :obj:`SOLVERS`; an unknown name is a
    :class:`~revgnn.utils.registry.UnknownName`, a ``ValueError``, listing them)."""
    return SOLVERS.get(name)


def solver_options(name: str) -> List[str]:
    r"""Keyword options accepted by solver :obj:`name`."""
    sig = inspect.signature(get_solver(name))
    return [p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]


def check_solver_options(name: str, options: Dict[str, object], prefix: str = "") -> None:
    r"""Raise :class:`TypeError` if :obj:`options` holds a key that solver :obj:`name` does not accept
    or a value of the wrong type, :class:`ValueError` for a value outside its choices or range (the
    solver's annotations, e.g. ``m: Annotated[int, Range(1)]``; :func:`~revgnn.utils.signature.check_types`).
    ``prefix`` goes before every key an error names (``"model.solver_options."``).

    Unknown keys are never ignored silently: a misspelt option would otherwise change nothing.
    """
    valid = solver_options(name)  # keyword-only: the map and the initial guess are positional
    params = {k: p for k, p in keyword_parameters(get_solver(name)).items() if k in valid}
    unknown = sorted(set(options) - set(params))
    if unknown:
        raise TypeError(
            f"unknown option(s) {[prefix + k for k in unknown]} for solver {name!r}; valid options: {valid}"
        )
    check_types(params, options, prefix)
