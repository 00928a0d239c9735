r"""GENConv's max aggregation under SAR through the fused kernel (C++ or Triton), edge features factored.

On one process :func:`revgnn.nn.gen_max.gen_max_aggregate` computes

.. math::
    \mathbf{h}_{i,c} = \max_{j \in \mathcal{N}(i)} \mathrm{ReLU}(\mathbf{x}_{j,c}
    + \mathbf{e}_{ji,c}) + \epsilon, \qquad
    \mathbf{e}_{ji} = \mathbf{W}\mathbf{a}_{ji} + \mathbf{b}

in one pass of ``revgnn/csrc/gen_max.cpp`` over the destination-sorted edges,
never forming an :math:`E \times C` tensor. Here the same kernel runs once per
shard of a :class:`~revgnn.distributed.sar.SARGraph` (its ``shard_forward`` /
``shard_backward`` entry points, whose sources are the rows fetched from the
shard's owner) on the shard's raw :math:`d`-dimensional edge features
:math:`\mathbf{a}` and the composed :math:`\mathbf{W}, \mathbf{b}`.

Forward, per shard :math:`q`, the kernel gives :math:`m^q_{ic} =
\mathrm{ReLU}(\max_{j \in \mathcal{N}_q(i)} \text{pre-activation})` (0
without edges; no :math:`\epsilon`, so exact), the winning edge per (node,
channel) and :math:`n^q_{ic}`, the number of the shard's edges reaching the
maximum where it is positive (0 elsewhere). Shards merge as the SAR max does:
:math:`(m, n) \oplus (m', n') = (m, n)` if :math:`m > m'`, :math:`(m', n')` if
:math:`m' > m`, :math:`(m, n + n')` if equal (NaN sticks). The result
:math:`m + \epsilon` (0 for nodes without in-edges) is bitwise the one-process
kernel's, and the gradient is split like it: evenly over the edges tied at a
positive maximum, ties judged before :math:`\epsilon` is added, none where the
maximum is :math:`\le 0` or NaN.

Saved for backward (only when one follows, so not in the no-grad forward of a
reversible block): the local input, the caller's raw edge features,
:math:`\mathbf{W}, \mathbf{b}`, the rows of :math:`n` of the nodes with a
tied maximum, the winners of all shards in one int32 ``[N, C]`` tensor (the
winning edge's position among the worker's local edges, -1 where no shard
reaches the global maximum) and per shard its tie flags (``[N]``), the tie
counts of its tied nodes and, for the nodes where it shares a maximum with an
earlier shard, its own rows of winners: no edge-sized float tensor, no second
kernel forward in backward, and one ``[N, C]`` tensor of winners whatever the
number of shards, so that a worker's winners shrink as :math:`1/P` (the
kernel's per-shard winners are rebuilt from it in backward, one shard at a
time).

Backward runs the ring again (re-fetching each remote block as
:func:`~revgnn.distributed.sar.sequential_aggregate` does: the kernel
recomputes the messages of tied nodes) and hands the kernel
:math:`g_{ic}/n_{ic}` per winner, or :math:`g_{ic}\,n^q_{ic}/n_{ic}` on a tied
node where the shard reaches the maximum (the kernel splits it over the
shard's :math:`n^q_{ic}` ties), which yields the gradients of the fetched
rows (sent home with :meth:`~revgnn.distributed.sar.SARGraph.return_grads`),
of :math:`\mathbf{W}, \mathbf{b}` and, if they require it, of the raw
features, in :math:`O(NCd)` per shard.

:func:`sar_gen_max` returns :obj:`None` where no fused kernel applies (the dispatch
table, :func:`revgnn.nn.dispatch.select`: the C++ kernel on CPU, the Triton kernel on CUDA or under
``REVGNN_KERNELS=triton``; none with ``REVGNN_KERNELS=0``, no compiler or other dtypes); the caller
then takes the PyTorch path of :mod:`revgnn.distributed.sar`.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from revgnn.nn import dispatch, ops
from revgnn.nn.edge_features import LinearEdgeFeatures

from .sar import SARGraph

__all__ = ["gen_edge_term", "sar_gen_max", "SARGENMax"]


class _ShardCSC:
    """Per shard: the CSC pointer over the local nodes, the sources (indices
    into the fetched block) and, if the shard's edges are not already sorted by
    destination (parts from :mod:`~revgnn.distributed.partition` are), the
    sorting permutation."""

    def __init__(self, graph: SARGraph):
        n = graph.num_local
        self.shards: List[Tuple[int, int, Tensor, Tensor, Optional[Tensor]]] = []
        for q in range(graph.world_size):
            a, b = graph.shard(q)
            src, dst, perm, _ = graph.sorted_shard(q)
            ptr = torch.zeros(n + 1, dtype=torch.long, device=dst.device)
            ptr[1:] = torch.cumsum(torch.bincount(dst, minlength=n), 0)
            self.shards.append((a, b, ptr, src.long().contiguous(), perm))

    @staticmethod
    def of(graph: SARGraph) -> "_ShardCSC":
        return graph.cached("_gen_max_csc", _ShardCSC)


def _shard_attr(attr: Optional[Tensor], a: int, b: int, perm: Optional[Tensor]) -> Optional[Tensor]:
    if attr is None:
        return None
    part = attr[a:b]
    return part.index_select(0, perm) if perm is not None else part


def _winners_of(best: Tensor, a: int, b: int, nodes: Tensor, rows: Tensor) -> Tensor:
    """A shard's winners as its kernel takes them (int32 ``[N, C]``, positions among the shard's
    edges ``a:b``, -1 where it does not reach the maximum), from the merged ``best`` (positions
    among the local edges) and the shard's own ``rows`` of the ``nodes`` where it shares a maximum
    with an earlier shard."""
    mine = (best >= a) & (best < b)
    arg = torch.where(mine, best - a, -1).to(torch.int32)
    if nodes.numel():
        arg.index_copy_(0, nodes, rows)
    return arg


class SARGENMax(torch.autograd.Function):
    r"""``max_j relu(x_j + e_ji) + eps`` over all shards of ``graph``; see the
    module docstring. ``attr`` is None, dense ``[E, C]``, or the raw ``[E, d]``
    features when ``weight`` ``[C, d]`` (and optionally ``bias`` ``[C]``) is
    given, in the graph's local edge order. ``keep``: a backward will follow
    (keep the winners)."""

    @staticmethod
    def forward(
        ctx,
        graph: SARGraph,
        eps: float,
        keep: bool,
        x: Tensor,
        attr: Optional[Tensor],
        weight: Optional[Tensor],
        bias: Optional[Tensor],
    ) -> Tensor:  # type: ignore[override]
        csc = _ShardCSC.of(graph)
        x = x.contiguous()
        attr = attr.contiguous() if attr is not None else None
        weight_c = weight.contiguous() if weight is not None else None
        bias_c = bias.contiguous() if bias is not None else None
        m = n = best = None
        # the winners of all shards (positions among the local edges; int64 past int32's range)
        pos = torch.int32 if graph.num_edges < 2**31 else torch.int64
        # per shard: tie flags, tied nodes, their counts, nodes sharing a maximum with an
        # earlier shard and the shard's own winners there
        winners: List[List[Tensor]] = []
        for q, block in graph.ring(x, "SAR GENConv max forward"):
            a, b, ptr, src, perm = csc.shards[q]
            mq, arg, tied, nq = ops.gen_max_shard(
                block.contiguous(), ptr, src, _shard_attr(attr, a, b, perm), weight_c, bias_c
            )
            del block
            shared = arg.new_zeros(0, dtype=torch.long)
            if m is None:
                m, n = mq, nq
                if keep:
                    best = torch.where(arg >= 0, arg.to(pos) + a, -1)
            else:
                gt, eq = mq > m, mq == m
                if keep:  # a winner stays one only where its shard reaches the maximum
                    lost = gt | mq.isnan()
                    if bool(lost.any()):
                        best.masked_fill_(lost, -1)
                        for w in winners:
                            w[4].masked_fill_(lost.index_select(0, w[3]), -1)
                    arg.masked_fill_(~(gt | eq), -1)
                    won = arg >= 0
                    both = won & (best >= 0)  # an earlier shard's winner stays in best
                    shared = both.any(1).nonzero().view(-1)
                    best = torch.where(won & ~both, arg.to(pos) + a, best)
                    del won, both, lost
                n = torch.where(gt, nq, torch.where(eq, n + nq, n))
                m = torch.maximum(m, mq)  # NaN sticks
            if keep:
                nodes = tied.nonzero().view(-1)
                winners.append([tied, nodes, nq.index_select(0, nodes), shared, arg.index_select(0, shared)])
            del mq, nq, arg, tied
        out = (m + eps).masked_fill_((graph.in_degree == 0).view(-1, 1), 0.0)
        ctx.graph = graph
        if keep:
            # only nodes with a tied maximum (rare) need their counts: elsewhere every
            # maximum has one winner, whose share is g itself
            multi = (n > 1).any(1).nonzero().view(-1)
            ctx.save_for_backward(
                x, attr, weight, bias, multi, n.index_select(0, multi), best, *[t for w in winners for t in w]
            )
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        graph: SARGraph = ctx.graph
        x, attr, weight, bias, multi, n_multi, best, *flat = ctx.saved_tensors
        winners = [flat[i : i + 5] for i in range(0, len(flat), 5)]
        need_x, need_attr, need_w, need_b = ctx.needs_input_grad[3:7]
        need_attr = need_attr and attr is not None
        need_w = need_w and weight is not None
        need_b = need_b and bias is not None
        csc = _ShardCSC.of(graph)
        weight_c = weight.contiguous() if weight is not None else None
        bias_c = bias.contiguous() if bias is not None else None
        grad_out = grad_out.contiguous()
        # each edge reaching a positive maximum gets g / n (the kernel ignores the rest)
        share = grad_out
        if multi.numel():
            share = grad_out.clone()
            share.index_copy_(0, multi, grad_out.index_select(0, multi) / n_multi.clamp_min(1.0))
        grad_x = torch.zeros_like(x)
        grad_attr = torch.zeros_like(attr) if need_attr else None
        grad_w = torch.zeros_like(weight) if need_w else None
        grad_b = torch.zeros_like(bias) if need_b else None
        tag = graph.next_tag()
        what = "SAR GENConv max backward"
        # the rows are re-fetched for the nodes with tied maxima (the kernel recomputes
        # their messages); the ring also carries the gradients home
        for step, (q, block) in enumerate(graph.ring(x, f"{what} re-fetch")):
            a, b, ptr, src, perm = csc.shards[q]
            tied, nodes, counts, shared, rows = winners[step]  # forward's ring order
            arg = _winners_of(best, a, b, shared, rows)
            block = block.contiguous()
            attr_q = _shard_attr(attr, a, b, perm)
            g = share
            if nodes.numel():
                # tied nodes: the kernel splits g evenly over the shard's own ties, so it
                # gets g n^q / n where the shard reaches the maximum, else 0
                g = share.clone()
                reach = (arg.index_select(0, nodes) >= 0).to(share.dtype)
                g.index_copy_(0, nodes, share.index_select(0, nodes) * counts * reach)
            # the fetched rows' gradient is always formed: the owner waits for it
            grad_block, ga, gw, gb = ops.gen_max_shard_backward(
                g, arg, tied, block, ptr, src, attr_q, weight_c, bias_c, need_attr, need_w, need_b
            )
            del g
            if need_attr:
                if perm is None:
                    grad_attr[a:b] += ga
                else:
                    grad_attr[a:b].index_add_(0, perm, ga)
            if need_w:
                grad_w += gw
            if need_b:
                grad_b += gb
            if q == graph.rank:
                grad_x += grad_block
            else:
                graph.return_grads(q, grad_block, grad_x, tag, what)
            del block, grad_block, ga, gw, gb, arg
        return (None, None, None, grad_x if need_x else None, grad_attr, grad_w, grad_b)


def gen_edge_term(
    edge_attr, lin_edge: Optional[torch.nn.Module]
) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    r"""GENConv's edge term as the shard kernels take it, ``(attr, weight, bias)``: the raw features
    and the map :math:`\mathbf{W}, \mathbf{b}` of a
    :class:`~revgnn.nn.edge_features.LinearEdgeFeatures` (with GENConv's own edge encoder
    ``lin_edge``, if any, composed into it), a tensor with ``lin_edge``'s weight and bias, or a dense
    ``[E, C]`` tensor (or :obj:`None`) with no map."""
    if isinstance(edge_attr, LinearEdgeFeatures):
        term = edge_attr.compose(lin_edge) if lin_edge is not None else edge_attr
        return term.raw, term.weight, term.bias
    if edge_attr is not None and lin_edge is not None:
        return edge_attr, lin_edge.weight, lin_edge.bias
    return edge_attr, None, None


def sar_gen_max(
    graph: SARGraph, x: Tensor, edge_attr=None, lin_edge: Optional[torch.nn.Module] = None, eps: float = 1e-7
) -> Optional[Tensor]:
    r"""GENConv's max aggregation of ``x`` (the local source-side features)
    over ``graph`` through the kernel, or :obj:`None` where the kernel does not
    apply (the caller then takes the PyTorch path).

    ``edge_attr`` is None, a tensor in the graph's local edge order, or a
    :class:`~revgnn.nn.edge_features.LinearEdgeFeatures` on the local raw
    features; ``lin_edge`` (GENConv's own edge encoder, if any) is composed into
    the factored map, or makes one from a tensor, so the encoded
    :math:`E \times C` features are never formed.
    """
    attr, weight, bias = gen_edge_term(edge_attr, lin_edge)
    if attr is not None and attr.dim() == 1:
        return None
    channels = x.size(-1) if x.dim() == 2 else -1
    if weight is not None and weight.size(0) != channels:
        return None
    if weight is None and attr is not None and attr.size(-1) != channels:
        return None
    if x.dim() != 2 or dispatch.select("gen_max", x, attr, weight, bias, num_edges=graph.num_edges) is None:
        return None
    keep = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, attr, weight, bias))
    return SARGENMax.apply(graph, float(eps), keep, x, attr, weight, bias)
