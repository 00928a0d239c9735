r"""Fused GENConv message + max aggregation over destination-sorted edges.

PyG's GENConv with ``aggr='max'`` builds the messages
:math:`\mathbf{m}_{ji} = \mathrm{ReLU}(\mathbf{x}_j + \mathbf{e}_{ji}) + \epsilon`
through its generic message-passing path (index expansions, an
:math:`E \times C` message tensor plus an :math:`E \times C` ReLU mask kept
for backward, then ``scatter_reduce`` amax whose backward allocates several
more edge-sized temporaries). :func:`gen_max_aggregate` computes

.. math::
    \mathbf{h}_{i,c} = \max_{j \in \mathcal{N}(i)} \mathrm{ReLU}(\mathbf{x}_{j,c}
    + \mathbf{e}_{ji,c}) + \epsilon

as one operator, ``torch.ops.revgnn.gen_max`` (:mod:`revgnn.nn.ops`: ``torch.compile`` and
``torch.export`` see one op, autograd its registered backward), with two implementations of the
same outputs:

* **the C++ kernel** (:mod:`revgnn.nn.kernels`, CPU, float32/float64): one
  pass over the destination-sorted (CSC) edges that forms each message in
  registers and keeps only the running maximum. With the edge term in factored
  form :math:`\mathbf{e}_{ji} = \mathbf{W}\mathbf{a}_{ji} + \mathbf{b}`
  (a :class:`~revgnn.nn.edge_features.LinearEdgeFeatures` on the raw
  :math:`d`-dimensional features, :math:`d = 8` on proteins) no
  :math:`E \times C` tensor is ever written, in forward or backward;
* **PyTorch** (GPU, other dtypes, or no compiler): the messages are formed
  once (an :math:`E \times C` temporary) and aggregated with native
  ``scatter_reduce`` amax.

Both keep the winning edge per (node, channel) (int32, :math:`N \times C`)
and a tie flag per node, nothing edge-sized, so backward costs
:math:`O(NCd)` rather than :math:`O(EC)`; both add the floor :math:`\epsilon`
to the :math:`N \times C` result (equal: rounding is monotone), split the
gradient evenly among tied maxima exactly as ``scatter_reduce`` amax does in
PyG's CPU path (ties are judged before :math:`\epsilon` is added), and
aggregate nodes without incoming edges to 0, as PyG. (torch-scatter's
``segment_max_csr`` returns an argmax too, but is much slower than native
``scatter_reduce`` on CPU: ``docs/bench/in_code.md``.)
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor
from torch_geometric import EdgeIndex

from revgnn.nn import ops
from revgnn.nn.edge_features import LinearEdgeFeatures
from revgnn.nn.norm_act import sequential_forward
from revgnn.utils.functional import transforms_active


def sparse_to_edge_index(adj_t: Tensor, num_nodes: int) -> EdgeIndex:
    """The ``[2, E]`` (source, destination) :class:`~torch_geometric.EdgeIndex` of a ``torch.sparse``
    adjacency in PyG's ``adj_t`` convention (``adj_t[i, j]`` stored: an edge ``j -> i``), its edges in
    the sparse tensor's stored order (CSR: destination-sorted, so no sort follows). The values are the
    graph's structure only and must be 1: edge features go in ``edge_attr``, in that order."""
    if adj_t.dim() != 2 or tuple(adj_t.shape) != (num_nodes, num_nodes):
        raise ValueError(
            f"a sparse adj_t must be [{num_nodes}, {num_nodes}] (the nodes), got {list(adj_t.shape)}"
        )
    if adj_t.layout == torch.sparse_csr:
        ptr, src, values = adj_t.crow_indices(), adj_t.col_indices(), adj_t.values()
        dst = ops.destinations(ptr, src.numel())
        order = "col"
    elif adj_t.layout == torch.sparse_coo:
        (dst, src), values = adj_t._indices(), adj_t._values()
        order = None
    else:
        raise TypeError(f"a sparse adj_t must be in CSR or COO layout, got {adj_t.layout}")
    if values.numel() and bool((values != 1).any()):
        raise ValueError(
            "a sparse adj_t with values other than 1 (a weighted graph, or duplicate edges that coalescing "
            "summed): revgnn's models read the structure only; pass a 0/1 pattern (uncoalesced COO keeps "
            "duplicate edges) and the edge features as edge_attr, in the sparse tensor's order"
        )
    edge_index = torch.stack([src.long(), dst.long()])
    return EdgeIndex(edge_index, sparse_size=(num_nodes, num_nodes), sort_order=order)


