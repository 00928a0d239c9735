r"""GAT's attention without an :math:`E \times C` tensor.

PyG's ``GATConv`` forms its messages :math:`\alpha_{ijh}\mathbf{x}'_{jh}` (and, with edge features,
the projected features :math:`\mathbf{W}_e\mathbf{e}_{ij}`) as :math:`E \times C` tensors, forward
and in a reversible block's recompute. :func:`gat_conv` computes the same function,

.. math::
    s_{ijh} &= \mathrm{LeakyReLU}\big(\langle \mathbf{x}'_{jh}, \mathbf{a}^{src}_h \rangle +
    \langle \mathbf{x}'_{ih}, \mathbf{a}^{dst}_h \rangle +
    \langle (\mathbf{W}_e \mathbf{e}_{ij})_h, \mathbf{a}^{edge}_h \rangle, 0.2\big), \\
    \mathbf{x}''_i &= \big\Vert_{h} \sum_{j \in \mathcal{N}(i) \cup \{i\}}
    \mathrm{dropout}\big(\mathrm{softmax}_j(s_{ijh})\big)\, \mathbf{x}'_{jh} + \mathbf{b}

with :math:`\mathbf{x}' = \mathbf{W}\mathbf{x}` viewed ``[N, H, C']``, through one operator,
``torch.ops.revgnn.gat_attention`` (:mod:`revgnn.nn.ops`): it keeps per destination and head the
maximum logit and the softmax denominator (``[N, H]``) and the output, and recomputes every per-edge
quantity in backward. Since :math:`\mathbf{W}_e` has no bias, the edge term is the raw features
times one vector per head, :math:`\mathbf{e}_{ij} \cdot \mathbf{v}_h` with :math:`\mathbf{v}_h =
\mathbf{W}_{e,h}^\top \mathbf{a}^{edge}_h` (``[H, d]``), and edge features in factored form
(:class:`~revgnn.nn.edge_features.LinearEdgeFeatures`, :math:`\mathbf{e} = \mathbf{W}_0\mathbf{u} +
\mathbf{b}_0`) compose into it: no edge feature is ever projected to :math:`C` channels. Self loops
are PyG's: the graph's own are left out, and every node gets one whose edge feature is the mean of
its other in-edges' (0 without any), whose term is that mean's, computed per node. Attention dropout
draws its mask from a counter-based hash of (seed, edge, head), the seed from torch's default
generator once per call, so :class:`~revgnn.nn.GroupAddRev`'s RNG replay recomputes the same mask
without storing it.
"""

from __future__ import annotations

from typing import Union

import torch
from torch import Tensor

from revgnn.nn import ops
from revgnn.nn.edge_features import LinearEdgeFeatures
from revgnn.nn.graph_input import SortedEdges, backward_source_order, csc, pyg_edge_index, sort_edges
from revgnn.utils.functional import transforms_active

__all__ = ["draw_seed", "edge_logit_term", "gat_conv", "fused_applies", "self_loop_term"]

EdgeFeatures = Union[Tensor, LinearEdgeFeatures, None]


def draw_seed() -> Tensor:
    """The attention-dropout seed of one call: a 0-d int64 tensor from torch's default CPU
    generator (what :class:`~revgnn.nn.GroupAddRev` replays)."""
    return torch.randint(2**31 - 1, (), dtype=torch.int64)


def fused_applies(conv, x, edge_index) -> bool:
    """Whether :func:`gat_conv` runs ``conv`` through the fused operator: one shared projection
    (``lin``), concatenated heads, PyG's self loops, no residual, a tensor graph and node features,
    and no :mod:`torch.func` transform (which cannot see into the operator: PyG's conv runs there)."""
    return (
        conv.lin is not None
        and conv.concat
        and conv.add_self_loops
        and conv.fill_value == "mean"
        and conv.res is None
        and isinstance(x, Tensor)
        and isinstance(edge_index, (Tensor, SortedEdges))
        and not transforms_active()
    )


def edge_logit_term(conv, edge_attr: EdgeFeatures, heads: int, out: int):
    """(raw features ``[E, d]``, ``[H, d]`` map, ``[H]`` bias or None) of the edge logit term, or
    Nones where it is absent (PyG: no ``lin_edge`` or no features)."""
    if conv.lin_edge is None or edge_attr is None:
        return None, None, None
    # v_h = W_{e,h}^T a_h: the edge term <(W_e e)_h, a_h> = e . v_h, as W_e has no bias
    v = (conv.lin_edge.weight.view(heads, out, -1) * conv.att_edge.view(heads, out, 1)).sum(1)
    if isinstance(edge_attr, LinearEdgeFeatures):
        bias = v @ edge_attr.bias if edge_attr.bias is not None else None
        return edge_attr.raw, v @ edge_attr.weight, bias
    return (edge_attr.view(-1, 1) if edge_attr.dim() == 1 else edge_attr), v, None


