"""ogbn-proteins / -arxiv / -products through OGB's own loader, with its two traps defused.

1. ``PygNodePropPredDataset`` calls ``input()`` ("Will you update the dataset now?") when the data set
   directory exists without its ``RELEASE_v<version>.txt`` marker (e.g. raw files copied by hand), which
   blocks a job or raises ``EOFError`` without a terminal. :func:`load_ogbn` answers "no" the way OGB
   would keep the data: it writes the marker, and says so.
2. With torch >= 2.6, ``torch.load`` defaults to ``weights_only=True`` and refuses OGB's processed file.
   The loader allows exactly the three PyG classes that file contains, and only while OGB loads it
   (``torch.serialization.safe_globals``), instead of switching ``weights_only`` off globally.

Downloads are off by default (``allow_download=False``): a missing data set is an error that says which
files are expected where, rather than a prompt or a hang on a machine without internet access.

Each supported data set is one entry of :data:`OGBN_SPECS`: how its graph and features are prepared
for the recipes (ogbn-proteins gets the paper's features, Li et al.: per-node sum of the 8-d edge
features ‖ species one-hot, cached in ``<root>/ogbn_proteins/processed/``; ogbn-arxiv's citations are
symmetrised) and the raw feature widths :mod:`revgnn.testing.fake_ogb` writes. Everything else (split,
task type, tasks or classes, extra node files, download URL) is OGB's own ``master.csv``. Adding a node
data set is one entry here plus one ``revgnn/configs/data/*.yaml`` file.

This module imports torch only inside its functions, so that the config schema can read
:func:`load_ogbn`'s signature for ``--help``.
"""

from __future__ import annotations

import logging
import os
import os.path as osp
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict

from revgnn.data.ordering import NodeOrder

if TYPE_CHECKING:
    from revgnn.data.node_dataset import NodeDataset

__all__ = [
    "load_ogbn",
    "OGBN_SPECS",
    "OGBN_DATASETS",
    "OgbnSpec",
    "ogb_safe_globals",
    "DUPLICATE_EDGES",
    "duplicate_edge_copies",
    "last_copies",
]

log = logging.getLogger(__name__)

_FEATURE_CACHE = "revgnn_features_v1.pt"


def ogb_safe_globals():
    """Context manager allowing the PyG storage classes OGB pickles, for ``torch.load`` only."""
    import torch
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import GlobalStorage

    return torch.serialization.safe_globals([DataEdgeAttr, DataTensorAttr, GlobalStorage])


def _meta(name: str):
    """OGB's meta data of ``name``: from ``ogb.graphproppred`` for ``ogbg-*``, else ``ogb.nodeproppred``."""
    import pandas as pd

    if name.startswith("ogbg-"):
        import ogb.graphproppred as package
    else:
        import ogb.nodeproppred as package
    master = pd.read_csv(
        osp.join(osp.dirname(package.__file__), "master.csv"), index_col=0, keep_default_na=False
    )
    return master[name]


def _required_raw_files(meta) -> list[str]:
    labels = "graph-label.csv.gz" if str(meta.name).startswith("ogbg-") else "node-label.csv.gz"
    files = ["edge.csv.gz", labels, "num-node-list.csv.gz", "num-edge-list.csv.gz"]
    if meta["has_node_attr"] == "True":
        files.append("node-feat.csv.gz")
    if meta["has_edge_attr"] == "True":
        files.append("edge-feat.csv.gz")
    files += [f"{f}.csv.gz" for f in meta["additional node files"].split(",") if f != "None"]
    return files


