r"""The autograd machinery behind reversible blocks.

A reversible block computes :math:`\mathbf{Y} = F(\mathbf{X})` with an inverse
:math:`\mathbf{X} = F^{-1}(\mathbf{Y})`, so it does not need to keep
:math:`\mathbf{X}` for the backward pass: it reconstructs it from the output.
:class:`InvertibleFunction` runs the block's forward without building a graph,
keeps nothing but a handle on its own output and, in backward, lets the block
reconstruct its input and differentiate in one go.

How memory stays flat in depth (without touching anybody's storage)
---------------------------------------------------------------------
Every reversible output carries an :class:`OutputSlot`. Its producer keeps the
output alive through the slot only until another reversible block *consumes*
it as input; from then on the consumer promises to hand the reconstructed
tensor back through the slot during its own backward pass, which autograd
always runs before the producer's. So in a chain of reversible blocks only the
newest output is referenced by autograd, and nothing is ever freed in place:
a tensor that somebody else still holds (a skip connection, another op that
saved it) simply stays alive and correct. PyG's ``InvertibleModule`` instead
resizes the input storage to zero, which corrupts a tensor that is still needed
elsewhere and destroys the caller's input.

Stochastic layers inside a block (``nn.Dropout``, attention dropout) are
replayed exactly: the RNG state is recorded before each recomputed call in the
forward pass, but only kept when the call actually drew random numbers.
Buffers such as BatchNorm's running statistics are restored after each
recomputation, so they are updated once per step, as in a plain model. An
active ``torch.autocast`` context is recorded in forward and re-entered for
the recomputation, so mixed-precision blocks recompute the same values.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

SLOT_ATTR = "_revgnn_slot"


class OutputSlot:
    r"""Hands the output of a reversible block to whoever reconstructs it.

    ``tensor`` holds a detached alias of the output after the forward pass;
    it is dropped when another reversible block consumes the output and
    refilled by that block's backward with the reconstructed tensor.
    """

    __slots__ = ("tensor", "version", "consumed")

    def __init__(self, output: Tensor):
        self.tensor: Optional[Tensor] = output.detach()
        self.version: int = output._version
        self.consumed = False

    def consume(self) -> None:
        self.consumed = True
        self.tensor = None

    def fill(self, tensor: Tensor) -> None:
        self.tensor = tensor

    def take(self) -> Tensor:
        if self.tensor is None:
            raise RuntimeError(
                "revgnn: the output of a reversible block is needed for its backward "
                "pass, but it was handed to another reversible block whose backward "
                "did not run (its result does not reach the loss). Pass a copy to that "
                "block instead, e.g. `other_block(y.clone(), ...)`, or use its output."
            )
        if not self.consumed and self.tensor._version != self.version:
            raise RuntimeError(
                "revgnn: the output of a reversible block was modified in-place after "
                "the forward pass, so the block can no longer reconstruct its input. "
                "Use an out-of-place operation instead (e.g. `y = y.relu()` rather "
                "than `y.relu_()`)."
            )
        return self.tensor


def input_slot(x: Tensor) -> Optional[OutputSlot]:
    """The slot of ``x`` if ``x`` is an unmodified output of a reversible block."""
    slot = getattr(x, SLOT_ATTR, None)
    if slot is None or slot.version != x._version:
        return None
    return slot


# --------------------------------------------------------------------------- RNG


@dataclass
class RNGState:
    """The CPU generator state and, for CUDA inputs, the device generator state."""

    cpu: Tensor
    cuda: Optional[Tensor] = None
    device: Optional[torch.device] = None


def capture_rng(device: torch.device) -> RNGState:
    state = RNGState(torch.get_rng_state())
    if device.type == "cuda":
        state.cuda = torch.cuda.get_rng_state(device)
        state.device = device
    return state


def rng_advanced(before: RNGState) -> bool:
    """Whether any random numbers were drawn since ``before`` was captured."""
    if not torch.equal(before.cpu, torch.get_rng_state()):
        return True
    if before.cuda is not None:
        return not torch.equal(before.cuda, torch.cuda.get_rng_state(before.device))
    return False


@contextlib.contextmanager
def replay_rng(state: Optional[RNGState]) -> Iterator[None]:
    """Run the body with the generators set to ``state``, then restore them."""
    if state is None:
        yield
        return
    devices = [state.device] if state.cuda is not None else []
    with torch.random.fork_rng(devices=devices):
        torch.set_rng_state(state.cpu)
        if state.cuda is not None:
            torch.cuda.set_rng_state(state.cuda, state.device)
        yield


# ---------------------------------------------------------------------- autocast


def capture_autocast(device: torch.device) -> Optional[Tuple[str, torch.dtype]]:
    """The active autocast (device type, dtype) for ``device``, if any.

    Autograd runs backward outside the caller's ``torch.autocast`` context, so
    the recomputation must re-enter it to reproduce the forward values.
    """
    kind = device.type
    if torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind):
        return kind, torch.get_autocast_dtype(kind)
    return None


def autocast_as(state: Optional[Tuple[str, torch.dtype]]):
    return torch.autocast(state[0], dtype=state[1]) if state else contextlib.nullcontext()


# ----------------------------------------------------------------------- buffers


@contextlib.contextmanager
def frozen_buffers(module: nn.Module) -> Iterator[None]:
    """Undo buffer updates (e.g. BatchNorm running statistics) made in the body.

    A recomputation in backward must see the same training-mode statistics as
    the forward pass but must not count as a second update.
    """
    saved = [(b, b.clone()) for b in module.buffers() if b is not None]
    try:
        yield
    finally:
        with torch.no_grad():
            for buf, copy in saved:
                buf.copy_(copy)


# ------------------------------------------------------------------ arg binding


class Shared:
    """Marks an argument that every group of a reversible block receives whole.

    Example: ``block(x, edge_index, Shared(edge_attr))`` where ``edge_attr``
    happens to have as many columns as ``x`` but is not a node feature.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return f"Shared({type(self.value).__name__})"


