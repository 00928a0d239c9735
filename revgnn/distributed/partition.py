r"""Graph partitioning for SAR (sequential aggregation and rematerialisation): the algorithm.

A graph with :math:`N` nodes is cut into :math:`P` parts. Nodes are relabelled
so that part :math:`p` owns the contiguous range
:math:`[\mathrm{offsets}_p, \mathrm{offsets}_{p+1})` of new ids. Worker
:math:`p` stores every edge :math:`j \to i` whose *target* :math:`i` it owns
(so all messages into its nodes are computed locally), split into :math:`P`
shards by the part that owns the *source* :math:`j`:

.. math::
    \mathcal{E}_p = \bigcup_{q=0}^{P-1} \mathcal{E}_{q \to p}, \qquad
    \mathcal{E}_{q \to p} = \{ (j, i) \in \mathcal{E} :
    \pi(j) = q,\ \pi(i) = p \}.

Edges are stored shard by shard (``shard_ptr``), each shard sorted by target
then source, together with the original edge ids and the sliced edge
attributes. The parts are written and read back, checked, by
:mod:`revgnn.distributed.part_files`; ``revgnn-partition``
(:mod:`revgnn.cli.partition`) runs :func:`partition_dataset` on a data set of the
``data`` group.

Python::

    stats = partition_dataset(proteins_like(), 'parts/pl4', num_parts=4)
    parts = build_partitions(edge_index, num_nodes, num_parts=4)  # in memory
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from .part_files import FORMAT_VERSION, partition_fingerprint, save_partitions

if TYPE_CHECKING:  # torch is imported where it is used: ``--help`` stays fast
    from torch import Tensor

__all__ = ["partition_nodes", "build_partitions", "partition_dataset"]


def _metis_parts(edge_index: Tensor, num_nodes: int, num_parts: int, seed: int) -> Tensor:
    import pymetis
    import torch

    row, col = edge_index
    keep = row != col
    row, col = row[keep], col[keep]
    # METIS wants a symmetric adjacency without duplicates or self loops.
    sym = torch.cat([torch.stack([row, col]), torch.stack([col, row])], 1)
    key = torch.unique(sym[0] * num_nodes + sym[1])
    src, dst = key // num_nodes, key % num_nodes
    xadj = torch.zeros(num_nodes + 1, dtype=torch.long)
    xadj[1:] = torch.cumsum(torch.bincount(src, minlength=num_nodes), 0)
    opts = pymetis.Options(seed=seed)
    if hasattr(pymetis, "CSRAdjacency"):  # pymetis >= 2025.2
        adj = pymetis.CSRAdjacency(xadj.numpy(), dst.numpy())
        _, membership = pymetis.part_graph(num_parts, adj, options=opts)
    else:
        _, membership = pymetis.part_graph(num_parts, xadj=xadj.numpy(), adjncy=dst.numpy(), options=opts)
    return torch.as_tensor(membership, dtype=torch.long)


def partition_nodes(
    edge_index: Tensor, num_nodes: int, num_parts: int, method: str = "metis", seed: int = 0
) -> Tensor:
    r"""Assigns every node to one of ``num_parts`` parts.

    Args:
        edge_index (torch.Tensor): ``[2, E]`` edges (source, target).
        num_nodes (int): number of nodes :math:`N`.
        num_parts (int): number of parts :math:`P`.
        method (str, optional): ``"metis"`` (minimise the edge cut with
            METIS via ``pymetis``) or ``"random"`` (uniform, balanced in
            expectation). (default: ``"metis"``)
        seed (int, optional): random seed. (default: ``0``)

    Returns:
        torch.Tensor: ``[N]`` part id of each node.
    """
    import torch

    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    if method not in ("metis", "random"):
        raise ValueError(f"Unknown partition method '{method}' (use 'metis' or 'random')")
    if num_parts == 1:
        return torch.zeros(num_nodes, dtype=torch.long)
    if method == "metis":
        return _metis_parts(edge_index, num_nodes, num_parts, seed)
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, num_parts, (num_nodes,), generator=gen)


def build_partitions(
    edge_index: Tensor,
    num_nodes: int,
    num_parts: int,
    method: str = "metis",
    seed: int = 0,
    parts: Optional[Tensor] = None,
    edge_attr: Optional[Tensor] = None,
    node_data: Optional[Dict[str, Tensor]] = None,
    original_ids: Optional[Tensor] = None,
) -> List[dict]:
    r"""Partitions a graph and builds one self-contained dict per worker.

    Args:
        edge_index (torch.Tensor): ``[2, E]`` edges :math:`j \to i` in PyG's
            (source, target) convention.
        num_nodes (int): number of nodes.
        num_parts (int): number of workers :math:`P`.
        method (str, optional): see :func:`partition_nodes`.
            (default: ``"metis"``)
        seed (int, optional): random seed. (default: ``0``)
        parts (torch.Tensor, optional): a precomputed ``[N]`` assignment;
            overrides ``method``. Parts may be empty. (default: ``None``)
        edge_attr (torch.Tensor, optional): ``[E, ...]`` edge attributes,
            sliced into the shards. (default: ``None``)
        node_data (dict, optional): ``[N, ...]`` node tensors (features,
            labels, masks) sliced to each part. (default: ``None``)
        original_ids (torch.Tensor, optional): ``[N]``: the id ``node_ids``
            reports for each node, e.g. a reordered data set's ids as loaded
            (:func:`revgnn.data.ordering.original_ids`). (default: ``None``:
            the ids of ``edge_index``)

    Returns:
        list of dict: entry ``p`` holds ``rank``, ``num_parts``, ``num_nodes``,
        ``num_edges``, ``method``, ``offsets`` (``[P+1]``), ``node_ids``
        (original ids of the local nodes in new order), ``src`` (new global
        id of each local edge's source), ``dst`` (local id of its target),
        ``shard_ptr`` (``[P+1]``), ``edge_ids`` (original edge ids),
        ``edge_attr``, ``node_data`` and ``fingerprint``
        (:func:`~revgnn.distributed.part_files.partition_fingerprint`).
    """
    import torch

    edge_index = edge_index.long()
    E = edge_index.size(1)
    if edge_index.numel() and int(edge_index.max()) >= num_nodes:
        raise ValueError("edge_index refers to a node id >= num_nodes")
    method_used = method if parts is None else "given"
    if parts is None:
        parts = partition_nodes(edge_index, num_nodes, num_parts, method, seed)
    parts = parts.long()
    if parts.numel() != num_nodes or (num_nodes and (int(parts.min()) < 0 or int(parts.max()) >= num_parts)):
        raise ValueError("parts must hold a part id in [0, num_parts) for every node")
    if edge_attr is not None and edge_attr.size(0) != E:
        raise ValueError("edge_attr must have one row per edge")

    # New ids: ordered by (part, original id) -> contiguous ranges.
    order = torch.argsort(parts * num_nodes + torch.arange(num_nodes))
    new_id = torch.empty(num_nodes, dtype=torch.long)
    new_id[order] = torch.arange(num_nodes)
    counts = torch.bincount(parts, minlength=num_parts)
    offsets = torch.zeros(num_parts + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(counts, 0)

    src_new, dst_new = new_id[edge_index[0]], new_id[edge_index[1]]
    src_part, dst_part = parts[edge_index[0]], parts[edge_index[1]]

    out = []
    for p in range(num_parts):
        lo, hi = int(offsets[p]), int(offsets[p + 1])
        eids = (dst_part == p).nonzero().view(-1)
        # Sort by (source part, target, source): shard-major, CSR-friendly.
        key = (src_part[eids] * (num_nodes + 1) + (dst_new[eids] - lo)) * (num_nodes + 1) + src_new[eids]
        eids = eids[torch.argsort(key)]
        shard_ptr = torch.zeros(num_parts + 1, dtype=torch.long)
        shard_ptr[1:] = torch.cumsum(torch.bincount(src_part[eids], minlength=num_parts), 0)
        # a copy: a view would make torch.save write all of `order`
        local_nodes = order[lo:hi].clone()
        out.append(
            {
                "format_version": FORMAT_VERSION,
                "rank": p,
                "num_parts": num_parts,
                "num_nodes": num_nodes,
                "num_edges": E,
                "method": method_used,
                "offsets": offsets.clone(),
                "node_ids": local_nodes if original_ids is None else original_ids[local_nodes],
                "src": src_new[eids],
                "dst": dst_new[eids] - lo,
                "shard_ptr": shard_ptr,
                "edge_ids": eids,
                "edge_attr": None if edge_attr is None else edge_attr[eids],
                "node_data": {k: v[local_nodes] for k, v in (node_data or {}).items()},
            }
        )
    fingerprint = partition_fingerprint(out)
    for part in out:
        part["fingerprint"] = fingerprint
    return out


def partition_dataset(
    ds: Any,
    out: str,
    num_parts: int,
    method: str = "metis",
    seed: int = 0,
    data_config: Optional[dict] = None,
) -> dict:
    r"""Partitions a node-level data set for SAR and writes it to ``out``.

    Node features ``x``, labels ``y`` and the split masks (``train_mask``,
    ``valid_mask``, ``test_mask``) go into each part's ``node_data``, the
    edge features into ``edge_attr``; ``meta.json`` records the data set's
    ``name``, ``task``, ``num_classes``, ``evaluator`` and
    ``species_channels`` under ``"dataset"``.

    Args:
        ds (revgnn.data.NodeDataset): the graph, e.g.
            ``hydra.utils.instantiate(cfg.data)``.
        out (str): directory for ``part_{p}.pt`` and ``meta.json``.
        num_parts (int): number of workers :math:`P`.
        method (str, optional): ``"metis"`` or ``"random"``, see
            :func:`partition_nodes`. (default: ``"metis"``)
        seed (int, optional): seed of the partitioner. (default: ``0``)
        data_config (dict, optional): the ``data`` config ``ds`` was built
            from, recorded as ``meta["dataset"]["config"]`` so that
            ``revgnn-train backend=sar`` can check its own ``data`` group
            against it. (default: ``None``)

    Returns:
        dict: ``out``, ``nodes``, ``edges``, ``parts``, ``method``,
        ``cut_edges`` (edges whose endpoints lie in different parts),
        ``part_sizes`` and ``seconds``.
    """
    import torch

    from revgnn.data.node_dataset import NodeDataset
    from revgnn.data.ordering import original_ids

    if not isinstance(ds, NodeDataset):
        from revgnn.data.graph_dataset import GraphDataset

        if isinstance(ds, GraphDataset):
            raise ValueError(
                f"SAR trains full-graph on node-level data; {ds.name} is "
                f"graph-level (many small graphs): train it without SAR "
                f"(revgnn-train backend=local)"
            )
        raise TypeError(f"partition_dataset needs a revgnn.data.NodeDataset, got {type(ds).__name__}")
    t = time.perf_counter()
    n = ds.num_nodes
    node_data = {"x": ds.x, "y": ds.y}
    for split, idx in ds.split_idx.items():
        mask = torch.zeros(n, dtype=torch.bool)
        mask[idx] = True
        node_data[f"{split}_mask"] = mask
    parts = build_partitions(
        ds.edge_index,
        n,
        num_parts,
        method,
        seed,
        edge_attr=ds.edge_attr,
        node_data=node_data,
        original_ids=original_ids(ds),
    )
    info = dict(
        name=ds.name,
        task=ds.task,
        num_classes=ds.num_classes,
        evaluator=ds.evaluator,
        species_channels=ds.species_channels,
    )
    if data_config is not None:
        info["config"] = data_config
    save_partitions(parts, out, {"dataset": info})
    own = [int(pt["shard_ptr"][pt["rank"] + 1] - pt["shard_ptr"][pt["rank"]]) for pt in parts]
    return {
        "out": out,
        "nodes": n,
        "edges": ds.num_edges,
        "parts": num_parts,
        "method": method,
        "cut_edges": ds.num_edges - sum(own),
        "part_sizes": [len(pt["node_ids"]) for pt in parts],
        "seconds": round(time.perf_counter() - t, 2),
    }
