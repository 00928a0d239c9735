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
rows, so results do not depend on the thread count.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from revgnn.nn import ops
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
    w, b = norm.weight, norm.bias
    fused = (
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
    if fused:
        out, _, _ = ops.layer_norm_relu(
            _rows(x),
            w.contiguous(),
            b.contiguous(),
            norm.eps,
            _rows(mask) if mask is not None else None,
            mask_scale,
        )
        return out
    h = norm(x).relu()
    return h * ops.mask_values(mask, mask_scale, h) if mask is not None else h


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
