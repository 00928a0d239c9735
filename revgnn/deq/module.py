r"""The :class:`DEQ` module: an infinitely deep weight-tied layer, evaluated at its equilibrium."""

from __future__ import annotations

import math
import warnings
from typing import Annotated, Any, Dict, List, Literal, Mapping, Optional, Tuple, get_args

import torch
from torch import Tensor, nn

from revgnn.utils.functional import transforms_active
from revgnn.utils.ranges import Range
from revgnn.utils.signature import check_call, with_defaults

from .implicit import implicit_equilibrium, phantom_grad, unroll
from .regularize import jacobian_frobenius, spectral_radius, spectral_radius_penalty
from .solvers import (
    SOLVERS,
    SolverDivergenceError,
    SolverResult,
    check_solver_options,
    get_solver,
    solver_options,
)

#: Solver arguments the DEQ sets itself (from its own arguments); not allowed in ``solver_options``.
_MANAGED = ("max_iter", "tol", "stop_mode", "batch", "keep")

__all__ = ["DEQ", "DEQConvergenceWarning", "BACKWARD_MODES"]

Backward = Literal["implicit", "phantom", "unroll"]
#: The gradients a :class:`DEQ` computes (its ``backward``; set again by a model that pretrains unrolled).
BACKWARD_MODES = get_args(Backward)
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

    **Keeping the map solvable while it trains** (training forwards only, i.e. :obj:`self.training`
    with autograd on):

    * *Jacobian regularisation* (Bai et al., ICML 2021): every :obj:`jac_reg_every`-th training forward
      adds :math:`\gamma\, \widehat{\|\mathbf{J}\|_F^2} / d` to :meth:`auxiliary_loss`, the Hutchinson
      estimate (:func:`~revgnn.deq.jacobian_frobenius`, :obj:`jac_reg_probes` Rademacher probes) of the
      Jacobian :math:`\mathbf{J} = \partial f/\partial\mathbf{z}` at :math:`\mathbf{z}^*` divided by the
      state size :math:`d`, weighted by :math:`\gamma =` :obj:`jac_reg_weight`. Its value is logged by
      :meth:`epoch_stats` (``jac_frobenius_mean``/``_max``). The training loop adds every module's
      :meth:`auxiliary_loss` to the batch's loss (:func:`revgnn.engine.loop.model_auxiliary_loss`).
      The term's gradient differentiates :math:`f` twice; a map whose fast kernels are differentiable
      once offers the same function as :obj:`f.twice_differentiable(z, *inputs)`, used for this term.
    * *Spectral-radius penalty*: at the same forwards, with :obj:`spectral_reg_weight`
      :math:`=\gamma_\rho > 0`, adds :math:`\gamma_\rho \max(0, \hat\rho - \rho_0)^2` to
      :meth:`auxiliary_loss` (:func:`~revgnn.deq.spectral_radius_penalty`: :math:`\hat\rho` after
      :obj:`spectral_radius_iters` power iterations, :math:`\rho_0 =` :obj:`spectral_reg_target`). It
      acts on the worst direction of :math:`\mathbf{J}`, which sets the solver's speed and which the
      Frobenius average over all entries hardly sees when it lives on a few nodes; below the target it
      leaves the map alone.
    * *Spectral radius*: every :obj:`spectral_radius_every`-th training forward estimates
      :math:`\rho(\mathbf{J})` at :math:`\mathbf{z}^*` by :obj:`spectral_radius_iters` power iterations
      (:func:`~revgnn.deq.spectral_radius`; logged as ``spectral_radius_mean``/``_max``); the
      penalty's own estimate is logged at the forwards it acts on.
    * *Fixed-point correction* (Bai et al., CVPR 2022): :obj:`correction_states` :math:`=K` iterates
      :math:`\mathbf{z}_{k_i}` of the forward solve, at evaluations :math:`k_i = \lceil i \cdot
      \text{max\_iter}/(K+1) \rceil` (those the solve reached), each given a one-step gradient
      :math:`\hat{\mathbf{z}}_i = f(\operatorname{sg}(\mathbf{z}_{k_i}))`, with weights
      :math:`w_i = \lambda^{K+1-i}` (:math:`\lambda =` :obj:`correction_gamma`; later iterates weigh
      more, :math:`\mathbf{z}^*` itself has weight 1). :meth:`correction_states` hands them to the model
      that owns the DEQ, which adds :math:`\sum_i w_i\, \ell(\mathrm{head}(\hat{\mathbf{z}}_i))` to
      its loss (see :class:`revgnn.models.deq_gnn.DEQGNN`). Not used in :obj:`"unroll"` mode, whose
      iterates are all differentiated already.

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
        backward_stop_mode (str, optional): residual the adjoint solve stops on; :obj:`None` uses
            :obj:`stop_mode`. (default: :obj:`None`)
        eval_max_iter (int, optional): forward budget in evaluation mode (:obj:`self.training` false);
            :obj:`None` uses :obj:`max_iter`. (default: :obj:`None`)
        phantom_steps (int, optional): steps of the phantom gradient. (default: :obj:`5`)
        phantom_damping (float, optional): damping :math:`\tau \in (0, 1]` of the phantom gradient.
            (default: :obj:`0.8`)
        unroll_steps (int, optional): depth in :obj:`"unroll"` mode. (default: :obj:`max_iter`)
        warm_start (bool, optional): start from the previous equilibrium when the state has the same shape,
            dtype and device (useful when the same graph is solved repeatedly; a wrong warm start only
            costs iterations, never correctness). (default: :obj:`False`)
        jac_reg_weight (float, optional): weight :math:`\gamma \ge 0` of the Jacobian regularisation;
            :obj:`0` switches it off. (default: :obj:`0.0`)
        jac_reg_every (int, optional): apply the Jacobian terms (Frobenius and spectral) every this many
            training forwards. (default: :obj:`1`)
        jac_reg_probes (int, optional): Hutchinson probes per estimate. (default: :obj:`1`)
        spectral_reg_weight (float, optional): weight :math:`\gamma_\rho \ge 0` of the spectral-radius
            penalty; :obj:`0` switches it off. (default: :obj:`0.0`)
        spectral_reg_target (float, optional): spectral radius :math:`\rho_0 \ge 0` above which the
            penalty acts. (default: :obj:`0.5`)
        spectral_radius_every (int, optional): estimate :math:`\rho(\mathbf{J})` every this many training
            forwards; :obj:`0` never. (default: :obj:`0`)
        spectral_radius_iters (int, optional): power iterations per estimate. (default: :obj:`20`)
        correction_states (int, optional): number :math:`K` of supervised intermediate iterates (fixed-point
            correction); :obj:`0` switches it off. (default: :obj:`0`)
        correction_gamma (float, optional): weight decay :math:`\lambda \in (0, 1]` of the corrections.
            (default: :obj:`0.8`)
    """

    def __init__(
        self,
        f: nn.Module,
        solver: Annotated[str, SOLVERS] = "anderson",
        max_iter: Annotated[int, Range(1)] = 50,
        tol: Annotated[float, Range(0, low_open=True)] = 1e-4,
        stop_mode: Literal["rel", "abs"] = "rel",
        solver_options: Optional[Dict[str, Any]] = None,
        backward: Backward = "implicit",
        backward_solver: Optional[Annotated[str, SOLVERS]] = None,
        backward_max_iter: Annotated[Optional[int], Range(1)] = None,
        backward_tol: Annotated[Optional[float], Range(0, low_open=True)] = None,
        backward_solver_options: Optional[Dict[str, Any]] = None,
        phantom_steps: Annotated[int, Range(1)] = 5,
        phantom_damping: Annotated[float, Range(0, 1, low_open=True)] = 0.8,
        unroll_steps: Annotated[Optional[int], Range(1)] = None,
        warm_start: bool = False,
        backward_stop_mode: Optional[Literal["rel", "abs"]] = None,
        eval_max_iter: Annotated[Optional[int], Range(1)] = None,
        jac_reg_weight: Annotated[float, Range(0)] = 0.0,
        jac_reg_every: Annotated[int, Range(1)] = 1,
        jac_reg_probes: Annotated[int, Range(1)] = 1,
        spectral_reg_weight: Annotated[float, Range(0)] = 0.0,
        spectral_reg_target: Annotated[float, Range(0)] = 0.5,
        spectral_radius_every: Annotated[int, Range(0)] = 0,
        spectral_radius_iters: Annotated[int, Range(1)] = 20,
        correction_states: Annotated[int, Range(0)] = 0,
        correction_gamma: Annotated[float, Range(0, 1, low_open=True)] = 0.8,
    ):
        check_call(DEQ, locals())
        DEQ.check_options(locals())
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
        self.backward_stop_mode = backward_stop_mode or stop_mode
        self.eval_max_iter = int(eval_max_iter or max_iter)
        self.jac_reg_weight = float(jac_reg_weight)
        self.jac_reg_every = int(jac_reg_every)
        self.jac_reg_probes = int(jac_reg_probes)
        self.spectral_reg_weight = float(spectral_reg_weight)
        self.spectral_reg_target = float(spectral_reg_target)
        self.spectral_radius_every = int(spectral_radius_every)
        self.spectral_radius_iters = int(spectral_radius_iters)
        self.num_corrections = int(correction_states)
        self.correction_gamma = float(correction_gamma)
        self.backward = backward
        self.stats: Dict[str, float] = {}
        self.traces: Dict[str, List[float]] = {}
        self._z_prev: Optional[Tensor] = None
        self._solves: Dict[str, List[tuple]] = {"forward": [], "backward": []}
        self._monitor: Dict[str, List[float]] = {"jac_frobenius": [], "spectral_radius": []}
        self._aux: List[Tensor] = []
        self._corrections: List[Tuple[float, Tensor]] = []
        self._train_forwards = 0

    @staticmethod
    def check_options(arguments: Mapping[str, Any], prefix: str = "") -> None:
        """Checks what one parameter's annotation cannot say (each value's type, choice and range is
        :func:`~revgnn.utils.signature.check_call`'s, from the signature): the solvers' own options
        (their names, types and ranges, :func:`~revgnn.deq.check_solver_options`, less those the DEQ
        sets), and that :obj:`correction_states` fits the forward solve. ``arguments`` are
        constructor arguments (those not given keep their defaults), so a model and the check
        before a run starts call it without building anything; ``prefix`` goes before every key an
        error names (``"model."``). Raises :class:`ValueError` or :class:`TypeError`."""
        args = with_defaults(DEQ, arguments)
        solver, options = args["solver"], dict(args["solver_options"] or {})
        backward_solver = args["backward_solver"] or solver
        backward_options = args["backward_solver_options"]
        if backward_options is None:
            backward_options = options if backward_solver == solver else {}
        for which, name, opts in (
            ("solver_options", solver, options),
            ("backward_solver_options", backward_solver, dict(backward_options)),
        ):
            managed = sorted(set(opts) & set(_MANAGED))
            if managed:
                raise ValueError(
                    f"{prefix}{which} may not set {managed}: the DEQ sets them from its own arguments "
                    "(max_iter, tol, stop_mode, backward_*; batch is forward's argument)"
                )
            check_solver_options(name, opts, prefix=f"{prefix}{which}.")
        corrections, max_iter = args["correction_states"], args["max_iter"]
        if corrections > max_iter:
            raise ValueError(
                f"{prefix}correction_states={corrections} exceeds {prefix}max_iter={max_iter}: there are "
                "not that many iterates to supervise"
            )
        if corrections and "keep" not in solver_options(solver):
            raise TypeError(
                f"{prefix}correction_states needs a solver that returns intermediate iterates (keyword "
                f"'keep'); {solver!r} does not accept it"
            )

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

    @property
    def budget(self) -> int:
        r"""The forward evaluation budget in the current mode (:obj:`max_iter` or :obj:`eval_max_iter`)."""
        return self.max_iter if self.training else self.eval_max_iter

    def solve(
        self, *inputs: Tensor, z0: Optional[Tensor] = None, batch: Optional[Tensor] = None, keep=()
    ) -> SolverResult:
        r"""Run the forward solver only (no autograd graph); returns the full :class:`SolverResult`.
        :obj:`batch` and :obj:`keep` are passed to the solver (see :func:`~revgnn.deq.anderson`)."""
        z_init = self._initial_state(inputs, z0)
        extra = self._graph_options(self.solver, batch)
        if keep:
            extra["keep"] = tuple(keep)
        result = get_solver(self.solver)(
            lambda z: self.f(z, *inputs),
            z_init,
            max_iter=self.budget,
            tol=self.tol,
            stop_mode=self.stop_mode,
            **self.solver_options,
            **extra,
        )
        self._record("forward", result)
        if self.warm_start:
            self._z_prev = result.z.detach()
        return result

    # torch.compile: the solve runs eagerly (one graph break). Its number of iterations depends on the
    # residual, read back every iteration, so dynamo would break the graph at each read (41 breaks on a
    # 40-node graph) and recompile as the count changes; compiling the map inside gains nothing then.
    @torch.compiler.disable
    def forward(self, *inputs: Tensor, z0: Optional[Tensor] = None, batch: Optional[Tensor] = None) -> Tensor:
        r"""
        Args:
            *inputs (Tensor): passed to :obj:`f` after the state; the first one also fixes the default
                initial state :math:`\mathbf{z}_0 = \mathbf{0}` (same shape).
            z0 (Tensor, optional): initial state when there is no warm start (it also fixes the shape
                of the state when that differs from :obj:`inputs[0]`). (default: :obj:`None`)
            batch (LongTensor, optional): graph id of each row of the state: the forward and adjoint
                solves judge and mix every graph on its own (see :mod:`revgnn.deq.solvers`); for maps
                that do not couple the graphs. In :obj:`"unroll"` mode, which runs a fixed number of
                steps without a solver, it changes nothing. (default: :obj:`None`)
        """
        if torch.compiler.is_exporting():
            raise RuntimeError(
                "torch.export cannot capture a DEQ: its solver iterates until a residual test on the "
                "state's values passes, a loop whose length depends on the data, which an exported graph "
                "(static, no host reads) cannot hold; run the model eagerly or under torch.compile"
            )
        device_type = next((t.device.type for t in inputs if isinstance(t, Tensor)), "cpu")
        if torch.is_autocast_enabled(device_type):
            # Solve in float32: bf16/fp16 (eps 8e-3 / 1e-3) cannot reach a useful residual tolerance.
            with torch.autocast(device_type, enabled=False):
                inputs = tuple(t.float() if isinstance(t, Tensor) and t.dtype in _HALF else t for t in inputs)
                return self._forward(inputs, None if z0 is None else z0.float(), batch)
        return self._forward(inputs, z0, batch)

    def _forward(self, inputs, z0: Optional[Tensor], batch: Optional[Tensor]) -> Tensor:
        def f(z: Tensor) -> Tensor:
            return self.f(z, *inputs)

        training = self.training and torch.is_grad_enabled()
        if training:
            if self._corrections:
                raise RuntimeError(
                    "DEQ: the fixed-point corrections of the previous training forward were never "
                    "collected; the model that owns this DEQ must call correction_states() after each "
                    "forward (DEQGNN.auxiliary_loss does), or set correction_states=0"
                )
            self._train_forwards += 1
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
            if training:
                self._regularise(f, z, inputs)
            return z

        k = self.num_corrections if training else 0
        keep = [math.ceil(i * self.max_iter / (k + 1)) for i in range(1, k + 1)]
        result = self.solve(*inputs, z0=z0, batch=batch, keep=keep)
        z_star = result.z
        if training:
            self._regularise(f, z_star, inputs)
            weights = [self.correction_gamma ** (k + 1 - i) for i in range(1, k + 1)]
            self._corrections = [
                (w, f(result.iterates[s])) for w, s in zip(weights, keep) if s in result.iterates
            ]
        if not (torch.is_grad_enabled() and self._needs_grad(inputs)):
            return z_star
        if self.backward == "phantom":
            return phantom_grad(f, z_star, self.phantom_steps, self.phantom_damping)
        if transforms_active():
            raise RuntimeError(
                "DEQ: torch.func transforms (grad, vmap, jacrev, ...) cannot differentiate the implicit "
                "backward (a custom autograd function that solves the adjoint fixed point); under "
                "torch.func use backward='phantom' or backward='unroll', or take gradients with "
                "torch.autograd (functional_call works with the implicit backward)"
            )
        return implicit_equilibrium(
            self.f,
            z_star,
            inputs,
            list(self.f.parameters()),
            lambda adjoint_map, u0: self._solve_adjoint(adjoint_map, u0, batch),
            lambda r: self._record("backward", r),
        )

    def _regularise(self, f, z_star: Tensor, inputs) -> None:
        """Jacobian regularisation terms and spectral-radius estimate at the equilibrium (training)."""
        n = self._train_forwards - 1
        due = n % self.jac_reg_every == 0
        jac = self.jac_reg_weight > 0 and due
        spec = self.spectral_reg_weight > 0 and due
        rho = self.spectral_radius_every > 0 and n % self.spectral_radius_every == 0 and not spec
        if not (jac or spec or rho):
            return
        z = z_star.detach().requires_grad_()
        fz = f(z)
        fz2 = fz
        if jac or spec:
            twice = getattr(self.f, "twice_differentiable", None)  # a map with first-order-only kernels
            fz2 = fz if twice is None else twice(z, *inputs)
        if jac:
            term = jacobian_frobenius(fz2, z, self.jac_reg_probes, create_graph=True) / z.numel()
            self._aux.append(self.jac_reg_weight * term)
            self._monitor["jac_frobenius"].append(term.item())
        if spec:
            term, estimate = spectral_radius_penalty(
                fz, z, self.spectral_reg_target, self.spectral_radius_iters, fz_graph=fz2
            )
            self._aux.append(self.spectral_reg_weight * term)
            self._monitor["spectral_radius"].append(estimate)
        if rho:
            self._monitor["spectral_radius"].append(spectral_radius(fz, z, self.spectral_radius_iters))

    def auxiliary_loss(self, output_loss=None) -> Optional[Tensor]:
        r"""The Jacobian regularisation terms of the training forwards since the last call (summed), or
        :obj:`None`; forgets them. The training loop calls it after every forward and adds it to the
        batch's loss (:obj:`output_loss`, the loss of a model output, is not needed here)."""
        if not self._aux:
            return None
        total = torch.stack(self._aux).sum()
        self._aux.clear()
        return total

    def correction_states(self) -> List[Tuple[float, Tensor]]:
        r"""The fixed-point corrections :math:`(w_i, \hat{\mathbf{z}}_i)` of the last training forward
        (with autograd; empty without :obj:`correction_states`), and forgets them."""
        out, self._corrections = self._corrections, []
        return out

    def _graph_options(self, solver: str, batch: Optional[Tensor]) -> Dict[str, Any]:
        if batch is None:
            return {}
        if "batch" not in solver_options(solver):
            raise TypeError(f"DEQ: solver {solver!r} does not accept 'batch' (per-graph solves)")
        return {"batch": batch}

    def _solve_adjoint(self, adjoint_map, u0: Tensor, batch: Optional[Tensor] = None) -> SolverResult:
        return get_solver(self.backward_solver)(
            adjoint_map,
            u0,
            max_iter=self.backward_max_iter,
            tol=self.backward_tol,
            stop_mode=self.backward_stop_mode,
            **self.backward_solver_options,
            **self._graph_options(self.backward_solver, batch),
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
                "keep the map contractive (spectral_reg_weight; DEQ-GNN's contraction option).",
                DEQConvergenceWarning,
                stacklevel=3,
            )

    def epoch_stats(self) -> Dict[str, float]:
        r"""Convergence of the solves since the last call, and forgets them: for ``forward`` and
        ``backward``, the mean and max function evaluations, the max final residual and the fraction
        of solves that converged (``{which}_steps_mean``, ``_steps_max``, ``_residual_max``,
        ``_converged``); with the monitors on, the mean and max of the Jacobian term
        (``jac_frobenius_*``, :math:`\widehat{\|\mathbf{J}\|_F^2}/d`) and of the spectral radius
        (``spectral_radius_*``). The training loop logs it once per epoch (``metrics.csv``, TensorBoard,
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
        for name, values in self._monitor.items():
            if values:
                out[f"{name}_mean"] = sum(values) / len(values)
                out[f"{name}_max"] = max(values)
            values.clear()
        return out

    def extra_repr(self) -> str:
        return (
            f"solver={self.solver}, max_iter={self.max_iter}, tol={self.tol:g}, "
            f"stop_mode={self.stop_mode}, backward={self.backward}"
            + (f", jac_reg_weight={self.jac_reg_weight:g}" if self.jac_reg_weight else "")
            + (
                f", spectral_reg_weight={self.spectral_reg_weight:g}, "
                f"spectral_reg_target={self.spectral_reg_target:g}"
                if self.spectral_reg_weight
                else ""
            )
            + (f", correction_states={self.num_corrections}" if self.num_corrections else "")
        )