class PerGroup:
    """Marks an argument given explicitly per group: group ``i`` gets ``values[i]``."""

    __slots__ = ("values",)

    def __init__(self, values: Sequence[Any]):
        self.values = list(values)

    def __repr__(self) -> str:
        return f"PerGroup(len={len(self.values)})"


def _requires_grad(v: Any) -> bool:
    return isinstance(v, Tensor) and v.requires_grad


class ArgBinding:
    """Separates the differentiable tensors out of ``(args, kwargs)``.

    Arguments are flattened as a pytree (tuples, lists, dicts, :class:`Shared`,
    :class:`PerGroup` and registered containers such as
    :class:`~revgnn.nn.edge_features.LinearEdgeFeatures`). Tensors that require
    grad are handed to :class:`InvertibleFunction` as inputs so that autograd
    routes their gradients; everything else is kept by reference.
    """

    def __init__(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]):
        leaves, self._spec = pytree.tree_flatten((args, kwargs))
        self.tensors: List[Tensor] = [v for v in leaves if _requires_grad(v)]
        self._leaves = [_HOLE if _requires_grad(v) else v for v in leaves]

    def bind(self, tensors: Sequence[Tensor]) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        """``(args, kwargs)`` with the differentiable tensors replaced by ``tensors``."""
        it = iter(tensors)
        return pytree.tree_unflatten([next(it) if v is _HOLE else v for v in self._leaves], self._spec)


def any_requires_grad(tree: Any) -> bool:
    """Whether any tensor in the pytree ``tree`` requires grad."""
    return any(_requires_grad(v) for v in pytree.tree_leaves(tree))


_HOLE = object()
pytree.register_pytree_node(Shared, lambda s: ([s.value], None), lambda v, _: Shared(v[0]))
pytree.register_pytree_node(PerGroup, lambda p: (list(p.values), None), lambda v, _: PerGroup(v))


# --------------------------------------------------------------------- function


@dataclass
class _Call:
    block: "nn.Module"
    binding: ArgBinding
    params: List[nn.Parameter]  # the trainable parameters at forward time, in input order
    in_slot: Optional[OutputSlot]
    keep_input: bool
    num_bwd_passes: int
    out_slot: Optional[OutputSlot] = None


