r"""SAGE, GIN and GCN aggregations under SAR through the fused operators, shard by shard.

On one process ``torch.ops.revgnn.aggregate`` computes
:math:`\mathbf{h}_i = s_i \sum_{j \in \mathcal{N}(i)} w_{ji} \mathbf{x}_j` and
``torch.ops.revgnn.segment_max`` :math:`\mathbf{h}_{i,c} = \max_{j \in \mathcal{N}(i)} \mathbf{x}_{j,c}`
over the destination-sorted edges without an :math:`E \times C` tensor (C++ on CPU, Triton on CUDA
or under ``REVGNN_KERNELS=triton``, chunked PyTorch otherwise: :func:`revgnn.nn.dispatch.select`).
Here the same operators run once per shard :math:`q` of a :class:`~revgnn.distributed.sar.SARGraph`:
their sources are the :math:`R_q` rows fetched from worker :math:`q` (the "block"), their destinations
the :math:`n` local nodes. The operators take square graphs (as many source rows as destinations), so
a shard is handed over on :math:`\max(R_q, n)` nodes: the pointer is extended with empty segments and
the block (or the gradient) padded with zero rows where it is the shorter one, :math:`O(N C)` per
shard, never :math:`O(E_q C)`.

* **sum / mean / weighted sum** (SAGE, GIN, GCN with :func:`~revgnn.distributed.convs.gcn_edge_weight`):
  :math:`\mathbf{h}_i = s_i \sum_q \sum_{j \in \mathcal{N}_q(i)} w_{ji} \mathbf{x}_j` with
  :math:`s_i = 1 / \max(d_i, 1)` for mean, :math:`d_i` the *global* in-degree (all shards), 1
  otherwise. The weights are constants of the graph. Backward is the transposed aggregation of
  :math:`s_i \mathbf{g}_i` per shard over the shard's source-sorted edges (no re-fetch of the
  block: design §6's fast path); nothing is saved.
* **max** (SAGE max): per shard :math:`(m^q_{ic}, n^q_{ic})` (maximum over the shard's edges,
  :math:`-\infty` without any, and the number of edges reaching it), merged as
  :math:`(m, n) \oplus (m', n') = (m, n)` if :math:`m > m'`, :math:`(m', n')` if :math:`m' > m`,
  :math:`(m, n + n')` if equal; 0 for nodes without in-edges. This is the one-process operator's
  maximum and tie count, so backward gives every edge reaching the maximum
  :math:`g_{ic} / (n_{ic} + [h_{ic} = 0])` exactly as it does (PyG's semantics,
  ``revgnn.nn.ops._tie_divisor``): the ring re-fetches each block and runs
  ``torch.ops.revgnn.segment_max_backward`` on the shard with the merged maximum and counts.
  Saved: the local input, the maximum and the counts (:math:`O(N C)`).

Per shard the destination pointer, the sources and the sorting permutation (if the part's edges are
not sorted by destination) are computed once and cached with the graph, the source order (pointer,
destinations, permutation: :math:`E_q` int64s each, no channels) on first use, as are the weights in
shard order per dtype.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from revgnn.nn import ops

from .sar import SARGraph

__all__ = [
    "sar_aggregate",
    "SARAggregate",
    "SARSegmentMax",
    "Shard",
    "ShardSegments",
    "add_shard_rows",
    "pad_rows",
    "shard_rows",
]

_KINDS = ("sum", "mean", "max")


class Shard:
    """One shard's edges for the operators: the destination order at once, the source order (``sptr``,
    ``sdst``, ``sperm``: :math:`E_q` int64s each and a sort) on first use and kept, so that a
    conv whose backward does not read it (GEN sum / mean / softmax on the C++ kernel:
    :func:`revgnn.nn.dispatch.reads_source_order`) never builds it."""

    def __init__(
        self,
        a: int,
        b: int,
        rows: int,
        size: int,
        ptr: Tensor,
        src: Tensor,
        perm: Optional[Tensor],
        dst: Tensor,
    ):
        self.a, self.b = a, b  # the shard's edges are a:b of the graph's local edges
        self.rows = rows  # rows fetched from the shard's owner (the block)
        self.size = size  # max(rows, local nodes): the square graph the operators see
        self.ptr = ptr  # [size + 1] over destinations (empty beyond the local nodes)
        self.src = src  # [E_q] rows of the block, destination order
        self.perm = perm  # destination order -> the graph's edge order (None: already sorted)
        self.dst = dst  # [E_q] destinations, destination order
        self._source_order: Optional[Tuple[Tensor, Tensor, Tensor]] = None

    def source_order(self) -> Tuple[Tensor, Tensor, Tensor]:
        """``(sptr [size + 1], sdst [E_q], sperm [E_q])``: the pointer over sources, each edge's
        destination in source order and its position in destination order (a stable sort)."""
        if self._source_order is None:
            sperm = torch.sort(self.src, stable=True).indices
            sptr = torch.zeros(self.size + 1, dtype=torch.long, device=self.src.device)
            sptr[1:] = torch.cumsum(torch.bincount(self.src, minlength=self.size), 0)
            self._source_order = (sptr, self.dst[sperm].contiguous(), sperm)
        return self._source_order

    @property
    def sptr(self) -> Tensor:
        """``[size + 1]`` over sources (:meth:`source_order`)."""
        return self.source_order()[0]

    @property
    def sdst(self) -> Tensor:
        """``[E_q]`` destinations in source order (:meth:`source_order`)."""
        return self.source_order()[1]

    @property
    def sperm(self) -> Tensor:
        """``[E_q]`` each source-ordered edge's position in destination order (:meth:`source_order`)."""
        return self.source_order()[2]


