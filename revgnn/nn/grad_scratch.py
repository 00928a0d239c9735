"""Whether a backward pass may overwrite the output gradient autograd handed it.

A backward that returns an input gradient shaped like its output gradient can write it into that
gradient's storage, one buffer less at the peak, but only where nothing else reads that gradient:
a tensor hook or ``retain_grad`` that kept it, a ``torch.autograd.grad`` that was given it as
``grad_outputs`` or returns it, a second consumer autograd has not yet passed it to, or another
view of the same storage. Each of those holds one more reference to the tensor or its storage.

:func:`holders` counts them, ``(Python references, C++ tensor references, storage references)``,
and must be called as the first statement of the backward, before anything else takes a
reference. A backward may reuse the gradient where the count equals :func:`sole_holders`', the
count measured once, outside any backward pass, on a probe whose gradient nothing but autograd
holds. The probe is of the same kind as the caller (``"function"``: a
:class:`torch.autograd.Function`'s ``backward``; ``"operator"``: a ``torch.library`` custom
operator's registered backward), since the two calling paths hold different numbers of
references; the count depends on the Python and torch versions, not on the graph.
"""

from __future__ import annotations

import functools
import sys
from typing import List, Tuple

import torch
from torch import Tensor

__all__ = ["holders", "sole_holders", "whole_storage"]

Holders = Tuple[int, int, int]


def holders(grad: Tensor) -> Holders:
    """The Python references to ``grad``, the C++ references to its tensor and to its storage
    (call it as the backward's first statement: see the module's docstring)."""
    return (
        sys.getrefcount(grad),
        grad._use_count(),
        torch._C._storage_Use_Count(grad.untyped_storage()._cdata),
    )


def whole_storage(grad: Tensor) -> bool:
    """Whether ``grad`` is contiguous and the whole of its storage (no other view can share it)."""
    return (
        grad.is_contiguous()
        and grad.storage_offset() == 0
        and grad.untyped_storage().nbytes() == grad.numel() * grad.element_size()
    )


_PROBED: List[Holders] = []


class _FunctionProbe(torch.autograd.Function):
    """A copy whose backward records :func:`holders` of its output gradient and returns a fresh
    gradient (so that a probe consumed by a probe gets a gradient nobody else holds)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[override]
        return x.clone()

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        _PROBED.append(holders(grad))
        return grad.clone()


@torch.library.custom_op("revgnn::_holder_probe", mutates_args=())
def _operator_probe(x: Tensor) -> Tensor:
    """A copy whose registered backward records :func:`holders` of its output gradient."""
    return x.clone()


@_operator_probe.register_fake
def _(x):
    return torch.empty_like(x)


def _operator_probe_grad(ctx, grad):
    _PROBED.append(holders(grad))
    return grad


_operator_probe.register_autograd(_operator_probe_grad)


_PROBES = {"function": _FunctionProbe.apply, "operator": _operator_probe}


@functools.lru_cache(maxsize=None)
def sole_holders(kind: str) -> Holders:
    """:func:`holders` of an output gradient nothing but autograd holds, as a backward of ``kind``
    (``"function"`` or ``"operator"``) sees it; measured once. Call it first outside any backward
    pass (it runs one)."""
    with torch.inference_mode(False), torch.enable_grad():
        x = torch.zeros(2, requires_grad=True)
        _FunctionProbe.apply(_PROBES[kind](x)).sum().backward()
    measured = _PROBED[-1]  # the inner probe's, which runs last
    _PROBED.clear()
    return measured
