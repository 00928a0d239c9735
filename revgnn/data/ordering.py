r"""Node orders that keep neighbours close in memory, applied once to a data set and undone for outputs.

A conv over destination-sorted edges reads the source rows :math:`\mathbf{x}_j` of each node's
in-edges; in a random order those rows are scattered over the whole ``[N, C]`` feature matrix, and
the time per edge grows with the graph as fewer of them are in cache. Relabelling the nodes so that
neighbours get nearby ids keeps the rows a segment reads close together. :func:`node_order` computes
such an order:

* ``"rcm"``: reverse Cuthill–McKee (SciPy's :func:`scipy.sparse.csgraph.reverse_cuthill_mckee` on
  the symmetrised pattern): breadth-first levels from a peripheral node, which bounds the bandwidth
  :math:`\max_{(j, i) \in E} |i - j|`;
* ``"degree"``: by descending in-degree (hubs first, so the rows read most often share pages);
* ``"none"``: the identity.

:func:`reorder` applies an order to a :class:`~revgnn.data.NodeDataset`: node features, labels,
split indices and edges are relabelled (edges re-sorted by destination, edge features with them),
and ``dataset.info["node_order"]`` keeps ``order`` (new id -> original id), so that
:func:`original_ids` and :func:`in_original_order` map any per-node output back. Splits, labels
and every metric are the same sets of nodes as before; only their ids change.

Every node data set's loader takes the option as ``node_order`` (``revgnn-train
data.node_order=rcm``: :func:`~revgnn.data.ogbn.load_ogbn`, :func:`~revgnn.data.synthetic.proteins_like`,
:func:`~revgnn.data.pyg_data.load_pyg_file`, :func:`~revgnn.data.pyg_data.load_pyg_dataset`,
:func:`~revgnn.data.pyg_data.from_pyg`) and applies it once, at the end of loading; its choices are
:data:`NodeOrder`'s, checked with the rest of the data config before anything loads. A model's
outputs on the reordered graph are, mapped back, the same as on the original one up to the
summation order; training differs only where randomness is drawn per node id (the random
partitions, dropout masks), i.e. it draws other but equally distributed samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:  # torch is imported in the functions: loaders' signatures use NodeOrder for --help
    from torch import Tensor

__all__ = [
    "NODE_ORDERS",
    "NodeOrder",
    "node_order",
    "reorder",
    "original_ids",
    "in_original_order",
    "bandwidth",
]

#: The orders :func:`node_order` computes: the choices of every loader's ``node_order`` option.
NodeOrder = Literal["none", "rcm", "degree"]
NODE_ORDERS = get_args(NodeOrder)


def bandwidth(edge_index: "Tensor") -> int:
    r""":math:`\max_{(j, i) \in E} |i - j|`: how far apart in memory the endpoints of an edge can be."""
    if edge_index.numel() == 0:
        return 0
    return int((edge_index[0] - edge_index[1]).abs().max())


def node_order(edge_index: "Tensor", num_nodes: int, method: NodeOrder = "rcm") -> "Tensor":
    """``order`` ``[N]`` int64, a permutation of the nodes: new id ``k`` is original node ``order[k]``.

    Args:
        edge_index (torch.Tensor): ``[2, E]`` (source, destination); ids must lie in ``[0, N)``.
        num_nodes (int): :math:`N`.
        method (str, optional): ``"rcm"``, ``"degree"`` or ``"none"`` (see the module docstring).
            (default: :obj:`"rcm"`)
    """
    if method not in NODE_ORDERS:
        raise ValueError(f"node order {method!r}: choose one of {', '.join(NODE_ORDERS)}")
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
        raise ValueError(
            f"edge_index holds node ids outside [0, {num_nodes}): check the graph before ordering it"
        )
    import torch

    if method == "none" or num_nodes == 0:
        return torch.arange(num_nodes)
    if method == "degree":
        degree = torch.bincount(edge_index[1], minlength=num_nodes)
        return torch.sort(degree, descending=True, stable=True).indices
    import numpy as np
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    # the pattern of A + A^T: RCM wants a symmetric structure; int32 indices halve its memory
    index_dtype = np.int32 if num_nodes < 2**31 else np.int64
    row = torch.cat([edge_index[0], edge_index[1]]).numpy().astype(index_dtype, copy=False)
    col = torch.cat([edge_index[1], edge_index[0]]).numpy().astype(index_dtype, copy=False)
    pattern = csr_matrix((np.ones(row.size, dtype=np.int8), (row, col)), shape=(num_nodes, num_nodes))
    del row, col
    order = reverse_cuthill_mckee(pattern, symmetric_mode=True)
    return torch.from_numpy(np.ascontiguousarray(order, dtype=np.int64))


def reorder(dataset, method: NodeOrder = "rcm"):
    """The :class:`~revgnn.data.NodeDataset` ``dataset`` relabelled by :func:`node_order` (in place,
    and returned): ``x`` (with proteins' species one-hot, the partition's per-node input), ``y`` and
    the split indices follow the nodes, the edges are relabelled and re-sorted by destination with
    their features, and ``info["node_order"]`` holds the order (composed with an earlier one, so it
    always maps to the ids of the data as loaded). ``"none"`` returns it unchanged."""
    import torch

    if method not in NODE_ORDERS:
        raise ValueError(f"node order {method!r}: choose one of {', '.join(NODE_ORDERS)}")
    if method == "none":
        return dataset
    n = dataset.num_nodes
    order = node_order(dataset.edge_index, n, method)
    new_id = torch.empty_like(order)
    new_id[order] = torch.arange(n)
    dataset.x = dataset.x.index_select(0, order)
    dataset.y = dataset.y.index_select(0, order)
    dataset.split_idx = {k: new_id.index_select(0, v).sort().values for k, v in dataset.split_idx.items()}
    dataset.edge_index = new_id[dataset.edge_index]
    del new_id
    earlier = dataset.info.get("node_order")
    dataset.info["node_order"] = order if earlier is None else earlier.index_select(0, order)
    dataset.info["node_order_method"] = method
    return dataset.sorted_by_destination()


def original_ids(dataset) -> "Tensor":
    """The original (as loaded) id of every node of ``dataset``: ``out[k]`` for node ``k`` now."""
    import torch

    order = dataset.info.get("node_order")
    return torch.arange(dataset.num_nodes) if order is None else order


def in_original_order(dataset, per_node: "Tensor") -> "Tensor":
    """``per_node`` (``[N, ...]``, row ``k`` for node ``k`` of ``dataset``) with its rows in the
    original ids: row ``original_ids(dataset)[k]`` of the result is row ``k``. Per-node results that
    leave a run (``revgnn-evaluate --predictions``) go through this, and ids through
    :func:`original_ids` (SAR part files' ``node_ids``), so neither depends on the order the data
    was trained in. The tensor itself where no order was applied."""
    import torch

    if per_node.size(0) != dataset.num_nodes:
        raise ValueError(f"{per_node.size(0)} rows for the {dataset.num_nodes} nodes of {dataset.name}")
    order = dataset.info.get("node_order")
    if order is None:
        return per_node
    out = torch.empty_like(per_node)
    out[order.to(per_node.device)] = per_node
    return out
