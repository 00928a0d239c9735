r"""The :class:`DEQ` module: an infinitely deep weight-tied layer, evaluated at its equilibrium."""

from __future__ import annotations

import math
import warnings
from typing import Any, Dict, List, Optional

import torch
from torch import Tensor, nn

from .implicit import implicit_equilibrium, phantom_grad, unroll
from .solvers import SolverDivergenceError, SolverResult, check_solver_options, get_solver

__all__ = ["DEQ", "DEQConvergenceWarning", "BACKWARD_MODES"]

BACKWARD_MODES = ("implicit", "phantom", "unroll")
_HALF = (torch.float16, torch.bfloat16)


class DEQConvergenceWarning(RuntimeWarning):
    r"""A forward or adjoint solve stopped at :obj:`max_iter` without meeting its tolerance."""


class DEQ(nn.Module):
    r"""Deep equilibrium wrapper around a map :math:`f_\theta` (Bai et al., NeurIPS 2019), as used for
    the DEQ-GNN of `"Training Graph Neural Networks with 1000 Layers"
    <https://arxiv.org/abs/2106.07476>`_.

    The output is the fixed point of the weight-tied layer,

    .. math::
        \mathbf{z}^* = f_\theta(\mathbf{z}^*, \mathbf{x}, \ldots),

    found by a root solver without building an autograd graph. Gradients follow :obj:`backward`:

    * :obj:`"implicit"`: exact implicit differentiation; the adjoint fixed point
      :math:`\mathbf{u}^\top = \mathbf{u}^\top \partial f/\partial\mathbf{z}
      + \partial\ell/\partial\mathbf{z}^*`
      is solved by :obj:`backward_solver` (see :mod:`revgnn.deq.implicit`). Only :math:`\mathbf{z}^*` and
      the inputs are saved; the backward pass re-evaluates :math:`f` once at :math:`\mathbf{z}^*`.
      Memory does not depend on the number of solver iterations.
    * :obj:`"phantom"`: :obj:`phantom_steps` damped steps from :math:`\mathbf{z}^*` with autograd.
    * :obj:`"unroll"`: no solver; :obj:`unroll_steps` weight-tied iterations from :math:`\mathbf{z}_0`,
      backpropagated through (a depth-:math:`k` weight-tied network; for tests and pretraining). This mode
      applies in evaluation too, so a model pretrained unrolled is evaluated the same way.

    Stochastic layers must not draw fresh randomness inside :math:`f` (the map would change at every
    iteration and have no fixed point): sample masks once per forward outside and pass them to :math:`f`
    as extra inputs (see :class:`revgnn.models.deq_gnn.DEQGNNLayer`). Layers with running statistics
    (BatchNorm) would update them at every iteration; use LayerNorm.

    Under :func:`torch.autocast` the equilibrium is computed in float32 (autocast is switched off inside
    and half-precision inputs are upcast): a bf16 map cannot reach a useful residual tolerance.

    A solve that ends above its tolerance emits a :class:`DEQConvergenceWarning` and is recorded in
    :attr:`stats` (with :attr:`traces`); NaN/inf raises :class:`~revgnn.deq.SolverDivergenceError`.

    Args:
        f (torch.nn.Module): the map, called as :obj:`f(z, *inputs)`; must return a tensor shaped like
            :obj:`z`.
        solver (str, optional): forward solver, :obj:`"anderson"`, :obj:`"broyden"` or
            :obj:`"fixed_point"`. (default: :obj:`"anderson"`)
        max_iter (int, optional): forward evaluations budget. (default: :obj:`50`)
        tol (float, optional): forward residual tolerance. (default: :obj:`1e-4`)
        stop_mode (str, optional): :obj:`"rel"` or :obj:`"abs"`. (default: :obj:`"rel"`)
        solver_options (dict, optional): extra options of the forward solver (e.g. :obj:`m`, :obj:`lam`);
            unknown keys raise :class:`TypeError`. (default: :obj:`None`)
        backward (str, optional): :obj:`"implicit"`, :obj:`"phantom"` or :obj:`"unroll"`.
            (default: :obj:`"implicit"`)
        backward_solver (str, optional): adjoint solver; :obj:`None` uses :obj:`solver`.
            (default: :obj:`None`)
        backward_max_iter (int, optional): adjoint budget; :obj:`None` uses :obj:`max_iter`.
            (default: :obj:`None`)
        backward_tol (float, optional): adjoint tolerance; :obj:`None` uses :obj:`tol`.
            (default: :obj:`None`)
        backward_solver_options (dict, optional): extra options of the adjoint solver; :obj:`None` reuses
            :obj:`solver_options` when the solvers are the same. (default: :obj:`None`)
        phantom_steps (int, optional): steps of the phantom gradient. (default: :obj:`5`)
        phantom_damping (float, optional): damping :math:`\tau \in (0, 1]` of the phantom gradient.
            (default: :obj:`0.8`)
        unroll_steps (int, optional): depth in :obj:`"unroll"` mode. (default: :obj:`max_iter`)
        warm_start (bool, optional): start from the previous equilibrium when the state has the same shape,
            dtype and device (useful when the same graph is solved repeatedly; a wrong warm start only
            costs iterations, never correctness). (default: :obj:`False`)
    """

    def __init__(
        self,
        f: nn.Module,
        solver: str = "anderson",
        max_iter: int = 50,
        tol: float = 1e-4,
        stop_mode: str = "rel",
        solver_options: Optional[Dict[str, Any]] = None,
        backward: str = "implicit",
        backward_solver: Optional[str] = None,
        backward_max_iter: Optional[int] = None,
        backward_tol: Optional[float] = None,
        backward_solver_options: Optional[Dict[str, Any]] = None,
        phantom_steps: int = 5,
        phantom_damping: float = 0.8,
        unroll_steps: Optional[int] = None,
        warm_start: bool = False,
    ):
        super().__init__()
        self.f = f
        self.solver = solver
        self.max_iter = int(max_iter)
        self.tol = float(tol)
        self.stop_mode = stop_mode
        self.solver_options = dict(solver_options or {})
        self.backward_solver = backward_solver or solver
        self.backward_max_iter = int(backward_max_iter or max_iter)
        self.backward_tol = float(backward_tol or tol)
        if backward_solver_options is None:
            backward_solver_options = self.solver_options if self.backward_solver == solver else {}
        self.backward_solver_options = dict(backward_solver_options)
        self.phantom_steps = int(phantom_steps)
        self.phantom_damping = float(phantom_damping)
        self.unroll_steps = int(unroll_steps or max_iter)
        self.warm_start = warm_start
        self.backward = backward
        self._check()
        self.stats: Dict[str, float] = {}
        self.traces: Dict[str, List[float]] = {}
        self._z_prev: Optional[Tensor] = None
        self._solves: Dict[str, List[tuple]] = {"forward": [], "backward": []}

    def _check(self) -> None:
        check_solver_options(self.solver, self.solver_options)
        check_solver_options(self.backward_solver, self.backward_solver_options)
        if self.stop_mode not in ("abs", "rel"):
            raise ValueError(f"stop_mode must be 'abs' or 'rel', got {self.stop_mode!r}")
        if self.backward not in BACKWARD_MODES:
            raise ValueError(f"backward must be one of {BACKWARD_MODES}, got {self.backward!r}")
        if self.phantom_steps < 1 or not 0.0 < self.phantom_damping <= 1.0:
            raise ValueError("phantom_steps must be >= 1 and phantom_damping in (0, 1]")
        if self.unroll_steps < 1 or self.max_iter < 1 or self.backward_max_iter < 1:
            raise ValueError("max_iter, backward_max_iter and unroll_steps must be >= 1")

    @property
    def backward(self) -> str:
        return self._backward

    @backward.setter
    def backward(self, mode: str) -> None:
        if mode not in BACKWARD_MODES:
            raise ValueError(f"backward must be one of {BACKWARD_MODES}, got {mode!r}")
        self._backward = mode

    def reset_parameters(self) -> None:
        r"""Resets the parameters of :obj:`f` and forgets the warm-start state."""
        if hasattr(self.f, "reset_parameters"):
            self.f.reset_parameters()
        self.reset_state()

    def reset_state(self) -> None:
        r"""Forgets the stored equilibrium used for warm starts."""
        self._z_prev = None

    def solve(self, *inputs: Tensor, z0: Optional[Tensor] = None) -> SolverResult:
        r"""Run the forward solver only (no autograd graph); returns the full :class:`SolverResult`."""
        z_init = self._initial_state(inputs, z0)
        result = get_solver(self.solver)(
            lambda z: self.f(z, *inputs),
            z_init,
            max_iter=self.max_iter,
            tol=self.tol,
            stop_mode=self.stop_mode,
            **self.solver_options,
        )
        self._record("forward", result)
        if self.warm_start:
            self._z_prev = result.z.detach()
        return result

    def forward(self, *inputs: Tensor, z0: Optional[Tensor] = None) -> Tensor:
        r"""
        Args:
            *inputs (Tensor): passed to :obj:`f` after the state; the first one also fixes the default
                initial state :math:`\mathbf{z}_0 = \mathbf{0}` (same shape).
            z0 (Tensor, optional): initial state when there is no warm start (it also fixes the shape
                of the state when that differs from :obj:`inputs[0]`). (default: :obj:`None`)
        """
        device_type = next((t.device.type for t in inputs if isinstance(t, Tensor)), "cpu")
        if torch.is_autocast_enabled(device_type):
            # Solve in float32: bf16/fp16 (eps 8e-3 / 1e-3) cannot reach a useful residual tolerance.
            with torch.autocast(device_type, enabled=False):
                inputs = tuple(t.float() if isinstance(t, Tensor) and t.dtype in _HALF else t for t in inputs)
                return self._forward(inputs, None if z0 is None else z0.float())
        return self._forward(inputs, z0)

    def _forward(self, inputs, z0: Optional[Tensor]) -> Tensor:
        def f(z: Tensor) -> Tensor:
            return self.f(z, *inputs)

        if self.backward == "unroll":
            z, abs_res, rel_res = unroll(f, self._initial_state(inputs, z0), self.unroll_steps)
            if not (math.isfinite(abs_res) and math.isfinite(rel_res)):
                raise SolverDivergenceError(
                    f"DEQ unroll: the state contains NaN/inf after {self.unroll_steps} steps"
                )
            res = rel_res if self.stop_mode == "rel" else abs_res
            self.stats = {
                "forward_steps": self.unroll_steps,
                "forward_residual": res,
                "forward_abs_residual": abs_res,
                "forward_rel_residual": rel_res,
            }
            self._solves["forward"].append((self.unroll_steps, res, res <= self.tol))
            return z

        z_star = self.solve(*inputs, z0=z0).z
        if not (torch.is_grad_enabled() and self._needs_grad(inputs)):
            return z_star
        if self.backward == "phantom":
            return phantom_grad(f, z_star, self.phantom_steps, self.phantom_damping)
        return implicit_equilibrium(
            self.f,
            z_star,
            inputs,
            list(self.f.parameters()),
            self._solve_adjoint,
            lambda r: self._record("backward", r),
        )

    def _solve_adjoint(self, adjoint_map, u0: Tensor) -> SolverResult:
        return get_solver(self.backward_solver)(
            adjoint_map,
            u0,
            max_iter=self.backward_max_iter,
            tol=self.backward_tol,
            stop_mode=self.stop_mode,
            **self.backward_solver_options,
        )

    def _needs_grad(self, inputs) -> bool:
        return any(p.requires_grad for p in self.f.parameters()) or any(
            isinstance(t, Tensor) and t.requires_grad for t in inputs
        )

    def _initial_state(self, inputs, z0: Optional[Tensor]) -> Tensor:
        if z0 is None and not (inputs and isinstance(inputs[0], Tensor)):
            raise ValueError("DEQ: pass z0 when the first input is not a tensor shaped like the state")
        cold = z0.detach() if z0 is not None else torch.zeros_like(inputs[0])
        prev = self._z_prev
        if (
            self.warm_start
            and prev is not None
            and prev.shape == cold.shape
            and prev.dtype == cold.dtype
            and prev.device == cold.device
        ):
            return prev
        return cold

    def _record(self, which: str, result: SolverResult) -> None:
        if which == "forward":
            self.stats = {}
            self.traces = {}
        self.stats.update(result.summary(prefix=f"{which}_"))
        self.traces[which] = result.trace
        self._solves[which].append((result.steps, result.residual, result.converged))
        if not result.converged:
            warnings.warn(
                f"DEQ {which} solve did not converge: {result.solver} stopped after {result.steps} "
                f"evaluations at {result.stop_mode} residual {result.residual:.2e} > tol "
                f"{result.tol:.1e}; returning the best iterate. Raise max_iter, change the solver, or "
                "enable the contraction guarantee.",
                DEQConvergenceWarning,
                stacklevel=3,
            )

    def epoch_stats(self) -> Dict[str, float]:
        r"""Convergence of the solves since the last call, and forgets them: for ``forward`` and
        ``backward``, the mean and max function evaluations, the max final residual and the fraction
        of solves that converged (``{which}_steps_mean``, ``_steps_max``, ``_residual_max``,
        ``_converged``). The training loop logs it once per epoch (``metrics.csv``, TensorBoard,
        ``summary.json``)."""
        out: Dict[str, float] = {}
        for which, solves in self._solves.items():
            if solves:
                steps = [s[0] for s in solves]
                out[f"{which}_steps_mean"] = sum(steps) / len(steps)
                out[f"{which}_steps_max"] = float(max(steps))
                out[f"{which}_residual_max"] = max(float(s[1]) for s in solves)
                out[f"{which}_converged"] = sum(bool(s[2]) for s in solves) / len(solves)
            solves.clear()
        return out

    def extra_repr(self) -> str:
        return (
            f"solver={self.solver}, max_iter={self.max_iter}, tol={self.tol:g}, "
            f"stop_mode={self.stop_mode}, backward={self.backward}"
        )