class SortedEdges(NamedTuple):
    """A destination-sorted graph in plain tensors: what :func:`sort_edges` returns under
    ``torch.compile``, ``torch.export`` and :mod:`torch.func` transforms in place of a
    :class:`~torch_geometric.EdgeIndex`, which does not trace there (:func:`pyg_edge_index` says how it
    fails). Not a tensor subclass, so a compiled graph only ever holds the two tensors."""

    edge_index: Tensor  #: ``[2, E]`` (source, destination), sorted by destination
    ptr: Tensor  #: ``[N + 1]`` CSC pointer: the edges into node ``i`` are ``ptr[i]:ptr[i + 1]``


def tracing() -> bool:
    """Whether ``torch.compile`` or ``torch.export`` is tracing, or a :mod:`torch.func` transform
    runs: where a graph travels as :class:`SortedEdges` rather than as an ``EdgeIndex``."""
    return torch.compiler.is_compiling() or transforms_active()


def sort_edges(edge_index, edge_attr: Optional[Tensor], num_nodes: int):
    """Destination-sorted edges (and edge features in that order) with their CSC pointer.

    Sorting once per forward pass lets every layer aggregate over contiguous
    segments (CSR) instead of sorting or scattering in each of hundreds of
    layers. ``edge_index`` is a ``[2, E]`` tensor or ``EdgeIndex``, or a ``torch.sparse`` CSR/COO
    ``adj_t`` (:func:`sparse_to_edge_index`). Run eagerly it returns a
    :class:`torch_geometric.EdgeIndex`, its CSC pointer filled; traced (:func:`tracing`) a
    :class:`SortedEdges`, sorted inside the graph for a plain tensor. A graph sorted already is
    returned unchanged, and so is one that is not a tensor (a ``SparseTensor``, a distributed
    ``SARGraph``).
    """
    if isinstance(edge_index, SortedEdges):
        return edge_index, edge_attr
    if not tracing():
        if (
            isinstance(edge_index, EdgeIndex)
            and edge_index.is_sorted_by_col
            and edge_index._indptr is not None
        ):
            return edge_index, edge_attr
        if not isinstance(edge_index, Tensor):
            return edge_index, edge_attr
        return _sorted(edge_index, edge_attr, num_nodes)
    if not isinstance(edge_index, Tensor):
        return edge_index, edge_attr
    if isinstance(edge_index, EdgeIndex) or edge_index.layout != torch.strided:
        if torch.compiler.is_compiling() and not torch.compiler.is_exporting():
            # unpacked eagerly (one graph break): an EdgeIndex must not become a compiled graph's input
            return _unpacked(edge_index, edge_attr, num_nodes)
        if isinstance(edge_index, EdgeIndex):
            edge_index = edge_index.as_tensor()
        else:
            edge_index = sparse_to_edge_index(edge_index, num_nodes).as_tensor()
    # traceable: static shapes, no host sync (a stable sort keeps parallel edges in input order)
    perm = edge_index[1].argsort(stable=True)
    edge_index = edge_index.index_select(1, perm)
    if edge_attr is not None:
        edge_attr = edge_attr.index_select(0, perm)
    nodes = torch.arange(num_nodes + 1, device=edge_index.device, dtype=edge_index.dtype)
    return SortedEdges(edge_index, torch.searchsorted(edge_index[1], nodes)), edge_attr


