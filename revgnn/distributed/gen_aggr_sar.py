r"""GENConv's sum, mean and softmax aggregations under SAR through the fused operator, shard by shard.

On one process ``torch.ops.revgnn.gen_aggr`` (:func:`revgnn.nn.gen_max.gen_aggregate`) computes, with
:math:`\mathbf{m}_{ji} = \mathrm{ReLU}(\mathbf{x}_j + \mathbf{e}_{ji}) + \epsilon` and the edge term
absent, dense or factored (:math:`\mathbf{e}_{ji} = \mathbf{W}\mathbf{a}_{ji} + \mathbf{b}` on the raw
features, never expanded),

.. math::
    \mathbf{h}_i = \sum_j \mathbf{m}_{ji}, \qquad
    \frac{1}{d_i} \sum_j \mathbf{m}_{ji} \qquad\text{or}\qquad
    \sum_j \frac{e^{t m_{jic} - M_{ic}}}{D_{ic}}\, m_{jic}

without an :math:`E \times C` tensor (C++ on CPU, Triton on CUDA, chunked PyTorch otherwise:
:func:`revgnn.nn.dispatch.select`). Here the same operator runs once per shard :math:`q` of a
:class:`~revgnn.distributed.sar.SARGraph` on the rows fetched from worker :math:`q`, the shard handed
over as a square graph of :math:`\max(R_q, n)` nodes as in :mod:`~revgnn.distributed.aggregate_sar`:

* **sum / mean**: the shards' sums add up; mean divides by the *global* in-degree :math:`d_i`
  (all shards), at least 1.
* **softmax** (SAR's online softmax, Mostafa 2021): shard :math:`q` gives its per-(node, channel)
  maximum :math:`M^q`, denominator :math:`D^q` and normalised sum :math:`\mathbf{h}^q`, so its
  numerator is :math:`U^q = \mathbf{h}^q D^q`; shards merge as
  :math:`M = \max(M, M^q)`, :math:`D \leftarrow D e^{M^{old} - M} + D^q e^{M^q - M}`,
  :math:`U \leftarrow U e^{M^{old} - M} + U^q e^{M^q - M}` (a shard without edges into a node has
  :math:`M^q = -\infty` and adds nothing), and :math:`\mathbf{h} = U / (D + 10^{-16})` (PyG's floor).
  The operator adds the floor to :math:`D^q` too, which leaves it unchanged where the shard has edges
  (:math:`D^q \ge 1` holds the maximum's own :math:`e^0`, and :math:`10^{-16}` is below half an ulp
  of 1 in float32 and float64).

Backward runs the ring again, re-fetching each block (the messages depend on
:math:`\mathbf{x}_j` through the ReLU), and hands the operator's backward the *merged* :math:`\mathbf{h},
M, D`: the weights it recomputes per edge, :math:`\alpha_{jic} = e^{t m_{jic} - M_{ic}} / D_{ic}`, are
then the global softmax's, and its per-edge terms
:math:`\partial L/\partial m_{jic} = g_{ic}\,\alpha_{jic}(1 + t(m_{jic} - h_{ic}))` and
:math:`\partial L/\partial t = \sum g_{ic}\,\alpha_{jic}(m_{jic} - h_{ic})^2` summed over the shards
are the one-process gradient's (the second form of :math:`\partial L/\partial t` equals
:math:`\sum g\alpha m(m - h)` because :math:`\sum_j \alpha_{jic}(m_{jic} - h_{ic}) = 0` over *all* a
node's edges, which the sum over shards restores). The fetched rows' gradient goes home with
:meth:`~revgnn.distributed.sar.SARGraph.return_grads`. Saved: the local input, the caller's edge
features and the merged :math:`\mathbf{h}, M, D` (:math:`O(N C)`); no edge-sized float tensor.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from revgnn.nn import ops
from revgnn.nn.dispatch import reads_source_order

from .aggregate_sar import Shard, ShardSegments, add_shard_rows, pad_rows, shard_rows
from .gen_max_sar import gen_edge_term
from .sar import SOFTMAX_EPS, SARGraph

__all__ = ["sar_gen_aggregate", "SARGENAggr"]

_REDUCES = ("sum", "mean", "softmax")


def _source_order(s: Shard, read: bool):
    """Shard ``s``'s source order where the operator's implementation reads it (only its Triton
    backward: :func:`revgnn.nn.dispatch.reads_source_order`), else empty placeholders: the shard's
    source order is built on first use, so a GEN-only model on the C++ kernel never builds it."""
    if read:
        return s.source_order()
    empty = s.ptr.new_empty(0)
    return empty, empty, empty


def _merge_softmax(state, out_q: Tensor, top_q: Tensor, den_q: Tensor):
    """Folds one shard's ``(h^q, M^q, D^q)`` into the running ``(U, M, D)`` (:obj:`None` at first)."""
    empty = top_q == float("-inf")
    den_q = den_q.masked_fill(empty, 0.0)  # the operator's floor alone: no edge of the shard
    num_q = out_q * den_q
    if state is None:
        return num_q, top_q, den_q
    num, top, den = state
    hi = torch.maximum(top, top_q)
    # exp(M - hi) with 0 where M = -inf (also where both are: nothing summed on either side)
    r = torch.where(top == float("-inf"), 0.0, torch.exp(top - hi))
    r_q = torch.where(empty, 0.0, torch.exp(top_q - hi))
    return num * r + num_q * r_q, hi, den * r + den_q * r_q


