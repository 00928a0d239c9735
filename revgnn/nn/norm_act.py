r"""Fused pre-activation :math:`\mathrm{ReLU}(\mathrm{LayerNorm}(\mathbf{X})) \odot \mathbf{M}`.

Every GENConv block runs LayerNorm -> ReLU twice (the pre-activation and inside its MLP), and the
pre-activation then multiplies by the shared dropout mask :math:`\mathbf{M}`:

.. math::
    \mathbf{H}_{i} = \max\Big(\frac{\mathbf{x}_i - \mu_i}{\sqrt{\sigma_i^2 + \epsilon}}
    \odot \mathbf{w} + \mathbf{b},\ 0\Big) \odot \mathbf{m}_i

PyTorch runs that as three ops forward and three backward, each a pass over ``[N, C]`` with
per-row overhead that dominates at these widths (``C`` = 40 in RevGNN-Deep's groups).
:func:`layer_norm_relu` runs it as one operator, ``torch.ops.revgnn.layer_norm_relu``
(:mod:`revgnn.nn.ops`), saving only the row means and inverse standard deviations (the ReLU mask is
recomputed): one pass each way through the C++ kernel of :mod:`revgnn.nn.kernels` (CPU,
float32/64), PyTorch's ``native_layer_norm`` and its backward elsewhere. Under autocast, for a
``LayerNorm`` subclass or with hooks, and for a mask that needs a gradient it calls the module and
the same PyTorch ops instead. The kernel sums the weight and bias gradients in fixed blocks of
rows, so results do not depend on the thread count. Its backward writes the input gradient over
the output gradient where nothing but autograd holds that (``[N, C]`` either way).

Inside GENConv's MLP (:func:`sequential_forward`) LayerNorm-ReLU and the linear layer after it run
as one autograd function that keeps the hidden input and row statistics but not the activation
between them (recomputed in backward, freed before its gradient is allocated): the MLP's backward
holds two ``[N, 2C]`` tensors at once, not three.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from revgnn.nn import ops
from revgnn.nn.grad_scratch import sole_holders
from revgnn.utils.functional import transforms_active


def _rows(t: Tensor) -> Tensor:
    """``t`` itself when its rows are contiguous (a channel slice of a wider tensor is fine)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def layer_norm_relu(
    x: Tensor, norm: nn.LayerNorm, mask: Optional[Tensor] = None, mask_scale: float = 1.0
) -> Tensor:
    r"""``norm(x).relu() * mask`` (``mask`` optional); for a ``[N, C]`` input and an
    :class:`~torch.nn.LayerNorm` (exactly, without forward hooks) over ``C`` with weight and bias
    the one operator ``torch.ops.revgnn.layer_norm_relu`` (:mod:`revgnn.nn.ops`), and computed as
    written otherwise (a subclass's own ``forward`` and hooks run).

    Args:
        x (torch.Tensor): ``[N, C]``.
        norm (torch.nn.LayerNorm): Normalises the last dimension; its ``eps``, ``weight`` and
            ``bias`` are used.
        mask (torch.Tensor, optional): Multiplies the result (a dropout mask), shaped like ``x``:
            typed like ``x``, or bool (``mask_scale`` where true, 0 where false).
        mask_scale (float, optional): A bool mask's value where true. (default: :obj:`1.0`)
    """
    if _fusable(x, norm, mask):
        if torch.is_grad_enabled() and not torch.compiler.is_compiling():
            sole_holders("operator")  # measured outside any backward pass, before the first one needs it
        out, _, _ = ops.layer_norm_relu(
            _rows(x),
            norm.weight.contiguous(),
            norm.bias.contiguous(),
            norm.eps,
            _rows(mask) if mask is not None else None,
            mask_scale,
        )
        return out
    h = norm(x).relu()
    return h * ops.mask_values(mask, mask_scale, h) if mask is not None else h


def _fusable(x: Tensor, norm: nn.LayerNorm, mask: Optional[Tensor] = None) -> bool:
    """Whether :func:`layer_norm_relu` runs the one operator on these arguments."""
    w, b = norm.weight, norm.bias
    return (
        type(norm) is nn.LayerNorm
        and plain_module(norm)
        and x.dim() == 2
        and w is not None
        and b is not None
        and tuple(norm.normalized_shape) == (x.size(1),)
        and all(t.dtype == x.dtype and t.device == x.device for t in (w, b))
        and not torch.is_autocast_enabled(x.device.type)
        and not transforms_active()  # torch.func differentiates the plain ops
        and (
            mask is None
            or (
                mask.shape == x.shape
                and mask.dtype in (x.dtype, torch.bool)
                and mask.device == x.device
                and not mask.requires_grad
            )
        )
    )