@torch.compiler.disable
def _sorted(edge_index: Tensor, edge_attr: Optional[Tensor], num_nodes: int):
    if edge_index.layout != torch.strided:
        edge_index = sparse_to_edge_index(edge_index, num_nodes)
    if not (isinstance(edge_index, EdgeIndex) and edge_index.is_sorted_by_col):
        if not isinstance(edge_index, EdgeIndex):
            edge_index = EdgeIndex(edge_index.contiguous(), sparse_size=(num_nodes, num_nodes))
        edge_index, perm = edge_index.sort_by("col")
        if edge_attr is not None and perm is not None:
            edge_attr = edge_attr.index_select(0, perm)
    edge_index.get_csc()  # filled once here, not lazily in every layer
    return edge_index, edge_attr


@torch.compiler.disable
def _unpacked(edge_index: Tensor, edge_attr: Optional[Tensor], num_nodes: int):
    edge_index, edge_attr = _sorted(edge_index, edge_attr, num_nodes)
    (ptr, _), _ = edge_index.get_csc()
    return SortedEdges(edge_index.as_tensor(), ptr), edge_attr


def pyg_edge_index(edge_index):
    """The graph as revgnn hands it to a PyG conv: a :class:`~torch_geometric.EdgeIndex` as it is when
    run eagerly (PyG then aggregates over its CSC pointer and fuses sparse matrix products), its plain
    ``[2, E]`` tensor (same edges, same order) under ``torch.compile``, ``torch.export`` and
    :mod:`torch.func` transforms; for a :class:`SortedEdges`, its ``edge_index``.

    PyG's ``EdgeIndex`` is a tensor subclass whose operations (``edge_index[i]`` in every
    ``propagate``) do not trace there (torch 2.13, PyG 2.8.1): ``torch.export`` fails ("Unable to cast
    NotImplemented to Tensor"), ``torch.func.grad`` too ("Cannot access storage of TensorWrapper"), and
    a compiled graph holding one fails whenever ``torch.__trace`` has a handler (``TORCH_TRACE``, or
    pytest's log capture): AOTAutograd's trace log prints the graph's metadata, ``EdgeIndex.__repr__``
    reads the fake tensor's values, the compile fails and dynamo, falling back frame by frame, breaks
    inside ``Index.__new__`` ("'Index' object has no attribute '_data'"). On the plain tensor PyG takes
    its scatter path, which all three trace."""
    if isinstance(edge_index, SortedEdges):
        return edge_index.edge_index
    if isinstance(edge_index, EdgeIndex) and tracing():
        return edge_index.as_tensor()
    return edge_index


def _csc(
    edge_index: Tensor, edge_attr: Optional[Tensor], num_nodes: int
) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """(source, destination) per edge in destination order, the CSC pointer ``[N + 1]``, and
    the edge features in that order."""
    edge_index, edge_attr = sort_edges(edge_index, edge_attr, num_nodes)
    if isinstance(edge_index, SortedEdges):
        return edge_index.edge_index[0], edge_index.edge_index[1], edge_index.ptr, edge_attr
    (colptr, _), _ = edge_index.get_csc()
    plain = edge_index.as_tensor()
    return plain[0], plain[1], colptr, edge_attr


EdgeTerm = Union[Tensor, LinearEdgeFeatures, None]


def gen_max_reference(
    x: Tensor, src: Tensor, dst: Tensor, ptr: Tensor, edge_term: Optional[Tensor], eps: float = 1e-7
) -> Tensor:
    """The same aggregation in plain differentiable PyTorch ops (an :math:`E \\times C` message
    tensor, ``scatter_reduce`` amax, whose gradient splits ties evenly): what runs under
    :mod:`torch.func` transforms, and the reference the kernels are tested against. ``src``/``dst``
    per edge, ``ptr`` the CSC pointer, ``edge_term`` ``[E, C]`` or None."""
    msg = x.index_select(0, src)
    msg = (msg + edge_term if edge_term is not None else msg).relu()
    index = dst.view(-1, 1).expand_as(msg)
    out = msg.new_zeros(ptr.numel() - 1, x.size(1)).scatter_reduce(0, index, msg, "amax", include_self=False)
    return (out + eps).masked_fill((ptr.diff() == 0).view(-1, 1), 0.0)


