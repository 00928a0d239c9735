r"""Invertible blocks: the contract (:class:`InvertibleModule`) and the autograd machinery behind it.

A reversible block computes :math:`\mathbf{Y} = F(\mathbf{X})` with an inverse
:math:`\mathbf{X} = F^{-1}(\mathbf{Y})`, so it does not need to keep
:math:`\mathbf{X}` for the backward pass: it reconstructs it from the output.
A block subclasses :class:`InvertibleModule` (as :class:`~revgnn.nn.GroupAddRev`
does); :class:`InvertibleFunction` runs its forward without building a graph,
keeps nothing but a handle on its own output and, in backward, lets the block
reconstruct its input and differentiate.

How memory stays flat in depth (without touching anybody's storage)
---------------------------------------------------------------------
Every reversible output has an :class:`OutputSlot`, looked up by the output's identity in a weak
table (:func:`input_slot`), so the output itself stays a plain tensor (``torch.save`` and
``torch.load(weights_only=True)`` read it like any other). Its producer keeps the
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
replayed exactly: the RNG state is recorded before each keyed call
(:meth:`InvertibleModule.replay_random`) in the forward pass, but only kept
when the call actually drew random numbers.
Buffers such as BatchNorm's running statistics are restored after each
recomputation, so they are updated once per step, as in a plain model. An
active ``torch.autocast`` context is recorded in forward and re-entered for
the recomputation, so mixed-precision blocks recompute the same values.

Under :func:`torch.func.functional_call` the recomputation in backward binds the
tensors the forward pass computed with (the ones passed in), so their gradients
are exact; under :mod:`torch.func` transforms (``grad``, ``vmap``, ...) a block runs
as its plain map (:mod:`revgnn.utils.functional`), with activations stored.
"""

from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree
from torch.utils.weak import WeakIdKeyDictionary

from revgnn.nn.grad_scratch import holders, sole_holders, whole_storage
from revgnn.utils.functional import bound_to, module_tensors, transforms_active

#: The :class:`OutputSlot` of each live output of an invertible block, by the output's identity. Not a
#: tensor attribute: one would make the output a tensor with state, which ``torch.save`` pickles and
#: ``torch.load(weights_only=True)`` refuses. Weak, so the entry goes with the output.
_SLOTS: WeakIdKeyDictionary = WeakIdKeyDictionary()


class OutputSlot:
    r"""Hands the output of a reversible block to whoever reconstructs it.

    ``tensor`` holds a detached alias of the output after the forward pass;
    it is dropped when another reversible block consumes the output and
    refilled by that block's backward with the reconstructed tensor.
    """

    __slots__ = ("tensor", "version", "consumed", "internal")

    def __init__(self, output: Tensor):
        self.tensor: Optional[Tensor] = output.detach()
        self.version: int = output._version
        self.consumed = False
        self.internal = False  # mark_internal: nothing reads the output after backward

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


def mark_internal(y: Tensor) -> None:
    """Declares that nothing reads ``y``, the output of a reversible block, after the backward
    pass (a model's own intermediate, e.g. the last block's output that only the model's head
    reads): the block may then rebuild its input in ``y``'s storage on its last backward pass
    instead of a new tensor, one node state less at the peak of the backward. No effect on
    any other tensor, and none inside a compiled region (where looking the slot up would break
    the graph; the reversible blocks themselves run eagerly there)."""
    if torch.compiler.is_compiling():
        return
    slot = _SLOTS.get(y)
    if slot is not None:
        slot.internal = True


def input_slot(x: Tensor) -> Optional[OutputSlot]:
    """The slot of ``x`` if ``x`` is an unmodified output of a reversible block."""
    slot = _SLOTS.get(x)
    if slot is None or slot.version != x._version:
        return None
    return slot


# --------------------------------------------------------------------------- RNG


@dataclass
class RNGState:
    """The CPU generator state and, for an accelerator's inputs, that device's generator state."""

    cpu: Tensor
    accelerator: Optional[Tensor] = None
    device: Optional[torch.device] = None


