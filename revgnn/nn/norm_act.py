r"""Fused pre-activation :math:`\mathrm{ReLU}(\mathrm{LayerNorm}(\mathbf{X})) \odot \mathbf{M}`.

Every GENConv block runs LayerNorm -> ReLU twice (the pre-activation and inside its MLP), and the
pre-activation then multiplies by the shared dropout mask :math:`\mathbf{M}`:

.. math::
    \mathbf{H}_{i} = \max\Big(\frac{\mathbf{x}_i - \mu_i}{\sqrt{\sigma_i^2 + \epsilon}}
    \odot \mathbf{w} + \mathbf{b},\ 0\Big) \odot \mathbf{m}_i

PyTorch runs that as three ops forward and three backward, each a pass over ``[N, C]`` with
per-row overhead that dominates at these widths (``C`` = 40 in RevGNN-Deep's groups).
:func:`layer_norm_relu` runs it as one pass each way through the C++ kernel of
:mod:`revgnn.nn.kernels` (CPU, float32/64, outside autocast), saving only the row means and
inverse standard deviations (the ReLU mask is recomputed); elsewhere it calls the same three
PyTorch ops. The weight and bias gradients are summed in fixed blocks of rows, so results do not
depend on the thread count.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable


def _kernel():
    from revgnn.nn import kernels

    return kernels.layer_norm_relu()


class LayerNormReLU(torch.autograd.Function):
    """The C++ kernel as an autograd function; ``mask`` is :obj:`None` or shaped like ``x``."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, eps: float, mask: Optional[Tensor]) -> Tensor:  # type: ignore[override]
        out, mean, rstd = _kernel().forward(x, weight, bias, eps, mask)
        ctx.save_for_backward(x, weight, bias, mean, rstd, mask)
        return out

    @staticmethod
    @once_differentiable  # a double backward through it raises rather than silently giving 0
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        x, weight, bias, mean, rstd, mask = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        gx, gw, gb = _kernel().backward(
            grad_out.contiguous(), x, weight, bias, mean, rstd, mask, need_x, need_w, need_b
        )
        return (gx if need_x else None, gw if need_w else None, gb if need_b else None, None, None)


def _rows(t: Tensor) -> Tensor:
    """``t`` itself when its rows are contiguous (a channel slice of a wider tensor is fine)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def layer_norm_relu(x: Tensor, norm: nn.LayerNorm, mask: Optional[Tensor] = None) -> Tensor:
    r"""``norm(x).relu() * mask`` (``mask`` optional); fused for a ``[N, C]`` input and an
    :class:`~torch.nn.LayerNorm` (exactly, without forward hooks) over ``C`` with weight and bias
    where the kernel applies, and computed as written otherwise (a subclass's own ``forward``
    and hooks run).

    Args:
        x (torch.Tensor): ``[N, C]``.
        norm (torch.nn.LayerNorm): Normalises the last dimension; its ``eps``, ``weight`` and
            ``bias`` are used.
        mask (torch.Tensor, optional): Multiplies the result (a dropout mask), shaped like ``x``.
    """
    w, b = norm.weight, norm.bias
    fused = (
        type(norm) is nn.LayerNorm
        and plain_module(norm)
        and x.dim() == 2
        and w is not None
        and b is not None
        and tuple(norm.normalized_shape) == (x.size(1),)
        and x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and all(t.dtype == x.dtype and t.device == x.device and t.is_contiguous() for t in (w, b))
        and not torch.is_autocast_enabled("cpu")
        and (
            mask is None
            or (
                mask.shape == x.shape
                and mask.dtype == x.dtype
                and mask.device == x.device
                and not mask.requires_grad
            )
        )
        and _kernel() is not None
    )
    if fused:
        return LayerNormReLU.apply(_rows(x), w, b, norm.eps, _rows(mask) if mask is not None else None)
    h = norm(x).relu()
    return h * mask if mask is not None else h


def sequential_forward(seq: nn.Sequential, x: Tensor) -> Tensor:
    """``seq(x)`` with each :class:`~torch.nn.LayerNorm` that a :class:`~torch.nn.ReLU` follows run
    as :func:`layer_norm_relu`, and dropouts of ``p = 0`` (identities) skipped; used for
    GENConv's MLP (``Linear -> LayerNorm -> ReLU -> Dropout -> Linear``). Only exact
    ``ReLU``/``Dropout`` modules without forward hooks are replaced (and
    :func:`layer_norm_relu` fuses only such a ``LayerNorm``)."""
    if not plain_module(seq):
        return seq(x)
    mods = list(seq)
    i = 0
    while i < len(mods):
        mod = mods[i]
        if (
            isinstance(mod, nn.LayerNorm)
            and i + 1 < len(mods)
            and type(mods[i + 1]) is nn.ReLU
            and plain_module(mods[i + 1])
        ):
            x = layer_norm_relu(x, mod)
            i += 2
            continue
        if not (type(mod) is nn.Dropout and mod.p == 0.0 and plain_module(mod)):
            x = mod(x)
        i += 1
    return x


def plain_module(module: nn.Module) -> bool:
    """No forward hooks on ``module`` or globally: calling its functional form instead of the
    module skips nothing the user registered."""
    from torch.nn.modules import module as nn_module

    return not (
        module._forward_hooks
        or module._forward_pre_hooks
        or nn_module._global_forward_hooks
        or nn_module._global_forward_pre_hooks
    )