class SARGENAggr(torch.autograd.Function):
    r"""GENConv's ``reduce`` (``"sum"``, ``"mean"``, ``"softmax"``) aggregation over all shards of
    ``graph``; see the module docstring. ``attr`` is None, dense ``[E, C]``, or the raw ``[E, d]``
    features when ``weight`` ``[C, d]`` (and optionally ``bias`` ``[C]``) is given, in the graph's local
    edge order; ``t`` a one-element tensor (softmax) or None; all in ``x``'s dtype."""

    @staticmethod
    def forward(
        ctx,
        graph: SARGraph,
        eps: float,
        reduce: str,
        x: Tensor,
        attr: Optional[Tensor],
        weight: Optional[Tensor],
        bias: Optional[Tensor],
        t: Optional[Tensor],
    ) -> Tensor:  # type: ignore[override]
        segs = ShardSegments.of(graph)
        n = graph.num_local
        x = x.contiguous()
        weight_c, bias_c, t_c = (v.contiguous() if v is not None else None for v in (weight, bias, t))
        shard_reduce = "softmax" if reduce == "softmax" else "sum"
        total = state = None
        for q, block in graph.ring(x, f"SAR GENConv {reduce} forward"):
            s = segs.shards[q]
            out_q, top_q, den_q = ops.gen_aggr(
                pad_rows(block, s.size), s.ptr, s.src, s.dst, *_source_order(s, False),
                shard_rows(attr, s), weight_c, bias_c, t_c, eps, shard_reduce,
            )  # fmt: skip
            del block
            if reduce == "softmax":
                state = _merge_softmax(state, out_q[:n], top_q[:n], den_q[:n])
            else:
                total = out_q[:n] if total is None else total + out_q[:n]
            del out_q, top_q, den_q
        if reduce == "softmax":
            num, top, den = state
            den = den + SOFTMAX_EPS
            out = num / den
        else:
            out = total
            if reduce == "mean":  # by the global in-degree, as the one-process operator divides
                out = out / graph.in_degree.clamp_min(1).to(out.dtype).view(-1, 1)
            top = den = None
        ctx.graph, ctx.eps, ctx.reduce = graph, eps, reduce
        ctx.save_for_backward(x, attr, weight, bias, t, out if reduce == "softmax" else None, top, den)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        graph: SARGraph = ctx.graph
        x, attr, weight, bias, t, out, top, den = ctx.saved_tensors
        need_x, need_attr, need_w, need_b, need_t = ctx.needs_input_grad[3:8]
        need_attr = need_attr and attr is not None
        need_w = need_w and weight is not None and attr is not None
        need_b = need_b and bias is not None and weight is not None and attr is not None
        need_t = need_t and t is not None
        segs = ShardSegments.of(graph)
        reduce = ctx.reduce
        softmax = reduce == "softmax"
        g = grad_out.contiguous()
        if reduce == "mean":
            g = g / graph.in_degree.clamp_min(1).to(g.dtype).view(-1, 1)
        weight_c, bias_c, t_c = (v.contiguous() if v is not None else None for v in (weight, bias, t))
        grad_x = torch.zeros_like(x)
        grad_attr = torch.zeros_like(attr) if need_attr else None
        grad_w = torch.zeros_like(weight) if need_w else None
        grad_b = torch.zeros_like(bias) if need_b else None
        grad_t = torch.zeros_like(t) if need_t else None
        tag = graph.next_tag()
        what = f"SAR GENConv {reduce} backward"
        for q, block in graph.ring(x, f"{what} re-fetch"):
            s = segs.shards[q]
            gq = pad_rows(g, s.size)
            if softmax:  # the merged values: every recomputed weight is the global softmax's
                saved = (pad_rows(out, s.size), pad_rows(top, s.size), pad_rows(den, s.size, 1.0))
            else:  # unread by sum's backward, which wants the output's shape: gq stands for them
                saved = (gq, gq[:0], gq[:0])
            block, attr_q = pad_rows(block, s.size), shard_rows(attr, s)
            read = reads_source_order(
                "gen_aggr", block, attr_q, weight_c, bias_c, t_c, num_edges=s.src.numel()
            )
            # the fetched rows' gradient is always formed: the owner waits for it
            grad_block, ga, gw, gb, gt = ops.gen_aggr_backward(
                gq, *saved, block, s.ptr, s.src, s.dst, *_source_order(s, read),
                attr_q, weight_c, bias_c, t_c, ctx.eps, "softmax" if softmax else "sum",
                True, need_attr, need_w, need_b, need_t,
            )  # fmt: skip
            del block, attr_q, gq, saved
            if need_attr:
                add_shard_rows(grad_attr, ga, s)
            if need_w:
                grad_w += gw
            if need_b:
                grad_b += gb
            if need_t:
                grad_t += gt.view_as(grad_t)
            grad_block = grad_block[: s.rows].contiguous()
            if q == graph.rank:
                grad_x += grad_block
            else:
                graph.return_grads(q, grad_block, grad_x, tag, what)
            del grad_block, ga, gw, gb, gt
        return None, None, None, grad_x if need_x else None, grad_attr, grad_w, grad_b, grad_t