def check_layout(name: str, root: str, allow_download: bool) -> str:
    """Validates the on-disk layout; returns the data set directory. Writes a missing release marker."""
    meta = _meta(name)
    dir_name = name.replace("-", "_")
    if osp.exists(osp.join(root, dir_name + "_pyg")):
        dir_name += "_pyg"
    path = osp.join(root, dir_name)
    processed = osp.join(path, "processed", "geometric_data_processed.pt")
    split_dir = osp.join(path, "split", meta["split"])
    if not osp.isdir(path):
        if allow_download:
            return path
        raise FileNotFoundError(
            f"{name}: no data set directory {osp.abspath(path)!r}. Download {meta['url']} and unzip it "
            f"there (so that {osp.join(path, 'raw')} exists), point data.root at its parent, or set "
            f"data.allow_download=true on a machine with internet access."
        )
    if not osp.exists(processed):
        missing = [f for f in _required_raw_files(meta) if not osp.exists(osp.join(path, "raw", f))]
        if missing:
            raise FileNotFoundError(
                f"{name}: {osp.join(path, 'raw')} lacks {', '.join(missing)} "
                f"(and no processed file exists); the data set is incomplete."
            )
    missing = [
        f"{s}.csv.gz"
        for s in ("train", "valid", "test")
        if not osp.exists(osp.join(split_dir, f"{s}.csv.gz"))
    ]
    if missing and not osp.exists(osp.join(split_dir, "split_dict.pt")):
        raise FileNotFoundError(f"{name}: split directory {split_dir} lacks {', '.join(missing)}")
    marker = osp.join(path, f"RELEASE_v{meta['version']}.txt")
    if not osp.exists(marker):
        # OGB would prompt interactively here; keeping the data is its "no" answer.
        log.warning("%s: %s missing; writing it so that OGB does not prompt (data kept as is)", name, marker)
        with open(marker, "w") as f:
            f.write(f"# written by revgnn: data set placed manually (OGB version {meta['version']})\n")
    return path


_RAW_STAMP = "revgnn_raw_stamp.json"


def _raw_files(path: str) -> Dict[str, list]:
    """``{relative path: [size, mtime_ns]}`` of every file under ``raw/`` and ``split/``."""
    out = {}
    for sub in ("raw", "split"):
        for dirpath, _, names in os.walk(osp.join(path, sub)):
            for n in names:
                full = osp.join(dirpath, n)
                st = os.stat(full)
                out[osp.relpath(full, path)] = [st.st_size, st.st_mtime_ns]
    return out


def _sha256(file: str) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _stale_cache(name: str, path: str) -> list:
    """The raw files that changed since OGB's ``processed/`` cache was built from them (by size and
    mtime, then content), per the stamp written next to it; ``[]`` when the cache is current. A cache
    without a stamp (built by OGB itself or an older revgnn) is trusted and stamped."""
    import json

    processed = osp.join(path, "processed")
    stamp_path = osp.join(processed, _RAW_STAMP)
    if not osp.isdir(processed) or not osp.exists(stamp_path):
        return []
    with open(stamp_path) as f:
        stamp = json.load(f)
    now = _raw_files(path)
    changed = []
    for rel in sorted(set(stamp) | set(now)):
        old, cur = stamp.get(rel), now.get(rel)
        if old is None or cur is None:
            changed.append(rel)
        elif old[:2] != cur and (old[0] != cur[0] or old[2] != _sha256(osp.join(path, rel))):
            changed.append(rel)
    return changed


def _write_stamp(path: str) -> None:
    import json

    files = {
        rel: [size, mtime, _sha256(osp.join(path, rel))] for rel, (size, mtime) in _raw_files(path).items()
    }
    target = osp.join(path, "processed", _RAW_STAMP)
    tmp = f"{target}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(files, f, indent=1)
    os.replace(tmp, target)


def _check_edge_count(name: str, path: str, dataset) -> None:
    """OGB slices ``edge.csv.gz`` by ``num-edge-list.csv.gz`` without checking that the rows are
    there: a short file trains on a silently smaller graph. Refuses it (and its cache)."""
    import pandas as pd

    meta = _meta(name)
    said = int(pd.read_csv(osp.join(path, "raw", "num-edge-list.csv.gz"), header=None).values.sum())
    factor = 2 if meta["add_inverse_edge"] == "True" else 1
    data = dataset._data if hasattr(dataset, "_data") else dataset.data
    have = int(data.edge_index.size(1)) // factor
    if have != said:
        import shutil

        shutil.rmtree(osp.join(path, "processed"), ignore_errors=True)
        raise ValueError(
            f"{name}: {osp.join(path, 'raw', 'edge.csv.gz')} holds {have} edges but "
            f"num-edge-list.csv.gz says {said}: the raw files are truncated or from different "
            f"versions; replace them with the complete set (nothing was cached)"
        )


