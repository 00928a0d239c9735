r"""GAT's attention under SAR through the fused operator, shard by shard.

On one process ``torch.ops.revgnn.gat_attention`` (:func:`revgnn.nn.gat.gat_conv`) computes per
destination :math:`i` and head :math:`h`

.. math::
    s_{ijh} = \mathrm{LeakyReLU}(a^{src}_{jh} + a^{dst}_{ih} + \mathbf{a}_{ij} \cdot \mathbf{v}_h),
    \qquad \mathbf{o}_{ih} = \sum_{j \in \mathcal{N}(i) \cup \{i\}}
    \frac{e^{s_{ijh} - M_{ih}}}{D_{ih}} \mathbf{x}'_{jh}

(PyG's self loops: the graph's own left out, one per node whose edge term is ``loop``) as an online
softmax that keeps only :math:`\mathbf{o}, M, D` and recomputes every per-edge quantity in backward,
never forming an :math:`E \times` heads :math:`\times C` tensor (C++ on CPU, Triton on CUDA, chunked
PyTorch otherwise: :func:`revgnn.nn.dispatch.select`). Here the same operator runs once per shard
:math:`q` of a :class:`~revgnn.distributed.sar.SARGraph` (SAR's fused attention, Mostafa 2021):

* the **own shard** is the operator's own case: local sources, the self loops added there;
* a **remote shard** is handed over as a graph of :math:`n + R_q` nodes, the :math:`n` local
  destinations first and the :math:`R_q` fetched rows (:math:`[\mathbf{x}' \,\|\, a^{src}]`, one
  transfer) after them, so no source equals its destination. The operator's self loops get the edge
  term :math:`L = -\max(\mathrm{dtype}) / 4`: their logit :math:`\mathrm{LeakyReLU}(L + \cdot)` is so
  far below any real one that their weight :math:`e^{s - M}` is exactly 0 wherever the node has an
  edge in the shard (which needs a positive negative slope), and a node without one gets
  :math:`\mathbf{o} = 0` (its loop's value is a zero row) with a maximum that no merge can pick.

Shards merge as in :mod:`~revgnn.distributed.gen_aggr_sar`: the numerator of shard :math:`q` is
:math:`\mathbf{o}^q D^q`, and :math:`M = \max_q M^q`, :math:`D = \sum_q D^q e^{M^q - M}`,
:math:`\mathbf{o} = \sum_q \mathbf{o}^q D^q e^{M^q - M} / D`. Backward runs the ring again,
re-fetching each block, and hands the operator's backward the merged :math:`\mathbf{o}, M, D`, so the
coefficients it recomputes per edge are the global softmax's and its
:math:`\partial L / \partial s_{ijh} = \alpha_{ijh}(\langle \mathbf{g}_{ih}, \mathbf{x}'_{jh}\rangle
- \langle \mathbf{g}_{ih}, \mathbf{o}_{ih}\rangle)` are the one-process gradient's; the fetched rows'
gradient goes home with :meth:`~revgnn.distributed.sar.SARGraph.return_grads`. Saved: the local
inputs, the caller's edge features and the merged :math:`\mathbf{o}, M, D` (:math:`O(N H C)`).

Attention dropout (rate :math:`p`, one ``seed`` per call) is the one-process operator's: its mask
is a counter-based hash of (seed, id, head) (:func:`revgnn.nn.ops.attention_keep`), and each shard
hands the operator its edges' ids in the whole graph, ``edge_key`` (:attr:`SARGraph.edge_ids`, the
edges' columns in the partitioned ``edge_index``: :math:`E/P` int64s the part holds already, passed
as views where the shard is stored in destination order), and the own shard the self loops' ids
:math:`E + \text{node id}` (``loop_key``, :math:`N/P` int64s). On a destination-sorted graph, whose
columns are the positions in destination order, the workers together draw exactly the mask of
:func:`revgnn.nn.gat.gat_conv` in one process; forward and backward (and a reversible block's
recompute, which replays the seed) draw it again from the seed, nothing stored. A remote shard's
self loops have weight 0, so their ids do not matter (the defaults).
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from revgnn.nn import ops

from .aggregate_sar import ShardSegments, add_shard_rows, shard_rows
from .sar import SARGraph

__all__ = ["sar_gat_attention", "SARGATAttention", "shard_form_applies"]

_NO_SEED = torch.zeros((), dtype=torch.int64)


class _Layout(NamedTuple):
    """One shard as the operator sees it: ``size`` nodes, destination pointer ``ptr``, sources
    ``src`` and the source order (``rowptr``, ``col``, ``perm``); for a remote shard the fetched rows
    are nodes ``n .. n + rows - 1``."""

    size: int
    ptr: Tensor
    src: Tensor
    rowptr: Tensor
    col: Tensor
    perm: Tensor


class _GatShards:
    """Per shard its :class:`_Layout`, cached on the graph (valid while ``graph.src`` is the tensor
    it was built from), and, once attention dropout asks for them, the dropout ids
    (:meth:`dropout_ids`)."""

    def __init__(self, graph: SARGraph):
        segs = ShardSegments.of(graph)
        n = graph.num_local
        self._ids: Optional[Tuple[List[Tensor], Tensor]] = None
        self.layouts: List[_Layout] = []
        for q, s in enumerate(segs.shards):
            if q == graph.rank:  # square already: rows = n
                self.layouts.append(_Layout(n, s.ptr, s.src, s.sptr, s.sdst, s.sperm))
                continue
            e = s.src.numel()
            size = n + s.rows
            ptr = torch.cat([s.ptr[: n + 1], s.ptr.new_full((s.rows,), e)])
            rowptr = torch.cat([s.sptr.new_zeros(n), s.sptr[: s.rows + 1]])
            self.layouts.append(_Layout(size, ptr, (s.src + n).contiguous(), rowptr, s.sdst, s.sperm))

    @staticmethod
    def of(graph: SARGraph) -> "_GatShards":
        return graph.cached("_gat_shards", _GatShards)

    def dropout_ids(self, graph: SARGraph) -> Tuple[List[Tensor], Tensor]:
        """``(edge_key per shard, loop_key)``: each shard's edges' ids in the whole graph in the
        shard's destination order (views of :attr:`SARGraph.edge_ids` where it is stored in that
        order), and the own shard's self loops' ids :math:`E + \text{node id}` (``[n]``); built once."""
        if self._ids is None:
            if graph.edge_ids is None:
                raise ValueError(
                    "SAR GATConv attention dropout needs the part's edge_ids (the edges' global ids)"
                )
            dev = graph.dst.device
            segs = ShardSegments.of(graph)
            edge_key = [shard_rows(graph.edge_ids.to(dev), s) for s in segs.shards]
            loop_key = (graph.global_num_edges + graph.node_ids.to(dev)).contiguous()
            self._ids = (edge_key, loop_key)
        return self._ids


def _masked_loop(like: Tensor) -> float:
    """The self loop term that gives a remote shard's loops weight 0 (the module docstring)."""
    return -torch.finfo(like.dtype).max / 4


