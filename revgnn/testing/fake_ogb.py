"""Writes tiny raw OGB data sets in OGB's on-disk layout: :func:`write_fake_ogbn` (node property:
ogbn-proteins, arxiv, products) and :func:`write_fake_ogbg` (graph property: ogbg-molhiv).

OGB's data cannot be downloaded everywhere; tests and ``revgnn-reproduce --smoke`` write a small raw
directory with this module and load it through OGB's real loaders, so the whole loading path is
exercised.
Layout (headerless gzip CSV)::

    <root>/ogbn_proteins/raw/{edge, edge-feat, node-label, node_species, num-node-list, num-edge-list}.csv.gz
    <root>/ogbn_proteins/split/species/{train, valid, test}.csv.gz      # beside raw/, not in it
"""

from __future__ import annotations

import os
import os.path as osp
from typing import Optional

import numpy as np
import torch

__all__ = ["write_fake_ogbn", "write_fake_ogbg"]


#: rows formatted and compressed at a time: bounds the writer's memory at full data set sizes
_CHUNK_ROWS = 1 << 20


def _fields(scaled: np.ndarray, digits: int, decimals: int) -> np.ndarray:
    """The fixed-width text of integers ``scaled`` (``value * 10**decimals``): ``[..., width]`` bytes, a
    sign or ``0``, ``digits`` zero-padded digits with ``.`` before the last ``decimals``."""
    magnitude = np.abs(scaled)
    point = 1 if decimals else 0
    out = np.empty((*scaled.shape, 1 + digits + point), dtype=np.uint8)
    out[..., 0] = np.where(scaled < 0, ord("-"), ord("0"))
    for k in range(digits):  # the k-th digit from the left
        column = 1 + k + (point if k >= digits - decimals else 0)
        out[..., column] = ord("0") + (magnitude // 10 ** (digits - 1 - k)) % 10
    if decimals:
        out[..., 1 + digits - decimals] = ord(".")
    return out


def _text_rows(values: np.ndarray, decimals: int) -> np.ndarray:
    """``values`` ``[n, m]`` as headerless CSV text, ``[n, width]`` bytes, without per-value Python
    formatting: every field is fixed-width (:func:`_fields`; leading zeros parse as the same number in
    ``pandas.read_csv``, which OGB's loaders use). Where the values span fewer than 2^22 integers (ids,
    labels, rounded features) each field is one lookup in a table of their texts."""
    scaled = np.rint(values * 10.0**decimals).astype(np.int64) if decimals else values.astype(np.int64)
    n, m = scaled.shape
    low, high = (int(scaled.min()), int(scaled.max())) if scaled.size else (0, 0)
    digits = max(decimals + 1, len(str(max(abs(low), abs(high)))))
    if high - low < 1 << 22:
        text = _fields(np.arange(low, high + 1), digits, decimals)[scaled - low]
    else:
        text = _fields(scaled, digits, decimals)
    out = np.empty((n, m, text.shape[-1] + 1), dtype=np.uint8)
    out[:, :, :-1] = text
    out[:, :, -1] = ord(",")
    out[:, -1, -1] = ord("\n")
    return out.reshape(n, -1)


def _write(path: str, array, decimals: int = 0) -> None:
    """``array`` (one value per row, or ``[n, m]``) as a headerless gzip CSV in OGB's layout; floats are
    written with ``decimals`` decimals (the caller rounds its data to them). Vectorised and written in
    chunks of :data:`_CHUNK_ROWS` rows, so a raw directory of ogbn-proteins' or ogbn-products' full
    size is written in minutes."""
    import gzip

    values = np.asarray(array)
    values = values.reshape(-1, 1) if values.ndim < 2 else values
    if not decimals and not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"{path}: float values need decimals")
    with gzip.open(path, "wb", compresslevel=1) as f:
        for start in range(0, len(values), _CHUNK_ROWS):
            f.write(_text_rows(values[start : start + _CHUNK_ROWS], decimals).tobytes())