def _node_split(dataset, meta) -> Dict[str, Any]:
    """The split of an OGB node data set, read as ``get_idx_split`` reads it but copied into tensors:
    ``pandas``' ``.values`` of a one-column file is a read-only array (copy-on-write, pandas >= 3),
    and OGB's ``torch.from_numpy`` of it warned "The given NumPy array is not writable" on every
    load. A ``split_dict.pt`` (OGB's short-cut) is still OGB's to read."""
    import pandas as pd
    import torch

    split_dir = osp.join(dataset.root, "split", meta["split"])
    if osp.isfile(osp.join(split_dir, "split_dict.pt")):
        return dataset.get_idx_split()
    return {
        s: torch.tensor(
            pd.read_csv(osp.join(split_dir, f"{s}.csv.gz"), header=None)[0].to_numpy(), dtype=torch.long
        )
        for s in ("train", "valid", "test")
    }


def load_ogb_dataset(name: str, root: str):
    if name.startswith("ogbg-"):
        from ogb.graphproppred import PygGraphPropPredDataset as Dataset
    else:
        from ogb.nodeproppred import PygNodePropPredDataset as Dataset
    meta = _meta(name)
    path = osp.join(root, name.replace("-", "_"))
    if osp.exists(path + "_pyg"):
        path += "_pyg"
    downloading = not osp.isdir(path)
    stale = [] if downloading else _stale_cache(name, path)
    if stale:
        import shutil

        log.warning(
            "%s: the raw files changed since %s was built (%s): rebuilding it",
            name,
            osp.join(path, "processed"),
            ", ".join(stale),
        )
        shutil.rmtree(osp.join(path, "processed"))
    fresh = downloading or not osp.isdir(osp.join(path, "processed"))
    with ogb_safe_globals(), warnings.catch_warnings():
        # OGB's process() wraps pandas' read-only label array with torch.from_numpy; that tensor is
        # only saved to processed/ and the data set is then read back from the file, so nothing
        # ever writes through it: torch's "not writable" warning is about no tensor a run uses.
        warnings.filterwarnings(
            "ignore", message="The given NumPy array is not writable", category=UserWarning
        )
        try:
            dataset = Dataset(name=name, root=root)
            split_idx = dataset.get_idx_split() if name.startswith("ogbg-") else _node_split(dataset, meta)
        except Exception as e:  # pandas parser errors, gzip/EOF errors, unpickling errors, bad shapes
            if downloading:
                raise RuntimeError(
                    f"{name}: downloading {meta['url']} failed ({type(e).__name__}: {e}); "
                    "is this machine offline? Download the archive elsewhere and unzip it under "
                    f"{osp.abspath(root)} (so that "
                    f"{osp.join(osp.abspath(path), 'raw')} exists), then run with data.allow_download=false."
                ) from e
            raise RuntimeError(
                f"{name}: OGB could not read the data set under {osp.abspath(root)} "
                f"({type(e).__name__}: {e}). "
                f"A raw file is probably corrupt or truncated; if a processed/ directory exists, delete it "
                f"so that OGB re-processes the raw files."
            ) from e
    if fresh and not name.startswith("ogbg-"):
        _check_edge_count(name, path, dataset)
    if fresh or not osp.exists(osp.join(path, "processed", _RAW_STAMP)):
        _write_stamp(path)
    return dataset, split_idx


def _proteins_features(path: str, data) -> Dict[str, Any]:
    """Paper node features for ogbn-proteins, cached next to OGB's processed file. Takes OGB's edge
    tensors out of ``data`` (see :class:`OgbnSpec`): the destination sort replaces them one at a time,
    and a current cache is read only once OGB's copy is gone."""
    import torch

    from revgnn.data.node_dataset import species_one_hot, sum_edge_features
    from revgnn.data.random_parts import sort_by_destination

    cache = osp.join(path, "processed", _FEATURE_CACHE)
    num_nodes, num_edges = data.num_nodes, data.edge_index.size(1)
    if osp.exists(cache):
        cached = torch.load(cache, weights_only=True, mmap=True)  # its shapes; no data read yet
        current = cached["x"].size(0) == num_nodes and cached["edge_index"].size(1) == num_edges
        del cached
        if current:
            data.edge_index = data.edge_attr = None
            return torch.load(cache, weights_only=True)
        log.warning("ogbn-proteins: stale feature cache %s (shape mismatch); rebuilding", cache)
    edge_index, edge_attr = data.edge_index, data.edge_attr.float()
    data.edge_index = data.edge_attr = None  # these names hold the only references now
    perm = sort_by_destination(edge_index, num_nodes)  # copies of an edge keep the file's order
    edge_index = edge_index[:, perm].contiguous()
    edge_attr = edge_attr[perm].contiguous()
    del perm
    one_hot, _ = species_one_hot(data.node_species)
    x = torch.cat([sum_edge_features(edge_index, edge_attr, num_nodes), one_hot], dim=1)
    feats = {"x": x, "edge_index": edge_index, "edge_attr": edge_attr}
    tmp = cache + f".tmp{os.getpid()}"
    torch.save(feats, tmp)
    os.replace(tmp, cache)
    return feats