class ShardSegments:
    """Per shard of a graph, its :class:`Shard`; cached on the graph (valid while ``graph.src`` is the
    tensor it was built from: :meth:`SARGraph.with_self_loops` views are graphs of their own)."""

    def __init__(self, graph: SARGraph):
        n = graph.num_local
        self.shards: List[Shard] = []
        self._weights: Dict[Tuple[torch.dtype, torch.device], Tuple[Tensor, List[Tensor]]] = {}
        for q in range(graph.world_size):
            a, b = graph.shard(q)
            src, dst, perm, rows = graph.sorted_shard(q)
            size = max(rows, n)
            ptr = torch.zeros(size + 1, dtype=torch.long, device=dst.device)
            ptr[1:] = torch.cumsum(torch.bincount(dst, minlength=size), 0)
            self.shards.append(Shard(a, b, rows, size, ptr, src.contiguous(), perm, dst.contiguous()))

    @staticmethod
    def of(graph: SARGraph) -> "ShardSegments":
        return graph.cached("_aggregate_segments", ShardSegments)

    def weights(self, weight: Optional[Tensor], dtype: torch.dtype) -> List[Optional[Tensor]]:
        """``weight`` (the graph's local edge order) per shard in destination order, in ``dtype``;
        cached (one tensor per dtype and device, so a caller passing new weights every time does not
        pile them up) while ``weight`` is the same tensor, e.g. the graph's cached GCN normalisation."""
        if weight is None:
            return [None] * len(self.shards)
        key = (dtype, weight.device)
        hit = self._weights.get(key)
        if hit is not None and hit[0] is weight:
            return hit[1]
        w = weight.detach().to(dtype)
        per_shard = [
            (w[s.a : s.b] if s.perm is None else w[s.a : s.b].index_select(0, s.perm)).contiguous()
            for s in self.shards
        ]
        self._weights[key] = (weight, per_shard)
        return per_shard


def pad_rows(t: Tensor, size: int, fill: float = 0.0) -> Tensor:
    """``t`` with rows of ``fill`` appended up to ``size`` rows (``t`` itself if it has them)."""
    if t.size(0) == size:
        return t.contiguous()
    out = t.new_full((size,) + t.shape[1:], fill)
    out[: t.size(0)] = t
    return out


def shard_rows(t: Optional[Tensor], s: Shard) -> Optional[Tensor]:
    """The rows of the per-edge tensor ``t`` (the graph's local edge order) of shard ``s``, in the
    shard's destination order (:obj:`None` for :obj:`None`)."""
    if t is None:
        return None
    part = t[s.a : s.b]
    return (part if s.perm is None else part.index_select(0, s.perm)).contiguous()


def add_shard_rows(total: Tensor, rows: Tensor, s: Shard) -> None:
    """Adds ``rows`` (shard ``s``'s edges in destination order) into ``total`` (the graph's local
    edge order): the inverse of :func:`shard_rows`."""
    if s.perm is None:
        total[s.a : s.b] += rows
    else:
        total[s.a : s.b].index_add_(0, s.perm, rows)


class SARAggregate(torch.autograd.Function):
    r""":math:`\mathbf{h}_i = s_i \sum_{j \to i} w_{ji} \mathbf{x}_j` over all shards of ``graph``
    (see the module docstring); ``weight`` constant edge weights in the graph's local edge order or
    :obj:`None`."""

    @staticmethod
    def forward(ctx, graph: SARGraph, mean: bool, weight: Optional[Tensor], x: Tensor) -> Tensor:  # type: ignore[override]
        segs = ShardSegments.of(graph)
        weights = segs.weights(weight, x.dtype)
        n = graph.num_local
        out = x.new_zeros(n, x.size(1))
        for q, block in graph.ring(x, "SAR aggregate forward"):
            s = segs.shards[q]
            part = ops.aggregate(
                pad_rows(block, s.size), s.ptr, s.src, weights[q], False, s.sptr, s.sdst, s.sperm
            )
            del block
            out += part[:n]
            del part
        if mean:  # by the global in-degree, as the one-process operator divides the full sum
            out = out.div_(graph.in_degree.clamp_min(1).to(out.dtype).view(-1, 1))
        ctx.graph, ctx.mean, ctx.weight = graph, mean, weight
        ctx.rows = x.shape
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        graph: SARGraph = ctx.graph
        segs = ShardSegments.of(graph)
        g = grad_out.contiguous()
        if ctx.mean:
            g = g / graph.in_degree.clamp_min(1).to(g.dtype).view(-1, 1)
        weights = segs.weights(ctx.weight, g.dtype)
        grad_x = g.new_zeros(ctx.rows)
        tag = graph.next_tag()
        what = "SAR aggregate backward"
        for k in range(graph.world_size):  # the ring's order, so that the gradient returns pair up
            q = (graph.rank - k) % graph.world_size
            s = segs.shards[q]
            gq = pad_rows(g, s.size)
            # the transposed aggregation reads only the gradient: gq also stands for the (unread) x
            gb, _ = ops.aggregate_backward(
                gq, gq, s.ptr, s.src, weights[q], False, s.sptr, s.sdst, s.sperm, True, False
            )
            gb = gb[: s.rows]
            if q == graph.rank:
                grad_x += gb
            else:
                graph.return_grads(q, gb.contiguous(), grad_x, tag, what)
            del gq, gb
        return None, None, None, grad_x


