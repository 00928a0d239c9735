r"""Graph partitioning for SAR (sequential aggregation and rematerialisation).

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
attributes. Parts are written one file per worker (``part_{p}.pt``: tensors,
ints, strings and dicts only, read with ``torch.load(weights_only=True)``)
plus a ``meta.json`` holding the data set's description, the sha256 of every
part file and the partitioning's fingerprint (a hash of the node assignment
and the edges). ``meta.json`` covers itself too: ``meta_sha256`` holds the
sha256 of each of its other fields, so an edited, added or removed field
(``num_nodes``, ``dataset.num_classes``, ``part_sha256``, ...) is a
:class:`PartitionMismatchError` naming the file and the field, never a run on
a description that no longer fits the part files. A worker reads only its own
file, and checks its hash before unpickling it: a corrupted, truncated,
renamed or foreign file is a :class:`PartitionMismatchError` naming it. :func:`load_partition_checked`
then makes all workers compare fingerprints, so a host holding another
partitioning's directory stops every worker before training.

Command line (Hydra; ``data`` is the same config group as ``revgnn-train``'s)::

    revgnn-partition data=proteins_like num_parts=4 out=parts/pl4
    revgnn-partition data=ogbn_proteins data.root=/data num_parts=8 \
        out=parts/p8
    torchrun --nproc_per_node=4 -m revgnn.train backend=sar \
        backend.partition_dir=parts/pl4

Python::

    stats = partition_dataset(proteins_like(), 'parts/pl4', num_parts=4)
    part = load_partition('parts/pl4', rank=1, world_size=4)  # one worker
    part = load_partition_checked('parts/pl4')  # all torchrun workers at once
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from omegaconf import MISSING

if TYPE_CHECKING:  # torch is imported where it is used: ``--help`` stays fast
    from torch import Tensor

__all__ = [
    "PartitionMismatchError",
    "partition_nodes",
    "build_partitions",
    "partition_fingerprint",
    "save_partitions",
    "load_meta",
    "meta_digests",
    "load_partition",
    "load_partition_checked",
    "partition_dataset",
    "PartitionConfig",
    "main",
]

# 2: part files are checked against their sha256 in meta.json, the
# fingerprint covers the node assignment and the edges, weights_only loading.
# 3: meta.json's own fields are hashed (meta_sha256).
FORMAT_VERSION = 3


class PartitionMismatchError(RuntimeError):
    """Partition files do not fit the running job: wrong world size, a
    corrupted or foreign file, or workers reading different partitionings."""


def _repartition(root: str, num_parts: Any = "<P>", verb="re-partition") -> str:
    return f"{verb}: revgnn-partition data=<data set> num_parts={num_parts} out={root}"


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


def partition_fingerprint(parts: List[dict]) -> str:
    r"""The sha256 (hex) identifying one partitioning, computed from all its
    parts: format version, :math:`N`, :math:`E`, ``offsets``, every part's
    node order (``node_ids``, i.e. the node assignment itself), edge count and
    edges (``src``, ``dst``). Two partitionings with equal part sizes but
    different assignments get different fingerprints."""
    import torch

    first = parts[0]
    h = hashlib.sha256(
        f"revgnn-partition:{FORMAT_VERSION}:{first['num_nodes']}:"
        f"{first['num_edges']}:{first['offsets'].tolist()}".encode()
    )
    for part in parts:
        h.update(f":{part['rank']}:{part['src'].numel()}:".encode())
        for key in ("node_ids", "src", "dst"):
            h.update(part[key].to(torch.int64).contiguous().numpy())
    return h.hexdigest()


def build_partitions(
    edge_index: Tensor,
    num_nodes: int,
    num_parts: int,
    method: str = "metis",
    seed: int = 0,
    parts: Optional[Tensor] = None,
    edge_attr: Optional[Tensor] = None,
    node_data: Optional[Dict[str, Tensor]] = None,
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

    Returns:
        list of dict: entry ``p`` holds ``rank``, ``num_parts``, ``num_nodes``,
        ``num_edges``, ``method``, ``offsets`` (``[P+1]``), ``node_ids``
        (original ids of the local nodes in new order), ``src`` (new global
        id of each local edge's source), ``dst`` (local id of its target),
        ``shard_ptr`` (``[P+1]``), ``edge_ids`` (original edge ids),
        ``edge_attr``, ``node_data`` and ``fingerprint``
        (:func:`partition_fingerprint`).
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
                "node_ids": local_nodes,
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


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    buf = memoryview(bytearray(1 << 20))
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(buf[:n])
    return h.hexdigest()


def _meta_leaves(meta: Any, prefix: str = "") -> Dict[str, Any]:
    """``{dotted path: value}`` of every leaf of ``meta`` (a JSON object); an
    empty object is a leaf of its own, so removing all its entries is seen."""
    if not isinstance(meta, dict) or not meta:
        return {prefix.rstrip("."): meta}
    out: Dict[str, Any] = {}
    for key, value in meta.items():
        if not prefix and key == "meta_sha256":
            continue
        out.update(_meta_leaves(value, f"{prefix}{key}."))
    return out


def meta_digests(meta: dict) -> Dict[str, str]:
    """The sha256 (hex) of each field of ``meta`` (a ``meta.json`` as JSON
    reads it back), by dotted path (``dataset.num_classes``), its own
    ``meta_sha256`` left out: what ``meta_sha256`` holds. The value is hashed
    as canonical JSON (sorted keys, no spaces), so the digests depend on the
    contents only, not on how the file is laid out."""
    return {
        path: hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        for path, value in _meta_leaves(meta).items()
    }


def _check_meta_digests(meta: dict, path: str, root: str) -> None:
    """Raises :class:`PartitionMismatchError` naming ``path`` and every field
    of ``meta`` that is not the one ``revgnn-partition`` wrote."""
    saved = meta.get("meta_sha256")
    num_parts = meta.get("num_parts", "<P>")
    if not isinstance(saved, dict):
        raise PartitionMismatchError(
            f"{path} has no meta_sha256 (the hashes of its fields): it was edited, or written by an "
            f"older revgnn-partition; {_repartition(root, num_parts, verb='re-run it')}"
        )
    now = meta_digests(meta)
    saved_tops = {str(f).split(".", 1)[0] for f in saved}
    changed: List[str] = []
    for field in sorted(set(saved) | set(now)):
        if saved.get(field) == now.get(field):
            continue
        what = "removed" if field not in now else "added" if field not in saved else "edited"
        if what == "added" and any(str(f).startswith(f"{field}.") for f in saved):
            continue  # a section emptied: its removed fields say so
        top = field.split(".", 1)[0]
        if (what == "removed" and top not in meta) or (what == "added" and top not in saved_tops):
            field = top  # a whole section went or came: name it once
        if f"{field} ({what})" not in changed:
            changed.append(f"{field} ({what})")
    if changed:
        shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
        raise PartitionMismatchError(
            f"{path} is not as revgnn-partition wrote it: {shown}. It describes the part files "
            f"and is never edited by hand; copy the directory again or {_repartition(root, num_parts)}"
        )


def save_partitions(parts: List[dict], root: str, extra_meta: Optional[dict] = None) -> None:
    """Writes ``part_{p}.pt`` for every worker, then ``meta.json`` with the
    sizes, the fingerprint, each part file's sha256, ``extra_meta`` (e.g.
    the data set's description under ``"dataset"``) and ``meta_sha256``
    (:func:`meta_digests` of all of that).

    An old ``meta.json`` in ``root`` is removed first, so an interrupted run
    leaves a directory that fails to load instead of one whose meta vouches
    for a mix of old and new part files.
    """
    import torch

    os.makedirs(root, exist_ok=True)
    meta_path = os.path.join(root, "meta.json")
    if os.path.exists(meta_path):
        os.remove(meta_path)
    digests = {}
    for part in parts:
        name = f"part_{part['rank']}.pt"
        torch.save(part, os.path.join(root, name))
        digests[name] = _file_sha256(os.path.join(root, name))
    first = parts[0]
    meta = {
        **(extra_meta or {}),
        "format_version": FORMAT_VERSION,
        "num_parts": first["num_parts"],
        "num_nodes": first["num_nodes"],
        "num_edges": first["num_edges"],
        "method": first["method"],
        "fingerprint": first["fingerprint"],
        "part_sizes": (first["offsets"][1:] - first["offsets"][:-1]).tolist(),
        "edges_per_part": [int(p["src"].numel()) for p in parts],
        "node_data": sorted(first["node_data"]),
        "edge_attr": first["edge_attr"] is not None,
        "part_sha256": digests,
    }
    meta = json.loads(json.dumps(meta))  # hashed as it will be read back (tuples are lists, ...)
    meta["meta_sha256"] = meta_digests(meta)
    tmp = f"{meta_path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=2)
    os.replace(tmp, meta_path)


def load_meta(root: str) -> dict:
    """Reads ``root/meta.json`` and checks it is of this format and that
    every field is the one ``revgnn-partition`` wrote (``meta_sha256``);
    raises :class:`PartitionMismatchError` naming the file (and the fields)
    and saying to (re-)partition if not."""
    path = os.path.join(root, "meta.json")
    if not os.path.isfile(path):
        raise PartitionMismatchError(
            f"{path} not found: copy the partition directory to this host "
            f"or {_repartition(root, verb='partition the graph first')}"
        )
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise PartitionMismatchError(f"{path} cannot be read ({e}); {_repartition(root)}") from e
    if not isinstance(meta, dict):
        raise PartitionMismatchError(f"{path} holds no JSON object; {_repartition(root)}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise PartitionMismatchError(
            f"{path} is partition format {meta.get('format_version')}, but "
            f"this revgnn reads format {FORMAT_VERSION} (part files and "
            f"meta.json's own fields hashed); {_repartition(root, meta.get('num_parts', '<P>'))}"
        )
    _check_meta_digests(meta, path, root)
    return meta


def load_partition(root: str, rank: int, world_size: int) -> dict:
    """Loads worker ``rank``'s part of the partitioning in ``root`` for a
    job of ``world_size`` workers.

    The file's sha256 is compared with ``meta.json`` before it is
    unpickled (with ``weights_only=True``), so a corrupted, truncated,
    renamed or foreign part file raises :class:`PartitionMismatchError`
    naming it, as do a missing file and a wrong world size. That every
    worker read the *same* partitioning is checked collectively by
    :func:`load_partition_checked`.

    Returns:
        dict: the part, as built by :func:`build_partitions`.
    """
    import torch

    meta = load_meta(root)
    P = meta["num_parts"]
    if P != world_size:
        raise PartitionMismatchError(
            f"{root} holds {P} parts but the job runs {world_size} workers; "
            f"launch {P} workers or {_repartition(root, world_size)}"
        )
    name = f"part_{rank}.pt"
    path = os.path.join(root, name)
    if not os.path.isfile(path):
        raise PartitionMismatchError(
            f"{path} is missing: copy all of {root} to every host, or {_repartition(root, P)}"
        )
    expected, actual = meta["part_sha256"].get(name), _file_sha256(path)
    if actual != expected:
        raise PartitionMismatchError(
            f"{path} does not match {root}/meta.json (sha256 {actual[:16]}, "
            f"expected {str(expected)[:16]}): the file is corrupted, "
            f"truncated, renamed or from another partitioning; copy the "
            f"directory again or {_repartition(root, P)}"
        )
    try:
        part = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise PartitionMismatchError(
            f"{path} cannot be loaded ({type(e).__name__}: {e}); {_repartition(root, P)}"
        ) from e
    if (part["rank"], part["num_parts"], part["fingerprint"]) != (
        rank,
        P,
        meta["fingerprint"],
    ):  # only a hand-edited meta.json
        raise PartitionMismatchError(
            f"{path} is part {part['rank']} of {part['num_parts']} "
            f"(fingerprint {part['fingerprint'][:16]}), not part {rank} of "
            f"{P} of {root}/meta.json ({meta['fingerprint'][:16]}); "
            f"{_repartition(root, P)}"
        )
    return part


def load_partition_checked(root: str) -> dict:
    """Loads this worker's part like :func:`load_partition`, and makes every
    worker agree before any of them goes on (collective).

    Inside a process group every rank loads ``part_{rank}.pt`` of ``root``
    (``root`` may be a different local copy on each host), then all ranks
    exchange (host, fingerprint, error). If any rank failed, or the ranks
    read partitionings with different fingerprints (a host holding another
    partitioning's directory), *every* rank raises
    :class:`PartitionMismatchError` listing each failing rank's file and
    reason, so no worker is left waiting on a peer that gave up. Without a
    process group it is ``load_partition(root, 0, 1)``.

    Returns:
        dict: this worker's part, as :func:`load_partition` returns it.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return load_partition(root, 0, 1)
    from .comm import all_gather_object_checked

    rank, world = dist.get_rank(), dist.get_world_size()
    part, cause, error = None, None, None
    try:
        part = load_partition(root, rank, world)
    except Exception as e:  # report it: every rank must reach the exchange
        cause = e
        error = (
            str(e)
            if isinstance(e, PartitionMismatchError)
            else f"{os.path.join(root, f'part_{rank}.pt')}: {type(e).__name__}: {e}"
        )
    fingerprint = None if part is None else part["fingerprint"]
    reports = all_gather_object_checked(
        (socket.gethostname(), os.path.abspath(root), fingerprint, error),
        "partition check (load_partition_checked)",
    )
    failed = [f"  rank {r} on {host}: {err}" for r, (host, _, _, err) in enumerate(reports) if err]
    if failed:
        raise PartitionMismatchError(
            f"partition check failed on {len(failed)} of {world} workers:\n" + "\n".join(failed)
        ) from cause
    if len({fp for _, _, fp, _ in reports}) > 1:
        raise PartitionMismatchError(
            "the workers read different partitionings (a host holds another "
            "partitioning's directory); give every host a copy of the same "
            "one:\n"
            + "\n".join(
                f"  rank {r} on {host}: {path}/part_{r}.pt has fingerprint {fp[:16]}"
                for r, (host, path, fp, _) in enumerate(reports)
            )
        )
    return part


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
        ds.edge_index, n, num_parts, method, seed, edge_attr=ds.edge_attr, node_data=node_data
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


# ---- the revgnn-partition command -------------------------------------------


class PartitionMethod(str, Enum):
    """``metis``: minimum edge cut (``pymetis``). ``random``: uniform."""

    metis = "metis"
    random = "random"


@dataclass
class PartitionConfig:
    """Schema of ``revgnn-partition`` (``revgnn/configs/partition.yaml``).

    Attributes:
        data: a node-level option of the ``data`` group, as for
            ``revgnn-train`` (``proteins_like``, ``ogbn_proteins``, ...).
        num_parts: number of SAR workers :math:`P` (one part file each).
        method: ``metis`` or ``random``.
        seed: seed of the partitioner.
        out: directory for ``part_{p}.pt`` and ``meta.json``.
    """

    data: Any = MISSING
    num_parts: int = MISSING
    method: PartitionMethod = PartitionMethod.metis
    seed: int = 0
    out: str = MISSING


def register_partition_config() -> None:
    """Stores :class:`PartitionConfig` (and the ``data`` schemas) in Hydra's
    ConfigStore as ``partition_schema`` (idempotent)."""
    from hydra.core.config_store import ConfigStore

    import revgnn.config  # noqa: F401  (registers the data group's schemas)

    ConfigStore.instance().store(name="partition_schema", node=PartitionConfig)


def partition_from_config(cfg: Any) -> dict:
    """Runs a composed ``partition.yaml``: instantiates ``cfg.data`` and
    calls :func:`partition_dataset`; returns its statistics."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    for key, example in (("num_parts", "num_parts=4"), ("out", "out=parts/pl4")):
        if OmegaConf.is_missing(cfg, key):
            raise ValueError(f"{key} is required, e.g. {example}")
    if cfg.num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {cfg.num_parts}")
    return partition_dataset(
        instantiate(cfg.data),
        cfg.out,
        cfg.num_parts,
        cfg.method.value,
        cfg.seed,
        OmegaConf.to_container(cfg.data, resolve=True),
    )


def main() -> None:
    """``revgnn-partition``: partitions a data set of the ``data`` group and
    prints the statistics of :func:`partition_dataset` as one JSON line."""
    import hydra

    register_partition_config()

    @hydra.main(version_base="1.3", config_path="pkg://revgnn.configs", config_name="partition")
    def run(cfg) -> None:
        print(json.dumps(partition_from_config(cfg)))

    run()


if __name__ == "__main__":
    main()