def _proteins_graph(path: str, data) -> Dict[str, Any]:
    """The paper's proteins features (cached) and the width of the species one-hot they end with."""
    feats = _proteins_features(path, data)
    species_channels = int(feats["x"].size(1) - feats["edge_attr"].size(1))
    return {**feats, "species_channels": species_channels}


def _node_features(data):
    """OGB's node features, taken out of ``data``, as a row-major float tensor: OGB stores them
    column-major (pandas' layout), where every row a part gathers spans the whole array (and the
    whole-graph evaluation would copy them); the copy is made here once, OGB's freed with it."""
    x, data.x = data.x, None
    return x.float().contiguous()


def _symmetrised_graph(path: str, data) -> Dict[str, Any]:
    """OGB's node features; each directed edge also reversed (RevGAT's arxiv recipe), duplicates removed."""
    import torch

    edge_index = torch.unique(torch.cat([data.edge_index, data.edge_index.flip(0)], dim=1), dim=1)
    return {"x": _node_features(data), "edge_index": edge_index, "edge_attr": None}


def _graph_as_given(path: str, data) -> Dict[str, Any]:
    """OGB's node features and edges (already both directions where OGB adds inverse edges)."""
    edge_index, data.edge_index = data.edge_index, None
    return {"x": _node_features(data), "edge_index": edge_index, "edge_attr": None}


@dataclass(frozen=True)
class OgbnSpec:
    """What revgnn adds to OGB's ``master.csv`` for one node data set.

    Attributes:
        prepare (Callable): ``(data set directory, OGB's Data) -> dict`` with ``x``, ``edge_index``,
            ``edge_attr`` (or :obj:`None`) and optionally ``species_channels``: the graph and features
            the recipes train on. :func:`load_ogbn` hands it the only references to OGB's tensors, so
            it may take them out of the ``Data`` (set them to :obj:`None`) to free each one as soon as
            it is converted: at ogbn-proteins' size each copy of the graph is 3.8 GB.
        node_channels (int): Columns of the raw ``node-feat.csv.gz`` (0: the data set has none).
        edge_channels (int): Columns of the raw ``edge-feat.csv.gz`` (0: none).
    """

    prepare: Callable[[str, Any], Dict[str, Any]]
    node_channels: int = 0
    edge_channels: int = 0


#: The OGB node data sets :func:`load_ogbn` reads: one entry each.
OGBN_SPECS: Dict[str, OgbnSpec] = {
    "ogbn-proteins": OgbnSpec(_proteins_graph, edge_channels=8),
    "ogbn-arxiv": OgbnSpec(_symmetrised_graph, node_channels=128),
    "ogbn-products": OgbnSpec(_graph_as_given, node_channels=100),
}
OGBN_DATASETS = tuple(OGBN_SPECS)

# OGB's task types -> NodeDataset.task
_TASKS = {"binary classification": "multilabel", "multiclass classification": "multiclass"}


#: What :func:`load_ogbn` does with repeated (source, destination) pairs.
DUPLICATE_EDGES = ("keep", "merge")


def last_copies(edge_index, num_nodes: int):
    """``[E]`` bool: :obj:`True` for the last copy of every distinct (source, destination) pair (so for
    every edge when none repeats). Edges sorted by destination (a
    :class:`~revgnn.data.node_dataset.NodeDataset`'s order) are compared with their neighbours in one
    pass; others are sorted first."""
    import torch

    from revgnn.data.random_parts import destination_key, is_destination_sorted

    key = destination_key(edge_index, num_nodes)
    last = torch.ones_like(key, dtype=torch.bool)
    if is_destination_sorted(key):
        torch.ne(key[1:], key[:-1], out=last[:-1])
        return last
    key, perm = torch.sort(key, stable=True)  # copies of an edge keep their order
    last[:-1] = key[1:] != key[:-1]
    del key
    mask = torch.zeros_like(last)
    mask[perm[last]] = True
    return mask