def _remote_inputs(n, block, a_dst, heads, channels, rows):
    """The operator's node inputs for a remote shard: the fetched rows after ``n`` zero rows."""
    size = n + rows
    xp = block.new_zeros(size, heads, channels)
    xp[n:] = block[:, : heads * channels].view(rows, heads, channels)
    a_src = block.new_zeros(size, heads)
    a_src[n:] = block[:, heads * channels :]
    a_dst_pad = a_dst.new_zeros(size, heads)
    a_dst_pad[:n] = a_dst
    loop = a_dst.new_full((size, heads), _masked_loop(a_dst))
    return xp, a_src, a_dst_pad, loop


def _merge(state, out_q: Tensor, top_q: Tensor, den_q: Tensor):
    """Folds one shard's ``(o^q, M^q, D^q)`` (``[n, H, C]``, ``[n, H]``, ``[n, H]``) into the running
    ``(numerator, M, D)`` (:obj:`None` at first: the own shard, whose maxima are finite)."""
    num_q = out_q * den_q.unsqueeze(-1)
    if state is None:
        return num_q, top_q, den_q
    num, top, den = state
    hi = torch.maximum(top, top_q)
    r, r_q = torch.exp(top - hi), torch.exp(top_q - hi)
    return num * r.unsqueeze(-1) + num_q * r_q.unsqueeze(-1), hi, den * r + den_q * r_q


def _pad(t: Tensor, size: int, fill: float, front: bool = False) -> Tensor:
    """``t`` with rows of ``fill`` added up to ``size`` rows, after it (or before it if ``front``)."""
    if t.size(0) == size:
        return t.contiguous()
    out = t.new_full((size,) + t.shape[1:], fill)
    if front:
        out[size - t.size(0) :] = t
    else:
        out[: t.size(0)] = t
    return out


