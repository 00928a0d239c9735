r"""Gradients through a fixed point.

At an equilibrium :math:`\mathbf{z}^* = f_\theta(\mathbf{z}^*, \mathbf{x})` the implicit function theorem
gives, for a loss :math:`\ell(\mathbf{z}^*)`,

.. math::
    \frac{\partial \ell}{\partial \theta} = \mathbf{u}^\top \frac{\partial f_\theta}{\partial \theta}
    \Big|_{\mathbf{z}^*}, \qquad
    \mathbf{u}^\top = \mathbf{u}^\top \mathbf{J} + \frac{\partial \ell}{\partial \mathbf{z}^*}, \qquad
    \mathbf{J} = \frac{\partial f_\theta}{\partial \mathbf{z}} \Big|_{\mathbf{z}^*},

so the backward pass is itself a fixed-point problem (the *adjoint* equation), solved with any solver from
:mod:`revgnn.deq.solvers` using vector-Jacobian products of a single re-evaluation of :math:`f`. Nothing
from the forward solver iterations is kept, so memory does not depend on their number.

Two cheaper approximations are provided as well:

* :func:`phantom_grad`: :math:`k` damped steps
  :math:`\mathbf{z} \leftarrow (1-\tau)\mathbf{z} + \tau f(\mathbf{z}, \mathbf{x})` from
  :math:`\mathbf{z}^*` with autograd (Geng et al., 2021); memory grows with :math:`k`, not with the solver.
* :func:`unroll`: plain weight-tied iteration from :math:`\mathbf{z}_0`, backpropagated through every step
  (for tests and for unrolled pretraining).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from .solvers import SolverResult

__all__ = ["attach_implicit_grad", "phantom_grad", "unroll"]

AdjointSolve = Callable[[Callable[[Tensor], Tensor], Tensor], SolverResult]


class _ImplicitGrad(torch.autograd.Function):
    r"""Identity in the forward pass; in the backward pass replaces the incoming gradient
    :math:`\partial\ell/\partial\mathbf{z}` by the adjoint solution :math:`\mathbf{u}`, which then flows
    through the graph of the single re-evaluation :math:`f(\mathbf{z}^*, \mathbf{x})` to :math:`\theta` and
    :math:`\mathbf{x}`."""

    @staticmethod
    def forward(ctx, z_out: Tensor, z_in: Tensor, solve: AdjointSolve,
                on_result: Optional[Callable[[SolverResult], None]]) -> Tensor:
        # Kept as attributes, not via save_for_backward: z_out must keep its grad_fn (we differentiate
        # through it), and neither adds memory: z_out is f's own output, z_in the detached equilibrium.
        ctx.z_out, ctx.z_in, ctx.solve, ctx.on_result = z_out, z_in, solve, on_result
        # A copy, not a view: callers may modify the output in place (view + in-place is forbidden on
        # custom Function outputs).
        return z_out.clone()

    @staticmethod
    def backward(ctx, grad: Tensor):
        z_out, z_in = ctx.z_out, ctx.z_in

        def adjoint_map(u: Tensor) -> Tensor:
            (vjp,) = torch.autograd.grad(z_out, z_in, u, retain_graph=True)
            return vjp + grad

        result = ctx.solve(adjoint_map, grad)
        if ctx.on_result is not None:
            ctx.on_result(result)
        ctx.z_out = ctx.z_in = None  # let the graph go once the outer backward is done with it
        return result.z, None, None, None


def attach_implicit_grad(z_out: Tensor, z_in: Tensor, solve: AdjointSolve,
                         on_result: Optional[Callable[[SolverResult], None]] = None) -> Tensor:
    r"""Make backpropagation through :obj:`z_out` use implicit differentiation.

    Args:
        z_out (Tensor): :math:`f(\mathbf{z}_{in}, \mathbf{x})`, computed with autograd enabled.
        z_in (Tensor): the equilibrium, a detached leaf with :obj:`requires_grad=True`.
        solve (callable): :obj:`solve(adjoint_map, u0) -> SolverResult` for the adjoint fixed point.
        on_result (callable, optional): receives the adjoint :class:`SolverResult` (for statistics).

    Returns:
        A tensor equal to :obj:`z_out` (a copy) whose gradient is the implicit one. Higher-order
        gradients (:obj:`create_graph=True`) are not supported.
    """
    if not z_in.requires_grad or z_in.grad_fn is not None:
        raise ValueError("z_in must be a detached leaf tensor with requires_grad=True")
    return _ImplicitGrad.apply(z_out, z_in, solve, on_result)


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