# OGB's additional node files -> a writer of plausible values (rng, num_nodes, num_species)
_TAXA = np.array([3702, 4932, 6239, 7227, 7955, 9606, 10090, 511145])  # ogbn-proteins' NCBI ids
_EXTRA_NODE_FILES = {
    "node_species": lambda rng, n, k: _TAXA[:k][np.arange(n) % k],
    "node_year": lambda rng, n, k: rng.integers(2000, 2020, (n, 1)),
}


def _distinct_pairs(rng: np.random.Generator, num_nodes: int, count: int):
    """``(src, dst)`` of ``count`` random node pairs (at most all of them), no self loop and no pair
    twice in either direction, each in a random direction: with the reverse edges OGB adds, the graph
    has no duplicate edge (whose count the loader would report)."""
    count = min(count, num_nodes * (num_nodes - 1) // 2)
    keys = np.empty(0, dtype=np.int64)
    while keys.size < count:  # draw, keep the first copy of every unordered pair, in drawing order
        a = rng.integers(0, num_nodes, 2 * count)
        b = (a + rng.integers(1, num_nodes, 2 * count)) % num_nodes  # no self loops
        keys = np.concatenate([keys, np.minimum(a, b) * num_nodes + np.maximum(a, b)])
        keys = keys[np.sort(np.unique(keys, return_index=True)[1])]
    low, high = np.divmod(keys[:count], num_nodes)
    flip = rng.random(count) < 0.5
    return np.where(flip, high, low), np.where(flip, low, high)


def write_fake_ogbn(
    root: str,
    name: str = "ogbn-proteins",
    num_nodes: int = 64,
    avg_degree: int = 6,
    num_species: int = 8,
    seed: int = 0,
    num_edges: Optional[int] = None,
) -> str:
    """Writes a random raw data set ``name`` (a key of :data:`revgnn.data.ogbn.OGBN_SPECS`) under
    ``root``; returns its directory.

    The layout follows OGB's ``master.csv`` (split directory, extra node files, tasks or classes) and
    the feature widths of the data set's :class:`~revgnn.data.ogbn.OgbnSpec`. Labels are random (this is
    for plumbing, not learning): 0/1 per task for binary tasks, a class id for multiclass ones. Where the
    split is by species (ogbn-proteins) every node gets one of ``num_species`` NCBI-like taxonomy ids and
    train/valid/test never share one, as in the real data set; other splits are random thirds. Edges are
    distinct node pairs without self loops, each stored once (OGB adds the reverse direction where the
    real data set has it), so the graph has no duplicate edges: ``num_edges`` of them (default:
    ``num_nodes * avg_degree // 2``; e.g. ogbn-proteins' real 39,561,252 over 132,534 nodes).
    """
    from revgnn.data.ogbn import OGBN_SPECS, _meta

    if name not in OGBN_SPECS:
        raise ValueError(f"no fake layout for {name!r}; expected one of {sorted(OGBN_SPECS)}")
    spec, meta = OGBN_SPECS[name], _meta(name)
    if meta["split"] == "species" and not 4 <= num_species <= len(_TAXA):
        raise ValueError(
            f"num_species must be in [4, {len(_TAXA)}] (train, valid, 2 test), got {num_species}"
        )
    rng = np.random.default_rng(seed)
    path = osp.join(root, name.replace("-", "_"))
    raw, split = osp.join(path, "raw"), osp.join(path, "split", meta["split"])
    os.makedirs(raw, exist_ok=True)
    os.makedirs(split, exist_ok=True)

    count = num_nodes * avg_degree // 2 if num_edges is None else num_edges
    src, dst = _distinct_pairs(rng, num_nodes, count)
    num_edges = src.size
    _write(osp.join(raw, "edge.csv.gz"), np.stack([src, dst], 1))
    _write(osp.join(raw, "num-node-list.csv.gz"), [num_nodes])
    _write(osp.join(raw, "num-edge-list.csv.gz"), [num_edges])
    if spec.edge_channels:
        _write(osp.join(raw, "edge-feat.csv.gz"), rng.random((num_edges, spec.edge_channels)).round(3), 3)
    if spec.node_channels:
        feats = rng.standard_normal((num_nodes, spec.node_channels)).round(4)
        _write(osp.join(raw, "node-feat.csv.gz"), feats, 4)
    if meta["task type"] == "binary classification":
        labels = (rng.random((num_nodes, int(meta["num tasks"]))) < 0.3).astype(np.int64)
    else:
        labels = rng.integers(0, int(meta["num classes"]), (num_nodes, 1))
    _write(osp.join(raw, "node-label.csv.gz"), labels)
    for extra in meta["additional node files"].split(","):
        if extra != "None":
            _write(osp.join(raw, f"{extra}.csv.gz"), _EXTRA_NODE_FILES[extra](rng, num_nodes, num_species))
    if meta["split"] == "species":
        group = np.arange(num_nodes) % num_species
        train = np.nonzero(group < num_species - 3)[0]
        valid = np.nonzero(group == num_species - 3)[0]
        test = np.nonzero(group >= num_species - 2)[0]
    else:
        train, valid, test = np.array_split(rng.permutation(num_nodes), 3)
    for split_name, idx in (("train", train), ("valid", valid), ("test", test)):
        _write(osp.join(split, f"{split_name}.csv.gz"), np.sort(idx))
    return path


def write_fake_ogbg(root: str, name: str = "ogbg-molhiv", num_graphs: int = 40, seed: int = 0) -> str:
    """Writes a tiny raw ``ogbg-molhiv`` under ``root`` in OGB's layout; returns its directory::

        <root>/ogbg_molhiv/raw/{edge, edge-feat, node-feat, graph-label, num-node-list,
                                num-edge-list}.csv.gz                     # headerless gzip CSV
        <root>/ogbg_molhiv/split/scaffold/{train, valid, test}.csv.gz    # beside raw/, not in it

    The molecules come from :func:`~revgnn.data.graph_dataset.mol_like` (so the labels are
    learnable); each bond is stored once and OGB adds the reverse direction, as in the real files.
    """
    if name != "ogbg-molhiv":
        raise ValueError(f"no fake layout for {name!r}; only 'ogbg-molhiv'")
    from revgnn.data.graph_dataset import mol_like

    ds = mol_like(num_graphs=num_graphs, min_nodes=6, max_nodes=12, distance=3, seed=seed)
    path = osp.join(root, "ogbg_molhiv")
    raw, split = osp.join(path, "raw"), osp.join(path, "split", "scaffold")
    os.makedirs(raw, exist_ok=True)
    os.makedirs(split, exist_ok=True)

    edges, edge_feats = [], []
    for g in ds.graphs:
        half = g.edge_index.size(1) // 2  # first half: one direction of every bond
        edges.append(g.edge_index[:, :half].T.numpy())
        edge_feats.append(g.edge_attr[:half].numpy())
    _write(osp.join(raw, "edge.csv.gz"), np.concatenate(edges))
    _write(osp.join(raw, "edge-feat.csv.gz"), np.concatenate(edge_feats))
    _write(osp.join(raw, "node-feat.csv.gz"), torch.cat([g.x for g in ds.graphs]).numpy())
    _write(osp.join(raw, "graph-label.csv.gz"), torch.cat([g.y for g in ds.graphs]).numpy())
    _write(osp.join(raw, "num-node-list.csv.gz"), [g.num_nodes for g in ds.graphs])
    _write(osp.join(raw, "num-edge-list.csv.gz"), [len(e) for e in edges])
    # every split gets both classes (OGB's ROC-AUC needs them): interleave positives and negatives
    labels = np.array([int(g.y) for g in ds.graphs])
    pos, neg = np.nonzero(labels == 1)[0], np.nonzero(labels == 0)[0]
    order = [int(i) for pair in zip(pos, neg) for i in pair]
    order += [int(i) for i in np.concatenate([pos[len(neg) :], neg[len(pos) :]])]
    k = max(2, num_graphs // 10)
    splits = {"valid": order[:k], "test": order[k : 2 * k], "train": order[2 * k :]}
    for key, idx in splits.items():
        _write(osp.join(split, f"{key}.csv.gz"), np.sort(np.array(idx, dtype=np.int64)))
    return path
