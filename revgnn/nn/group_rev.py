r"""Grouped additive reversible residual block (a drop-in for PyG's ``GroupAddRev``)."""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn
from torch_geometric import EdgeIndex

from revgnn.nn.invertible import InvertibleModule, PerGroup, RNGState, Shared, frozen_buffers

GroupArgs = List[Tuple[Tuple[Any, ...], Dict[str, Any]]]

#: How the groups of a block built from one module start (``GroupAddRev(group_init=...)``).
GROUP_INIT = ("independent", "copy")


def _shares_storage(a: Tensor, b: Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def reset_recursively(module: nn.Module) -> None:
    """Calls ``module.reset_parameters()`` where it exists; otherwise recurses into the children, so
    an ``nn.Sequential`` of ``nn.Linear`` layers is re-initialised layer by layer. Parameters and
    buffers registered on a module that has no ``reset_parameters`` (nor an ancestor that has one)
    are left as they are."""
    reset = getattr(module, "reset_parameters", None)
    if callable(reset):
        reset()
        return
    for child in module.children():
        reset_recursively(child)


class GroupAddRev(InvertibleModule):
    r"""The grouped reversible residual block of `"Training Graph Neural Networks
    with 1000 Layers" <https://arxiv.org/abs/2106.07476>`_ (Li et al., ICML 2021).

    The input is split into :math:`C` groups along ``split_dim``,
    :math:`\mathbf{X} = \langle \mathbf{X}_1, \ldots, \mathbf{X}_C \rangle`, and

    .. math::
        \mathbf{X}'_0 &= \sum_{i=2}^{C} \mathbf{X}_i

        \mathbf{X}'_i &= \mathbf{X}_i + f_{\mathbf{w}_i}(\mathbf{X}'_{i-1},
        \mathbf{A}, \mathbf{U}) \qquad i \in \{1, \ldots, C\}

    which is inverted group by group from the last one:
    :math:`\mathbf{X}_i = \mathbf{X}'_i - f_{\mathbf{w}_i}(\mathbf{X}'_{i-1})`
    for :math:`i = C, \ldots, 2`, then :math:`\mathbf{X}'_0` from those, then
    :math:`\mathbf{X}_1`. Training memory therefore does not grow with depth:
    inputs are reconstructed in the backward pass instead of being stored. It
    is an :class:`~revgnn.nn.InvertibleModule` (the contract a user's own
    invertible block implements) with a fused backward.

    Compared with :class:`torch_geometric.nn.GroupAddRev` (same signature):

    * **One evaluation of each** :math:`f_i` **in backward, not two.** For
      :math:`i \ge 2` the input of :math:`f_i` is the *output* group
      :math:`\mathbf{X}'_{i-1}`, which is known, so one call with grad enabled
      both reconstructs :math:`\mathbf{X}_i` and gives the graph for the
      gradient. Only :math:`\mathbf{X}'_0` has to be rebuilt before
      :math:`f_1` runs.
    * **Exact gradients with stochastic layers** inside the block (dropout,
      attention dropout): the RNG state is replayed (``preserve_rng_state``).
    * **Running statistics** (BatchNorm) are updated once per step.
    * **No in-place freeing of storage**: the caller's tensors are never
      destroyed, in training, ``eval()`` or ``no_grad()``.

    Extra arguments are handed to each group's module by this rule: a dense
    floating-point or bool tensor whose size along ``split_dim`` equals the
    channel count of ``x`` is split into groups like ``x`` (e.g. a dropout
    mask); any other argument (``edge_index``, an ``EdgeIndex``, a
    ``torch.sparse`` or ``SparseTensor`` ``adj_t`` of any size, ``None``, ...)
    is shared. A *dense* ``[N, N]`` adjacency with :math:`N` equal to the
    channel count cannot be told from node features: wrap it in ``Shared``.
    Wrap an argument in :class:`~revgnn.nn.Shared` to share a tensor that has
    the feature width (e.g. edge embeddings), or pass
    :class:`~revgnn.nn.PerGroup` to give each group its own value. Keyword
    arguments follow the same rule.

    Args:
        conv (torch.nn.Module or torch.nn.ModuleList): The module
            :math:`f_{\mathbf{w}}` mapping ``[*, channels / num_groups]`` to the
            same shape, or one module per group.
        split_dim (int, optional): The dimension holding the channels.
            (default: :obj:`-1`)
        num_groups (int, optional): Number of groups :math:`C \ge 2`; required
            when ``conv`` is a single module, which is then deep-copied for
            the other groups (see ``group_init``). (default: :obj:`None`)
        disable (bool, optional): Run as a plain (memory-hungry) residual
            block with ordinary autograd. (default: :obj:`False`)
        num_bwd_passes (int, optional): How many backward passes through the
            block are allowed (``retain_graph=True``). (default: :obj:`1`)
        preserve_rng_state (bool, optional): Replay the random number
            generator in backward so that dropout inside :math:`f` gives exact
            gradients. (default: :obj:`True`)
        keep_input (bool, optional): Store this block's input instead of
            reconstructing it; set on every :math:`k`-th block of a very deep
            float32 stack to bound reconstruction drift. (default: :obj:`False`)
        quantize (int, optional): Make the coupling exactly invertible: the
            block's input and every :math:`f_i` output are rounded to multiples
            of :math:`2^{-q}` (straight-through gradient), so every sum and
            difference in the coupling is exact while values stay below
            :math:`2^{p - q}` (:math:`p` = 24 mantissa bits in float32). The
            input is then reconstructed bit for bit at any depth and in any
            autocast precision, where rounding inside :math:`f_i` otherwise
            amplifies the float32 reconstruction error (bf16 autocast at 1001
            layers: max drift 0.6 instead of 3e-4). ``q = 16`` gives a grid of
            1.5e-5 for values up to 256; a warning says when values outgrow it.
            (default: :obj:`None`)
        group_init (str, optional): How the deep copies of a single ``conv``
            start: ``"independent"`` re-initialises each copy
            (:math:`\mathbf{w}_i` drawn independently) through
            :func:`reset_recursively`: ``conv.reset_parameters()`` where it has
            one, else that of each submodule that has one (e.g. the
            ``nn.Linear`` layers of an ``nn.Sequential``); parameters held by a
            module with no ``reset_parameters`` above them keep ``conv``'s
            values (as in PyG). ``"copy"`` keeps them
            equal to ``conv``'s (:math:`\mathbf{w}_1 = \ldots =
            \mathbf{w}_C` at initialisation, as the official RevGNN code
            does); they are trained apart either way. Only for a single
            ``conv``. (default: :obj:`"independent"`)

    Example:
        >>> import torch
        >>> from revgnn.nn import GENBlock, GroupAddRev, Shared, SharedDropout
        >>> conv = GENBlock(32, edge_channels=64)
        >>> block = GroupAddRev(conv, num_groups=2)        # 64 channels in, 64 out
        >>> x, edge_index = torch.randn(10, 64), torch.randint(0, 10, (2, 40))
        >>> edge_attr = torch.randn(40, 64)                # 64 wide like x: Shared, not split
        >>> dropout_mask = SharedDropout(0.1)(x)
        >>> block(x, edge_index, Shared(edge_attr), dropout_mask).shape
        torch.Size([10, 64])
    """

    def __init__(
        self,
        conv: Union[nn.Module, nn.ModuleList],
        split_dim: int = -1,
        num_groups: Optional[int] = None,
        disable: bool = False,
        num_bwd_passes: int = 1,
        preserve_rng_state: bool = True,
        keep_input: bool = False,
        quantize: Optional[int] = None,
        group_init: str = "independent",
    ):
        super().__init__(disable, num_bwd_passes, preserve_rng_state, keep_input)
        if group_init not in GROUP_INIT:
            raise ValueError(f"group_init must be one of {', '.join(GROUP_INIT)}, got {group_init!r}")
        if quantize is not None and not 1 <= quantize <= 50:
            raise ValueError(
                f"quantize must be the number of fractional bits, 1..50 (e.g. 16), got {quantize}"
            )
        if isinstance(conv, nn.ModuleList):
            if num_groups is not None and num_groups != len(conv):
                raise ValueError(
                    f"GroupAddRev got num_groups={num_groups} but a ModuleList "
                    f"of {len(conv)} modules; pass one or the other."
                )
            if group_init != "independent":
                raise ValueError(
                    f"group_init={group_init!r} concerns the copies of a single conv; a ModuleList "
                    f"brings its own module per group: initialise them as you mean them to start"
                )
            convs = conv
        else:
            if num_groups is None:
                raise ValueError(
                    "GroupAddRev needs `num_groups` when `conv` is a single "
                    "module (or pass a ModuleList with one module per group)."
                )
            convs = nn.ModuleList([conv])
            for _ in range(num_groups - 1):
                clone = copy.deepcopy(conv)
                if group_init == "independent":
                    reset_recursively(clone)
                convs.append(clone)
        if len(convs) < 2:
            raise ValueError(
                f"GroupAddRev needs at least 2 groups, got {len(convs)}: with "
                f"one group the input cannot be recovered from the output."
            )
        self.convs = convs
        self.split_dim = split_dim
        self.quantize = quantize
        self.group_init = group_init
        self._warned_range = False
        self._peak: Optional[Tensor] = None  # the largest |output| since construction, on its device
        self._range_calls = 0

    @property
    def num_groups(self) -> int:
        return len(self.convs)

    def reset_parameters(self) -> None:
        """Re-initialises every group; with ``group_init='copy'`` the first one, copied to the others."""
        convs = self.convs[:1] if self.group_init == "copy" else self.convs
        for conv in convs:
            reset_recursively(conv)
        if self.group_init == "copy":
            for conv in self.convs[1:]:
                conv.load_state_dict(self.convs[0].state_dict())

    # ------------------------------------------------------------------ helpers

    def _channels(self, x: Tensor) -> int:
        if not isinstance(x, Tensor):
            raise TypeError(f"GroupAddRev expects a Tensor as first input, got {type(x).__name__}")
        channels = x.size(self.split_dim)
        if channels % self.num_groups != 0:
            raise ValueError(
                f"GroupAddRev with {self.num_groups} groups needs the channel count "
                f"(size {channels} of dim {self.split_dim}) to be divisible by "
                f"{self.num_groups}; change the hidden size or num_groups."
            )
        return channels

    def _split_value(self, v: Any, channels: int) -> List[Any]:
        C = self.num_groups
        if isinstance(v, Shared):
            return [v.value] * C
        if isinstance(v, PerGroup):
            if len(v.values) != C:
                raise ValueError(
                    f"PerGroup argument has {len(v.values)} values but the block has {C} groups."
                )
            return v.values
        if (
            isinstance(v, Tensor)
            and v.layout == torch.strided  # a sparse adj_t is the graph, whatever its size
            and not isinstance(v, EdgeIndex)
            and v.dim() > 0
            and (v.is_floating_point() or v.dtype == torch.bool)
            and v.size(self.split_dim) == channels
        ):
            return list(v.chunk(C, dim=self.split_dim))
        return [v] * C

    def _group_args(self, args: Tuple[Any, ...], kwargs: Dict[str, Any], channels: int) -> GroupArgs:
        split_args = [self._split_value(a, channels) for a in args]
        split_kwargs = {k: self._split_value(v, channels) for k, v in kwargs.items()}
        return [
            (tuple(a[i] for a in split_args), {k: v[i] for k, v in split_kwargs.items()})
            for i in range(self.num_groups)
        ]

    def _check_shape(self, out: Tensor, group: Tensor, i: int) -> None:
        if not isinstance(out, Tensor) or out.shape != group.shape:
            shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(
                f"GroupAddRev: the module of group {i} ({type(self.convs[i]).__name__}) "
                f"returned {shape} for an input group of shape {tuple(group.shape)}; a "
                f"reversible block must keep the shape (for a conv: in_channels == "
                f"out_channels == channels / num_groups)."
            )

    def to_grid(self, t: Tensor) -> Tensor:
        """``t`` rounded to multiples of :math:`2^{-q}` (``q = quantize``; straight-through gradient), or
        ``t`` itself without ``quantize``. The block rounds its input and every :math:`f_i` output so,
        which makes the coupling exact: inverting a quantized stack returns ``to_grid(x)`` of its
        input ``x`` bit for bit, the reference to measure its reconstruction against."""
        if self.quantize is None:
            return t
        scale = float(2**self.quantize)
        return t + (torch.round(t.detach() * scale) / scale - t.detach())

    def _f(self, i: int, inp: Tensor, groups: GroupArgs) -> Tensor:
        """:math:`f_i` on its input group, in the input's dtype and on the grid when quantizing."""
        out = self.convs[i](inp, *groups[i][0], **groups[i][1])
        if self.quantize is None or not isinstance(out, Tensor):
            return out
        return self.to_grid(out.to(inp.dtype))

    def _check_range(self, y: Tensor) -> None:
        """Warns once when the outputs leave the range where the grid is exact in ``y``'s dtype. The
        running maximum stays on ``y``'s device and is read (a host sync on a GPU) only at calls
        1, 2, 4, ..., 1024 and then every 1024th: no sync per layer, and no peak missed (the warning
        comes at the next read)."""
        if self.quantize is None or self._warned_range or not y.numel():
            return
        peak = y.detach().abs().amax()
        self._peak = (
            peak
            if self._peak is None or self._peak.device != peak.device
            else torch.maximum(self._peak, peak)
        )
        self._range_calls += 1
        n = self._range_calls
        if n & (n - 1) and n % 1024:  # not a power of two nor a multiple of 1024
            return
        significand_bits = round(-math.log2(torch.finfo(y.dtype).eps)) + 1  # 24 in float32
        limit = 2.0 ** (significand_bits - self.quantize)
        top = self._peak.item()
        if top >= limit:
            self._warned_range = True
            warnings.warn(
                f"GroupAddRev(quantize={self.quantize}): values reached {top:.3g} >= "
                f"{limit:.3g}, beyond which the coupling is no longer exact in "
                f"{y.dtype}; reconstruction then drifts as without quantize. Use a "
                f"smaller quantize.",
                RuntimeWarning,
                stacklevel=3,
            )

    @staticmethod
    def _sum(tensors: Sequence[Tensor]) -> Tensor:
        out = tensors[0]
        for t in tensors[1:]:
            out = out + t
        return out

    # ----------------------------------------------------------- the coupling

    def _forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        groups = self._group_args(args, kwargs, self._channels(x))
        xs = self.to_grid(x).chunk(self.num_groups, dim=self.split_dim)
        y_in = self._sum(xs[1:])
        ys = []
        for i in range(self.num_groups):
            out = self.replay_random(i, self._f, i, y_in, groups)
            self._check_shape(out, xs[i], i)
            y_in = xs[i] + out
            ys.append(y_in)
        y = torch.cat(ys, dim=self.split_dim)
        self._check_range(y)
        return y

    def _inverse(self, y: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        groups = self._group_args(args, kwargs, self._channels(y))
        ys = y.chunk(self.num_groups, dim=self.split_dim)
        xs: List[Optional[Tensor]] = [None] * self.num_groups
        for i in range(self.num_groups - 1, 0, -1):
            xs[i] = ys[i] - self.replay_random(i, self._f, i, ys[i - 1], groups)
        xs[0] = ys[0] - self.replay_random(0, self._f, 0, self._sum(xs[1:]), groups)
        return torch.cat(xs, dim=self.split_dim)

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
    ):
        r"""Reconstruction and gradient in one pass: :math:`f_i` for :math:`i \ge 2` runs
        on the known output group :math:`\mathbf{X}'_{i-1}`, so one evaluation with grad both
        rebuilds :math:`\mathbf{X}_i` and differentiates; only :math:`\mathbf{X}'_0` is
        rebuilt before :math:`f_1` runs."""
        C, dim = self.num_groups, self.split_dim
        groups = self._group_args(args, kwargs, y.size(dim))
        ys = y.chunk(C, dim=dim)
        gs = list(grad_y.chunk(C, dim=dim))
        kept = x_kept.chunk(C, dim=dim) if x_kept is not None else None
        targets = [*arg_leaves, *params]
        acc: List[Optional[Tensor]] = [None] * len(targets)

        def step(i: int, inp: Tensor) -> Tuple[Tensor, Optional[Tensor]]:
            conv = self.convs[i]
            # buffers are restored only after the gradient: BatchNorm's graph holds them
            with torch.enable_grad(), self.replaying(rng_states, y.device), frozen_buffers(conv):
                out = self.replay_random(i, self._f, i, inp, groups)
                grads = torch.autograd.grad(out, [inp, *targets], gs[i], allow_unused=True)
            for j, g in enumerate(grads[1:]):
                if g is not None:
                    if acc[j] is None and grad_x is grad_y and _shares_storage(g, grad_y):
                        g = g.clone()  # f passed grad_y through to an argument: grad_y is rewritten
                    acc[j] = g if acc[j] is None else acc[j] + g
            return out.detach(), grads[0]

        # The input and its gradient are written group by group into one buffer each (no
        # torch.cat of the groups): at the peak of a block's backward the groups' parts and their
        # concatenation are never alive together. Group i of the input replaces group i of the
        # output once f_i has run on group i - 1 (the loop runs downwards), so where the output
        # is scratch the input is rebuilt in its storage.
        if x_kept is not None:
            x = x_kept
        elif self.output_is_scratch and y.is_contiguous():
            x = y
        else:
            x = torch.empty_like(y)
        xs = x.chunk(C, dim=dim)
        # Likewise the input's gradient is written in grad_y's storage where autograd alone holds
        # it (gradient_is_scratch): group i - 1 of grad_x is grad_y's group i - 1 plus f_i's input
        # gradient, an update in place, and each f_i reads its group of grad_y before that.
        grad_x = grad_y if self.gradient_is_scratch else torch.empty_like(grad_y)
        gxs = grad_x.chunk(C, dim=dim)
        for i in range(C - 1, 0, -1):
            out, g_in = step(i, ys[i - 1].detach().requires_grad_())
            if kept is None:
                torch.sub(ys[i], out, out=xs[i])
            del out
            if g_in is not None:
                gs[i - 1] = torch.add(gs[i - 1], g_in, out=gxs[i - 1])
        out, g_0 = step(0, self._sum(xs[1:]).detach().requires_grad_())
        if kept is None:
            torch.sub(ys[0], out, out=xs[0])
        del out
        for i in range(C):
            if i > 0 and g_0 is not None:
                torch.add(gs[i], g_0, out=gxs[i])
            elif gs[i].data_ptr() != gxs[i].data_ptr():
                gxs[i].copy_(gs[i])
        return x, grad_x, acc[: len(arg_leaves)], acc[len(arg_leaves) :]

    def __repr__(self) -> str:
        extra = ", disable=True" if self.disable else ""
        extra += f", quantize={self.quantize}" if self.quantize is not None else ""
        extra += f", group_init={self.group_init!r}" if self.group_init != "independent" else ""
        return f"{self.__class__.__name__}({self.convs[0]}, num_groups={self.num_groups}{extra})"
