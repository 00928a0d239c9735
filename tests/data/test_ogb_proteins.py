"""The real OGB loading path on tiny raw directories: no prompt, no download, clear errors."""

import os

import pytest
import torch

from revgnn.data.ogbn import OGBN_SPECS, load_ogbn
from revgnn.testing.fake_ogb import write_fake_ogbn


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


@pytest.mark.filterwarnings("error::UserWarning")  # OGB's harmless "not writable" one is filtered
@pytest.mark.parametrize("name,dim,classes", [("ogbn-arxiv", 128, 40), ("ogbn-products", 100, 47)])
def test_arxiv_products(tmp_path, name, dim, classes):
    write_fake_ogbn(str(tmp_path), name, num_nodes=30, avg_degree=4)
    ds = load_ogbn(name, str(tmp_path))
    assert ds.x.shape == (30, dim) and ds.y.shape == (30, 1) and ds.num_classes == classes
    assert ds.task == "multiclass" and ds.edge_attr is None
    assert ds.x.is_contiguous()  # OGB's are column-major: rows gathered per part, or none at all


@pytest.mark.parametrize("name", sorted(OGBN_SPECS))
def test_every_spec_has_a_fake_layout_that_loads_with_its_widths(tmp_path, name):
    spec = OGBN_SPECS[name]
    write_fake_ogbn(str(tmp_path), name, num_nodes=24, avg_degree=4)
    ds = load_ogbn(name, str(tmp_path))
    assert ds.edge_channels == (spec.edge_channels or None)
    assert ds.in_channels == (spec.node_channels or ds.species_channels + spec.edge_channels)
    assert ds.y.size(1) == (ds.num_classes if ds.task == "multilabel" else 1)


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


def test_changed_raw_files_rebuild_the_stale_cache(tmp_path, caplog):
    """OGB loads processed/ whatever raw/ holds now: after the raw files change, the cache is
    rebuilt (naming the changed files) instead of silently serving the old graph."""
    write_fake_ogbn(str(tmp_path), "ogbn-proteins", num_nodes=48, avg_degree=4)
    assert load_ogbn("ogbn-proteins", str(tmp_path)).num_edges == 2 * 48 * 4 // 2
    write_fake_ogbn(str(tmp_path), "ogbn-proteins", num_nodes=48, avg_degree=8, seed=1)
    with caplog.at_level("WARNING"):
        ds = load_ogbn("ogbn-proteins", str(tmp_path))
    assert ds.num_edges == 2 * 48 * 8 // 2
    assert "rebuilding" in caplog.text and "edge.csv.gz" in caplog.text
    caplog.clear()
    again = load_ogbn("ogbn-proteins", str(tmp_path))  # current cache: no rebuild
    assert torch.equal(again.edge_index, ds.edge_index) and "rebuilding" not in caplog.text


def test_edge_file_shorter_than_its_count_is_refused(tmp_path):
    import numpy as np
    import pandas as pd

    path = write_fake_ogbn(str(tmp_path), "ogbn-proteins", num_nodes=40, avg_degree=4)
    edges = pd.read_csv(os.path.join(path, "raw", "edge.csv.gz"), header=None).values
    pd.DataFrame(np.asarray(edges[:-5])).to_csv(
        os.path.join(path, "raw", "edge.csv.gz"), header=False, index=False, compression="gzip"
    )
    with pytest.raises(ValueError, match=r"holds 75 edges but num-edge-list.csv.gz says 80"):
        load_ogbn("ogbn-proteins", str(tmp_path))
    assert not os.path.exists(os.path.join(path, "processed"))  # no corrupt cache left behind


def test_failed_download_says_so(tmp_path, monkeypatch):
    import urllib.error

    import ogb.nodeproppred.dataset_pyg as dataset_pyg

    def offline(url):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(dataset_pyg, "decide_download", offline)
    with pytest.raises(RuntimeError, match=r"downloading .*proteins\.zip failed.*offline.*by hand|unzip it"):
        load_ogbn("ogbn-proteins", str(tmp_path / "fresh"), allow_download=True)


def test_fake_data_has_no_duplicate_edges_and_loads_without_warnings(tmp_path):
    """Every fake OGB node data set (also one too small for its degree) holds distinct edges, so the
    loader reports no duplicate; loading fake ogbn-proteins (processing, then from the cache) and a
    processed ogbn-arxiv warns nothing, in particular not NumPy's "not writable" (OGB's split reader
    wrapped pandas' read-only arrays). In subprocesses: torch gives that warning once per process."""
    import subprocess
    import sys

    from revgnn.data.ogbn import OGBN_DATASETS, duplicate_edge_copies

    for name in OGBN_DATASETS:
        for num_nodes, degree in ((40, 4), (8, 20)):
            root = tmp_path / f"{name}_{num_nodes}"
            write_fake_ogbn(str(root), name, num_nodes=num_nodes, avg_degree=degree)
            ds = load_ogbn(name, str(root))
            assert duplicate_edge_copies(ds.edge_index, ds.num_nodes)[0] == 0, (name, num_nodes)
    code = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from revgnn.testing.fake_ogb import write_fake_ogbn\n"
        "from revgnn.data.ogbn import load_ogbn\n"
        "root = sys.argv[1]\n"
        "if len(sys.argv) > 2:\n"
        "    write_fake_ogbn(root, 'ogbn-proteins', num_nodes=48, avg_degree=6)\n"
        "load_ogbn('ogbn-proteins', root)\n"
        "load_ogbn('ogbn-arxiv', root)\n"
    )
    write_fake_ogbn(str(tmp_path / "w"), "ogbn-arxiv", num_nodes=40, avg_degree=4)
    load_ogbn("ogbn-arxiv", str(tmp_path / "w"))  # processed here: OGB's own processing may warn
    for args in ([str(tmp_path / "w"), "write"], [str(tmp_path / "w")]):
        out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        text = out.stdout + out.stderr
        assert "not writable" not in text and "Warning" not in text and "repeat a" not in text, text


def test_raw_writer_text_parses_back_exactly(tmp_path):
    """The vectorised raw writer (fixed-width fields, a table lookup or digit arithmetic) gives text that
    pandas, as OGB's loaders read it, parses back to the same numbers: ids past the lookup's span,
    negatives, rounded floats, one value per row."""
    import numpy as np
    import pandas as pd

    from revgnn.testing.fake_ogb import _write

    rng = np.random.default_rng(0)
    cases = [
        (rng.integers(-5, 200_000, (500, 2)), 0),
        (rng.integers(-(2**40), 2**40, (500, 3)), 0),
        (rng.random((500, 8)).round(3), 3),
        (rng.standard_normal((500, 5)).round(4), 4),
        (np.array([7, 0, 12]), 0),
    ]
    for array, decimals in cases:
        path = tmp_path / "a.csv.gz"
        _write(str(path), array, decimals)
        back = pd.read_csv(path, header=None).values
        assert np.array_equal(back, array.reshape(len(array), -1)), (array.dtype, decimals)
    with pytest.raises(ValueError, match="need decimals"):
        _write(str(tmp_path / "b.csv.gz"), rng.random(3))
