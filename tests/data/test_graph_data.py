"""Graph-level data: the generated mol_like set and the real OGB loader on a fake raw ogbg-molhiv."""

import os

import numpy as np
import pytest
import torch

from revgnn.data.graph_dataset import GraphDataset, load_ogbg, mol_like
from revgnn.engine.tasks import GraphTask
from revgnn.models import create_model
from revgnn.testing.fake_ogb import write_fake_ogbg

ATOM_DIMS = [119, 5, 12, 12, 10, 6, 6, 2, 2]  # ogb.utils.features.get_atom_feature_dims()
BOND_DIMS = [5, 6, 2]


@pytest.fixture(scope="module")
def mols():
    return mol_like(num_graphs=300, seed=1)


def _distance(g, a, b):
    """Shortest-path hops between nodes a and b (BFS)."""
    adj = {i: set() for i in range(g.num_nodes)}
    for s, d in g.edge_index.T.tolist():
        adj[s].add(d)
    seen, frontier, hop = {a}, {a}, 0
    while frontier:
        if b in frontier:
            return hop
        frontier = {j for i in frontier for j in adj[i]} - seen
        seen |= frontier
        hop += 1
    return None


def test_mol_like_schema_and_label_rule(mols):
    assert isinstance(mols, GraphDataset) and mols.num_graphs == 300
    assert 0.3 < mols.info["positive_fraction"] < 0.7
    assert sum(v.numel() for v in mols.split_idx.values()) == 300
    assert len(set(torch.cat(list(mols.split_idx.values())).tolist())) == 300
    for g in mols.graphs[:60]:
        assert g.x.dtype == torch.long and g.x.shape[1] == 9 and g.edge_attr.shape[1] == 3
        assert all(int(g.x[:, i].max()) < d for i, d in enumerate(ATOM_DIMS))
        assert all(int(g.edge_attr[:, i].max()) < d for i, d in enumerate(BOND_DIMS))
        ei = g.edge_index
        assert set(map(tuple, ei.T.tolist())) == set(map(tuple, ei.flip(0).T.tolist()))  # undirected
        assert int((g.x[:, 2] != torch.bincount(ei[0], minlength=g.num_nodes)).sum()) == 0  # degree
        nitrogen = (g.x[:, 0] == 6).nonzero().view(-1).tolist()
        oxygen = (g.x[:, 0] == 7).nonzero().view(-1).tolist()
        assert len(nitrogen) == len(oxygen) == 2  # counts carry no signal
        expected = any(_distance(g, n, o) == 5 for n in nitrogen for o in oxygen)
        assert int(g.y) == int(expected)


def test_mol_like_is_deterministic_and_seeded():
    a, b, c = (
        mol_like(num_graphs=20, seed=3),
        mol_like(num_graphs=20, seed=3),
        mol_like(num_graphs=20, seed=4),
    )
    assert all(
        torch.equal(x.x, y.x) and torch.equal(x.edge_index, y.edge_index) for x, y in zip(a.graphs, b.graphs)
    )
    assert not all(x.num_nodes == y.num_nodes and torch.equal(x.x, y.x) for x, y in zip(a.graphs, c.graphs))
    with pytest.raises(ValueError, match="hetero_atoms"):
        mol_like(num_graphs=2, min_nodes=3, hetero_atoms=2)


def test_loader_batches_and_model_output(mols):
    task = GraphTask(mols)
    step = next(task.train_steps(torch.Generator().manual_seed(0), "cpu"))
    (batch,) = step.batches
    assert step.total == batch.count == 32
    x, edge_index, edge_attr, graph_index, num_graphs = batch.inputs
    assert num_graphs == 32 and batch.y.shape == (32, 1) and int(graph_index.max()) == 31
    model = create_model("revgnn_mol_small", num_layers=2, hidden_channels=16)
    out = model(*batch.inputs)
    assert out.shape == (32, 1)
    task.loss(out, batch, step.total).backward()
    scores = task.evaluate(model, None, "cpu")
    assert set(scores) == {"train", "valid", "test"} and all(0 <= s <= 1 for s in scores.values())