def _device_rng(device: torch.device):
    """The torch module whose ``get_rng_state``/``set_rng_state`` serve ``device`` (``torch.cuda``,
    ``torch.xpu``, ``torch.mps``, ...), or None for the CPU and ``meta``; an error for a device whose
    generator torch does not expose, rather than dropout replayed wrongly."""
    if device.type in ("cpu", "meta"):
        return None
    module = getattr(torch, device.type, None)
    if module is None or not hasattr(module, "get_rng_state") or not hasattr(module, "set_rng_state"):
        raise RuntimeError(
            f"revgnn: cannot record the random state of {device.type} tensors, so dropout inside a "
            "reversible block could not be replayed exactly in backward; pass dropout masks in as "
            "arguments (SharedDropout), or construct the block with preserve_rng_state=False if it draws "
            "no random numbers"
        )
    return module


def capture_rng(device: torch.device) -> RNGState:
    state = RNGState(torch.get_rng_state())
    module = _device_rng(device)
    if module is not None:
        state.accelerator = module.get_rng_state(device)
        state.device = device
    return state


def rng_advanced(before: RNGState) -> bool:
    """Whether any random numbers were drawn since ``before`` was captured."""
    if not torch.equal(before.cpu, torch.get_rng_state()):
        return True
    if before.accelerator is not None:
        now = _device_rng(before.device).get_rng_state(before.device)
        return not torch.equal(before.accelerator, now)
    return False


@contextlib.contextmanager
def replay_rng(state: Optional[RNGState]) -> Iterator[None]:
    """Run the body with the generators set to ``state``, then restore them."""
    if state is None:
        yield
        return
    if state.accelerator is None:
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(state.cpu)
            yield
        return
    device = state.device
    with torch.random.fork_rng(devices=[device], device_type=device.type):
        torch.set_rng_state(state.cpu)
        _device_rng(device).set_rng_state(state.accelerator, device)
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
    state: Dict[str, Tensor]  # every parameter and buffer the forward computed with, by name
    in_slot: Optional[OutputSlot]
    keep_input: bool
    num_bwd_passes: int
    out_slot: Optional[OutputSlot] = None


class InvertibleFunction(torch.autograd.Function):
    r"""Runs an :class:`InvertibleModule` without storing activations.

    Forward calls the block's ``_inverse_forward`` under ``no_grad``; backward
    takes the output from its :class:`OutputSlot`, calls ``_inverse_backward``
    and hands the reconstructed input to the slot of the block that produced
    it. The hooks are documented on :class:`InvertibleModule`.
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
        held = holders(grad_y)  # first: see revgnn.nn.grad_scratch
        call: _Call = ctx.call
        if torch.is_grad_enabled():
            # autograd runs a backward with grad mode on only for create_graph=True. The input is
            # rebuilt and differentiated here with torch.autograd.grad on detached tensors, so the
            # gradient this returns has no graph back to x or the parameters: a second derivative
            # taken through it would be silently wrong. Making it exact would mean keeping the
            # recomputation's graph, i.e. the activations the block exists not to store.
            raise RuntimeError(
                f"revgnn: a backward pass with create_graph=True (a second derivative: gradient "
                f"penalty, double backward, Hessian-vector product) ran through the reversible block "
                f"{type(call.block).__name__}, whose gradient has no graph of its own. Construct the "
                f"block with disable=True (a plain residual block: activations stored, second "
                f"derivatives exact), or differentiate with torch.func (e.g. torch.func.grad of "
                f"torch.func.grad), under which the block runs as its plain map."
            )
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
        # A consumer's reconstruction that nothing else holds, or an output marked internal, on
        # its last use: the block may rebuild its input in it (InvertibleModule.output_is_scratch).
        scratch = (call.out_slot.consumed or call.out_slot.internal) and last_pass
        grad_scratch = _gradient_is_scratch(call.out_slot, grad_y, held)
        with (
            autocast_as(ctx.autocast),
            bound_to(call.block, call.state),
            call.block.scratch_output(scratch, grad_scratch),
        ):
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


def _gradient_is_scratch(slot: OutputSlot, grad: Tensor, held: Tuple[int, int, int]) -> bool:
    """Whether ``grad``, the gradient autograd passed for ``slot``'s output, is a buffer the block
    may overwrite: the output is the model's own (consumed by another reversible block, or
    marked internal), and ``grad`` is contiguous, the whole of its storage, and held by nothing
    but autograd's call (``holders``, counted as the caller's ``backward`` began, equal to a
    probe's). A tensor hook that kept it, a second consumer that autograd has not yet passed it
    to, a ``torch.autograd.grad`` returning it to its caller, or a view of a larger gradient
    (another view of which another function reads) each make one more holder."""
    return (slot.consumed or slot.internal) and whole_storage(grad) and held == sole_holders("function")


# InvertibleFunction's backward hands tensors between blocks through OutputSlots and calls
# torch.autograd.grad, which torch.compile cannot capture: the reversible call runs eagerly inside a
# compiled model (one graph break per block), so its backward reconstructs instead of storing.
@torch.compiler.disable
def apply_invertible(
    block: nn.Module,
    x: Tensor,
    args: Tuple[Any, ...],
    kwargs: Dict[str, Any],
    *,
    keep_input: bool,
    num_bwd_passes: int,
) -> Tensor:
    """Calls ``block`` (an :class:`InvertibleModule`) through :class:`InvertibleFunction` and
    records its output's :class:`OutputSlot` (:func:`input_slot`)."""
    sole_holders("function")  # measured outside any backward pass, before the first one needs it
    binding = ArgBinding(args, kwargs)
    params = list(block._inverse_params)
    slot = input_slot(x)
    call = _Call(block, binding, params, module_tensors(block), slot, keep_input, num_bwd_passes)
    y = InvertibleFunction.apply(call, x, *binding.tensors, *params)
    if slot is not None:
        slot.consume()
    _SLOTS[y] = call.out_slot
    return y