class _NormReluLinear(torch.autograd.Function):
    r""":math:`\mathrm{Linear}(\mathrm{ReLU}(\mathrm{LayerNorm}(\mathbf{X})))` keeping
    :math:`\mathbf{X}` and the row statistics, not the activation :math:`\mathbf{H}` between them:
    backward recomputes :math:`\mathbf{H}` (the same kernel, so the same bits), takes the linear
    layer's weight gradient :math:`\mathbf{G}^\top \mathbf{H}` and frees :math:`\mathbf{H}`
    before it allocates :math:`\partial \mathbf{H} = \mathbf{G}\mathbf{W}`, then writes
    :math:`\partial \mathbf{X}` over :math:`\partial \mathbf{H}`
    (``torch.ops.revgnn.layer_norm_relu_backward_``): two ``[N, C]`` tensors alive where autograd
    through the two operators holds three. Every gradient is computed by the ops autograd runs
    for ``F.linear`` (``addmm``), in the same order, so it is bitwise the same."""

    @staticmethod
    def forward(ctx, x: Tensor, nw: Tensor, nb: Tensor, eps: float, weight: Tensor, bias: Optional[Tensor]):  # type: ignore[override]
        h, mean, rstd = ops.layer_norm_relu(x, nw, nb, eps, None, 1.0)
        ctx.eps = eps
        ctx.save_for_backward(x, nw, nb, mean, rstd, weight)
        return torch.nn.functional.linear(h, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        x, nw, nb, mean, rstd, weight = ctx.saved_tensors
        need_x, need_nw, need_nb, _, need_w, need_b = ctx.needs_input_grad
        gw = gb = gx = gnw = gnb = None
        if need_w:
            h = ops.layer_norm_relu(x, nw, nb, ctx.eps, None, 1.0)[0]
            gw = grad.t().mm(h)  # addmm's weight gradient for F.linear's transposed weight
            del h
        if need_b:
            gb = grad.sum(0)
        if need_x or need_nw or need_nb:
            gh = grad.mm(weight)
            del grad
            if need_x:
                gnw, gnb = ops.layer_norm_relu_backward_(
                    gh, x, nw, nb, mean, rstd, None, 1.0, need_nw, need_nb
                )
                gx = gh
            else:
                _, gnw, gnb = ops.layer_norm_relu_backward(
                    gh, x, nw, nb, mean, rstd, None, 1.0, False, need_nw, need_nb
                )
        return gx, gnw if need_nw else None, gnb if need_nb else None, None, gw, gb


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
            i += 2
            while i < len(mods) and _identity(mods[i]):
                i += 1
            nxt = mods[i] if i < len(mods) else None
            if _fusable(x, mod) and _plain_linear(nxt, x):
                x = _NormReluLinear.apply(_rows(x), mod.weight, mod.bias, mod.eps, nxt.weight, nxt.bias)
                i += 1
            else:
                x = layer_norm_relu(x, mod)
            continue
        if not _identity(mod):
            x = mod(x)
        i += 1
    return x


def _identity(mod: nn.Module) -> bool:
    return type(mod) is nn.Dropout and mod.p == 0.0 and plain_module(mod)


def _plain_linear(mod: Optional[nn.Module], x: Tensor) -> bool:
    """``mod`` computes ``F.linear(x, mod.weight, mod.bias)``: an exact :class:`~torch.nn.Linear`
    or PyG ``Linear`` (initialised) without hooks, its parameters typed and placed like ``x``."""
    from torch_geometric.nn.dense.linear import Linear as PygLinear

    return (
        type(mod) in (nn.Linear, PygLinear)
        and plain_module(mod)
        and not isinstance(mod.weight, nn.parameter.UninitializedParameter)
        and mod.weight.dim() == 2
        and mod.weight.size(1) == x.size(1)
        and all(t is None or (t.dtype == x.dtype and t.device == x.device) for t in (mod.weight, mod.bias))
    )


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
