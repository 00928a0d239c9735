"""The real OGB loading path on tiny raw directories: no prompt, no download, clear errors."""
import gzip
import os

import pytest
import torch

from revgnn.data.fake_ogb import write_fake_ogbn
from revgnn.data.ogbn import load_ogbn


@pytest.fixture(autouse=True)
def _no_stdin(monkeypatch):
    # OGB's update prompt would raise here instead of blocking: the loader must never reach it.
    def refuse(*args):
        raise AssertionError(f"OGB prompted: {args}")
    monkeypatch.setattr("builtins.input", refuse)


def test_proteins_features_split_and_cache(tmp_path):
    write_fake_ogbn(str(tmp_path), "ogbn-proteins", num_nodes=48, avg_degree=4)
    ds = load_ogbn("ogbn-proteins", str(tmp_path))
    assert ds.x.shape == (48, 16) and ds.y.shape == (48, 112) and ds.edge_attr.shape == (ds.num_edges, 8)
    # OGB adds the inverse edges; node feature = sum of incoming edge features || species one-hot
    assert ds.num_edges == 2 * 48 * 4 // 2
    manual = torch.zeros(48, 8).index_add_(0, ds.edge_index[1], ds.edge_attr)
    assert torch.allclose(ds.x[:, :8], manual, atol=1e-5)
    assert torch.equal(ds.x[:, 8:].sum(1), torch.ones(48))
    key = ds.edge_index[1] * 48 + ds.edge_index[0]
    assert bool((key[1:] >= key[:-1]).all())
    species = ds.x[:, 8:].argmax(1)
    assert not set(species[ds.split_idx["train"]].tolist()) & set(species[ds.split_idx["test"]].tolist())
    cache = tmp_path / "ogbn_proteins" / "processed" / "revgnn_features_v1.pt"
    assert cache.exists() and (tmp_path / "ogbn_proteins" / "RELEASE_v1.txt").exists()
    again = load_ogbn("ogbn-proteins", str(tmp_path))  # from OGB's processed file and our cache
    assert torch.equal(again.x, ds.x) and torch.equal(again.edge_index, ds.edge_index)


@pytest.mark.parametrize("name,dim,classes", [("ogbn-arxiv", 128, 40), ("ogbn-products", 100, 47)])
def test_arxiv_products(tmp_path, name, dim, classes):
    write_fake_ogbn(str(tmp_path), name, num_nodes=30, avg_degree=4)
    ds = load_ogbn(name, str(tmp_path))
    assert ds.x.shape == (30, dim) and ds.y.shape == (30, 1) and ds.num_classes == classes
    assert ds.task == "multiclass" and ds.edge_attr is None


def test_missing_directory_names_path_and_url(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"ogbn_proteins.*proteins\.zip"):
        load_ogbn("ogbn-proteins", str(tmp_path / "nowhere"))


def test_missing_raw_file_is_named(tmp_path):
    path = write_fake_ogbn(str(tmp_path), "ogbn-proteins", num_nodes=24)
    os.remove(os.path.join(path, "raw", "edge-feat.csv.gz"))
    with pytest.raises(FileNotFoundError, match="edge-feat.csv.gz"):
        load_ogbn("ogbn-proteins", str(tmp_path))


def test_corrupt_raw_file_is_reported(tmp_path):
    path = write_fake_ogbn(str(tmp_path), "ogbn-proteins", num_nodes=24)
    target = os.path.join(path, "raw", "edge.csv.gz")
    with open(target, "rb") as f:
        blob = f.read()
    with open(target, "wb") as f:
        f.write(blob[: len(blob) // 2])  # truncated download
    with pytest.raises(RuntimeError, match="corrupt"):
        load_ogbn("ogbn-proteins", str(tmp_path))


def test_unknown_name():
    with pytest.raises(ValueError, match="ogbn-papers"):
        load_ogbn("ogbn-papers", "data")
