r"""The graph a block receives: its input forms, destination sorting, caching and tracing.

Every conv, model and operator of revgnn reads the graph through this module. The forms a user may
pass are a ``[2, E]`` ``edge_index`` tensor (source in row 0, destination in row 1), a PyG
:class:`~torch_geometric.EdgeIndex` (sorted or not), a ``torch.sparse`` CSR/COO ``adj_t`` in PyG's
convention (:func:`sparse_to_edge_index`), or a graph that is not a tensor (a PyG ``SparseTensor``,
a distributed ``SARGraph``), which is passed through. :func:`sort_edges` turns a tensor form into
destination-sorted edges with their CSC pointer once per forward pass (an ``EdgeIndex`` eagerly, a
:class:`SortedEdges` under ``torch.compile``, ``torch.export`` and :mod:`torch.func`), so every layer
aggregates over contiguous segments; :func:`csc` unpacks that into plain tensors for the operators,
and :func:`pyg_edge_index` hands the graph to a PyG conv in a form that conv can trace.
:func:`check_graph` (node ids in range, ``[2, E]`` integers, ``edge_attr`` rows) runs once per graph
object, as it is sorted, before anything indexes with the ids; :func:`check_features` checks the
features' dtype and device against a model's.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Tuple

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary
from torch_geometric import EdgeIndex

from revgnn.nn import ops
from revgnn.utils.functional import transforms_active

__all__ = [
    "Segments",
    "SortedEdges",
    "backward_source_order",
    "check_features",
    "check_graph",
    "csc",
    "segments",
    "pyg_edge_index",
    "sort_edges",
    "source_order",
    "sparse_to_edge_index",
    "tracing",
]

#: Sorted graphs already checked, by identity: ``EdgeIndex -> (num_nodes, versions)``
#: (:func:`_versions`). Weak, so a graph dropped by its owner leaves; not an attribute on the tensor,
#: which ``torch.save`` would pickle.
_CHECKED: WeakIdKeyDictionary = WeakIdKeyDictionary()
#: Each sorted graph's :func:`source_order` with its :func:`_versions`, by identity (weak, and not
#: pickled with the graph).
_SOURCE_ORDERS: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _versions(edge_index: Tensor) -> Optional[Tuple[int, ...]]:
    """The version counters of a graph tensor's ids, which every in-place write bumps: an
    ``EdgeIndex``'s own (a write through the ``EdgeIndex``) and its data's (a write through
    ``as_tensor()``, or through the tensor it was built from, which it shares). ``None`` for an
    inference tensor (made under ``torch.inference_mode``, which counts no versions): the caches
    above then never hit, so such a graph is checked again wherever it is read."""
    parts = (edge_index, edge_index.as_tensor()) if isinstance(edge_index, EdgeIndex) else (edge_index,)
    if any(t.is_inference() for t in parts):
        return None
    return tuple(t._version for t in parts)


def check_graph(edge_index: Tensor, edge_attr: Any, num_nodes: int) -> None:
    """Raises a :class:`ValueError` or :class:`TypeError` naming the argument and the fix unless
    ``edge_index`` is a ``[2, E]`` integer tensor of node ids in ``[0, num_nodes)`` (sources and
    destinations, negative ids included) and ``edge_attr`` (if a tensor) has ``E`` rows.

    :math:`O(E)` and one host sync (the ids' minimum and maximum): :func:`sort_edges` runs it once per
    graph object, before anything indexes with the ids, since an id out of range makes the CSC pointer
    and the kernels read and write out of bounds (a corrupted heap, or NaN rather than an error)."""
    if edge_index.is_floating_point() or edge_index.is_complex() or edge_index.dtype == torch.bool:
        raise TypeError(
            f"edge_index must hold integer node ids, got {edge_index.dtype}; pass edge_index.long()"
        )
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(
            f"edge_index must be [2, E] (sources in row 0, destinations in row 1), got "
            f"{list(edge_index.shape)}; transpose an [E, 2] list with edge_index.t()"
        )
    num_edges = edge_index.size(1)
    _check_rows(num_edges, edge_attr)
    if num_edges == 0:
        return
    plain = edge_index.as_tensor() if isinstance(edge_index, EdgeIndex) else edge_index
    low, high = (int(v) for v in torch.aminmax(plain.detach()))
    if low < 0 or high >= num_nodes:  # the error path: find which row, and which id, to name
        row = 0 if bool(((plain[0] < 0) | (plain[0] >= num_nodes)).any()) else 1
        low, high = (int(v) for v in torch.aminmax(plain[row].detach()))
        raise ValueError(
            f"edge_index holds node id {low if low < 0 else high} among its "
            f"{('sources (row 0)', 'destinations (row 1)')[row]}, but the graph has "
            f"{num_nodes} nodes (x.size(0)): every id must be in [0, {num_nodes}); drop or renumber the "
            f"edges out of range, or pass the features of every node"
        )


def _check_rows(num_edges: int, edge_attr: Any) -> None:
    if isinstance(edge_attr, Tensor) and (edge_attr.dim() == 0 or edge_attr.size(0) != num_edges):
        rows = edge_attr.size(0) if edge_attr.dim() else "no"
        raise ValueError(
            f"edge_attr must have one row per edge: {num_edges} edges in edge_index, {rows} rows in "
            f"edge_attr; pass the features of exactly these edges, in edge_index's order"
        )


def _cast(dtype: torch.dtype) -> str:
    named = {torch.float32: ".float()", torch.float64: ".double()", torch.float16: ".half()"}
    return named.get(dtype, f".to({dtype})")


def check_features(like: Tensor, **features: Any) -> None:
    """Raises a :class:`TypeError` naming the argument and the fix unless every floating-point tensor in
    ``features`` has the dtype and device of ``like`` (a model's parameter): a float64 ``x`` into a
    float32 model otherwise fails deep inside a layer (``mat1 and mat2 must have the same dtype``).
    Under ``torch.autocast`` the model's own dtype is still what its inputs must have."""
    for name, t in features.items():
        if not isinstance(t, Tensor) or not t.is_floating_point():
            continue
        if t.dtype != like.dtype:
            raise TypeError(
                f"{name} is {t.dtype} but the model's parameters are {like.dtype}: pass "
                f"{name}{_cast(like.dtype)}, or convert the model with model{_cast(t.dtype)}"
            )
        if t.device != like.device:
            raise TypeError(
                f"{name} is on {t.device} but the model is on {like.device}: pass "
                f"{name}.to('{like.device}'), or move the model with model.to('{t.device}')"
            )


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
        # built without check_invariants, a CSR tensor may hold any pointer: read it before use
        if not torch.compiler.is_compiling() and (
            int(ptr[0]) != 0 or int(ptr[-1]) != src.numel() or bool((ptr.diff() < 0).any())
        ):
            raise ValueError(
                "a sparse CSR adj_t must have crow_indices starting at 0, non-decreasing, ending at its "
                "number of stored edges; build it with torch.sparse_csr_tensor(..., check_invariants=True) "
                "to see where it is not"
            )
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
            _check_once(edge_index, edge_attr, num_nodes)
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
    plain = None if torch.compiler.is_compiling() else _plain_values(edge_index)
    if plain is not None:
        # torch.func runs eagerly: the ids can be read. A compiled or exported graph cannot read them
        # without a host sync (a graph break, or an export failure), so a plain edge_index sorted in
        # the graph is not checked here: an EdgeIndex or sparse adj_t is, where a compiled model
        # unpacks it eagerly (_unpacked), and the C++ kernel's own checks refuse the pointer or ids
        # that a bad plain edge_index leads to (a RuntimeError, measured: no corruption).
        check_graph(plain, edge_attr, num_nodes)
    # traceable: static shapes, no host sync (a stable sort keeps parallel edges in input order)
    perm = edge_index[1].argsort(stable=True)
    edge_index = edge_index.index_select(1, perm)
    if edge_attr is not None:
        edge_attr = edge_attr.index_select(0, perm)
    nodes = torch.arange(num_nodes + 1, device=edge_index.device, dtype=edge_index.dtype)
    return SortedEdges(edge_index, torch.searchsorted(edge_index[1], nodes)), edge_attr


def _plain_values(t: Tensor) -> Optional[Tensor]:
    """``t``'s values as a plain tensor, unwrapped from :mod:`torch.func`'s gradient-tracking wrappers,
    or None under ``vmap``, where one tensor stands for a batch of graphs (not checked there)."""
    functorch = torch._C._functorch
    while functorch.is_functorch_wrapped_tensor(t):
        if functorch.is_batchedtensor(t):
            return None
        t = functorch.get_unwrapped(t)
    return t


def _check_once(edge_index: Tensor, edge_attr: Any, num_nodes: int) -> None:
    """:func:`check_graph` once per graph object: a sorted ``EdgeIndex`` is the cache (its size, ids and
    version remembered in :data:`_CHECKED`), so the layers of a deep model re-check only ``edge_attr``'s
    row count, which needs no sync."""
    if isinstance(edge_index, EdgeIndex):
        sizes = edge_index.sparse_size()
        if any(size is not None and size != num_nodes for size in sizes):
            raise ValueError(
                f"edge_index is an EdgeIndex of sparse_size {tuple(sizes)} but the graph has {num_nodes} "
                f"nodes (x.size(0)); build it with sparse_size=({num_nodes}, {num_nodes})"
            )
        versions = _versions(edge_index)
        if versions is not None and _CHECKED.get(edge_index) == (num_nodes, versions):
            _check_rows(edge_index.size(1), edge_attr)
            return
    check_graph(edge_index, edge_attr, num_nodes)
    if isinstance(edge_index, EdgeIndex):
        _CHECKED[edge_index] = (num_nodes, _versions(edge_index))


@torch.compiler.disable
def _sorted(edge_index: Tensor, edge_attr: Optional[Tensor], num_nodes: int):
    if torch.is_inference_mode_enabled():
        # the graph built here (sorted, or from a sparse adj_t) would be an inference tensor, which
        # counts no versions (_versions): built as a normal one, the layers find it checked, as they
        # do under no_grad, rather than check it again in every layer or solver iteration
        with torch.inference_mode(False), torch.no_grad():
            return _sorted(edge_index, edge_attr, num_nodes)
    if edge_index.layout != torch.strided:
        edge_index = sparse_to_edge_index(edge_index, num_nodes)
    _check_once(edge_index, edge_attr, num_nodes)
    if not (isinstance(edge_index, EdgeIndex) and edge_index.is_sorted_by_col):
        if not isinstance(edge_index, EdgeIndex):
            edge_index = EdgeIndex(edge_index.contiguous(), sparse_size=(num_nodes, num_nodes))
        edge_index, perm = edge_index.sort_by("col")
        if edge_attr is not None and perm is not None:
            edge_attr = edge_attr.index_select(0, perm)
    edge_index.get_csc()  # filled once here, not lazily in every layer
    _CHECKED[edge_index] = (num_nodes, _versions(edge_index))  # checked above: its layers need not again
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
    its scatter path, which all three trace.

    Under ``torch.inference_mode`` an ``EdgeIndex`` made outside it (a user's, or the one
    :func:`sort_edges` builds) cannot be indexed ("Cannot set version_counter for inference
    tensor", torch 2.13, PyG 2.8.1): PyG receives an alias made inside it, which shares the ids and
    the CSC pointer (no copy)."""
    if isinstance(edge_index, SortedEdges):
        return edge_index.edge_index
    if isinstance(edge_index, EdgeIndex) and tracing():
        return edge_index.as_tensor()
    if (
        isinstance(edge_index, EdgeIndex)
        and torch.is_inference_mode_enabled()
        and not edge_index.is_inference()
    ):
        return edge_index._shallow_copy()
    return edge_index


def csc(
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


class Segments(NamedTuple):
    """A graph's edges in both orders, as int64 tensors for the aggregation operators
    (``torch.ops.revgnn.aggregate``): destination order for the forward pass, source order (E int64s
    each, no channels) for the backward pass's reduction to the sources (empty where no backward
    pass can follow: :func:`backward_source_order`)."""

    src: Tensor  #: ``[E]`` the source of each edge, in destination order
    dst: Tensor  #: ``[E]`` the destination of each edge, in destination order
    ptr: Tensor  #: ``[N + 1]`` CSC pointer over destinations
    sptr: Tensor  #: ``[N + 1]`` CSR pointer over sources
    sdst: Tensor  #: ``[E]`` the destination of each edge, in source order
    sperm: Tensor  #: ``[E]`` the id (position in destination order) of each edge, in source order


def segments(edge_index, num_nodes: int, read: bool = True) -> Segments:
    """The :class:`Segments` of a tensor graph (any form :func:`sort_edges` takes): its destination
    order and :func:`backward_source_order` (stable, so sums taken in it do not depend on the
    thread count; computed once per ``EdgeIndex`` and kept with it, sorted inside the graph when
    traced; empty where no backward pass can follow, or where ``read`` is false: the operator's
    backward does not read it, :func:`revgnn.nn.dispatch.reads_source_order`)."""
    edge_index, _ = sort_edges(edge_index, None, num_nodes)
    if isinstance(edge_index, SortedEdges):
        (src, dst), ptr = edge_index.edge_index, edge_index.ptr
    else:
        (ptr, _), _ = edge_index.get_csc()
        src, dst = edge_index.as_tensor()
    sptr, sdst, sperm = backward_source_order(edge_index, num_nodes, read)
    return Segments(*(t.long().contiguous() for t in (src, dst, ptr, sptr, sdst, sperm)))


def backward_source_order(edge_index, num_nodes: int, read: bool = True) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`source_order` where a backward pass may follow (grad mode on) and reads it (``read``:
    :func:`revgnn.nn.dispatch.reads_source_order` of the operator that runs), else three empty int64
    tensors in its place, which no operator's forward reads: inference under ``no_grad``, a
    reversible block's forward (its backward recomputes with grad mode on, and builds the order
    then), and a backward that walks the destination order only, never build it. Two ``[E]`` int64
    arrays and a stable sort of ``E`` ids, about twice a ``[N, C]`` node state's bytes at
    ogbn-products' size."""
    if read and torch.is_grad_enabled():
        return source_order(edge_index, num_nodes)
    plain = edge_index.edge_index if isinstance(edge_index, SortedEdges) else edge_index
    empty = torch.empty(0, dtype=torch.long, device=plain.device)
    return empty, empty, empty


def source_order(edge_index, num_nodes: int) -> Tuple[Tensor, Tensor, Tensor]:
    """The destination-sorted graph of :func:`sort_edges` sorted by source: ``(rowptr, col, perm)``,
    the pointer ``[N + 1]`` over sources, each edge's destination ``[E]`` and its position in the
    destination order ``[E]`` (E int64s each, no channels), by which a backward sums the sources'
    gradients as segments, without atomics. The sort is stable (each source's edges in destination
    order), so the order, and any sum taken in it, does not depend on the thread count, as PyG's
    ``EdgeIndex.get_csr()`` (an unstable sort) would. For an :class:`~torch_geometric.EdgeIndex` it is
    computed once and kept with the graph, so every layer of a forward pass, and the reversible
    recompute, share it; for a :class:`SortedEdges` (traced) it is a sort inside the graph."""
    if isinstance(edge_index, SortedEdges):
        return _source_order(edge_index.edge_index, num_nodes)
    if not isinstance(edge_index, EdgeIndex) or not edge_index.is_sorted_by_col:
        raise TypeError(f"source_order takes the graph sort_edges returns, got {type(edge_index).__name__}")
    versions = _versions(edge_index)
    cached = _SOURCE_ORDERS.get(edge_index)
    if versions is None or cached is None or cached[0] != versions:
        cached = _SOURCE_ORDERS[edge_index] = versions, _source_order(edge_index.as_tensor(), num_nodes)
    return cached[1]


def _source_order(edge_index: Tensor, num_nodes: int) -> Tuple[Tensor, Tensor, Tensor]:
    src, dst = edge_index[0].long(), edge_index[1].long()
    perm = src.argsort(stable=True)
    nodes = torch.arange(num_nodes + 1, device=src.device)
    return torch.searchsorted(src.index_select(0, perm), nodes), dst.index_select(0, perm), perm