def gen_max_aggregate(x: Tensor, edge_index: Tensor, edge_attr: EdgeTerm = None, eps: float = 1e-7) -> Tensor:
    r"""Fused :math:`\max_{j \in \mathcal{N}(i)} \mathrm{ReLU}(\mathbf{x}_j +
    \mathbf{e}_{ji}) + \epsilon` (GENConv's max aggregation).

    Args:
        x (torch.Tensor): Node features ``[N, C]``.
        edge_index (torch.Tensor or torch_geometric.EdgeIndex): ``[2, E]``,
            source in row 0, destination in row 1. A destination-sorted
            ``EdgeIndex`` avoids a sort per call.
        edge_attr (torch.Tensor or LinearEdgeFeatures, optional): Edge terms
            ``[E, C]`` in the order of ``edge_index``, or the same in factored
            form (raw ``[E, d]`` features with a ``C x d`` map), which the C++
            kernel never expands.
        eps (float, optional): The message floor :math:`\epsilon`.
    """
    if isinstance(edge_attr, LinearEdgeFeatures):
        if edge_attr.channels != x.size(1):
            raise ValueError(f"edge features map to {edge_attr.channels} channels but x has {x.size(1)}")
        attr, weight, bias = edge_attr.raw, edge_attr.weight, edge_attr.bias
    else:
        attr, weight, bias = edge_attr, None, None
    src, dst, ptr, attr = _csc(edge_index, attr, x.size(0))
    if transforms_active():  # torch.func: the plain ops, which it can differentiate and batch
        if weight is not None:
            attr = LinearEdgeFeatures(attr, weight, bias).materialize()
        return gen_max_reference(x, src, dst, ptr, attr, eps)
    # one dtype throughout (autocast may leave x in bfloat16 and the edge terms in float32): the edge
    # terms are cast to x's, differentiably, as adding them to x's messages would
    attr, weight, bias = (t.to(x.dtype) if t is not None else None for t in (attr, weight, bias))
    contiguous = (t.contiguous() if t is not None else None for t in (attr, weight, bias))
    out, _, _ = ops.gen_max(
        x.contiguous(), ptr.long().contiguous(), src.long().contiguous(), *contiguous, eps
    )
    return out


def gen_conv(conv, x: Tensor, edge_index, edge_attr: Optional[Tensor] = None) -> Tensor:
    """``conv(x, edge_index, edge_attr)`` for a PyG ``GENConv``, through
    :func:`gen_max_aggregate` when that computes the same function.

    The fused path applies to max aggregation with equal in/out channels and no
    message norm or internal edge encoder (edge features already encoded,
    possibly in factored form); anything else, or a non-tensor graph
    (``SparseTensor``, a distributed ``SARGraph``), calls the conv itself, with
    factored edge features expanded unless the conv takes them as they are
    (``takes_factored_edges``: the SAR GENConv, whose max aggregation runs the
    kernel shard by shard).
    """
    plain = not any(
        hasattr(conv, name) for name in ("lin_src", "lin_dst", "lin_edge", "lin_aggr_out", "msg_norm")
    )
    graph = isinstance(edge_index, (Tensor, SortedEdges))
    if conv.aggr == "max" and plain and graph and isinstance(x, Tensor):
        return sequential_forward(conv.mlp, gen_max_aggregate(x, edge_index, edge_attr, conv.eps) + x)
    if isinstance(edge_attr, LinearEdgeFeatures) and not getattr(conv, "takes_factored_edges", False):
        edge_attr = edge_attr.materialize()
    return conv(x, pyg_edge_index(edge_index), edge_attr)