class SARGATAttention(torch.autograd.Function):
    r"""GAT's attention over all shards of ``graph``; see the module docstring. ``xs`` ``[n, H, C]``
    the projected local features, ``a_src``, ``a_dst``, ``loop`` ``[n, H]``, the edge term absent or
    ``attr`` ``[E, d]`` (the graph's local edge order) with ``edge_w`` ``[H, d]`` and ``edge_b``
    ``[H]`` (optional); all of one dtype. ``p`` the attention dropout, ``seed`` its 0-d int64 seed."""

    @staticmethod
    def forward(ctx, graph, slope, p, seed, xs, a_src, a_dst, loop, attr, edge_w, edge_b):  # type: ignore[override]
        segs, shards = ShardSegments.of(graph), _GatShards.of(graph)
        keys = _shard_keys(graph, shards, p)
        n, heads, channels = xs.shape
        xs, a_src, a_dst, loop = (t.contiguous() for t in (xs, a_src, a_dst, loop))
        w_c, b_c = (t.contiguous() if t is not None else None for t in (edge_w, edge_b))
        send = torch.cat([xs.reshape(n, heads * channels), a_src], dim=1)
        state = None
        for q, block in graph.ring(send, "SAR GATConv attention forward"):
            lay = shards.layouts[q]
            if q == graph.rank:
                inputs = (xs, a_src, a_dst, loop)
            else:
                inputs = _remote_inputs(n, block, a_dst, heads, channels, segs.shards[q].rows)
            del block
            out_q, top_q, den_q = ops.gat_attention(
                *inputs, lay.ptr, lay.src, shard_rows(attr, segs.shards[q]), w_c, b_c, slope, p, seed,
                lay.rowptr, lay.col, lay.perm, *keys(q),
            )  # fmt: skip
            del inputs
            state = _merge(state, out_q[:n], top_q[:n], den_q[:n])
            del out_q, top_q, den_q
        num, top, den = state
        out = num / den.unsqueeze(-1)
        ctx.graph, ctx.slope, ctx.p = graph, slope, p
        ctx.save_for_backward(xs, a_src, a_dst, loop, attr, edge_w, edge_b, out, top, den, seed)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        graph: SARGraph = ctx.graph
        xs, a_src, a_dst, loop, attr, edge_w, edge_b, out, top, den, seed = ctx.saved_tensors
        need = ctx.needs_input_grad
        need_attr = need[8] and attr is not None
        segs, shards = ShardSegments.of(graph), _GatShards.of(graph)
        keys = _shard_keys(graph, shards, ctx.p)
        n, heads, channels = xs.shape
        w_c, b_c = (t.contiguous() if t is not None else None for t in (edge_w, edge_b))
        g = grad_out.contiguous()
        hc = heads * channels
        g_send = xs.new_zeros(n, hc + heads)  # the sent rows' gradient: [x' | a_src], as sent
        g_dst, g_loop = torch.zeros_like(a_dst), torch.zeros_like(loop)
        g_attr = torch.zeros_like(attr) if need_attr else None
        g_w = torch.zeros_like(edge_w) if attr is not None else None
        g_b = torch.zeros_like(edge_b) if attr is not None and edge_b is not None else None
        tag = graph.next_tag()
        what = "SAR GATConv attention backward"
        send = torch.cat([xs.reshape(n, heads * channels), a_src], dim=1)
        for q, block in graph.ring(send, f"{what} re-fetch"):
            lay, s = shards.layouts[q], segs.shards[q]
            own = q == graph.rank
            if own:
                inputs = (xs, a_src, a_dst, loop)
            else:
                inputs = _remote_inputs(n, block, a_dst, heads, channels, s.rows)
            del block
            # the merged values: every recomputed coefficient is the global softmax's (padded rows:
            # no gradient reaches them, and their loops' weight is 0 with M = 0, D = 1)
            grads = ops.gat_attention_backward(
                _pad(g, lay.size, 0.0), _pad(out, lay.size, 0.0), _pad(top, lay.size, 0.0),
                _pad(den, lay.size, 1.0), *inputs, lay.ptr, lay.src, shard_rows(attr, s), w_c, b_c,
                ctx.slope, ctx.p, seed, lay.rowptr, lay.col, lay.perm, need_attr, *keys(q),
            )  # fmt: skip
            gxp, gs, gd, gl, ga, gw, gb = grads
            del inputs, grads
            g_dst += gd[:n]
            if need_attr:
                add_shard_rows(g_attr, ga, s)
            if g_w is not None:
                g_w += gw
            if g_b is not None:
                g_b += gb
            if own:
                g_send[:, :hc] += gxp.reshape(n, hc)
                g_send[:, hc:] += gs
                g_loop += gl
            else:  # the fetched rows' gradient, in the block's layout, goes home
                grad_block = torch.cat([gxp[n:].reshape(s.rows, hc), gs[n:]], dim=1)
                graph.return_grads(q, grad_block, g_send, tag, what)
                del grad_block
            del gxp, gs, gd, gl, ga, gw, gb
        g_xs = g_send[:, :hc].reshape(n, heads, channels)
        return None, None, None, None, g_xs, g_send[:, hc:].contiguous(), g_dst, g_loop, g_attr, g_w, g_b


