r"""revgnn's operators, registered with :mod:`torch.library` so that ``torch.compile``, ``torch.export``
and autograd see them as single ops.

* ``torch.ops.revgnn.gen_max``:
  :math:`\max_{j \to i} \mathrm{ReLU}(\mathbf{x}_j + \mathbf{e}_{ji}) + \epsilon` per destination,
  with the winning edge per (node, channel) and a per-node tie flag
  (:mod:`revgnn.nn.gen_max`); ``torch.ops.revgnn.gen_max_backward``: its gradients from the winners,
  :math:`O(NCd)` rather than :math:`O(EC)`;
* ``torch.ops.revgnn.gen_aggr``: GENConv's sum, mean and softmax (temperature :math:`t`)
  aggregations of :math:`\mathrm{ReLU}(\mathbf{x}_j + \mathbf{e}_{ji}) + \epsilon`
  (:mod:`revgnn.nn.gen_max`), keeping only per-node values for backward (the softmax's maximum and
  denominator); ``torch.ops.revgnn.gen_aggr_backward``: its gradients, every per-edge quantity
  recomputed. Its PyTorch implementation streams the edges in chunks of
  :data:`CHUNK_EDGES`, so no :math:`E \times C` tensor exists there either;
* ``torch.ops.revgnn.layer_norm_relu``: :math:`\mathrm{ReLU}(\mathrm{LayerNorm}(\mathbf{X})) \odot
  \mathbf{M}` with the row means and inverse deviations (:mod:`revgnn.nn.norm_act`);
  ``torch.ops.revgnn.layer_norm_relu_backward``: its gradients, and
  ``torch.ops.revgnn.layer_norm_relu_backward_`` the same writing the gradient for :math:`\mathbf{X}`
  into the output gradient's buffer (autograd takes it where nothing else holds that gradient);
* ``torch.ops.revgnn.gen_max_shard``: GEN max over one shard of a SAR graph (no :math:`\epsilon`, with
  tie counts; :mod:`revgnn.distributed.gen_max_sar`); ``torch.ops.revgnn.gen_max_shard_backward``: its
  gradients;
* ``torch.ops.revgnn.aggregate``: the sum / mean / edge-weighted sum over destination-sorted edges
  (SAGE, GIN, GCN; :mod:`revgnn.nn.linear_aggr`), ``torch.ops.revgnn.segment_max``: the plain
  per-channel maximum with tie counts (SAGE max); each with its ``_backward``;
* ``torch.ops.revgnn.gat_attention``: GATConv's attention (heads, edge features, PyG's self loops,
  attention dropout from a counter-based hash) as an online softmax per destination and head, keeping
  the per (node, head) maximum and denominator (:mod:`revgnn.nn.gat`);
  ``torch.ops.revgnn.gat_attention_backward``: its gradients, every per-edge quantity recomputed.

Each operator has a fake (meta) implementation, so it traces with FakeTensors, and each forward
operator has its autograd formula registered (the backward operators are differentiable once: a
second derivative raises). Behind each operator there are up to three implementations of the same
function, chosen per call from the inputs alone:

* **the C++ kernels** of :mod:`revgnn.nn.kernels` for CPU float32/float64 tensors, where they built
  (``REVGNN_KERNELS=0`` turns them off);
* **the Triton kernels** of :mod:`revgnn.nn.triton_kernels` for CUDA tensors (float32, float64,
  bfloat16) where Triton is installed, and for every tensor under ``REVGNN_KERNELS=triton`` (on CPU
  through Triton's interpreter, ``TRITON_INTERPRET=1``). They have not yet run on a GPU: only in the
  interpreter, against the C++ kernels (``tests/nn/test_triton_kernels.py``);
* **PyTorch** everywhere else (other dtypes, no compiler, no Triton): the same outputs from PyTorch ops
  over chunks of :data:`CHUNK_EDGES` edges, so that no :math:`E \times C` tensor exists in any
  implementation (``gen_max`` keeps only the winners for backward, like the kernel).

The choice is the dispatch table's (:func:`revgnn.nn.dispatch.select`, one rule for every operator),
made inside the operator, which ``torch.compile`` does not trace into. The GEN max shard operators
have only the fused implementations, C++ or Triton (their caller takes PyTorch's SAR path elsewhere).
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch
from torch import Tensor

from revgnn.nn.dispatch import select
from revgnn.nn.grad_scratch import holders, sole_holders, whole_storage

__all__ = [
    "gen_aggr",
    "gen_aggr_backward",
    "gen_max",
    "gen_max_backward",
    "layer_norm_relu",
    "layer_norm_relu_backward",
    "uses_kernel",
]


def uses_kernel(name: str, x: Tensor, *others: Optional[Tensor], num_edges: int = 0) -> bool:
    """Whether the operators run a fused kernel (C++ or Triton) on these inputs
    (:func:`revgnn.nn.dispatch.select`)."""
    return select(name, x, *others, num_edges=num_edges) is not None


def kernel_checks() -> bool:
    """Whether ``REVGNN_KERNEL_CHECKS`` (``1``) asks the operators to check their graph inputs before
    any implementation runs (read on every call, so a test can set it): the C++ kernels check
    theirs always, the Triton kernels (a host sync on a GPU) and the PyTorch implementations here."""
    return os.environ.get("REVGNN_KERNEL_CHECKS", "0") not in ("", "0")


def check_segments(ptr: Tensor, src: Tensor, rows: int, arg: Optional[Tensor] = None) -> None:
    """Raises unless ``ptr`` runs from 0 to ``E`` without decreasing, every ``src`` is in
    ``[0, rows)`` and every winner offset in ``arg`` is -1 or below its node's in-degree: the
    preconditions under which no implementation reads out of bounds (:func:`kernel_checks`)."""
    num_edges = src.numel()
    if ptr.numel() < 1 or int(ptr[0]) != 0 or int(ptr[-1]) != num_edges or bool((ptr.diff() < 0).any()):
        raise ValueError(f"revgnn operators: ptr must run from 0 to E = {num_edges} without decreasing")
    if num_edges and (int(src.min()) < 0 or int(src.max()) >= rows):
        raise ValueError(f"revgnn operators: every source id must be in [0, {rows}) (the rows of x)")
    if arg is not None and arg.numel():
        degree = ptr.diff().view(-1, 1)
        if bool(((arg < -1) | (arg >= degree)).any()):
            raise ValueError("revgnn operators: arg must hold winner offsets from forward")


#: Edges per chunk in the PyTorch implementations of the aggregations (:func:`aggregate`,
#: :func:`segment_max`, :func:`gen_aggr`): their largest temporary is ``CHUNK_EDGES x C`` (16 MiB at
#: 64 float32 channels), never :math:`E \times C`, whatever the graph.
CHUNK_EDGES = 2**16


def _edge_chunks(num_edges: int):
    """Consecutive slices of at most :data:`CHUNK_EDGES` edges covering ``range(num_edges)`` (the
    module's value read per call: tests shrink it)."""
    return (slice(s, min(s + CHUNK_EDGES, num_edges)) for s in range(0, num_edges, CHUNK_EDGES))


def _empty(like: Tensor) -> Tensor:
    return like.new_empty(0)


def _or_empty(t: Optional[Tensor], like: Tensor) -> Tensor:
    return t if t is not None else _empty(like)


# ----------------------------------------------------------------------------------- GEN max


def destinations(ptr: Tensor, num_edges: int) -> Tensor:
    """The destination of every edge of a CSC pointer ``ptr`` ``[N + 1]`` (``num_edges`` given: no sync)."""
    n = ptr.numel() - 1
    return torch.repeat_interleave(torch.arange(n, device=ptr.device), ptr.diff(), output_size=num_edges)


def _in_dtype(like: Tensor):
    """Autocast off for the operators' PyTorch implementations, which then compute in their inputs'
    dtype as the fused kernels do. Autocast reaches into a custom operator: the forward's edge
    projection (``F.linear``) would run in bfloat16, while the backward, which autograd runs outside
    autocast, recomputes the tied nodes' messages in float32 and would pick other maxima."""
    return torch.autocast(like.device.type, enabled=False)


def _messages(
    x: Tensor, src: Tensor, attr: Optional[Tensor], weight: Optional[Tensor], bias: Optional[Tensor]
):
    """The pre-activation messages ``x[src] + e`` of the given edges (``attr`` in their order)."""
    msg = x.index_select(0, src)
    if attr is not None:
        msg = msg + (torch.nn.functional.linear(attr, weight, bias) if weight is not None else attr)
    return msg


def _gen_max_torch(x, ptr, src, attr, weight, bias, eps):
    """Two passes over :data:`CHUNK_EDGES`-edge chunks (the maximum; then its first winner and how
    many edges reach it), each chunk's messages formed and dropped: no :math:`E \times C` tensor."""
    n, c, e = ptr.numel() - 1, x.size(1), src.numel()
    dst = destinations(ptr, e)

    def chunk_messages():
        for part in _edge_chunks(e):
            a = attr[part] if attr is not None else None
            yield part, _messages(x, src[part], a, weight, bias), dst[part]

    top = x.new_full((n, c), float("-inf"))
    for _, msg, d in chunk_messages():  # NaN propagates through amax
        top.scatter_reduce_(0, d.view(-1, 1).expand_as(msg), msg, "amax")
    positive = top > 0
    none = torch.iinfo(torch.int64).max
    arg = torch.full((n, c), none, dtype=torch.int64, device=x.device)
    count = torch.zeros((n, c), dtype=torch.int32, device=x.device)
    for part, msg, d in chunk_messages():
        index = d.view(-1, 1).expand_as(msg)
        reached = (msg == top.index_select(0, d)) & positive.index_select(0, d)
        offset = (torch.arange(part.start, part.stop, device=x.device) - ptr.index_select(0, d)).view(-1, 1)
        arg.scatter_reduce_(0, index, torch.where(reached, offset, none), "amin")  # the first winner
        count.scatter_add_(0, index, reached.int())
    arg = torch.where(positive, arg, -1).to(torch.int32)
    tied = (count > 1).any(1).to(torch.uint8)
    out = torch.where(positive | top.isnan(), top, 0.0) + eps
    return out.masked_fill_((ptr.diff() == 0).view(-1, 1), 0.0), arg, tied


def _gen_max_backward_torch(
    grad, arg, tied, x, ptr, src, attr, weight, bias, need_x, need_attr, need_w, need_b
):
    """The gradient reaches each (node, channel)'s winner, split evenly among the tied edges of a
    tied node (whose messages are recomputed): no :math:`E \\times C` tensor but for the tied nodes."""
    n, c = arg.shape
    if src.numel() == 0:  # no edges: every output is 0, and so is every gradient
        zero = lambda t, need: torch.zeros_like(t) if need and t is not None else None  # noqa: E731
        return zero(x, need_x), zero(attr, need_attr), zero(weight, need_w), zero(bias, need_b)
    untied = (arg >= 0) & (tied == 0).view(-1, 1)
    g = torch.where(untied, grad, 0.0)
    # [N, C] winning edge ids (any valid id where there is no winner: its gradient is 0 there)
    edge = (ptr[:-1].view(-1, 1) + arg.clamp_min(0).long()).clamp_max(max(src.numel() - 1, 0))
    channel = torch.arange(c, device=x.device).expand(n, c)
    gx = torch.zeros_like(x).index_put_((src.index_select(0, edge.flatten()).view(n, c), channel), g, True)
    ga = gw = gb = None
    if attr is not None and weight is None:
        ga = torch.zeros_like(attr).index_put_((edge, channel), g, True)
    elif attr is not None:
        if need_w:
            gw = (g.unsqueeze(-1) * attr.index_select(0, edge.flatten()).view(n, c, -1)).sum(0)
        if need_b and bias is not None:
            gb = g.sum(0)
        if need_attr:
            ga = torch.zeros_like(attr).index_add_(
                0, edge.flatten(), (g.unsqueeze(-1) * weight).flatten(0, 1)
            )
    nodes = tied.nonzero().flatten()
    if nodes.numel():  # the edges of tied nodes: split each node's gradient among its maxima
        dst = destinations(ptr, src.numel())
        tied_edges = (tied.index_select(0, dst) != 0).nonzero().flatten()

        def chunk_messages():  # the tied nodes' edges, a chunk of messages at a time
            for part in _edge_chunks(tied_edges.numel()):
                edges = tied_edges[part]
                a = attr.index_select(0, edges) if attr is not None else None
                yield (
                    edges,
                    dst.index_select(0, edges),
                    a,
                    _messages(x, src.index_select(0, edges), a, weight, bias),
                )

        top = x.new_full((n, c), float("-inf"))
        for _, d, _, msg in chunk_messages():
            top.scatter_reduce_(0, d.view(-1, 1).expand_as(msg), msg, "amax")
        count = torch.zeros_like(top)
        for _, d, _, msg in chunk_messages():
            reached = (msg == top.index_select(0, d)) & (top > 0).index_select(0, d)
            count.scatter_add_(0, d.view(-1, 1).expand_as(msg), reached.to(top.dtype))
        share_of = grad / count.clamp_min(1)
        for edges, d, a, msg in chunk_messages():
            reached = (msg == top.index_select(0, d)) & (top > 0).index_select(0, d)
            share = torch.where(reached, share_of.index_select(0, d), 0.0)
            gx.index_add_(0, src.index_select(0, edges), share)
            if attr is not None and weight is None:
                ga.index_add_(0, edges, share)
            elif attr is not None:
                if gw is not None:
                    gw += share.t() @ a
                if gb is not None:
                    gb += share.sum(0)
                if ga is not None:
                    ga.index_add_(0, edges, share @ weight)
    return gx if need_x else None, ga if need_attr else None, gw, gb


@torch.library.custom_op("revgnn::gen_max", mutates_args=())
def gen_max(
    x: Tensor,
    ptr: Tensor,
    src: Tensor,
    attr: Optional[Tensor],
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    eps: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    r"""``(out, arg, tied)``: ``out[i] = relu(max_{e = (j -> i)} x[j] + t[e]) + eps`` (0 for nodes
    without in-edges) over destination-sorted edges (``ptr`` ``[N + 1]`` over destinations, ``src``
    ``[E]``), where the edge term ``t`` is absent, ``attr`` ``[E, C]``, or ``attr @ weight.T + bias``
    with ``attr`` the raw ``[E, d]`` features and ``weight`` ``[C, d]`` (never expanded by the
    kernel); ``arg`` ``[N, C]`` int32 is the first winning edge's offset in its node's segment (-1
    where the maximum is not positive), ``tied`` ``[N]`` uint8 whether a positive maximum was reached
    by several edges."""
    if kernel_checks():
        check_segments(ptr, src, x.size(0))
    kernel = select("gen_max", x, attr, weight, bias, num_edges=src.numel())
    if kernel is not None:
        wt = weight.t().contiguous() if weight is not None else None
        return tuple(kernel.forward(x, ptr, src, attr, wt, bias, eps))
    with _in_dtype(x):
        return _gen_max_torch(x, ptr, src, attr, weight, bias, eps)


@gen_max.register_fake
def _(x, ptr, src, attr, weight, bias, eps):
    n, c = ptr.size(0) - 1, x.size(1)
    return x.new_empty(n, c), x.new_empty(n, c, dtype=torch.int32), x.new_empty(n, dtype=torch.uint8)


@torch.library.custom_op("revgnn::gen_max_backward", mutates_args=())
def gen_max_backward(
    grad: Tensor,
    arg: Tensor,
    tied: Tensor,
    x: Tensor,
    ptr: Tensor,
    src: Tensor,
    attr: Optional[Tensor],
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    need_x: bool,
    need_attr: bool,
    need_w: bool,
    need_b: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients of :func:`gen_max`'s ``out`` for ``x``, ``attr``, ``weight``, ``bias`` (an empty
    tensor where not asked for, or where that input is absent)."""
    if kernel_checks():
        check_segments(ptr, src, x.size(0), arg)
    kernel = select("gen_max", x, attr, weight, bias, num_edges=src.numel())
    if kernel is not None:
        wt = weight.t().contiguous() if weight is not None else None
        grads = kernel.backward(
            grad, arg, tied, x, ptr, src, attr, wt, bias, need_x, need_attr, need_w, need_b
        )
    else:
        with _in_dtype(x):
            grads = _gen_max_backward_torch(
                grad, arg, tied, x, ptr, src, attr, weight, bias, need_x, need_attr, need_w, need_b
            )
    return tuple(_or_empty(g, x) for g in grads)


def _fake_grads(x, attr, weight, bias, need_x, need_attr, need_w, need_b):
    """Fake gradients of the GEN max operators: shaped like the input, or empty where not formed."""

    def like(t, need):
        return torch.empty_like(t) if need and t is not None else x.new_empty(0)

    factored = weight is not None and attr is not None
    return (
        like(x, need_x),
        like(attr, need_attr),
        like(weight, need_w and factored),
        like(bias, need_b and factored),
    )


@gen_max_backward.register_fake
def _(grad, arg, tied, x, ptr, src, attr, weight, bias, need_x, need_attr, need_w, need_b):
    return _fake_grads(x, attr, weight, bias, need_x, need_attr, need_w, need_b)


def _gen_max_setup(ctx, inputs, output):
    x, ptr, src, attr, weight, bias, _ = inputs
    _, arg, tied = output
    ctx.save_for_backward(x, ptr, src, attr, weight, bias, arg, tied)


def _gen_max_grad(ctx, grad_out, _grad_arg, _grad_tied):
    x, ptr, src, attr, weight, bias, arg, tied = ctx.saved_tensors
    need_x, _, _, need_attr, need_w, need_b, _ = ctx.needs_input_grad
    gx, ga, gw, gb = gen_max_backward(
        grad_out.contiguous(), arg, tied, x, ptr, src, attr, weight, bias, need_x, need_attr, need_w, need_b
    )
    return (
        gx if need_x else None,
        None,
        None,
        ga if need_attr and attr is not None else None,
        gw if need_w and weight is not None else None,
        gb if need_b and bias is not None else None,
        None,
    )


gen_max.register_autograd(_gen_max_grad, setup_context=_gen_max_setup)


# ---------------------------------------------------------------------- LayerNorm + ReLU


@torch.library.custom_op("revgnn::layer_norm_relu", mutates_args=())
def layer_norm_relu(
    x: Tensor, weight: Tensor, bias: Tensor, eps: float, mask: Optional[Tensor], mask_scale: float
) -> Tuple[Tensor, Tensor, Tensor]:
    r"""``(out, mean, rstd)``: ``out = relu((x - mean) * rstd * weight + bias) * mask`` over the last
    dimension of ``x`` ``[N, C]`` (rows may be strided), ``mask`` optional: typed like ``x``, or bool
    standing for ``mask_scale`` where true and 0 where false (a dropout mask in a quarter of the
    bytes); ``mean``, ``rstd`` ``[N]``."""
    kernel = select("layer_norm_relu", x, weight, bias, _float_mask(mask))
    if kernel is not None:
        return tuple(kernel.forward(x, weight, bias, eps, mask, mask_scale))
    with _in_dtype(x):
        y, mean, rstd = torch.native_layer_norm(x, (x.size(1),), weight, bias, eps)
        out = y.relu()
    return out * mask_values(mask, mask_scale, x) if mask is not None else out, mean.view(-1), rstd.view(-1)


def _float_mask(mask: Optional[Tensor]) -> Optional[Tensor]:
    """The mask where the kernel selection must check its dtype (a bool mask is the kernels' own
    second mask type: only its device must match, as the callers check)."""
    return mask if mask is not None and mask.dtype != torch.bool else None


def mask_values(mask: Tensor, scale: float, like: Tensor) -> Tensor:
    """A mask's values in ``like``'s dtype: a bool mask as ``scale`` where true, 0 where false (the
    values the kernels multiply by); a mask typed like ``like`` as it is."""
    return mask.to(like.dtype) * scale if mask.dtype == torch.bool else mask


@layer_norm_relu.register_fake
def _(x, weight, bias, eps, mask, mask_scale):
    n, c = x.shape
    return x.new_empty(n, c), x.new_empty(n), x.new_empty(n)


@torch.library.custom_op("revgnn::layer_norm_relu_backward", mutates_args=())
def layer_norm_relu_backward(
    grad: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    mean: Tensor,
    rstd: Tensor,
    mask: Optional[Tensor],
    mask_scale: float,
    need_x: bool,
    need_w: bool,
    need_b: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    """The gradients of :func:`layer_norm_relu`'s ``out`` for ``x``, ``weight``, ``bias`` (an empty
    tensor where not asked for)."""
    grads = _layer_norm_relu_grads(
        grad, x, weight, bias, mean, rstd, mask, mask_scale, need_x, need_w, need_b, False
    )
    return tuple(_or_empty(g if need else None, x) for g, need in zip(grads, (need_x, need_w, need_b)))


@layer_norm_relu_backward.register_fake
def _(grad, x, weight, bias, mean, rstd, mask, mask_scale, need_x, need_w, need_b):
    return tuple(
        x.new_empty(shape) if need else x.new_empty(0)
        for shape, need in ((x.shape, need_x), (weight.shape, need_w), (bias.shape, need_b))
    )


@torch.library.custom_op(
    "revgnn::layer_norm_relu_backward_",
    mutates_args=("grad",),
    schema="(Tensor(a!) grad, Tensor x, Tensor weight, Tensor bias, Tensor mean, Tensor rstd, Tensor? mask, "
    "float mask_scale, bool need_w, bool need_b) -> (Tensor, Tensor)",
)
def layer_norm_relu_backward_(grad, x, weight, bias, mean, rstd, mask, mask_scale, need_w, need_b):
    """:func:`layer_norm_relu_backward` writing the gradient for ``x`` into ``grad`` (contiguous,
    shaped and typed like ``x``): ``(grad_weight, grad_bias)``, an empty tensor where not asked for.
    The fused kernels overwrite each row of ``grad`` after reading it, so no third ``[N, C]``
    tensor exists."""
    grads = _layer_norm_relu_grads(
        grad, x, weight, bias, mean, rstd, mask, mask_scale, True, need_w, need_b, True
    )
    return tuple(_or_empty(g if need else None, x) for g, need in zip(grads[1:], (need_w, need_b)))


@layer_norm_relu_backward_.register_fake
def _(grad, x, weight, bias, mean, rstd, mask, mask_scale, need_w, need_b):
    return tuple(
        x.new_empty(shape) if need else x.new_empty(0)
        for shape, need in ((weight.shape, need_w), (bias.shape, need_b))
    )


def _layer_norm_relu_grads(
    grad, x, weight, bias, mean, rstd, mask, mask_scale, need_x, need_w, need_b, into_grad
):
    """Both backward operators' gradients (``grad_x`` written into ``grad`` where ``into_grad``)."""
    kernel = select("layer_norm_relu", x, weight, bias, _float_mask(mask))
    if kernel is not None:
        return kernel.backward(
            grad, x, weight, bias, mean, rstd, mask, mask_scale, need_x, need_w, need_b, into_grad
        )
    c = x.size(1)
    with _in_dtype(x):
        y = (x - mean.view(-1, 1)) * rstd.view(-1, 1) * weight + bias
        g = grad * mask_values(mask, mask_scale, x) if mask is not None else grad
        g = torch.where(y <= 0, 0.0, g)  # NaN passes, as ReLU's backward
        grads = torch.ops.aten.native_layer_norm_backward(
            g, x, (c,), mean.view(-1, 1), rstd.view(-1, 1), weight, bias, [need_x, need_w, need_b]
        )
    if into_grad:
        grad.copy_(grads[0])
    return grads


def _layer_norm_relu_setup(ctx, inputs, output):
    x, weight, bias, _, mask, mask_scale = inputs
    _, mean, rstd = output
    ctx.mask_scale = mask_scale
    ctx.save_for_backward(x, weight, bias, mean, rstd, mask)


def _layer_norm_relu_grad(ctx, grad_out, _grad_mean, _grad_rstd):
    held = holders(grad_out)  # first: see revgnn.nn.grad_scratch
    x, weight, bias, mean, rstd, mask = ctx.saved_tensors
    need_x, need_w, need_b, _, _, _ = ctx.needs_input_grad
    if need_x and _is_scratch(grad_out, x, held):
        gw, gb = layer_norm_relu_backward_(
            grad_out, x, weight, bias, mean, rstd, mask, ctx.mask_scale, need_w, need_b
        )
        gx = grad_out
    else:
        gx, gw, gb = layer_norm_relu_backward(
            grad_out.contiguous(), x, weight, bias, mean, rstd, mask, ctx.mask_scale, need_x, need_w, need_b
        )
    return gx if need_x else None, gw if need_w else None, gb if need_b else None, None, None, None


layer_norm_relu.register_autograd(_layer_norm_relu_grad, setup_context=_layer_norm_relu_setup)


def _is_scratch(grad: Tensor, like: Tensor, held: Tuple[int, int, int]) -> bool:
    """Whether ``grad``, the output gradient autograd passed to a custom operator's backward, is a
    buffer that backward may overwrite with an input gradient shaped like ``like``: not
    differentiated again, typed like ``like``, the whole of its storage, and held by nothing but
    autograd's call (``held``, :func:`revgnn.nn.grad_scratch.holders` counted as the backward
    began, equal to a probe operator's)."""
    return (
        not torch.is_grad_enabled()
        and not grad.requires_grad
        and not torch.compiler.is_compiling()
        and grad.dtype == like.dtype
        and grad.device == like.device
        and grad.shape == like.shape
        and whole_storage(grad)
        and held == sole_holders("operator")
    )


# --------------------------------------------------------------------------- SAR shards


@torch.library.custom_op("revgnn::gen_max_shard", mutates_args=())
def gen_max_shard(
    x: Tensor,
    ptr: Tensor,
    src: Tensor,
    attr: Optional[Tensor],
    weight: Optional[Tensor],
    bias: Optional[Tensor],
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """GEN max over one shard of a SAR graph: the sources are the rows of ``x`` (a fetched block), the
    destinations ``ptr.numel() - 1``; ``(max, arg, tied, count)`` with the ReLU'd maximum without
    :math:`\\epsilon` and the per (node, channel) tie counts (fused kernels only: C++ or Triton)."""
    if kernel_checks():
        check_segments(ptr, src, x.size(0))
    kernel = select("gen_max", x, attr, weight, bias, num_edges=src.numel())
    if kernel is None:
        raise RuntimeError("revgnn.gen_max_shard: no fused kernel for these inputs (the caller checks first)")
    wt = weight.t().contiguous() if weight is not None else None
    return tuple(kernel.shard_forward(x, ptr, src, attr, wt, bias))


@gen_max_shard.register_fake
def _(x, ptr, src, attr, weight, bias):
    n, c = ptr.size(0) - 1, x.size(1)
    return (
        x.new_empty(n, c),
        x.new_empty(n, c, dtype=torch.int32),
        x.new_empty(n, dtype=torch.uint8),
        x.new_empty(n, c),
    )


@torch.library.custom_op("revgnn::gen_max_shard_backward", mutates_args=())
def gen_max_shard_backward(
    grad: Tensor,
    arg: Tensor,
    tied: Tensor,
    x: Tensor,
    ptr: Tensor,
    src: Tensor,
    attr: Optional[Tensor],
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    need_attr: bool,
    need_w: bool,
    need_b: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients of :func:`gen_max_shard` for the fetched rows (always), ``attr``, ``weight`` and
    ``bias`` (an empty tensor where not asked for)."""
    if kernel_checks():
        check_segments(ptr, src, x.size(0), arg)
    kernel = select("gen_max", x, attr, weight, bias, num_edges=src.numel())
    if kernel is None:
        raise RuntimeError("revgnn.gen_max_shard_backward: no fused kernel for these inputs")
    wt = weight.t().contiguous() if weight is not None else None
    grads = kernel.shard_backward(
        grad, arg, tied, x, ptr, src, attr, wt, bias, True, need_attr, need_w, need_b
    )
    return tuple(_or_empty(g, x) for g in grads)


@gen_max_shard_backward.register_fake
def _(grad, arg, tied, x, ptr, src, attr, weight, bias, need_attr, need_w, need_b):
    return _fake_grads(x, attr, weight, bias, True, need_attr, need_w, need_b)


# ------------------------------------------------- linear aggregations and SAGE max (#33 a)


def _check_graph(name: str, x: Tensor, ptr: Tensor, src: Tensor, weight: Optional[Tensor]) -> None:
    if x.dim() != 2 or ptr.dim() != 1 or src.dim() != 1:
        raise ValueError(
            f"revgnn.{name}: x must be [N, C], ptr [N + 1], src [E]; got {list(x.shape)}, "
            f"{list(ptr.shape)}, {list(src.shape)}"
        )
    if weight is not None and tuple(weight.shape) != (src.numel(),):
        raise ValueError(f"revgnn.{name}: weight must be [E] = [{src.numel()}], got {list(weight.shape)}")
    if ptr.numel() != x.size(0) + 1:
        raise ValueError(f"revgnn.{name}: ptr must be [N + 1] = [{x.size(0) + 1}], got [{ptr.numel()}]")
    # always, not only under kernel_checks(): these kernels read ptr and src unchecked, and an id out
    # of range would read (C++) or write (PyTorch's index_add_) out of bounds; one pass over E
    # integers, small beside the E x C work that follows
    check_segments(ptr, src, x.size(0))


def _aggregate_torch(x: Tensor, ptr: Tensor, src: Tensor, weight: Optional[Tensor], mean: bool) -> Tensor:
    dst = destinations(ptr, src.numel())
    out = x.new_zeros(ptr.numel() - 1, x.size(1))
    for part in _edge_chunks(src.numel()):
        msg = x.index_select(0, src[part])
        if weight is not None:
            msg.mul_(weight[part].view(-1, 1))
        out.index_add_(0, dst[part], msg)
    # PyG's mean divides the sum by the clamped count; x / d and x * (1 / d) differ in the last bit
    return out.div_(ptr.diff().clamp_min(1).to(x.dtype).view(-1, 1)) if mean else out


def _aggregate_backward_torch(grad, x, ptr, src, weight, mean, need_x, need_w):
    """``grad`` scaled per destination, then per edge chunk: to the sources (``index_add_``, the
    transposed aggregation) and to the weights (a dot product per edge)."""
    dst = destinations(ptr, src.numel())
    g = grad / ptr.diff().clamp_min(1).to(grad.dtype).view(-1, 1) if mean else grad
    gx = torch.zeros_like(x) if need_x else None
    gw = weight.new_empty(src.numel()) if need_w and weight is not None else None
    for part in _edge_chunks(src.numel()):
        g_edge = g.index_select(0, dst[part])
        if gw is not None:
            gw[part] = (g_edge * x.index_select(0, src[part])).sum(1)
        if gx is not None:
            gx.index_add_(
                0, src[part], g_edge.mul_(weight[part].view(-1, 1)) if weight is not None else g_edge
            )
    return gx, gw


@torch.library.custom_op("revgnn::aggregate", mutates_args=())
def aggregate(
    x: Tensor,
    ptr: Tensor,
    src: Tensor,
    weight: Optional[Tensor],
    mean: bool,
    sptr: Tensor,
    sdst: Tensor,
    sperm: Tensor,
) -> Tensor:
    r"""``out[i] = sum_{e = (j -> i)} w[e] x[j]`` (divided by the in-degree of ``i`` if ``mean``; 0
    for nodes without in-edges) over destination-sorted edges (``ptr`` ``[N + 1]`` over
    destinations, ``src`` ``[E]``), ``w`` the optional edge weights ``[E]`` in that order (1 where
    :obj:`None`). ``sptr``, ``sdst``, ``sperm`` are the same edges in source order (pointer ``[N + 1]``
    over sources, each edge's destination, its id in destination order:
    :func:`revgnn.nn.graph_input.source_order`), which the backward pass reduces over; nothing
    edge-sized but these is kept for it."""
    _check_graph("aggregate", x, ptr, src, weight)
    kernel = select("aggregate", x, weight, num_edges=src.numel())
    if kernel is not None:
        return kernel.forward(x, ptr, src, weight, mean)
    with _in_dtype(x):
        return _aggregate_torch(x, ptr, src, weight, mean)


@aggregate.register_fake
def _(x, ptr, src, weight, mean, sptr, sdst, sperm):
    return x.new_empty(ptr.size(0) - 1, x.size(1))


@torch.library.custom_op("revgnn::aggregate_backward", mutates_args=())
def aggregate_backward(
    grad: Tensor,
    x: Tensor,
    ptr: Tensor,
    src: Tensor,
    weight: Optional[Tensor],
    mean: bool,
    sptr: Tensor,
    sdst: Tensor,
    sperm: Tensor,
    need_x: bool,
    need_w: bool,
) -> Tuple[Tensor, Tensor]:
    r"""The gradients of :func:`aggregate` for ``x`` (the transposed aggregation
    :math:`\sum_{e = (j \to i)} w_e \mathbf{g}_i`, over source-sorted edges) and ``weight``
    (:math:`\langle \mathbf{g}_i, \mathbf{x}_j \rangle` per edge); an empty tensor where not asked for
    (or where ``weight`` is :obj:`None`)."""
    kernel = select("aggregate", x, grad, weight, num_edges=src.numel())
    need_w = need_w and weight is not None
    if kernel is not None:
        grads = kernel.backward(grad, x, ptr, src, weight, mean, sptr, sdst, sperm, need_x, need_w)
    else:
        with _in_dtype(x):
            grads = _aggregate_backward_torch(grad, x, ptr, src, weight, mean, need_x, need_w)
    return tuple(_or_empty(g, x) for g in grads)


@aggregate_backward.register_fake
def _(grad, x, ptr, src, weight, mean, sptr, sdst, sperm, need_x, need_w):
    gx = torch.empty_like(x) if need_x else x.new_empty(0)
    gw = torch.empty_like(weight) if need_w and weight is not None else x.new_empty(0)
    return gx, gw


def _aggregate_setup(ctx, inputs, output):
    x, ptr, src, weight, mean, sptr, sdst, sperm = inputs
    ctx.mean = mean
    ctx.save_for_backward(x, ptr, src, weight, sptr, sdst, sperm)


def _aggregate_grad(ctx, grad_out):
    x, ptr, src, weight, sptr, sdst, sperm = ctx.saved_tensors
    need_x, _, _, need_w, *_ = ctx.needs_input_grad
    gx, gw = aggregate_backward(
        grad_out.contiguous(), x, ptr, src, weight, ctx.mean, sptr, sdst, sperm, need_x, need_w
    )
    return gx if need_x else None, None, None, gw if need_w else None, None, None, None, None


aggregate.register_autograd(_aggregate_grad, setup_context=_aggregate_setup)


def _segment_max_torch(x: Tensor, ptr: Tensor, src: Tensor) -> Tuple[Tensor, Tensor]:
    n, c, e = ptr.numel() - 1, x.size(1), src.numel()
    dst = destinations(ptr, e)
    top = x.new_full((n, c), float("-inf"))
    for part in _edge_chunks(e):  # the maximum ...
        d = dst[part]
        top.scatter_reduce_(0, d.view(-1, 1).expand(-1, c), x.index_select(0, src[part]), "amax")
    count = torch.zeros((n, c), dtype=torch.int32, device=x.device)
    for part in _edge_chunks(e):  # ... and how many edges reach it
        d = dst[part]
        reached = x.index_select(0, src[part]) == top.index_select(0, d)
        count.index_add_(0, d, reached.int())
    return top.masked_fill_((ptr.diff() == 0).view(-1, 1), 0.0), count


def _tie_divisor(out: Tensor, count: Tensor) -> Tensor:
    """What each (node, channel)'s gradient is divided by among the edges reaching its maximum:
    ``count``, plus 1 where the maximum is 0. PyG aggregates with ``scatter_reduce_`` amax
    (``include_self=False``) into zeros, and torch's backward of that counts the untouched zero as one
    more tie where the maximum equals it (its share is dropped); matched here so that gradients equal
    PyG's on integer-valued features. 1 for nodes without in-edges (no edge reads it)."""
    return count + (out == 0).to(count.dtype)


def _segment_max_backward_torch(grad, x, out, count, ptr, src):
    """Each (node, channel)'s gradient split evenly among the edges reaching its maximum, as
    ``scatter_reduce`` amax's backward does: ``(x_j == out_i) * (g_i / n_i)`` (:func:`_tie_divisor`)."""
    dst = destinations(ptr, src.numel())
    share = grad / _tie_divisor(out, count).to(grad.dtype)
    gx = torch.zeros_like(x)
    for part in _edge_chunks(src.numel()):
        d, s = dst[part], src[part]
        reached = x.index_select(0, s) == out.index_select(0, d)
        gx.index_add_(0, s, torch.where(reached, share.index_select(0, d), 0.0))
    return gx


@torch.library.custom_op("revgnn::segment_max", mutates_args=())
def segment_max(x: Tensor, ptr: Tensor, src: Tensor, sptr: Tensor, sdst: Tensor) -> Tuple[Tensor, Tensor]:
    r"""``(out, count)``: ``out[i] = max_{e = (j -> i)} x[j]`` per channel (0 for nodes without
    in-edges, as PyG's max aggregation) over destination-sorted edges (``ptr``, ``src`` as in
    :func:`aggregate`), and ``count`` ``[N, C]`` int32 the number of edges reaching each maximum, by
    which the gradient is split among ties. ``sptr``, ``sdst`` are the edges in source order (pointer,
    destinations), which the backward pass reduces over."""
    _check_graph("segment_max", x, ptr, src, None)
    kernel = select("segment_max", x, num_edges=src.numel())
    if kernel is not None:
        return tuple(kernel.forward(x, ptr, src))
    with _in_dtype(x):
        return _segment_max_torch(x, ptr, src)


@segment_max.register_fake
def _(x, ptr, src, sptr, sdst):
    n, c = ptr.size(0) - 1, x.size(1)
    return x.new_empty(n, c), x.new_empty(n, c, dtype=torch.int32)


@torch.library.custom_op("revgnn::segment_max_backward", mutates_args=())
def segment_max_backward(
    grad: Tensor, x: Tensor, out: Tensor, count: Tensor, ptr: Tensor, src: Tensor, sptr: Tensor, sdst: Tensor
) -> Tensor:
    """The gradient of :func:`segment_max`'s ``out`` for ``x``."""
    kernel = select("segment_max", x, grad, out, num_edges=src.numel())
    if kernel is not None:
        return kernel.backward(grad, x, out, count, sptr, sdst)
    with _in_dtype(x):
        return _segment_max_backward_torch(grad, x, out, count, ptr, src)


@segment_max_backward.register_fake
def _(grad, x, out, count, ptr, src, sptr, sdst):
    return torch.empty_like(x)


def _segment_max_setup(ctx, inputs, output):
    x, ptr, src, sptr, sdst = inputs
    out, count = output
    ctx.save_for_backward(x, out, count, ptr, src, sptr, sdst)


def _segment_max_grad(ctx, grad_out, _grad_count):
    x, out, count, ptr, src, sptr, sdst = ctx.saved_tensors
    gx = segment_max_backward(grad_out.contiguous(), x, out, count, ptr, src, sptr, sdst)
    return gx if ctx.needs_input_grad[0] else None, None, None, None, None


segment_max.register_autograd(_segment_max_grad, setup_context=_segment_max_setup)


# ---- GEN sum / mean / softmax (issue #33, part b)

_GEN_REDUCES = ("sum", "mean", "softmax")
#: What PyG's ``softmax`` adds to every denominator (``torch_geometric.utils.softmax``).
_SOFTMAX_DENOMINATOR_FLOOR = 1e-16


def _check_gen_aggr(x: Tensor, ptr: Tensor, src: Tensor, dst: Tensor, t: Optional[Tensor], reduce: str):
    if reduce not in _GEN_REDUCES:
        raise ValueError(f"revgnn.gen_aggr: reduce must be one of {_GEN_REDUCES}, got {reduce!r}")
    if reduce == "softmax" and (t is None or t.numel() != 1):
        raise ValueError("revgnn.gen_aggr: softmax takes its temperature t as a one-element tensor")
    if x.dim() != 2 or ptr.dim() != 1 or src.shape != dst.shape or src.dim() != 1:
        raise ValueError(
            f"revgnn.gen_aggr: x [N, C], ptr [N + 1], src and dst [E], got x {list(x.shape)}, "
            f"ptr {list(ptr.shape)}, src {list(src.shape)}, dst {list(dst.shape)}"
        )


def _gen_pre(x, src, attr, weight, bias, lo, hi):
    """The pre-activations ``x[src] + e`` of edges ``lo:hi``."""
    return _messages(x, src[lo:hi], attr[lo:hi] if attr is not None else None, weight, bias)


def _gen_aggr_torch(x, ptr, src, dst, attr, weight, bias, t, eps, reduce):
    n, c = ptr.numel() - 1, x.size(1)
    out = x.new_zeros(n, c)
    if reduce != "softmax":
        for part in _edge_chunks(src.numel()):
            lo, hi = part.start, part.stop
            m = _gen_pre(x, src, attr, weight, bias, lo, hi).relu_() + eps
            out.index_add_(0, dst[lo:hi], m)
        if reduce == "mean":
            out = out / ptr.diff().clamp_min(1).view(-1, 1).to(out.dtype)
        return out, _empty(x), _empty(x)
    # softmax: the per-channel maximum of t * m first, then the sums (two passes over the edges: with
    # PyTorch ops an online rescaling would rescale the whole [N, C] accumulators once per chunk)
    top = x.new_full((n, c), float("-inf"))
    for part in _edge_chunks(src.numel()):
        lo, hi = part.start, part.stop
        s = (_gen_pre(x, src, attr, weight, bias, lo, hi).relu_() + eps) * t
        top.scatter_reduce_(0, dst[lo:hi].view(-1, 1).expand_as(s), s, "amax")
    denom = x.new_zeros(n, c)
    for part in _edge_chunks(src.numel()):
        lo, hi = part.start, part.stop
        m = _gen_pre(x, src, attr, weight, bias, lo, hi).relu_() + eps
        d = dst[lo:hi]
        p = (m * t - top.index_select(0, d)).exp_()
        denom.index_add_(0, d, p)
        out.index_add_(0, d, p.mul_(m))
    denom += _SOFTMAX_DENOMINATOR_FLOOR
    return out.div_(denom), top, denom


def _gen_aggr_backward_torch(
    grad,
    out,
    top,
    denom,
    x,
    ptr,
    src,
    dst,
    attr,
    weight,
    bias,
    t,
    eps,
    reduce,
    need_x,
    need_attr,
    need_w,
    need_b,
    need_t,
):
    """Streams the edges in chunks as forward does, recomputing each edge's message (and softmax
    weight) from the saved per-node values: the largest temporary is a chunk's."""
    factored = attr is not None and weight is not None
    gx = torch.zeros_like(x) if need_x else None
    ga = torch.zeros_like(attr) if need_attr and attr is not None else None
    gw = torch.zeros_like(weight) if need_w and factored else None
    gb = torch.zeros_like(bias) if need_b and factored and bias is not None else None
    gt = torch.zeros_like(t) if need_t and reduce == "softmax" else None
    scale = 1.0 / ptr.diff().clamp_min(1).to(x.dtype) if reduce == "mean" else None
    for part in _edge_chunks(src.numel()):
        lo, hi = part.start, part.stop
        d = dst[lo:hi]
        pre = _gen_pre(x, src, attr, weight, bias, lo, hi)
        g = grad.index_select(0, d)
        if reduce == "mean":
            g = g * scale.index_select(0, d).view(-1, 1)
        elif reduce == "softmax":
            m = pre.relu() + eps
            # alpha (1 + t (m - o)): d o / d m; the gradient of t is sum g alpha m (m - o), written
            # as g alpha (m - o)^2 (equal since sum_j alpha_j (m_j - o) = 0), free of that cancellation
            alpha = (m * t - top.index_select(0, d)).exp_().div_(denom.index_select(0, d))
            centred = m.sub_(out.index_select(0, d))
            g = g * alpha
            if gt is not None:
                gt += (g * centred * centred).sum()
            g = g.mul_(centred.mul_(t).add_(1.0))
        g = torch.where(pre > 0, g, 0.0)  # ReLU's backward (NaN pre-activations pass nothing)
        if gx is not None:
            gx.index_add_(0, src[lo:hi], g)
        if ga is not None:
            ga[lo:hi] = g @ weight if factored else g
        if gw is not None:
            gw += g.t() @ attr[lo:hi]
        if gb is not None:
            gb += g.sum(0)
    return gx, ga, gw, gb, gt


@torch.library.custom_op("revgnn::gen_aggr", mutates_args=())
def gen_aggr(
    x: Tensor,
    ptr: Tensor,
    src: Tensor,
    dst: Tensor,
    src_ptr: Tensor,
    src_dst: Tensor,
    src_perm: Tensor,
    attr: Optional[Tensor],
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    t: Optional[Tensor],
    eps: float,
    reduce: str,
) -> Tuple[Tensor, Tensor, Tensor]:
    r"""``(out, top, denom)``: GENConv's aggregation of the messages
    :math:`m_{jic} = \mathrm{ReLU}(x_{jc} + e_{jic}) + \epsilon` per destination ``i`` over
    destination-sorted edges (``ptr`` ``[N + 1]`` over destinations, ``src``/``dst`` ``[E]``;
    ``src_ptr`` ``[N + 1]``, ``src_dst`` and ``src_perm`` ``[E]`` the same edges in source order,
    their destinations and positions in destination order, over which the Triton kernel's backward
    gathers ``x``'s gradient: :func:`revgnn.nn.graph_input.segments`' ``sptr``, ``sdst``,
    ``sperm``; empty tensors where the C++ or PyTorch implementation runs, whose backward walks the
    destination order: :func:`revgnn.nn.dispatch.reads_source_order`): ``reduce`` is ``"sum"``
    (:math:`\sum_j m_{jic}`), ``"mean"`` or ``"softmax"``
    (:math:`\sum_j \alpha_{jic} m_{jic}` with :math:`\alpha_{jic} =
    \mathrm{softmax}_j(t\,m_{jic})`, ``t`` a one-element tensor), 0 for nodes without in-edges. The
    edge term is absent, ``attr`` ``[E, C]``, or ``attr @ weight.T + bias`` with ``attr`` the raw
    ``[E, d]`` features (never expanded). For softmax ``top`` and ``denom`` ``[N, C]`` are the
    per-channel maximum of :math:`t\,m` and the softmax denominator, which backward recomputes the
    weights from (empty for sum and mean): nothing edge-sized is kept."""
    _check_gen_aggr(x, ptr, src, dst, t, reduce)
    kernel = select("gen_aggr", x, attr, weight, bias, t, num_edges=src.numel())
    if kernel is not None:
        wt = weight.t().contiguous() if weight is not None else None
        return tuple(kernel.forward(x, ptr, src, attr, wt, bias, t, eps, reduce))
    with _in_dtype(x):
        return _gen_aggr_torch(x, ptr, src, dst, attr, weight, bias, t, eps, reduce)


@gen_aggr.register_fake
def _(x, ptr, src, dst, src_ptr, src_dst, src_perm, attr, weight, bias, t, eps, reduce):
    n, c = ptr.size(0) - 1, x.size(1)
    saved = (n, c) if reduce == "softmax" else (0,)
    return x.new_empty(n, c), x.new_empty(saved), x.new_empty(saved)


@torch.library.custom_op("revgnn::gen_aggr_backward", mutates_args=())
def gen_aggr_backward(
    grad: Tensor,
    out: Tensor,
    top: Tensor,
    denom: Tensor,
    x: Tensor,
    ptr: Tensor,
    src: Tensor,
    dst: Tensor,
    src_ptr: Tensor,
    src_dst: Tensor,
    src_perm: Tensor,
    attr: Optional[Tensor],
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    t: Optional[Tensor],
    eps: float,
    reduce: str,
    need_x: bool,
    need_attr: bool,
    need_w: bool,
    need_b: bool,
    need_t: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients of :func:`gen_aggr`'s ``out`` for ``x``, ``attr``, ``weight``, ``bias`` and
    ``t`` (an empty tensor where not asked for, or where that input is absent)."""
    kernel = select("gen_aggr", x, attr, weight, bias, t, num_edges=src.numel())
    if kernel is not None:
        wt = weight.t().contiguous() if weight is not None else None
        grads = kernel.backward(
            grad, out, top, denom, x, ptr, src, src_ptr, src_dst, src_perm, attr, wt, bias, t, eps, reduce,
            need_x, need_attr, need_w, need_b, need_t,
        )  # fmt: skip
    else:
        with _in_dtype(x):
            grads = _gen_aggr_backward_torch(
                grad, out, top, denom, x, ptr, src, dst, attr, weight, bias, t, eps, reduce,
                need_x, need_attr, need_w, need_b, need_t,
            )  # fmt: skip
    return tuple(_or_empty(g, x) for g in grads)


@gen_aggr_backward.register_fake
def _(grad, out, top, denom, x, ptr, src, dst, src_ptr, src_dst, src_perm, attr, weight, bias, t, eps,
      reduce, need_x, need_attr, need_w, need_b, need_t):  # fmt: skip
    grads = _fake_grads(x, attr, weight, bias, need_x, need_attr, need_w, need_b)
    gt = torch.empty_like(t) if need_t and t is not None and reduce == "softmax" else x.new_empty(0)
    return (*grads, gt)


def _gen_aggr_setup(ctx, inputs, output):
    x, ptr, src, dst, src_ptr, src_dst, src_perm, attr, weight, bias, t, eps, reduce = inputs
    ctx.eps, ctx.reduce = eps, reduce
    ctx.save_for_backward(x, ptr, src, dst, src_ptr, src_dst, src_perm, attr, weight, bias, t, *output)


def _gen_aggr_grad(ctx, grad_out, _grad_top, _grad_denom):
    x, ptr, src, dst, src_ptr, src_dst, src_perm, attr, weight, bias, t, out, top, denom = ctx.saved_tensors
    need = ctx.needs_input_grad
    need_x, need_attr, need_w, need_b, need_t = need[0], need[7], need[8], need[9], need[10]
    gx, ga, gw, gb, gt = gen_aggr_backward(
        grad_out.contiguous(), out, top, denom, x, ptr, src, dst, src_ptr, src_dst, src_perm, attr,
        weight, bias, t, ctx.eps, ctx.reduce, need_x, need_attr, need_w, need_b, need_t,
    )  # fmt: skip
    return (
        gx if need_x else None,
        None,
        None,
        None,
        None,
        None,
        None,
        ga if need_attr and attr is not None else None,
        gw if need_w and weight is not None and attr is not None else None,
        gb if need_b and bias is not None and weight is not None and attr is not None else None,
        gt if need_t and t is not None and ctx.reduce == "softmax" else None,
        None,
        None,
    )


gen_aggr.register_autograd(_gen_aggr_grad, setup_context=_gen_aggr_setup)


# ------------------------------------------------------------------------- (c) GAT attention

_M32 = 0xFFFFFFFF


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit integer mixer on int64 tensors holding values in ``[0, 2^32)``; every constant is below
    :math:`2^{31}`, so no product leaves int64 (the C++ kernel computes the same in uint32)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _M32
    x = x ^ (x >> 16)
    x = (x * 0x297A2D39) & _M32
    return x ^ (x >> 15)


def dropout_threshold(p: float) -> int:
    """The 24-bit threshold below which :func:`attention_keep` drops: :math:`\\lfloor p \\cdot 2^{24}
    \\rceil` (a drop probability within :math:`2^{-25}` of ``p``)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"attention dropout must be in [0, 1), got {p}")
    return int(round(p * 2**24))


def attention_keep(seed: Tensor, edge: Tensor, heads: int, p: float) -> Tensor:
    r"""The attention-dropout keep mask ``[len(edge), heads]`` (bool) of the given edge ids, drawn
    from a counter-based hash of ``(seed, edge, head)``, so the same mask is recomputed wherever it
    is needed (forward, backward, the reversible recompute) without being stored. Edge ids are the
    positions in the destination-sorted order and node ``i``'s self loop is ``E + i``, unless
    :func:`gat_attention` is given ``edge_key`` / ``loop_key`` (a SAR shard: the whole graph's ids).
    Only the low 32 bits of an id count. The C++ and Triton kernels draw the identical mask."""
    key = _mix32(seed.to(torch.int64).reshape(()) & _M32)
    x = _mix32(key ^ (edge.to(torch.int64).view(-1, 1) & _M32))
    x = _mix32(x ^ torch.arange(heads, dtype=torch.int64, device=edge.device))
    return (x >> 8) >= dropout_threshold(p)


def _gat_scale(seed, first, count, heads, p, like, key=None, offset=0):
    """The dropout scale (:math:`1 / (1 - p)` kept, 0 dropped) in ``like``'s dtype (None: no dropout)
    of the edges (or self loops) ``first .. first + count - 1``: their ids ``key[first : first +
    count]``, or without ``key`` ``offset + first ..`` (the default ids of :func:`attention_keep`)."""
    if p == 0.0:
        return None
    if key is not None:
        edge = key[first : first + count]
    else:
        edge = torch.arange(offset + first, offset + first + count, device=like.device)
    return attention_keep(seed, edge, heads, p).to(like.dtype) * (1.0 / (1.0 - p))


def _check_keys(name: str, edge_key: Optional[Tensor], loop_key: Optional[Tensor], e: int, n: int) -> None:
    """Refuses dropout ids that are not int64 vectors of one id per edge (``edge_key``) or node
    (``loop_key``)."""
    for what, key, size in (("edge_key", edge_key, e), ("loop_key", loop_key, n)):
        if key is not None and (key.dtype != torch.int64 or key.dim() != 1 or key.numel() != size):
            raise ValueError(
                f"{name}: {what} must be an int64 vector of {size} ids, got {key.dtype} {list(key.shape)}"
            )


def _gat_logits(a_src, a_dst, src, dst, attr, edge_w, edge_b):
    """The pre-LeakyReLU logits ``[len(src), H]`` of the given edges (``attr`` in their order)."""
    z = a_src.index_select(0, src) + a_dst.index_select(0, dst)
    if attr is not None:
        z = z + torch.nn.functional.linear(attr, edge_w, edge_b)
    return z


def _gat_chunks(ptr, src, attr):
    """(first edge, sources, destinations, raw features, self loop flags) per chunk of
    :data:`CHUNK_EDGES` edges (its largest temporaries: a chunk's messages, never E x C)."""
    e = src.numel()
    dst = destinations(ptr, e)
    for part in _edge_chunks(e):
        s, d = src[part], dst[part]
        a = attr[part] if attr is not None else None
        yield part.start, s, d, a, (s == d).view(-1, 1)


def _gat_attention_torch(
    xp, a_src, a_dst, loop, ptr, src, attr, edge_w, edge_b, slope, p, seed, edge_key, loop_key
):
    n, heads, _ = xp.shape
    e = src.numel()
    leaky = torch.nn.functional.leaky_relu
    s_loop = leaky(a_src + a_dst + loop, slope)
    top = s_loop.clone()  # every node has its self loop: the maximum is finite
    for _, s, d, a, self_edge in _gat_chunks(ptr, src, attr):
        logit = leaky(_gat_logits(a_src, a_dst, s, d, a, edge_w, edge_b), slope).masked_fill(
            self_edge, float("-inf")
        )
        top.scatter_reduce_(0, d.view(-1, 1).expand_as(logit), logit, "amax")
    w_loop = (s_loop - top).exp()
    den = w_loop.clone()
    keep = _gat_scale(seed, 0, n, heads, p, xp, loop_key, offset=e)
    acc = (w_loop if keep is None else w_loop * keep).unsqueeze(-1) * xp
    for start, s, d, a, self_edge in _gat_chunks(ptr, src, attr):
        logit = leaky(_gat_logits(a_src, a_dst, s, d, a, edge_w, edge_b), slope)
        w = (logit - top.index_select(0, d)).exp().masked_fill(self_edge, 0.0)
        den.index_add_(0, d, w)
        keep = _gat_scale(seed, start, s.numel(), heads, p, xp, edge_key)
        acc.index_add_(0, d, (w if keep is None else w * keep).unsqueeze(-1) * xp.index_select(0, s))
    return acc / den.unsqueeze(-1), top, den


def _gat_attention_backward_torch(
    grad, out, top, den, xp, a_src, a_dst, loop, ptr, src, attr, edge_w, edge_b, slope, p, seed, need_attr,
    edge_key, loop_key,
):  # fmt: skip
    r"""Per edge (recomputed, chunk by chunk) :math:`\partial L / \partial s_{ijh} = \alpha_{ijh}
    (\kappa_{ijh} \langle g_{ih}, x'_{jh} \rangle - \langle g_{ih}, o_{ih} \rangle)` with the dropout
    scale :math:`\kappa`, through the LeakyReLU to the logits' terms; :math:`\partial L / \partial
    x'_{jh} \mathrel{+}= \kappa_{ijh} \alpha_{ijh} g_{ih}`."""
    n, heads, _ = xp.shape
    e = src.numel()
    leaky = torch.nn.functional.leaky_relu
    g_out = (grad * out).sum(-1)  # [N, H]: <g_ih, o_ih>

    def through(z, alpha, q, go):
        """dL/dz of the logits z from the coefficients alpha, q = kappa <g_i, x'_j> and go = <g_i, o_i>."""
        ds = alpha * (q - go)
        return torch.where(z > 0, ds, ds * slope)  # LeakyReLU's backward (slope at 0, as torch's)

    z_loop = a_src + a_dst + loop
    alpha = (leaky(z_loop, slope) - top).exp() / den
    keep = _gat_scale(seed, 0, n, heads, p, xp, loop_key, offset=e)
    ka = alpha if keep is None else alpha * keep
    q = (grad * xp).sum(-1)
    dz_loop = through(z_loop, alpha, q if keep is None else q * keep, g_out)
    g_src, g_dst, g_loop = dz_loop.clone(), dz_loop.clone(), dz_loop
    g_xp = ka.unsqueeze(-1) * grad
    g_attr = torch.zeros_like(attr) if attr is not None and need_attr else None
    g_w = torch.zeros_like(edge_w) if attr is not None else None
    g_b = torch.zeros_like(edge_b) if attr is not None and edge_b is not None else None
    for start, s, d, a, self_edge in _gat_chunks(ptr, src, attr):
        z = _gat_logits(a_src, a_dst, s, d, a, edge_w, edge_b)
        alpha = ((leaky(z, slope) - top.index_select(0, d)).exp() / den.index_select(0, d)).masked_fill(
            self_edge, 0.0
        )
        keep = _gat_scale(seed, start, s.numel(), heads, p, xp, edge_key)
        g_d = grad.index_select(0, d)
        q = (g_d * xp.index_select(0, s)).sum(-1)
        dz = through(z, alpha, q if keep is None else q * keep, g_out.index_select(0, d))
        g_src.index_add_(0, s, dz)
        g_dst.index_add_(0, d, dz)
        ka = alpha if keep is None else alpha * keep
        g_xp.index_add_(0, s, ka.unsqueeze(-1) * g_d)
        if attr is not None:
            if g_attr is not None:
                g_attr[start : start + s.numel()] = dz @ edge_w
            g_w += dz.t() @ a
            if g_b is not None:
                g_b += dz.sum(0)
    return g_xp, g_src, g_dst, g_loop, g_attr, g_w, g_b


@torch.library.custom_op("revgnn::gat_attention", mutates_args=())
def gat_attention(
    xp: Tensor,
    a_src: Tensor,
    a_dst: Tensor,
    loop: Tensor,
    ptr: Tensor,
    src: Tensor,
    attr: Optional[Tensor],
    edge_w: Optional[Tensor],
    edge_b: Optional[Tensor],
    negative_slope: float,
    p: float,
    seed: Tensor,
    rowptr: Tensor,
    col: Tensor,
    perm: Tensor,
    edge_key: Optional[Tensor] = None,
    loop_key: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
    r"""``(out, max, den)``: GAT's attention over destination-sorted edges (``ptr`` ``[N + 1]``,
    ``src`` ``[E]``) plus one self loop per node, with the edges ``j -> j`` of ``src`` left out
    (PyG's ``remove_self_loops`` then ``add_self_loops``):

    .. math::
        s_{ijh} = \mathrm{LeakyReLU}(a^{src}_{jh} + a^{dst}_{ih} + \mathbf{a}_{ij} \cdot
        \mathbf{w}_h + b_h), \quad
        \mathbf{o}_{ih} = \sum_j \kappa_{ijh} \frac{\exp(s_{ijh} - M_{ih})}{D_{ih}} \mathbf{x}'_{jh}

    with ``xp`` :math:`\mathbf{x}'` ``[N, H, C']``, ``a_src``, ``a_dst`` ``[N, H]``, the edge term
    absent or from the raw features ``attr`` ``[E, d]``, ``edge_w`` ``[H, d]``, ``edge_b`` ``[H]``
    (optional); the self loop's edge term is ``loop`` ``[N, H]``. ``max`` :math:`M` and ``den``
    :math:`D` ``[N, H]`` are each destination's and head's maximum logit and softmax denominator,
    :math:`\kappa` the attention-dropout scale of :func:`attention_keep` (``seed``, drop rate
    ``p``; 1 where ``p = 0``). ``rowptr`` ``[N + 1]``, ``col`` ``[E]``, ``perm`` ``[E]`` are the same
    edges sorted by source (the pointer over sources, each edge's destination and its position in
    the destination order: :func:`revgnn.nn.graph_input.source_order`), by which the C++ backward
    sums the sources' gradients per source. ``edge_key`` ``[E]`` and ``loop_key`` ``[N]`` (int64,
    optional) are the ids the mask is drawn for, in place of the edges' positions and ``E + i``: a
    SAR shard passes its edges' ids in the whole graph and so draws the mask the one-process
    operator draws for them."""
    _check_keys("gat_attention", edge_key, loop_key, src.numel(), xp.size(0))
    kernel = select("gat_attention", xp, a_src, a_dst, loop, attr, edge_w, edge_b, num_edges=src.numel())
    if kernel is not None:
        dropout_threshold(p)  # refuses p outside [0, 1), as the PyTorch path does
        return tuple(
            kernel.forward(
                xp, a_src, a_dst, loop, ptr, src, attr, edge_w, edge_b, negative_slope, p, int(seed),
                edge_key, loop_key,
            )
        )  # fmt: skip
    with _in_dtype(xp):
        return _gat_attention_torch(
            xp, a_src, a_dst, loop, ptr, src, attr, edge_w, edge_b, negative_slope, p, seed,
            edge_key, loop_key,
        )  # fmt: skip


@gat_attention.register_fake
def _(
    xp, a_src, a_dst, loop, ptr, src, attr, edge_w, edge_b, negative_slope, p, seed, rowptr, col, perm,
    edge_key=None, loop_key=None,
):  # fmt: skip
    return torch.empty_like(xp), torch.empty_like(a_src), torch.empty_like(a_src)


@torch.library.custom_op("revgnn::gat_attention_backward", mutates_args=())
def gat_attention_backward(
    grad: Tensor,
    out: Tensor,
    top: Tensor,
    den: Tensor,
    xp: Tensor,
    a_src: Tensor,
    a_dst: Tensor,
    loop: Tensor,
    ptr: Tensor,
    src: Tensor,
    attr: Optional[Tensor],
    edge_w: Optional[Tensor],
    edge_b: Optional[Tensor],
    negative_slope: float,
    p: float,
    seed: Tensor,
    rowptr: Tensor,
    col: Tensor,
    perm: Tensor,
    need_attr: bool,
    edge_key: Optional[Tensor] = None,
    loop_key: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients of :func:`gat_attention`'s ``out`` for ``xp``, ``a_src``, ``a_dst``, ``loop``,
    ``attr``, ``edge_w``, ``edge_b`` (an empty tensor where that input is absent, and for ``attr``
    where not asked for)."""
    _check_keys("gat_attention_backward", edge_key, loop_key, src.numel(), xp.size(0))
    kernel = select("gat_attention", xp, a_src, a_dst, loop, attr, edge_w, edge_b, num_edges=src.numel())
    if kernel is not None:
        return tuple(
            kernel.backward(
                grad, out, top, den, xp, a_src, a_dst, loop, ptr, src, attr, edge_w, edge_b,
                negative_slope, p, int(seed), rowptr, col, perm, need_attr, edge_key, loop_key,
            )
        )  # fmt: skip
    with _in_dtype(xp):
        grads = _gat_attention_backward_torch(
            grad, out, top, den, xp, a_src, a_dst, loop, ptr, src, attr, edge_w, edge_b,
            negative_slope, p, seed, need_attr, edge_key, loop_key,
        )  # fmt: skip
    return tuple(_or_empty(g, xp) for g in grads)


@gat_attention_backward.register_fake
def _(
    grad,
    out,
    top,
    den,
    xp,
    a_src,
    a_dst,
    loop,
    ptr,
    src,
    attr,
    edge_w,
    edge_b,
    slope,
    p,
    seed,
    *order,
    need_attr,
    edge_key=None,
    loop_key=None,
):
    def like(t, present=True):
        return torch.empty_like(t) if t is not None and present else xp.new_empty(0)

    factored = attr is not None
    return (
        like(xp),
        like(a_src),
        like(a_dst),
        like(loop),
        like(attr, need_attr),
        like(edge_w, factored),
        like(edge_b, factored),
    )


def _gat_attention_setup(ctx, inputs, output):
    xp, a_src, a_dst, loop, ptr, src, attr, edge_w, edge_b, slope, p, seed, rowptr, col, perm, *keys = inputs
    out, top, den = output
    ctx.slope, ctx.p = slope, p
    ctx.save_for_backward(
        xp, a_src, a_dst, loop, ptr, src, attr, edge_w, edge_b, seed, rowptr, col, perm, out, top, den, *keys
    )


def _gat_attention_grad(ctx, grad_out, _grad_top, _grad_den):
    xp, a_src, a_dst, loop, ptr, src, attr, edge_w, edge_b, seed, rowptr, col, perm, out, top, den, *keys = (
        ctx.saved_tensors
    )
    need = ctx.needs_input_grad
    grads = gat_attention_backward(
        grad_out.contiguous(), out, top, den, xp, a_src, a_dst, loop, ptr, src, attr, edge_w, edge_b,
        ctx.slope, ctx.p, seed, rowptr, col, perm, need[6], *keys,
    )  # fmt: skip
    present = (True, True, True, True, attr is not None, attr is not None, edge_b is not None)
    g_xp, g_src, g_dst, g_loop, g_attr, g_w, g_b = (
        g if wanted and here else None for g, wanted, here in zip(grads, need[:4] + need[6:9], present)
    )
    nones = (None,) * (len(need) - 9)  # ptr .. perm and the dropout ids
    return (g_xp, g_src, g_dst, g_loop, None, None, g_attr, g_w, g_b, *nones)


gat_attention.register_autograd(_gat_attention_grad, setup_context=_gat_attention_setup)


__all__ += ["attention_keep", "gat_attention", "gat_attention_backward"]