class SARSegmentMax(torch.autograd.Function):
    r""":math:`\mathbf{h}_{i,c} = \max_{j \to i} \mathbf{x}_{j,c}` over all shards of ``graph`` (0 for
    nodes without in-edges); see the module docstring."""

    @staticmethod
    def forward(ctx, graph: SARGraph, x: Tensor) -> Tensor:  # type: ignore[override]
        segs = ShardSegments.of(graph)
        n = graph.num_local
        m = count = None
        for q, block in graph.ring(x, "SAR max forward"):
            s = segs.shards[q]
            mq, nq = ops.segment_max(pad_rows(block, s.size), s.ptr, s.src, s.sptr, s.sdst)
            del block
            mq, nq = mq[:n], nq[:n]
            # a node without edges in this shard: 0 from the operator, no candidate here
            mq = mq.masked_fill((s.ptr[1 : n + 1] == s.ptr[:n]).view(-1, 1), float("-inf"))
            if m is None:
                m, count = mq, nq.clone()
            else:
                gt, eq = mq > m, mq == m
                count = torch.where(gt, nq, torch.where(eq, count + nq, count))
                m = torch.maximum(m, mq)  # NaN sticks
            del mq, nq
        out = m.masked_fill_((graph.in_degree == 0).view(-1, 1), 0.0)
        ctx.graph = graph
        ctx.save_for_backward(x, out, count)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        graph: SARGraph = ctx.graph
        x, out, count = ctx.saved_tensors
        segs = ShardSegments.of(graph)
        g = grad_out.contiguous()
        grad_x = torch.zeros_like(x)
        tag = graph.next_tag()
        what = "SAR max backward"
        # the block is re-fetched: which of its rows reach the maximum is read from their values
        for q, block in graph.ring(x, f"{what} re-fetch"):
            s = segs.shards[q]
            gb = ops.segment_max_backward(
                pad_rows(g, s.size),
                pad_rows(block, s.size),
                pad_rows(out, s.size),
                pad_rows(count, s.size),
                s.ptr,
                s.src,
                s.sptr,
                s.sdst,
            )[: s.rows]
            del block
            if q == graph.rank:
                grad_x += gb
            else:
                graph.return_grads(q, gb.contiguous(), grad_x, tag, what)
            del gb
        return None, grad_x


def sar_aggregate(graph: SARGraph, x: Tensor, kind: str, weight: Optional[Tensor] = None) -> Tensor:
    r"""Aggregates ``x`` ``[num_local, C]`` (the local source-side features) over ``graph`` with the
    fused operators, shard by shard.

    Args:
        graph (SARGraph): this worker's share of the graph.
        x (torch.Tensor): ``[num_local, C]`` node features; peers fetch rows of it.
        kind (str): ``"sum"``, ``"mean"`` (divided by the global in-degree, at least 1) or ``"max"``
            (0 for nodes without in-edges).
        weight (torch.Tensor, optional): constant edge weights ``[num_local_edges]`` in the graph's
            edge order (``sum`` only), e.g. :func:`~revgnn.distributed.convs.gcn_edge_weight`; cached
            per shard while the same tensor is passed. (default: :obj:`None`)

    Returns:
        torch.Tensor: ``[num_local, C]``.
    """
    if kind not in _KINDS:
        raise ValueError(f"sar_aggregate: unknown aggregation {kind!r}; use one of {_KINDS}")
    if x.dim() != 2 or not x.is_floating_point():
        raise ValueError(
            f"sar_aggregate: x must be a floating-point [N, C] tensor, got {x.dtype} {list(x.shape)}"
        )
    if x.size(0) != graph.num_local:
        raise ValueError(f"sar_aggregate: expected {graph.num_local} local rows, got {x.size(0)}")
    if weight is not None:
        if kind != "sum":
            raise ValueError("sar_aggregate: edge weights go with kind='sum'")
        if weight.requires_grad:
            raise ValueError("sar_aggregate: edge weights are constants of the graph (no gradient)")
        if tuple(weight.shape) != (graph.num_edges,):
            raise ValueError(
                f"sar_aggregate: weight must be [{graph.num_edges}] (local edges), got {list(weight.shape)}"
            )
    if kind == "max":
        return SARSegmentMax.apply(graph, x)
    return SARAggregate.apply(graph, kind == "mean", weight, x)