def self_loop_term(dst: Tensor, is_loop: Tensor, attr: Tensor, weight: Tensor, bias, n: int) -> Tensor:
    """``[N, H]``: each node's self loop edge term, from the mean raw features of its in-edges other
    than self loops (``is_loop`` per edge; PyG's ``fill_value='mean'``; a node without such edges gets
    the feature 0)."""
    # self loops are summed into a row n that is dropped: autograd saves the index only (E int64s)
    index = torch.where(is_loop, n, dst)
    count = attr.new_zeros(n + 1).index_add_(0, index, attr.new_ones(()).expand(index.numel()))[:n]
    mean = attr.new_zeros(n + 1, attr.size(1)).index_add_(0, index, attr)[:n] / count.clamp_min(1).view(-1, 1)
    term = torch.nn.functional.linear(mean, weight, bias)
    return term * (count > 0).to(term.dtype).view(-1, 1)


def gat_conv(conv, x: Tensor, edge_index, edge_attr: EdgeFeatures = None) -> Tensor:
    r"""``conv(x, edge_index, edge_attr)`` for a PyG ``GATConv``, through the fused attention operator
    where :func:`fused_applies` (else the conv itself, with factored edge features expanded unless the
    conv takes them as they are: ``takes_factored_edges``, the SAR GATConv).

    Args:
        conv (torch_geometric.nn.GATConv): The conv, whose parameters are used.
        x (torch.Tensor): Node features ``[N, F]``.
        edge_index (torch.Tensor or torch_geometric.EdgeIndex or SortedEdges): The graph (any form
            of :mod:`revgnn.nn.graph_input`); a destination-sorted ``EdgeIndex`` avoids a sort.
        edge_attr (torch.Tensor or LinearEdgeFeatures, optional): Edge features ``[E, edge_dim]`` in
            the order of ``edge_index``, or the same in factored form, which is never expanded.
            (default: :obj:`None`)
    """
    if not fused_applies(conv, x, edge_index):
        if isinstance(edge_attr, LinearEdgeFeatures) and not getattr(conv, "takes_factored_edges", False):
            edge_attr = edge_attr.materialize()
        if conv.lin_edge is None:
            edge_attr = None
        return conv(x, pyg_edge_index(edge_index), edge_attr=edge_attr)
    n, heads, out = x.size(0), conv.heads, conv.out_channels
    xp = conv.lin(x).view(n, heads, out)
    a_src = (xp * conv.att_src).sum(-1)
    a_dst = (xp * conv.att_dst).sum(-1)
    raw, weight, bias = edge_logit_term(conv, edge_attr, heads, out)
    graph, raw = sort_edges(edge_index, raw, n)
    src, dst, ptr, raw = csc(graph, raw, n)
    rowptr, col, perm = backward_source_order(graph, n)
    src, ptr = src.long().contiguous(), ptr.long().contiguous()
    if raw is not None:
        raw, weight = raw.to(xp.dtype).contiguous(), weight.to(xp.dtype).contiguous()
        bias = bias.to(xp.dtype).contiguous() if bias is not None else None
        dst = dst.long()
        loop = self_loop_term(dst, src == dst, raw, weight, bias, n)
    else:
        loop = a_src.new_zeros(n, heads)
    p = conv.dropout if conv.training else 0.0
    seed = draw_seed() if p > 0 else torch.zeros((), dtype=torch.int64)
    # one dtype throughout (autocast leaves the projection in bfloat16 and the attention terms,
    # products with float32 parameters, in float32): cast to xp's, differentiably, as gen_max does
    a_src, a_dst, loop = (t.to(xp.dtype).contiguous() for t in (a_src, a_dst, loop))
    h, _, _ = ops.gat_attention(
        xp.contiguous(), a_src, a_dst, loop, ptr, src,
        raw, weight, bias, conv.negative_slope, p, seed, rowptr, col, perm,
    )  # fmt: skip
    h = h.reshape(n, heads * out)
    return h + conv.bias if conv.bias is not None else h
