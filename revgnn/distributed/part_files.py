r"""The part-file format of SAR: what ``revgnn-partition`` writes, and the checks every worker
runs before it trusts what it reads.

A partitioning (:mod:`revgnn.distributed.partition`) is written one file per worker
(``part_{p}.pt``: tensors, ints, strings and dicts only, read with
``torch.load(weights_only=True)``) plus a ``meta.json`` holding the data set's description, the
sha256 of every part file and the partitioning's fingerprint (a hash of the node assignment and
the edges). ``meta.json`` covers itself too: ``meta_sha256`` holds the sha256 of each of its other
fields, so an edited, added or removed field (``num_nodes``, ``dataset.num_classes``,
``part_sha256``, ...) is a :class:`PartitionMismatchError` naming the file and the field, never a
run on a description that no longer fits the part files. A worker reads only its own file, and
checks its hash before unpickling it: a corrupted, truncated, renamed or foreign file is a
:class:`PartitionMismatchError` naming it. :func:`load_partition_checked` then makes all workers
compare fingerprints, so a host holding another partitioning's directory stops every worker before
training.

Python::

    save_partitions(build_partitions(edge_index, num_nodes, 4), 'parts/pl4')
    part = load_partition('parts/pl4', rank=1, world_size=4)  # one worker
    part = load_partition_checked('parts/pl4')  # all torchrun workers at once
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from typing import Any, Dict, List, Optional

__all__ = [
    "FORMAT_VERSION",
    "PartitionMismatchError",
    "partition_fingerprint",
    "save_partitions",
    "load_meta",
    "meta_digests",
    "load_partition",
    "load_partition_checked",
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
        dict: the part, as built by
        :func:`~revgnn.distributed.partition.build_partitions`.
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
