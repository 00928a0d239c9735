r"""SAGEConv, GINConv and GCNConv without an :math:`E \times C` tensor: their aggregations as
segment reductions over destination-sorted edges.

PyG's convs form the messages :math:`\mathbf{x}_j` (times a weight) per edge, an
:math:`E \times C` tensor in forward, in its backward and in a reversible block's recomputation.
Here each aggregation is one operator of :mod:`revgnn.nn.ops`:

* ``torch.ops.revgnn.aggregate``, the linear aggregations
  :math:`\mathbf{o}_i = \frac{1}{|\mathcal{N}(i)|^{[\mathrm{mean}]}}
  \sum_{j \in \mathcal{N}(i)} w_{ji} \mathbf{x}_j`
  (sum, mean, optional edge weights with their gradient
  :math:`\partial L / \partial w_{ji} = \langle \mathbf{g}_i, \mathbf{x}_j \rangle`);
  its backward to :math:`\mathbf{X}` is the transposed aggregation, a segment reduction over the
  source-sorted edges (:func:`revgnn.nn.graph_input.segments`);
* ``torch.ops.revgnn.segment_max``, :math:`\max_{j \in \mathcal{N}(i)} \mathbf{x}_j` per channel
  with the number of edges reaching each maximum, by which the gradient is split among ties as PyG's
  ``scatter_reduce`` amax splits it.

Both save only :math:`O(NC + E)` for backward (the input, the output and tie counts, the graph's
index arrays); nodes without in-edges aggregate to 0, as in PyG. The functions :func:`sage_conv`,
:func:`gin_conv` and :func:`gcn_conv` compute a PyG conv module's function with them, reading the
module's parameters (the module stays their owner: ``state_dict`` keys and SAR's conversion are
unchanged), and call the module itself where they do not apply.
"""

from __future__ import annotations

from typing import Literal, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from revgnn.nn import ops
from revgnn.nn.graph_input import Segments, SortedEdges, pyg_edge_index, segments, sort_edges
from revgnn.utils.functional import transforms_active

__all__ = ["aggregate", "gcn_conv", "gcn_edge_weights", "gin_conv", "max_aggregate", "sage_conv"]

Reduce = Literal["sum", "add", "mean"]


def _graph(x: Tensor, edge_index) -> Optional[Segments]:
    """The graph's :class:`Segments` where the fused operators apply: a tensor graph (edge list,
    ``EdgeIndex``, ``torch.sparse`` adj_t, :class:`SortedEdges`) and no :mod:`torch.func` transform
    (which does not see into a custom operator's autograd); :obj:`None` otherwise."""
    if not isinstance(x, Tensor) or not isinstance(edge_index, (Tensor, SortedEdges)) or transforms_active():
        return None
    return segments(edge_index, x.size(0))


def aggregate(x: Tensor, edge_index, edge_weight: Optional[Tensor] = None, reduce: Reduce = "sum") -> Tensor:
    r"""The linear aggregation

    .. math::
        \mathbf{o}_i = \frac{1}{\max(1, |\mathcal{N}(i)|)^{[\mathrm{reduce} = \mathrm{mean}]}}
        \sum_{j \in \mathcal{N}(i)} w_{ji} \mathbf{x}_j

    without forming the :math:`E \times C` messages (``torch.ops.revgnn.aggregate``).

    Args:
        x (torch.Tensor): Node features ``[N, C]``.
        edge_index (torch.Tensor or torch_geometric.EdgeIndex): The graph in any tensor form of
            :func:`revgnn.nn.graph_input.sort_edges`; a destination-sorted ``EdgeIndex`` avoids a
            sort per call and caches the source order the backward pass uses.
        edge_weight (torch.Tensor, optional): Edge weights :math:`w_{ji}` ``[E]`` in the order of
            ``edge_index`` (differentiable); 1 where :obj:`None`. (default: :obj:`None`)
        reduce (str, optional): ``"sum"`` (or ``"add"``) or ``"mean"`` (divides by the in-degree).
            (default: :obj:`"sum"`)
    """
    if reduce not in ("sum", "add", "mean"):
        raise ValueError(f"aggregate: reduce must be 'sum', 'add' or 'mean', got {reduce!r}")
    given = edge_weight.shape if edge_weight is not None else None

    def check_weight(num_edges: int) -> None:
        if given is not None and tuple(given) != (num_edges,):
            raise ValueError(f"aggregate: edge_weight must be [E] = [{num_edges}], got {list(given)}")

    if isinstance(edge_index, Tensor) and edge_index.layout == torch.strided and edge_index.dim() == 2:
        check_weight(edge_index.size(1))  # before sorting, which would name it edge_attr
    if isinstance(edge_index, (Tensor, SortedEdges)):  # sorted once: the weights follow the edges
        edge_index, edge_weight = sort_edges(edge_index, edge_weight, x.size(0))
    graph = _graph(x, edge_index)
    if graph is None:
        raise TypeError(
            f"aggregate takes a tensor graph outside torch.func transforms, got {type(edge_index).__name__}"
        )
    check_weight(graph.src.numel())
    return _aggregate(x, graph, edge_weight, reduce == "mean")


def _aggregate(x: Tensor, graph: Segments, weight: Optional[Tensor], mean: bool) -> Tensor:
    weight = weight.to(x.dtype).contiguous() if weight is not None else None
    return ops.aggregate(
        x.contiguous(), graph.ptr, graph.src, weight, mean, graph.sptr, graph.sdst, graph.sperm
    )


