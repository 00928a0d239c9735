r"""Edge features kept in factored (linear) form, so per-layer edge encoders are cheap.

In RevGNN's recipe every layer owns an edge encoder
:math:`\mathbf{W}_\ell \in \mathbb{R}^{c \times h}` applied to the shared
edge embedding :math:`\mathbf{U} = \mathbf{E}\mathbf{W}_0^\top + \mathbf{b}_0`
(:math:`\mathbf{E}`: the raw :math:`E \times d` edge features, :math:`d = 8`
for proteins, :math:`h` the hidden width). Since both maps are linear,

.. math::
    \mathbf{U}\mathbf{W}_\ell^\top + \mathbf{b}_\ell =
    \mathbf{E}\,(\mathbf{W}_\ell\mathbf{W}_0)^\top +
    (\mathbf{W}_\ell\mathbf{b}_0 + \mathbf{b}_\ell)

costs :math:`E \cdot d \cdot c` multiply-adds per layer instead of
:math:`E \cdot h \cdot c` (10x fewer for proteins at :math:`h = 80`), and
:math:`\mathbf{U}` is never materialised. Same parameters, same function;
only the floating-point association differs. Gradients reach
:math:`\mathbf{W}_0, \mathbf{b}_0` through the composed weight.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from revgnn.nn.invertible import capture_autocast
from revgnn.utils.functional import transforms_active


class TallLinear(torch.autograd.Function):
    r""":func:`torch.nn.functional.linear` for a very tall input (one row per edge).

    Same forward; the weight gradient is formed as
    :math:`(\mathbf{X}^\top \mathbf{G})^\top` instead of PyTorch's
    :math:`\mathbf{G}^\top \mathbf{X}`, which is several times faster on CPU
    for a tall input with few columns and few outputs, as the edge encoders'
    (``docs/bench/in_code.md``).
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:  # type: ignore[override]
        autocast = capture_autocast(x.device)
        if autocast is not None:  # what autocast does to a linear, made explicit so that
            dtype = autocast[1]  # backward sees the same dtypes
            x, weight = x.to(dtype), weight.to(dtype)
            bias = bias.to(dtype) if bias is not None else None
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        with torch.autocast(x.device.type, enabled=False):
            return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        grad = grad.to(weight.dtype)
        grad_x = grad @ weight if ctx.needs_input_grad[0] else None
        grad_w = (x.t() @ grad).t() if ctx.needs_input_grad[1] else None
        grad_b = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b


class LinearEdgeFeatures:
    r"""The edge embedding :math:`\mathbf{E}\mathbf{W}_0^\top + \mathbf{b}_0`, unevaluated.

    Pass it where a block expects ``edge_attr``; it is shared by all groups of
    a :class:`~revgnn.nn.GroupAddRev` and its tensors get gradients there.

    Args:
        raw (torch.Tensor): Raw edge features ``[E, d]``.
        weight (torch.Tensor): :math:`\mathbf{W}_0`, ``[h, d]``.
        bias (torch.Tensor, optional): :math:`\mathbf{b}_0`, ``[h]``.
    """

    __slots__ = ("raw", "weight", "bias")

    def __init__(self, raw: Tensor, weight: Tensor, bias: Optional[Tensor] = None):
        if raw.size(-1) != weight.size(1):
            raise ValueError(
                f"edge features have {raw.size(-1)} columns but the encoder expects {weight.size(1)}"
            )
        self.raw, self.weight, self.bias = raw, weight, bias

    @classmethod
    def from_linear(cls, raw: Tensor, linear: nn.Linear) -> "LinearEdgeFeatures":
        return cls(raw, linear.weight, linear.bias)

    @property
    def channels(self) -> int:
        return self.weight.size(0)

    def materialize(self) -> Tensor:
        """:math:`\\mathbf{U}` itself, ``[E, h]``."""
        if transforms_active():  # torch.func: the plain linear, which it can differentiate and batch
            return F.linear(self.raw, self.weight, self.bias)
        return TallLinear.apply(self.raw, self.weight, self.bias)

    def compose(self, linear: Optional[nn.Linear]) -> "LinearEdgeFeatures":
        r"""``linear(U)``, still unevaluated: the raw features with the composed map
        :math:`(\mathbf{W}_\ell\mathbf{W}_0, \mathbf{W}_\ell\mathbf{b}_0 + \mathbf{b}_\ell)`."""
        if linear is None:
            return self
        weight = linear.weight @ self.weight
        bias = linear.bias
        if self.bias is not None:
            bias = linear.weight @ self.bias if bias is None else bias + linear.weight @ self.bias
        return LinearEdgeFeatures(self.raw, weight, bias)

    def __repr__(self) -> str:
        return f"LinearEdgeFeatures(edges={self.raw.size(0)}, {self.raw.size(-1)} -> {self.channels})"


pytree.register_pytree_node(
    LinearEdgeFeatures,
    lambda e: ([e.raw, e.weight, e.bias], None),
    lambda values, _: LinearEdgeFeatures(*values),
)