# ----------------------------------------------------------------------- contract


class InvertibleModule(nn.Module, abc.ABC):
    r"""Base class of a block with an exact inverse, trained without storing its activations.

    A subclass writes the block as a map and its inverse,

    .. math::
        \mathbf{Y} = F(\mathbf{X}, \ldots), \qquad \mathbf{X} = F^{-1}(\mathbf{Y}, \ldots),

    by implementing :meth:`_forward` and :meth:`_inverse`; the extra
    arguments (``edge_index``, edge features, masks, ...) are passed to both
    unchanged. Calling the module then runs :math:`F` without building a
    graph and keeps no activation: in backward, :math:`\mathbf{X}` is
    rebuilt from :math:`\mathbf{Y}` with :meth:`_inverse` and :math:`F` is
    evaluated once more with grad to differentiate. Gradients reach
    :math:`\mathbf{X}`, every trainable parameter and every extra argument
    that requires grad, as in a plain module.

    The protocol, which :class:`InvertibleFunction` drives, has three hooks
    with working defaults; a subclass may override them to do better:

    * :meth:`_inverse_forward` ``(x, args, kwargs) -> (y, rng_states)``: the
      forward pass, called under ``no_grad``; by default :meth:`_forward`,
      recording the random state of every :meth:`replay_random` call.
    * :meth:`_inverse_backward` ``(y, grad_y, args, kwargs, rng_states,
      x_kept, arg_leaves, params) -> (x, grad_x, arg_grads, param_grads)``:
      reconstructs the input and returns the gradients of the input, of
      ``arg_leaves`` (the extra arguments' tensors that need grad, in
      order) and of ``params``. By default :meth:`_inverse` followed by one
      evaluation of :meth:`_forward` with grad; :class:`~revgnn.nn.GroupAddRev`
      fuses the two so that each of its functions runs once in backward.
    * :attr:`_inverse_params`: the parameters whose gradients the block
      returns (by default every parameter that requires grad).

    **Output hand-off.** The output has an :class:`OutputSlot`, kept in a
    weak table by the output's identity (the output is a plain tensor). When
    another invertible module consumes that output, the producer's reference to it is dropped and the consumer
    refills the slot with the reconstructed tensor during its backward, which
    autograd runs first: a chain of invertible modules keeps only the newest
    output alive. Nothing is freed in place, so a tensor used elsewhere stays
    valid; modifying an output in place is an error in backward.

    **Randomness.** Stochastic calls inside :meth:`_forward` and
    :meth:`_inverse` go through :meth:`replay_random` with a key: the random
    state before each keyed call is recorded in the forward pass and
    restored for the same key in the reconstruction and the recomputation,
    so dropout gives exact gradients whatever order the inverse runs its
    calls in. Buffers (BatchNorm running statistics) are restored after the
    recomputation, so they are updated once per step, and an active
    ``torch.autocast`` is re-entered.

    Args:
        disable (bool, optional): Run :meth:`_forward` with ordinary autograd
            (stores activations; a reference). (default: :obj:`False`)
        num_bwd_passes (int, optional): How many backward passes through the
            block are allowed (``retain_graph=True``). (default: :obj:`1`)
        preserve_rng_state (bool, optional): Record and replay the random
            state of :meth:`replay_random` calls. (default: :obj:`True`)
        keep_input (bool, optional): Store the input instead of reconstructing
            it (bounds float32 drift in very deep stacks). (default: :obj:`False`)

    Example:
        >>> class AdditiveCoupling(InvertibleModule):
        ...     def __init__(self, channels):
        ...         super().__init__()
        ...         self.f = nn.Linear(channels // 2, channels // 2)
        ...
        ...     def _forward(self, x):
        ...         x1, x2 = x.chunk(2, dim=-1)
        ...         return torch.cat([x2, x1 + self.f(x2)], dim=-1)
        ...
        ...     def _inverse(self, y):
        ...         y1, y2 = y.chunk(2, dim=-1)
        ...         return torch.cat([y2 - self.f(y1), y1], dim=-1)
        >>> block = AdditiveCoupling(8)
        >>> x = torch.randn(5, 8, requires_grad=True)
        >>> block(block(x)).square().sum().backward()
        >>> torch.allclose(block.inverse(block(x)), x, atol=1e-6)
        True
    """

    #: the hooks a subclass must implement, with their signatures (for the error message)
    _REQUIRED = {
        "_forward": "_forward(self, x, *args, **kwargs) -> y",
        "_inverse": "_inverse(self, y, *args, **kwargs) -> x",
    }

    def __new__(cls, *args: Any, **kwargs: Any):
        abstract = getattr(cls, "__abstractmethods__", ())
        missing = [sig for name, sig in cls._REQUIRED.items() if name in abstract]
        if missing:
            raise TypeError(
                f"{cls.__name__} subclasses InvertibleModule but does not implement "
                f"{' and '.join(missing)}; an invertible block needs both the map and its inverse"
            )
        return super().__new__(cls)

    def __init__(
        self,
        disable: bool = False,
        num_bwd_passes: int = 1,
        preserve_rng_state: bool = True,
        keep_input: bool = False,
    ):
        super().__init__()
        if num_bwd_passes < 1:
            raise ValueError(f"num_bwd_passes must be >= 1, got {num_bwd_passes}")
        self.disable = disable
        self.num_bwd_passes = num_bwd_passes
        self.preserve_rng_state = preserve_rng_state
        self.keep_input = keep_input
        self._rng_scope: Optional[_RNGScope] = None

    @abc.abstractmethod
    def _forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        r"""The map :math:`\mathbf{Y} = F(\mathbf{X}, \ldots)`, differentiable, shape-preserving in ``x``."""

    @abc.abstractmethod
    def _inverse(self, y: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        r"""The inverse :math:`\mathbf{X} = F^{-1}(\mathbf{Y}, \ldots)` (called without grad)."""

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if (
            self.disable
            or not torch.is_grad_enabled()
            or not self._needs_graph(x, args, kwargs)
            or transforms_active()  # torch.func differentiates the plain map (activations are kept)
        ):
            return self._forward(x, *args, **kwargs)
        return apply_invertible(
            self, x, args, kwargs, keep_input=self.keep_input, num_bwd_passes=self.num_bwd_passes
        )

    @torch.no_grad()
    def inverse(self, y: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        r"""Reconstructs the input from the output :math:`\mathbf{Y}` (no graph is built).

        No random state is replayed here: stochastic layers must be in
        ``eval()`` mode or get an explicit mask.
        """
        return self._inverse(y, *args, **kwargs)

    def replay_random(self, key: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` whose random draws are replayed in backward.

        In the forward pass the random state before the call is recorded
        under ``key`` (only if the call draws random numbers); when the block
        reconstructs its input or recomputes in backward, the call with the
        same ``key`` runs from that state. Give every stochastic call of one
        forward pass its own key. Outside the protocol (``disable``,
        :meth:`inverse`, ``no_grad``) this is a plain call.
        """
        scope = self._rng_scope
        if scope is None:
            return fn(*args, **kwargs)
        if scope.record:
            if key in scope.states:
                raise ValueError(
                    f"{type(self).__name__}: replay_random key {key!r} was used twice in one forward "
                    f"pass; give every stochastic call its own key"
                )
            before = capture_rng(scope.device) if self.preserve_rng_state else None
            out = fn(*args, **kwargs)
            scope.states[key] = before if before is not None and rng_advanced(before) else None
            return out
        if key not in scope.states:
            raise KeyError(
                f"{type(self).__name__}: replay_random key {key!r} is used in backward but was not "
                f"used in the forward pass; _forward and _inverse must use the same keys"
            )
        with replay_rng(scope.states[key]):
            return fn(*args, **kwargs)

    @contextlib.contextmanager
    def replaying(self, rng_states: Dict[Any, Optional[RNGState]], device: torch.device) -> Iterator[None]:
        """Within the body, :meth:`replay_random` replays ``rng_states`` (those of
        :meth:`_inverse_forward`); for overrides of :meth:`_inverse_backward`."""
        with self._scope(_RNGScope(False, rng_states, device)):
            yield

    @property
    def gradient_is_scratch(self) -> bool:
        """True within :meth:`_inverse_backward` when its ``grad_y`` is a buffer nothing else
        holds (:func:`_gradient_is_scratch`: the gradient a consuming reversible block returned,
        passed on by autograd alone): an override may then write the input's gradient in
        ``grad_y``'s storage instead of a new tensor."""
        return getattr(self, "_gradient_is_scratch", False)

    @property
    def output_is_scratch(self) -> bool:
        """True within :meth:`_inverse_backward` when its ``y`` is a buffer nothing else reads
        (the tensor a consuming block rebuilt, or an output passed to :func:`mark_internal`, on
        the last backward pass): an override may then rebuild the input in ``y``'s storage
        instead of a new tensor. False for an output the caller may still read."""
        return getattr(self, "_output_is_scratch", False)

    @contextlib.contextmanager
    def scratch_output(self, scratch: bool, gradient: bool = False) -> Iterator[None]:
        """Within the body, :attr:`output_is_scratch` is ``scratch`` and
        :attr:`gradient_is_scratch` is ``gradient`` (set by :class:`InvertibleFunction` around
        :meth:`_inverse_backward`)."""
        outer = self.output_is_scratch, self.gradient_is_scratch
        self._output_is_scratch, self._gradient_is_scratch = scratch, gradient
        try:
            yield
        finally:
            self._output_is_scratch, self._gradient_is_scratch = outer

    @contextlib.contextmanager
    def _scope(self, scope: Optional[_RNGScope]) -> Iterator[None]:
        outer, self._rng_scope = self._rng_scope, scope
        try:
            yield
        finally:
            self._rng_scope = outer

    @property
    def _inverse_params(self) -> List[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def _needs_graph(self, x: Tensor, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> bool:
        return (
            x.requires_grad
            or any(p.requires_grad for p in self.parameters())
            or any_requires_grad((args, kwargs))
        )

    def _inverse_forward(
        self, x: Tensor, args: Tuple[Any, ...], kwargs: Dict[str, Any]
    ) -> Tuple[Tensor, Dict[Any, Optional[RNGState]]]:
        """The output, and the random states of the :meth:`replay_random` calls by key."""
        states: Dict[Any, Optional[RNGState]] = {}
        with self._scope(_RNGScope(True, states, x.device)):
            y = self._forward(x, *args, **kwargs)
        return y, states

    def _inverse_backward(
        self,
        y: Tensor,
        grad_y: Tensor,
        args: Tuple[Any, ...],
        kwargs: Dict[str, Any],
        rng_states: Dict[Any, Optional[RNGState]],
        x_kept: Optional[Tensor],
        arg_leaves: List[Tensor],
        params: List[nn.Parameter],
    ) -> Tuple[Tensor, Optional[Tensor], List[Optional[Tensor]], List[Optional[Tensor]]]:
        """The input rebuilt by :meth:`_inverse` (or ``x_kept``) and the gradients of the
        input, of ``arg_leaves`` and of ``params``, from one evaluation of :meth:`_forward`."""
        with self.replaying(rng_states, y.device):
            if x_kept is None:
                with torch.no_grad(), frozen_buffers(self):
                    x = self._inverse(y, *args, **kwargs)
            else:
                x = x_kept
            leaf = x.detach().requires_grad_()
            # buffers are restored only after the gradient: BatchNorm's graph holds them
            with torch.enable_grad(), frozen_buffers(self):
                out = self._forward(leaf, *args, **kwargs)
                grads = torch.autograd.grad(out, [leaf, *arg_leaves, *params], grad_y, allow_unused=True)
        n = len(arg_leaves)
        return x.detach(), grads[0], list(grads[1 : 1 + n]), list(grads[1 + n :])


@dataclass
class _RNGScope:
    record: bool  # forward: record; backward: replay
    states: Dict[Any, Optional[RNGState]]
    device: torch.device