def max_aggregate(x: Tensor, edge_index) -> Tensor:
    r""":math:`\mathbf{o}_i = \max_{j \in \mathcal{N}(i)} \mathbf{x}_j` per channel (0 for nodes
    without in-edges, as PyG's ``MaxAggregation``) without forming the :math:`E \times C` messages
    (``torch.ops.revgnn.segment_max``); the gradient is split among tied maxima as PyG's is.
    ``edge_index`` as in :func:`aggregate`."""
    graph = _graph(x, edge_index)
    if graph is None:
        raise TypeError(
            "max_aggregate takes a tensor graph outside torch.func transforms, got "
            f"{type(edge_index).__name__}"
        )
    return _max(x, graph)


def _max(x: Tensor, graph: Segments) -> Tensor:
    out, _ = ops.segment_max(x.contiguous(), graph.ptr, graph.src, graph.sptr, graph.sdst)
    return out


def _reduce(x: Tensor, graph: Segments, aggr: str) -> Tensor:
    if aggr == "max":
        return _max(x, graph)
    return _aggregate(x, graph, None, aggr == "mean")


def sage_conv(conv, x: Tensor, edge_index) -> Tensor:
    r"""``conv(x, edge_index)`` for a PyG ``SAGEConv``,

    .. math::
        \mathbf{x}_i' = \mathbf{W}_1 \mathbf{x}_i + \mathbf{W}_2 \cdot
        \mathrm{AGG}_{j \in \mathcal{N}(i)} \mathbf{x}_j

    (in PyG's order: ``project``, aggregation, ``lin_l``, ``+ lin_r(x)`` with ``root_weight``,
    ``normalize``), through the fused aggregations for ``aggr`` ``"mean"``, ``"sum"``/``"add"`` and
    ``"max"``; the conv itself for any other aggregation or graph form (a ``SparseTensor``, a SAR
    graph) and under :mod:`torch.func` transforms."""
    graph = _graph(x, edge_index)
    if graph is None or not isinstance(conv.aggr, str) or conv.aggr not in ("mean", "sum", "add", "max"):
        return conv(x, pyg_edge_index(edge_index))
    h = conv.lin(x).relu() if conv.project and hasattr(conv, "lin") else x
    out = conv.lin_l(_reduce(h, graph, conv.aggr))
    if conv.root_weight:
        out = out + conv.lin_r(x)
    if conv.normalize:
        out = F.normalize(out, p=2.0, dim=-1)
    return out


def gin_conv(conv, x: Tensor, edge_index) -> Tensor:
    r"""``conv(x, edge_index)`` for a PyG ``GINConv``,
    :math:`\mathbf{x}_i' = h_{\Theta}\big((1 + \epsilon) \mathbf{x}_i + \sum_{j \in \mathcal{N}(i)}
    \mathbf{x}_j\big)` (the gradient reaches a trainable :math:`\epsilon`), through the fused sum;
    the conv itself where that does not apply (see :func:`sage_conv`)."""
    graph = _graph(x, edge_index)
    if graph is None or conv.aggr not in ("add", "sum"):
        return conv(x, pyg_edge_index(edge_index))
    return conv.nn(_aggregate(x, graph, None, False) + (1 + conv.eps) * x)


def gcn_edge_weights(graph: Segments, fill_value: float, dtype: torch.dtype):
    r"""GCN's symmetric normalisation on ``graph`` after PyG's ``add_remaining_self_loops``: the
    weight :math:`d_j^{-1/2} d_i^{-1/2}` of each edge ``j -> i`` (0 for the graph's own self loops,
    which that replaces) ``[E]``, and the weight :math:`d_i^{-1/2} f d_i^{-1/2}` of the one self loop
    per node ``[N, 1]``, with :math:`d_i` the in-degree without self loops plus :math:`f`
    (``fill_value``: 1, or 2 for ``improved``). Computed in the order PyG computes them, so the
    weights are PyG's to the last bit."""
    n = graph.ptr.numel() - 1
    loop = graph.src == graph.dst
    # counted in int32: an E-long int64 copy of the mask would be the largest array of a GCN forward
    loops = torch.zeros(n, dtype=torch.int32, device=graph.src.device).index_add_(0, graph.dst, loop.int())
    deg = (graph.ptr.diff() - loops).to(dtype) + fill_value
    dinv = deg.pow(-0.5).masked_fill(deg == 0, 0.0)  # deg >= fill_value > 0 but for fill_value 0
    weight = (dinv.index_select(0, graph.src) * dinv.index_select(0, graph.dst)).masked_fill_(loop, 0.0)
    return weight, (dinv * fill_value * dinv).view(-1, 1)


def gcn_conv(conv, x: Tensor, edge_index) -> Tensor:
    r"""``conv(x, edge_index)`` for a PyG ``GCNConv``,

    .. math::
        \mathbf{x}_i' = \sum_{j \in \mathcal{N}(i) \cup \{i\}} \frac{1}{\sqrt{d_j d_i}}
        \mathbf{\Theta} \mathbf{x}_j + \mathbf{b}

    (self loops as PyG's ``add_remaining_self_loops`` adds them, :func:`gcn_edge_weights`), through the
    fused weighted sum; the conv itself for ``cached``, ``normalize=False``, no self loops, another
    flow, or where :func:`sage_conv` says."""
    graph = _graph(x, edge_index)
    plain = conv.normalize and conv.add_self_loops and not conv.cached and conv.flow == "source_to_target"
    if graph is None or not plain or conv.aggr not in ("add", "sum"):
        return conv(x, pyg_edge_index(edge_index))
    h = conv.lin(x)
    # 1 for improved too: without edge weights PyG's add_remaining_self_loops fills no weight and gcn_norm
    # then gives every edge, the added loops included, weight 1 (PyG 2.8), and this equals PyG's conv
    weight, loop = gcn_edge_weights(graph, 1.0, h.dtype)
    out = _aggregate(h, graph, weight, False) + loop * h
    return out + conv.bias if conv.bias is not None else out