class InvertibleFunction(torch.autograd.Function):
    r"""Runs an invertible block without storing activations.

    The block must provide

    * ``_inverse_forward(x, args, kwargs) -> (y, rng_states)`` (called under
      ``no_grad``), and
    * ``_inverse_backward(y, grad_y, args, kwargs, rng_states, x_kept,
      arg_leaves, params) -> (x, grad_x, arg_grads, param_grads)``, which
      reconstructs the input and differentiates in the same pass.
    """

    @staticmethod
    def forward(ctx, call: _Call, x: Tensor, *tensors: Tensor) -> Tensor:  # type: ignore[override]
        arg_tensors = tensors[: len(tensors) - len(call.params)]
        args, kwargs = call.binding.bind([t.detach() for t in arg_tensors])
        with torch.no_grad():
            y, rng_states = call.block._inverse_forward(x.detach(), args, kwargs)
        ctx.call = call
        ctx.rng_states = rng_states
        ctx.autocast = capture_autocast(x.device)
        ctx.passes_left = call.num_bwd_passes
        ctx.save_for_backward(*arg_tensors, *((x,) if call.keep_input else ()))
        call.out_slot = OutputSlot(y)
        return y

    @staticmethod
    def backward(ctx, grad_y: Tensor):  # type: ignore[override]
        call: _Call = ctx.call
        if ctx.passes_left <= 0:
            raise RuntimeError(
                f"revgnn: backward ran through a reversible block more than "
                f"num_bwd_passes={call.num_bwd_passes} times. Construct the block with "
                f"a larger `num_bwd_passes` if you need repeated backward passes "
                f"(e.g. `retain_graph=True`)."
            )
        ctx.passes_left -= 1
        last_pass = ctx.passes_left == 0

        saved = ctx.saved_tensors
        x_kept = saved[-1] if call.keep_input else None
        arg_tensors = saved[: len(saved) - 1] if call.keep_input else saved
        num_args = len(arg_tensors)
        needs = ctx.needs_input_grad[1:]  # (x, *arg tensors, *params)
        arg_leaves = [t.detach().requires_grad_(bool(needs[1 + i])) for i, t in enumerate(arg_tensors)]
        args, kwargs = call.binding.bind(arg_leaves)
        params = call.params
        wanted_params = [p for i, p in enumerate(params) if needs[1 + num_args + i]]

        y = call.out_slot.take()
        with autocast_as(ctx.autocast):
            x, grad_x, arg_grads, param_grads = call.block._inverse_backward(
                y,
                grad_y,
                args,
                kwargs,
                ctx.rng_states,
                x_kept,
                [leaf for leaf in arg_leaves if leaf.requires_grad],
                wanted_params,
            )

        if call.out_slot.consumed or last_pass:
            call.out_slot.tensor = None  # a consumer refills it on the next pass
        if call.in_slot is not None:
            call.in_slot.fill(x)

        grads_by_leaf = iter(arg_grads)
        out_arg_grads = [next(grads_by_leaf) if leaf.requires_grad else None for leaf in arg_leaves]
        grads_by_param = dict(zip(map(id, wanted_params), param_grads))
        out_param_grads = [grads_by_param.get(id(p)) for p in params]
        return (None, grad_x if needs[0] else None, *out_arg_grads, *out_param_grads)


def apply_invertible(
    block: nn.Module,
    x: Tensor,
    args: Tuple[Any, ...],
    kwargs: Dict[str, Any],
    *,
    keep_input: bool,
    num_bwd_passes: int,
) -> Tensor:
    """Calls ``block`` through :class:`InvertibleFunction` and tags its output."""
    binding = ArgBinding(args, kwargs)
    params = list(block._inverse_params)
    slot = input_slot(x)
    call = _Call(block, binding, params, slot, keep_input, num_bwd_passes)
    y = InvertibleFunction.apply(call, x, *binding.tensors, *params)
    if slot is not None:
        slot.consume()
    setattr(y, SLOT_ATTR, call.out_slot)
    return y
