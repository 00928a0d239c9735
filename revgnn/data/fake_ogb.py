"""Writes tiny raw OGB node-property data sets in OGB's on-disk layout.

ogbn-proteins (and arxiv, products) cannot be downloaded everywhere; tests and the ``--smoke`` mode of
``scripts/reproduce_proteins.py`` write a small raw directory with this module and load it through the
real :class:`ogb.nodeproppred.PygNodePropPredDataset` code, so the whole loading path is exercised.
Layout (headerless gzip CSV)::

    <root>/ogbn_proteins/raw/{edge, edge-feat, node-label, node_species, num-node-list, num-edge-list}.csv.gz
    <root>/ogbn_proteins/split/species/{train, valid, test}.csv.gz      # beside raw/, not in it
"""
from __future__ import annotations

import os
import os.path as osp

import numpy as np
import pandas as pd

__all__ = ["write_fake_ogbn"]

# name -> (dir, split dir, node features, edge features, tasks or classes, extra node file)
_SPECS = {
    "ogbn-proteins": ("ogbn_proteins", "species", 0, 8, 112, "node_species"),
    "ogbn-arxiv": ("ogbn_arxiv", "time", 128, 0, 40, "node_year"),
    "ogbn-products": ("ogbn_products", "sales_ranking", 100, 0, 47, None),
}


def _write(path: str, array) -> None:
    pd.DataFrame(np.asarray(array)).to_csv(path, header=False, index=False, compression="gzip")


def write_fake_ogbn(root: str, name: str = "ogbn-proteins", num_nodes: int = 64, avg_degree: int = 6,
                    num_species: int = 8, seed: int = 0) -> str:
    """Writes a random raw data set ``name`` under ``root``; returns its directory.

    Labels are random (this is for plumbing, not learning). For ogbn-proteins every node gets one of
    ``num_species`` NCBI-like taxonomy ids and the split is by species, as in the real data set; edges are
    stored once (OGB adds the reverse direction). Arxiv's and products' splits are random thirds.
    """
    if name not in _SPECS:
        raise ValueError(f"no fake layout for {name!r}; expected one of {sorted(_SPECS)}")
    dir_name, split_name, node_dim, edge_dim, out_dim, extra = _SPECS[name]
    rng = np.random.default_rng(seed)
    path = osp.join(root, dir_name)
    raw, split = osp.join(path, "raw"), osp.join(path, "split", split_name)
    os.makedirs(raw, exist_ok=True)
    os.makedirs(split, exist_ok=True)

    num_edges = num_nodes * avg_degree // 2
    src = rng.integers(0, num_nodes, num_edges)
    dst = (src + rng.integers(1, num_nodes, num_edges)) % num_nodes  # no self loops
    _write(osp.join(raw, "edge.csv.gz"), np.stack([src, dst], 1))
    _write(osp.join(raw, "num-node-list.csv.gz"), [num_nodes])
    _write(osp.join(raw, "num-edge-list.csv.gz"), [num_edges])
    if edge_dim:
        _write(osp.join(raw, "edge-feat.csv.gz"), rng.random((num_edges, edge_dim)).round(3))
    if node_dim:
        _write(osp.join(raw, "node-feat.csv.gz"), rng.standard_normal((num_nodes, node_dim)).round(4))
    if name == "ogbn-proteins":
        labels = (rng.random((num_nodes, out_dim)) < 0.3).astype(np.int64)
        taxa = np.array([3702, 4932, 6239, 7227, 7955, 9606, 10090, 511145])[:num_species]
        species = taxa[np.arange(num_nodes) % num_species]
        _write(osp.join(raw, "node-label.csv.gz"), labels)
        _write(osp.join(raw, "node_species.csv.gz"), species)
        group = np.arange(num_nodes) % num_species
        train = np.nonzero(group < num_species - 3)[0]
        valid = np.nonzero(group == num_species - 3)[0]
        test = np.nonzero(group >= num_species - 2)[0]
    else:
        _write(osp.join(raw, "node-label.csv.gz"), rng.integers(0, out_dim, (num_nodes, 1)))
        if extra:
            _write(osp.join(raw, f"{extra}.csv.gz"), rng.integers(2000, 2020, (num_nodes, 1)))
        perm = rng.permutation(num_nodes)
        train, valid, test = np.array_split(perm, 3)
    for split_name_, idx in (("train", train), ("valid", valid), ("test", test)):
        _write(osp.join(split, f"{split_name_}.csv.gz"), np.sort(idx))
    return path