def sar_gen_aggregate(
    graph: SARGraph,
    x: Tensor,
    edge_attr=None,
    lin_edge: Optional[torch.nn.Module] = None,
    eps: float = 1e-7,
    reduce: str = "sum",
    t: Union[Tensor, float, None] = None,
) -> Tensor:
    r"""GENConv's ``reduce`` aggregation of ``x`` (the local source-side features ``[num_local, C]``)
    over ``graph`` through ``torch.ops.revgnn.gen_aggr``, shard by shard (see the module docstring).

    Args:
        graph (SARGraph): this worker's share of the graph.
        x (torch.Tensor): ``[num_local, C]`` node features; peers fetch rows of it.
        edge_attr (torch.Tensor or LinearEdgeFeatures, optional): the local edges' features in the
            graph's edge order: dense ``[E, C]`` terms, raw features for ``lin_edge``, or a factored
            encoding (never expanded). (default: :obj:`None`)
        lin_edge (torch.nn.Linear, optional): GENConv's own edge encoder, composed into the factored
            map. (default: :obj:`None`)
        eps (float, optional): the message floor :math:`\epsilon`. (default: :obj:`1e-7`)
        reduce (str, optional): ``"sum"``, ``"mean"`` or ``"softmax"``. (default: :obj:`"sum"`)
        t (torch.Tensor or float, optional): the softmax's inverse temperature, a float or a
            one-element tensor (learnable); softmax only. (default: :obj:`None`)

    Returns:
        torch.Tensor: ``[num_local, C]``.
    """
    if reduce not in _REDUCES:
        raise ValueError(f"sar_gen_aggregate: reduce must be one of {_REDUCES}, got {reduce!r}")
    if (reduce == "softmax") != (t is not None):
        raise ValueError("sar_gen_aggregate: a temperature t is given for, and only for, reduce='softmax'")
    if x.dim() != 2 or not x.is_floating_point():
        raise ValueError(
            f"sar_gen_aggregate: x must be a floating-point [N, C] tensor, got {x.dtype} {list(x.shape)}"
        )
    if x.size(0) != graph.num_local:
        raise ValueError(f"sar_gen_aggregate: expected {graph.num_local} local rows, got {x.size(0)}")
    attr, weight, bias = gen_edge_term(edge_attr, lin_edge)
    if attr is not None:
        if attr.dim() != 2 or attr.size(0) != graph.num_edges:
            raise ValueError(
                f"sar_gen_aggregate: edge features must be [{graph.num_edges}, *] (the local edges in "
                f"shard order), got {list(attr.shape)}"
            )
        width = weight.size(0) if weight is not None else attr.size(1)
        if width != x.size(1):
            raise ValueError(f"sar_gen_aggregate: the edge term has {width} channels, x has {x.size(1)}")
    if t is not None and not isinstance(t, Tensor):
        t = x.new_tensor([float(t)])
    if t is not None and t.numel() != 1:
        raise ValueError("sar_gen_aggregate: the softmax's temperature must be one number")
    # one dtype throughout, cast differentiably outside the Function (as gen_aggregate does)
    attr, weight, bias, t = (v.to(x.dtype) if v is not None else None for v in (attr, weight, bias, t))
    return SARGENAggr.apply(
        graph, float(eps), reduce, x, attr, weight, bias, t.view(1) if t is not None else None
    )