def test_nan_labels_are_ignored_by_the_loss():
    from revgnn.engine.tasks import task_loss

    logits = torch.tensor([[0.3, -1.0], [2.0, 0.5]], requires_grad=True)
    y = torch.tensor([[1.0, float("nan")], [0.0, 1.0]])
    loss = task_loss(logits, y, "multilabel")
    ref = torch.nn.functional.binary_cross_entropy_with_logits(
        logits[[0, 1, 1], [0, 0, 1]], y[[0, 1, 1], [0, 0, 1]]
    )
    assert torch.allclose(loss, ref)
    loss.backward()
    assert logits.grad[0, 1] == 0


def test_fake_ogbg_molhiv_loads_through_real_ogb_code(tmp_path, monkeypatch):
    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("OGB prompted"))
    path = write_fake_ogbg(str(tmp_path), num_graphs=30, seed=2)
    assert sorted(os.listdir(os.path.join(path, "raw"))) == sorted(
        f"{f}.csv.gz"
        for f in ("edge", "edge-feat", "node-feat", "graph-label", "num-node-list", "num-edge-list")
    )
    assert sorted(os.listdir(os.path.join(path, "split", "scaffold"))) == [
        "test.csv.gz",
        "train.csv.gz",
        "valid.csv.gz",
    ]
    for _attempt in range(2):  # first: processes raw (and writes the release marker); then: processed file
        ds = load_ogbg("ogbg-molhiv", root=str(tmp_path), batch_size=8)
        assert os.path.exists(os.path.join(path, "RELEASE_v1.txt"))
        assert os.path.exists(os.path.join(path, "processed", "geometric_data_processed.pt"))
        assert ds.num_graphs == 30 and ds.in_channels == 9 and ds.edge_channels == 3
        assert ds.num_classes == 1 and ds.evaluator == "ogbg-molhiv" and ds.task == "multilabel"
        # OGB added the inverse edges; the molecules are the generator's
        ref = mol_like(num_graphs=30, min_nodes=6, max_nodes=12, distance=3, seed=2)
        for g, r in zip(ds.graphs[:5], ref.graphs[:5]):
            assert torch.equal(g.x, r.x) and int(g.y) == int(r.y)
            assert g.edge_index.size(1) == r.edge_index.size(1)
    task = GraphTask(ds)
    model = create_model("revgnn_molhiv", num_layers=2, hidden_channels=16)
    (batch,) = next(task.train_steps(torch.Generator().manual_seed(0), "cpu")).batches
    assert model(*batch.inputs).shape == (8, 1)
    assert set(task.evaluate(model, None, "cpu")) == {"train", "valid", "test"}


def test_ogbg_missing_and_corrupt_data_are_clear_errors(tmp_path, monkeypatch):
    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("OGB prompted"))
    with pytest.raises(FileNotFoundError, match="ogbg_molhiv"):
        load_ogbg("ogbg-molhiv", root=str(tmp_path))
    path = write_fake_ogbg(str(tmp_path), num_graphs=10)
    os.remove(os.path.join(path, "raw", "graph-label.csv.gz"))
    with pytest.raises(FileNotFoundError, match="graph-label.csv.gz"):
        load_ogbg("ogbg-molhiv", root=str(tmp_path))
    with open(os.path.join(path, "raw", "graph-label.csv.gz"), "wb") as f:
        f.write(b"\x1f\x8b not really gzip")
    with pytest.raises(RuntimeError, match="corrupt"):
        load_ogbg("ogbg-molhiv", root=str(tmp_path))
    with pytest.raises(ValueError, match="unknown OGB graph data set"):
        load_ogbg("ogbg-molhiw", root=str(tmp_path))


def test_ogb_encoder_shape_errors():
    with pytest.raises(ValueError, match="encoder='ogb'.*9 atom"):
        create_model("revgnn_mol_small", in_channels=16, edge_channels=8)
    model = create_model(
        "revgnn_mol_small",
        encoder="linear",
        in_channels=16,
        edge_channels=8,
        num_layers=2,
        readout="attention",
    )
    x, ei, ea = torch.randn(12, 16), torch.randint(0, 12, (2, 30)), torch.randn(30, 8)
    assert model(x, ei, ea, torch.arange(12) // 4).shape == (3, 1)
    with pytest.raises(ValueError, match="readout"):
        create_model("revgnn_mol_small", readout="median")
    np.testing.assert_equal(
        create_model("revgnn_mol_small")(x[:, :9].long().abs() % 2, ei, (ea[:, :3] > 0).long()).shape, (1, 1)
    )
