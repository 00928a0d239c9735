"""A graph of one's own: a torch.save'd PyG Data (data=pyg_file), a torch_geometric.datasets class
(data=pyg), a loader and YAML in the user's own directory (--config-dir), all through revgnn-train; the
checks of a bad file; the metrics by name."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, run_cli
from torch_geometric.data import Data

from revgnn.data.pyg_data import from_pyg, infer_task, load_pyg_file
from revgnn.engine.metrics import better, score
from revgnn.errors import ConfigError

#: a 2-layer, 8-channel node-level model, one epoch, no plot or bar
TINY_MODEL = [
    "model=revgnn_small",
    "model.num_layers=2",
    "model.hidden_channels=8",
    "trainer.epochs=1",
    "trainer.train_parts=2",
    "trainer.eval_parts=1",
    "logger.progress_bar=false",
    "logger.plot=false",
    "backend.num_threads=1",
]


def _graph(n=60, y=None, seed=0, **extra) -> Data:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g)
    edge_index = torch.randint(0, n, (2, 4 * n), generator=g)
    if y is None:
        y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return Data(x=x, edge_index=edge_index, y=y, **extra)


def _masks(n):
    i = torch.arange(n)
    return dict(
        train_mask=i < n * 2 // 3, val_mask=(i >= n * 2 // 3) & (i < n * 5 // 6), test_mask=i >= n * 5 // 6
    )


def _train(tmp_path, *overrides, expect=0):
    out = tmp_path / "run"
    run = run_cli("-m", "revgnn.train", *overrides, f"output_dir={out}", cwd=tmp_path, expect=expect)
    return run, out


def test_a_saved_data_trains_with_a_zoo_model_and_is_scored_by_its_labels(tmp_path):
    torch.save(_graph(**_masks(60)), tmp_path / "graph.pt")
    run, out = _train(tmp_path, "data=pyg_file", "data.path=graph.pt", *TINY_MODEL)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metric"] == "accuracy" and summary["data"] == "graph" and summary["status"] == "completed"
    assert 0 <= summary["highest_valid"] <= 1
    # where the run writes: at its start and in its last line
    assert f"output directory: {out}" in run.output, run.output[-2000:]
    assert run.output.strip().splitlines()[-1].endswith(f"outputs in {out}"), run.output[-500:]


def test_regression_with_split_idx_and_a_named_metric(tmp_path):
    n = 60
    data = _graph(n, y=torch.randn(n, 2))
    data.split_idx = {"train": torch.arange(40), "val": torch.arange(40, 50), "test": torch.arange(50, 60)}
    torch.save(data, tmp_path / "values.pt")
    _, out = _train(tmp_path, "data=pyg_file", "data.path=values.pt", "data.metric=mae", *TINY_MODEL)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metric"] == "mae" and summary["highest_valid"] > 0  # the lowest validation MAE


def test_task_and_metric_follow_from_y():
    n = 30
    assert infer_task(torch.zeros(n, dtype=torch.long)) == "multiclass"
    assert infer_task(torch.randint(0, 2, (n, 3)).float()) == "multilabel"
    assert infer_task(torch.randint(0, 2, (n, 3)).bool()) == "multilabel"
    assert infer_task(torch.randn(n)) == "regression"
    multilabel = from_pyg(_graph(n, y=torch.randint(0, 2, (n, 3)).float()))
    assert (multilabel.task, multilabel.evaluator, multilabel.num_classes) == ("multilabel", "rocauc", 3)
    regression = from_pyg(_graph(n, y=torch.randn(n)), metric="mae")
    assert (regression.task, regression.evaluator, regression.y.shape) == ("regression", "mae", (n, 1))
    classes = from_pyg(_graph(n), task="multiclass", metric="f1")
    assert classes.evaluator == "f1" and classes.num_classes == int(classes.y.max()) + 1
    # no split given: drawn at random, disjoint, covering every node
    parts = classes.split_idx
    assert (
        sum(p.numel() for p in parts.values()) == n and torch.cat(list(parts.values())).unique().numel() == n
    )
    with pytest.raises(ConfigError, match="rmse cannot score a multiclass task"):
        from_pyg(_graph(n), metric="rmse")


def test_metrics_by_name():
    y = torch.tensor([[0], [1], [2], [1]])
    logits = torch.eye(3)[[0, 1, 1, 1]]
    assert score("accuracy", y, logits, "multiclass") == pytest.approx(0.75)
    yb = torch.tensor([[0.0], [1.0], [1.0], [0.0]])
    assert score("rocauc", yb, torch.tensor([[0.1], [0.9], [0.8], [0.2]]), "multilabel") == pytest.approx(1.0)
    yr = torch.tensor([[1.0], [2.0], [float("nan")]])
    pred = torch.tensor([[2.0], [2.0], [5.0]])
    assert score("rmse", yr, pred, "regression") == pytest.approx(np.sqrt(0.5), rel=1e-6)
    assert score("mae", yr, pred, "regression") == pytest.approx(0.5, rel=1e-6)
    # the loop keeps the lowest validation error, the highest accuracy
    assert (
        better("rmse", 0.4, 0.5, True)
        and not better("rmse", 0.6, 0.5, True)
        and better("mae", 9.0, 0.0, False)
    )
    assert better("accuracy", 0.6, 0.5, True) and not better("accuracy", 0.4, 0.5, True)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: delattr(d, "y"), "has no 'y'"),
        (lambda d: d.edge_index.__setitem__((0, 3), 60), r"node ids out of range \[0, 60\)"),
        (lambda d: d.edge_index.__setitem__((1, 5), -1), r"out of range .*min -1"),
        (lambda d: d.val_mask.__setitem__(0, True), "splits overlap: node 0 is in 'train' and in 'valid'"),
        (lambda d: d.x.__setitem__((7, 2), float("nan")), "x holds 1 non-finite .* first at node 7"),
        (lambda d: setattr(d, "edge_attr", torch.ones(3, 2)), "edge_attr has 3 rows for 240 edges"),
    ],
)
def test_a_bad_file_is_one_message_naming_the_field(tmp_path, change, message):
    data = _graph(60, **_masks(60))
    change(data)
    torch.save(data, tmp_path / "bad.pt")
    with pytest.raises(ConfigError, match=message):
        load_pyg_file(str(tmp_path / "bad.pt"))


def test_unlabelled_nodes_and_a_sparse_adjacency():
    n = 40
    y = torch.arange(n) % 3
    y[:10] = -1  # no class: no random part may draw them
    data = _graph(n, y=y)
    ds = from_pyg(data)
    held = torch.cat(list(ds.split_idx.values()))
    assert held.numel() == 30 and int(held.min()) >= 10 and ds.num_classes == 3 and int(ds.y.min()) == 0
    with pytest.raises(ConfigError, match="node 0 is in split 'train' but has no class"):
        from_pyg(_graph(n, y=y, **_masks(n)))
    # PyG's ToSparseTensor layout: adj_t (destination x source) instead of edge_index
    plain = _graph(n, **_masks(n))
    ones = torch.ones(plain.edge_index.size(1))
    adj_t = torch.sparse_coo_tensor(plain.edge_index.flip(0), ones, (n, n), check_invariants=True)
    sparse = Data(x=plain.x, adj_t=adj_t.coalesce(), y=plain.y, **_masks(n))
    a, b = from_pyg(plain), from_pyg(sparse)
    assert torch.equal(torch.unique(a.edge_index, dim=1), torch.unique(b.edge_index, dim=1))


def test_loading_leaves_the_allowed_globals_as_they_were(tmp_path):
    from torch.serialization import get_safe_globals

    before = set(get_safe_globals())
    torch.save(_graph(20), tmp_path / "g.pt")
    load_pyg_file(str(tmp_path / "g.pt"))
    assert set(get_safe_globals()) == before  # PyG's Data stays allowed for OGB's loaders


def test_split_ids_out_of_range_and_unreadable_files(tmp_path):
    data = _graph(20)
    data.split_idx = {
        "train": torch.arange(10),
        "valid": torch.tensor([10, 25]),
        "test": torch.arange(12, 20),
    }
    torch.save(data, tmp_path / "split.pt")
    with pytest.raises(ConfigError, match=r"split 'valid' holds node ids out of range \[0, 20\)"):
        load_pyg_file(str(tmp_path / "split.pt"))
    (tmp_path / "junk.pt").write_bytes(b"not a pickle")
    with pytest.raises(ConfigError, match="cannot read it as a graph saved with torch.save"):
        load_pyg_file(str(tmp_path / "junk.pt"))
    with pytest.raises(ConfigError, match="no such file"):
        load_pyg_file(str(tmp_path / "missing.pt"))


def test_non_finite_inputs_are_refused_before_training_not_blamed_on_the_lr(tmp_path):
    data = _graph(60, **_masks(60))
    data.x[3, 1] = float("inf")
    torch.save(data, tmp_path / "nan.pt")
    run, out = _train(tmp_path, "data=pyg_file", "data.path=nan.pt", *TINY_MODEL, expect=2)
    errors = [line for line in run.output.splitlines() if "ERROR" in line or line.startswith("revgnn-train:")]
    assert len(errors) == 1 and "Traceback" not in run.output, run.output[-3000:]
    assert "not finite" in errors[0] and "first at node 3" in errors[0] and "optim.lr" not in run.output
    assert not (out / "last.pt").exists()


def test_a_list_of_graphs_is_graph_level(tmp_path):
    graphs = [_graph(6 + i % 3, y=torch.tensor([i % 2]), seed=i) for i in range(30)]
    graphs = [Data(x=g.x, edge_index=g.edge_index % g.num_nodes, y=g.y) for g in graphs]
    torch.save(
        {
            "graphs": graphs,
            "split_idx": {
                "train": torch.arange(20),
                "valid": torch.arange(20, 25),
                "test": torch.arange(25, 30),
            },
        },
        tmp_path / "graphs.pt",
    )
    ds = load_pyg_file(str(tmp_path / "graphs.pt"), batch_size=8)
    assert (ds.num_graphs, ds.task, ds.evaluator, ds.in_channels, ds.num_classes) == (
        30,
        "multiclass",
        "accuracy",
        5,
        2,
    )
    run = run_cli(
        "-m", "revgnn.train", "data=pyg_file", "data.path=graphs.pt", "data.batch_size=8",
        "model=revgnn_mol_small", "model.encoder=linear", "model.num_layers=2", "model.hidden_channels=8",
        "trainer.epochs=1", "logger.progress_bar=false", "logger.plot=false", f"output_dir={tmp_path / 'g'}",
        cwd=tmp_path,
    )  # fmt: skip
    assert json.loads((tmp_path / "g" / "summary.json").read_text())["metric"] == "accuracy", run.output


def test_a_torch_geometric_dataset_by_name(tmp_path):
    _, out = _train(tmp_path, "data=pyg", "data.name=KarateClub", *TINY_MODEL)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["data"] == "KarateClub" and summary["metric"] == "accuracy"


def _write_tu(root: Path, name: str = "TOY") -> None:
    """A TUDataset's raw files (PyG's TU format): 30 path graphs, 3 node attributes, 2 classes."""
    raw = root / name / "raw"
    raw.mkdir(parents=True, exist_ok=True)  # the refused run made it
    rng = np.random.default_rng(0)
    edges, graph_of, attrs, labels, offset = [], [], [], [], 0
    for g in range(30):
        n = int(rng.integers(4, 8))
        for i in range(n - 1):
            edges += [(offset + i + 1, offset + i + 2), (offset + i + 2, offset + i + 1)]
        graph_of += [g + 1] * n
        attrs += [rng.normal(size=3) + g % 2 for _ in range(n)]
        labels.append(g % 2)
        offset += n
    np.savetxt(raw / f"{name}_A.txt", np.array(edges), fmt="%d", delimiter=", ")
    np.savetxt(raw / f"{name}_graph_indicator.txt", np.array(graph_of), fmt="%d")
    np.savetxt(raw / f"{name}_graph_labels.txt", np.array(labels), fmt="%d")
    np.savetxt(raw / f"{name}_node_attributes.txt", np.array(attrs), fmt="%.5f", delimiter=", ")


def test_a_dataset_class_reads_files_put_in_place_and_never_downloads(tmp_path):
    run, _ = _train(tmp_path, "data=pyg", "data.name=TUDataset", "data.kwargs.name=TOY",
                    f"data.root={tmp_path / 'tu'}", *TINY_MODEL, expect=2)  # fmt: skip
    assert "downloads are off: put TOY_A.txt, TOY_graph_indicator.txt into" in run.output, run.output[-2000:]
    assert str(tmp_path / "tu" / "TOY" / "raw") in run.output and "data.allow_download=true" in run.output
    _write_tu(tmp_path / "tu")
    from revgnn.data.pyg_data import load_pyg_dataset

    with pytest.raises(ConfigError, match="graph 0: x must be"):  # TUDataset drops attributes by default
        load_pyg_dataset("TUDataset", root=str(tmp_path / "tu"), kwargs={"name": "TOY"})
    kwargs = {"name": "TOY", "use_node_attr": True}
    ds = load_pyg_dataset("TUDataset", root=str(tmp_path / "tu"), kwargs=kwargs, batch_size=8)
    assert (ds.name, ds.num_graphs, ds.task, ds.in_channels) == ("TUDataset-TOY", 30, "multiclass", 3)
    with pytest.raises(ConfigError, match="did you mean Planetoid"):
        load_pyg_dataset("Planetoif")


def _guide_example(dest: Path) -> list:
    """Writes the files of training.md's worked example ("Your own data") into ``dest`` and returns the
    words of its command."""
    text = (REPO / "docs" / "guides" / "training.md").read_text()
    section = text[text.index("## Your own data") : text.index("## Adding a data set")]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)
    written = 0
    for lang, body in blocks:
        body = "\n".join(line[2:] if line.startswith("  ") else line for line in body.splitlines()) + "\n"
        first = body.splitlines()[0]
        if lang in ("python", "yaml") and first.startswith("# ") and first.endswith((".py", ".yaml")):
            path = dest / first[2:].strip()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
            written += 1
    assert written == 2, blocks
    (command,) = [b for lang, b in blocks if lang == "bash" and "--config-dir" in b]
    words = command.split()
    assert words[0] == "revgnn-train"
    return words[1:]


def test_the_guides_own_loader_example_runs_from_the_users_directory(tmp_path):
    args = _guide_example(tmp_path)
    args = [a for a in args if not a.startswith(("trainer.epochs=", "model="))]
    # the example as written, shortened to one epoch of a tiny model; no PYTHONPATH to the user's module
    run, out = _train(tmp_path, *args, *TINY_MODEL)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["data"] == "two_communities" and summary["metric"] == "accuracy", run.output[-2000:]
    assert "num_nodes=200" in " ".join((out / ".hydra" / "config.yaml").read_text().split()).replace(
        ": ", "="
    )
    # a misspelt key names the closest argument of the user's function, before anything loads
    bad, _ = _train(tmp_path, *args, "data.num_nodez=5", *TINY_MODEL, expect=2)
    assert bad.output.strip().splitlines() == [
        "revgnn-train: unknown key data.num_nodez: revgnn-train has no such setting (did you mean "
        "data.num_nodes?); data takes _target_, num_nodes, p_in, seed"
    ], bad.output


def test_a_broken_user_module_fails_that_run_only_with_one_message(tmp_path):
    args = _guide_example(tmp_path)
    (tmp_path / "broken.py").write_text("import torch\n\nSCALE = 1 / 0\n")
    (tmp_path / "myconf" / "data" / "broken.yaml").write_text("_target_: broken.load\n")
    run, _ = _train(tmp_path, "--config-dir", "myconf", "data=broken", *TINY_MODEL, expect=2)
    assert run.output.strip().splitlines() == [
        "revgnn-train: data._target_=broken.load: importing broken failed (line 3): "
        "ZeroDivisionError: division by zero"
    ], run.output
    # the other options of that directory are untouched
    assert args[:2] == ["--config-dir", "myconf"]
    run_cli("-m", "revgnn.train", "--config-dir", "myconf", "data=my_graph", "--cfg", "job", cwd=tmp_path)