def duplicate_edge_copies(edge_index, num_nodes: int):
    """``(count, last)``: how many edges repeat an earlier (source, destination) pair, and the ids of
    the last copy of every distinct pair, ascending (all ids when there is no repeat)."""
    mask = last_copies(edge_index, num_nodes)
    return int(mask.numel() - mask.sum()), mask.nonzero().view(-1)


def _handle_duplicates(ds: NodeDataset, mode: str) -> NodeDataset:
    """Reports the repeated edges of ``ds`` (sorted by destination) and, with ``mode="merge"``,
    keeps one copy of each."""
    last = last_copies(ds.edge_index, ds.num_nodes)
    edges = ds.num_edges
    count = int(edges - last.sum())
    if not count:
        log.info("%s: no duplicate edges among %d", ds.name, edges)
        return ds
    log.warning(
        "%s: %d of %d edges repeat a (source, destination) pair (%d distinct pairs); "
        "data.duplicate_edges=%s: %s",
        ds.name,
        count,
        edges,
        edges - count,
        mode,
        "each copy is aggregated"
        if mode == "keep"
        else "one edge per pair, with the last copy's features (node features still sum every copy)",
    )
    if mode == "merge":
        ds.edge_index = ds.edge_index[:, last]
        ds.edge_attr = None if ds.edge_attr is None else ds.edge_attr[last]
    return ds


def load_ogbn(
    name: str,
    root: str = "data",
    allow_download: bool = False,
    duplicate_edges: str = "keep",
    node_order: NodeOrder = "none",
) -> NodeDataset:
    """Loads an OGB node-property data set into a :class:`~revgnn.data.node_dataset.NodeDataset`.

    Args:
        name (str): A data set of :data:`OGBN_SPECS`: ``"ogbn-proteins"``, ``"ogbn-arxiv"`` or
            ``"ogbn-products"``.
        root (str): Directory holding ``ogbn_<name>/`` (default: :obj:`"data"`).
        allow_download (bool): Let OGB download a missing data set (default: :obj:`False`).
        duplicate_edges (str): Edges that repeat a (source, destination) pair, counted and logged
            on every load: ``"keep"`` aggregates every copy; ``"merge"`` keeps one edge per pair
            with the features of its last copy in the file, as the official RevGNN code's sparse
            adjacency and edge-id dictionary do (the paper experiments set it; ogbn-proteins has
            none, so both give the same graph there). Node features computed from the edges
            (ogbn-proteins' summed edge features) use every copy either way, as the official code's.
            (default: :obj:`"keep"`)
        node_order (str): ``"none"``, ``"rcm"`` or ``"degree"``: relabel the nodes so that
            neighbours lie close in memory (:func:`~revgnn.data.ordering.reorder`), once, after the
            features are prepared; every per-node output is mapped back to OGB's ids. (default:
            :obj:`"none"`)
    """
    from revgnn.data.node_dataset import NodeDataset
    from revgnn.data.ordering import reorder
    from revgnn.utils.memory import release_free_memory

    if name not in OGBN_SPECS:
        raise ValueError(
            f"unknown OGB node data set {name!r}; expected one of {OGBN_DATASETS} "
            "(a new one is an entry of revgnn.data.ogbn.OGBN_SPECS)"
        )
    if duplicate_edges not in DUPLICATE_EDGES:
        raise ValueError(
            f"duplicate_edges must be one of {', '.join(DUPLICATE_EDGES)}, got {duplicate_edges!r}"
        )
    path = check_layout(name, root, allow_download)
    dataset, split_idx = load_ogb_dataset(name, root)
    data = dataset[0]  # a shallow copy: with the data set gone it holds OGB's only references
    task = _TASKS[_meta(name)["task type"]]
    num_classes = dataset.num_tasks if task == "multilabel" else dataset.num_classes
    del dataset
    release_free_memory()  # what OGB's processing freed: the allocator would keep it resident
    y = data.y.float() if task == "multilabel" else data.y.view(-1, 1).long()
    graph = OGBN_SPECS[name].prepare(path, data)
    del data
    ds = NodeDataset(
        name=name,
        y=y,
        split_idx={k: v.view(-1).long() for k, v in split_idx.items()},
        task=task,
        num_classes=num_classes,
        evaluator=name,
        **graph,
    )
    del graph  # the data set holds the only references: its sort replaces the edges one at a time
    ds = _handle_duplicates(ds.sorted_by_destination(), duplicate_edges)
    release_free_memory()  # OGB's copy and the sort's, likewise
    return reorder(ds, node_order)