def _shard_keys(graph: SARGraph, shards: _GatShards, p: float):
    """``keys(q)``: the operator's ``(edge_key, loop_key)`` for shard ``q`` (none without dropout;
    a remote shard's self loops, of weight 0, keep their default ids)."""
    if p == 0.0:
        return lambda q: (None, None)
    edge_key, loop_key = shards.dropout_ids(graph)
    return lambda q: (edge_key[q], loop_key if q == graph.rank else None)


def shard_form_applies(negative_slope: float, dtype: torch.dtype) -> bool:
    """Whether a remote shard's self loops get weight exactly 0 (the module docstring): a positive
    negative slope that keeps :math:`\\mathrm{LeakyReLU}(L)` below any real logit by far."""
    return negative_slope > 0 and negative_slope * torch.finfo(dtype).max / 4 > 1e30


def sar_gat_attention(
    graph: SARGraph,
    xs: Tensor,
    a_src: Tensor,
    a_dst: Tensor,
    loop: Tensor,
    attr: Optional[Tensor] = None,
    edge_w: Optional[Tensor] = None,
    edge_b: Optional[Tensor] = None,
    negative_slope: float = 0.2,
    dropout: float = 0.0,
    seed: Optional[Tensor] = None,
) -> Tensor:
    r"""GAT's attention over ``graph`` through ``torch.ops.revgnn.gat_attention``, shard by shard.

    Args:
        graph (SARGraph): this worker's share of the graph (without added self loops: the operator
            adds them, leaving the graph's own out).
        xs (torch.Tensor): ``[num_local, H, C]`` projected features (the values); peers fetch rows.
        a_src, a_dst (torch.Tensor): ``[num_local, H]`` the source and destination logit terms.
        loop (torch.Tensor): ``[num_local, H]`` each node's self loop edge term (0 without edge
            features; :func:`revgnn.nn.gat.self_loop_term`).
        attr (torch.Tensor, optional): ``[E, d]`` the local edges' raw features in the graph's edge
            order, with ``edge_w`` ``[H, d]`` and optionally ``edge_b`` ``[H]``: the edge logit term
            :math:`\mathbf{a}_{ij} \cdot \mathbf{w}_h + b_h`. (default: :obj:`None`)
        negative_slope (float, optional): LeakyReLU's slope; positive
            (:func:`shard_form_applies`). (default: :obj:`0.2`)
        dropout (float, optional): the attention dropout :math:`p \in [0, 1)`, its mask the
            one-process operator's (the module docstring). (default: :obj:`0.0`)
        seed (torch.Tensor, optional): the dropout's 0-d int64 seed, needed where ``dropout > 0``
            (:func:`revgnn.nn.gat.draw_seed`; every worker draws the same one where their
            generators agree). (default: :obj:`None`)

    Returns:
        torch.Tensor: ``[num_local, H, C]``.
    """
    n = graph.num_local
    if xs.dim() != 3 or xs.size(0) != n:
        raise ValueError(f"sar_gat_attention: xs must be [{n}, H, C], got {list(xs.shape)}")
    heads = xs.size(1)
    for name, t in (("a_src", a_src), ("a_dst", a_dst), ("loop", loop)):
        if tuple(t.shape) != (n, heads):
            raise ValueError(f"sar_gat_attention: {name} must be [{n}, {heads}], got {list(t.shape)}")
    if attr is not None and (attr.dim() != 2 or attr.size(0) != graph.num_edges or edge_w is None):
        raise ValueError(
            f"sar_gat_attention: edge features must be [{graph.num_edges}, d] (the local edges in shard "
            "order), with their map edge_w"
        )
    if not shard_form_applies(negative_slope, xs.dtype):
        raise ValueError(f"sar_gat_attention: negative_slope must be positive, got {negative_slope}")
    ops.dropout_threshold(dropout)  # refuses a rate outside [0, 1)
    if dropout > 0 and (seed is None or seed.dim() != 0 or seed.dtype != torch.int64):
        raise ValueError(
            "sar_gat_attention: attention dropout needs a 0-d int64 seed (revgnn.nn.gat.draw_seed)"
        )
    dtype = xs.dtype
    # one dtype throughout, cast differentiably outside the Function (as gat_conv does)
    a_src, a_dst, loop, attr, edge_w, edge_b = (
        t.to(dtype) if t is not None else None for t in (a_src, a_dst, loop, attr, edge_w, edge_b)
    )
    if attr is None:
        edge_w = edge_b = None
    seed = seed if dropout > 0 else _NO_SEED
    return SARGATAttention.apply(
        graph, float(negative_slope), float(dropout), seed, xs, a_src, a_dst, loop, attr, edge_w, edge_b
    )
