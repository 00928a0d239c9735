r"""Gradients through a fixed point.

At an equilibrium :math:`\mathbf{z}^* = f_\theta(\mathbf{z}^*, \mathbf{x})` the implicit function theorem
gives, for a loss :math:`\ell(\mathbf{z}^*)`,

.. math::
    \frac{\partial \ell}{\partial \theta} = \mathbf{u}^\top \frac{\partial f_\theta}{\partial \theta}
    \Big|_{\mathbf{z}^*}, \qquad
    \mathbf{u}^\top = \mathbf{u}^\top \mathbf{J} + \frac{\partial \ell}{\partial \mathbf{z}^*}, \qquad
    \mathbf{J} = \frac{\partial f_\theta}{\partial \mathbf{z}} \Big|_{\mathbf{z}^*},

so the backward pass is itself a fixed-point problem (the *adjoint* equation), solved with any solver from
:mod:`revgnn.deq.solvers` using vector-Jacobian products of a single re-evaluation of :math:`f` at
:math:`\mathbf{z}^*`. Nothing from the forward solver iterations is kept, and not even the activations of
:math:`f` (they are rebuilt in the backward pass): memory is :math:`\mathbf{z}^*` plus the inputs.

Two cheaper approximations are provided as well:

* :func:`phantom_grad`: :math:`k` damped steps
  :math:`\mathbf{z} \leftarrow (1-\tau)\mathbf{z} + \tau f(\mathbf{z}, \mathbf{x})` from
  :math:`\mathbf{z}^*` with autograd (Geng et al., 2021); memory grows with :math:`k`, not with the solver.
* :func:`unroll`: plain weight-tied iteration from :math:`\mathbf{z}_0`, backpropagated through every step
  (for tests and for unrolled pretraining).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor, nn

from revgnn.utils.functional import bound_to, module_tensors

from .solvers import SolverResult

__all__ = ["implicit_equilibrium", "phantom_grad", "unroll"]

AdjointSolve = Callable[[Callable[[Tensor], Tensor], Tensor], SolverResult]


class _ImplicitGrad(torch.autograd.Function):
    r"""Returns the equilibrium :math:`\mathbf{z}^*` (computed without autograd) and differentiates it
    implicitly.

    Only the inputs of :math:`f` and :math:`\mathbf{z}^*` are saved. The backward pass re-evaluates
    :math:`f(\mathbf{z}^*, \mathbf{x})` once with autograd (as a reversible block rebuilds its
    activations), solves the adjoint fixed point with vector-Jacobian products of that graph, and
    pulls :math:`\mathbf{u}` back to :math:`\theta` and :math:`\mathbf{x}`.
    """

    @staticmethod
    def forward(ctx, f, inputs, slots, solve, on_result, z_star, *tensors):
        # tensors = the inputs that need gradients (at positions `slots` of `inputs`), then the
        # parameters of f that need gradients. Other inputs (indices, masks) stay as given.
        ctx.f, ctx.solve, ctx.on_result = f, solve, on_result
        # the tensors f computes with now (under functional_call: the ones passed in), rebound in backward
        ctx.state = module_tensors(f) if isinstance(f, nn.Module) else None
        # Every tensor goes through save_for_backward (so saved-tensor hooks see the true memory);
        # other arguments (None, numbers) are kept as they are.
        ctx.is_tensor = tuple(isinstance(t, Tensor) for t in inputs)
        ctx.others = tuple(None if isinstance(t, Tensor) else t for t in inputs)
        ctx.slots, ctx.num_tensors = slots, len(tensors)
        ctx.save_for_backward(
            z_star, *tensors, *(t for i, t in enumerate(inputs) if isinstance(t, Tensor) and i not in slots)
        )
        return z_star.clone()

    @staticmethod
    def backward(ctx, grad):
        z_star, *saved = ctx.saved_tensors
        n = len(ctx.slots)
        tensors, rest = saved[: ctx.num_tensors], iter(saved[ctx.num_tensors :])
        bound = bound_to(ctx.f, ctx.state) if ctx.state is not None else contextlib.nullcontext()
        with torch.enable_grad(), bound:
            leaves = [t.detach().requires_grad_() for t in tensors[:n]]
            params = tensors[n:]
            inputs = list(ctx.others)
            for i, is_tensor in enumerate(ctx.is_tensor):
                if is_tensor and i not in ctx.slots:
                    inputs[i] = next(rest)
            for i, leaf in zip(ctx.slots, leaves):
                inputs[i] = leaf
            z_in = z_star.detach().requires_grad_()
            z_out = ctx.f(z_in, *inputs)

            def adjoint_map(u: Tensor) -> Tensor:
                (vjp,) = torch.autograd.grad(z_out, z_in, u, retain_graph=True)
                return vjp + grad

            result = ctx.solve(adjoint_map, grad)
            grads = torch.autograd.grad(z_out, leaves + list(params), result.z, allow_unused=True)
        if ctx.on_result is not None:
            ctx.on_result(result)
        return (None, None, None, None, None, None, *grads)


def implicit_equilibrium(
    f: Callable[..., Tensor],
    z_star: Tensor,
    inputs: Sequence[Any],
    params: Sequence[Tensor],
    solve: AdjointSolve,
    on_result: Optional[Callable[[SolverResult], None]] = None,
) -> Tensor:
    r"""Attach implicit differentiation to an equilibrium found without autograd.

    Args:
        f (callable): the map, called as :obj:`f(z, *inputs)`.
        z_star (Tensor): the equilibrium (no autograd history).
        inputs (sequence): the other arguments of :obj:`f`; floating tensors that require gradients
            receive them.
        params (sequence of Tensor): the parameters :math:`\theta` of :obj:`f` that require gradients.
        solve (callable): :obj:`solve(adjoint_map, u0) -> SolverResult` for the adjoint fixed point.
        on_result (callable, optional): receives the adjoint :class:`SolverResult` (for statistics).

    Returns:
        A copy of :obj:`z_star` whose gradient is the implicit one. Memory: :obj:`z_star` and the
        inputs, however many solver iterations ran; the backward pass costs one re-evaluation of
        :obj:`f` plus one vector-Jacobian product per adjoint iteration. Higher-order gradients
        (:obj:`create_graph=True`) are not supported.
    """
    slots = tuple(i for i, t in enumerate(inputs) if isinstance(t, Tensor) and t.requires_grad)
    tensors = [inputs[i] for i in slots] + [p for p in params if p.requires_grad]
    return _ImplicitGrad.apply(f, tuple(inputs), slots, solve, on_result, z_star.detach(), *tensors)


def phantom_grad(f: Callable[[Tensor], Tensor], z_star: Tensor, steps: int, damping: float) -> Tensor:
    r"""Phantom gradient: :obj:`steps` damped iterations from the (detached) equilibrium with autograd,
    :math:`\mathbf{z} \leftarrow (1-\tau)\,\mathbf{z} + \tau f(\mathbf{z})`."""
    z = z_star.detach()
    for _ in range(steps):
        fz = f(z)
        z = fz if damping == 1.0 else torch.lerp(z, fz, damping)
    return z


def unroll(f: Callable[[Tensor], Tensor], z0: Tensor, steps: int) -> tuple[Tensor, float, float]:
    r"""Weight-tied unrolled iteration :math:`\mathbf{z}_{k+1} = f(\mathbf{z}_k)` with autograd.

    Returns the last iterate and the absolute and relative size of the last update
    :math:`\|\mathbf{z}_k - \mathbf{z}_{k-1}\|` (i.e. the residual of :math:`\mathbf{z}_{k-1}`).
    """
    z, abs_res, rel_res = z0, float("nan"), float("nan")
    for _ in range(steps):
        fz = f(z)
        if _ == steps - 1:
            with torch.no_grad():
                abs_res = torch.linalg.vector_norm(fz - z, dtype=torch.float64).item()
                norm = torch.linalg.vector_norm(fz, dtype=torch.float64).item()
                rel_res = abs_res / max(norm, 1e-300)
        z = fz
    return z, abs_res, rel_res
