"""The official ogbn-proteins protocol (issue 15): group init by copy, uniform partitions in shuffled
order, a fixed selection view, the final multi-view test of ``best.pt``, duplicate edges."""

import dataclasses

import pytest
import torch
from conftest import TINY_GRAPH, published_score, run_summary

from revgnn.models import create_model, model_info
from revgnn.models.components import first_block


def _group_states(block):
    return [conv.state_dict() for conv in block.convs]


def test_group_init_copy_starts_groups_identical_and_trains_them_apart():
    torch.manual_seed(0)
    model = create_model("revgnn_112", num_layers=3, hidden_channels=8, group_init="copy").double()
    for block in model.layers:
        first, *others = _group_states(block)
        for other in others:
            for key in first:
                assert torch.equal(first[key], other[key]), key
    # independent: the groups differ; reset_parameters keeps each mode's rule
    torch.manual_seed(0)
    indep = create_model("revgnn_112", num_layers=3, hidden_channels=8)
    a, b = _group_states(first_block(indep.layers))
    assert any(not torch.equal(a[k], b[k]) for k in a if a[k].numel() > 1)
    model.reset_parameters()
    a, b = _group_states(model.layers[1])
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the copies are separate parameters: one optimiser step on a loss that depends on the
    # groups' inputs differently moves them apart
    x = torch.randn(20, 16, dtype=torch.float64)
    edge_index = torch.randint(0, 20, (2, 60))
    edge_attr = torch.randn(60, 8, dtype=torch.float64)
    model(x, edge_index, edge_attr).square().mean().backward()
    block = model.layers[0]
    g0, g1 = (dict(c.named_parameters()) for c in block.convs)
    assert any(not torch.equal(g0[k].grad, g1[k].grad) for k in g0 if g0[k].grad is not None)
    # weight-tied: the one block's groups start as copies too
    wt = create_model("wt_revgnn", num_layers=3, hidden_channels=8, group_init="copy")
    a, b = _group_states(first_block(wt.layers))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert "group_init='copy'" in repr(block)


def test_group_init_errors_are_clear():
    from torch import nn

    from revgnn.nn import GENBlock, GroupAddRev

    with pytest.raises(ValueError, match="group_init must be one of independent, copy"):
        GroupAddRev(GENBlock(4), num_groups=2, group_init="clone")
    with pytest.raises(ValueError, match="a ModuleList brings its own module"):
        GroupAddRev(nn.ModuleList([GENBlock(4), GENBlock(4)]), group_init="copy")

    class NoReset(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x)

    # no reset_parameters of its own: its submodules' are called (as PyG's GroupAddRev accepts it)
    torch.manual_seed(0)
    independent = GroupAddRev(NoReset(), num_groups=2)
    assert not torch.equal(independent.convs[0].lin.weight, independent.convs[1].lin.weight)
    copied = GroupAddRev(NoReset(), num_groups=2, group_init="copy")
    assert torch.equal(copied.convs[0].lin.weight, copied.convs[1].lin.weight)


# ---- partitions ---------------------------------------------------------------------------------


def test_uniform_partition_is_randint_with_multinomial_sizes_and_balanced_is_balanced():
    from revgnn.data.random_parts import random_partition

    n, k = 1000, 10
    part = random_partition(n, k, torch.Generator().manual_seed(3), mode="uniform")
    assert torch.equal(part, torch.randint(k, (n,), generator=torch.Generator().manual_seed(3)))
    # sizes over 400 fixed-seed draws: Multinomial(n; 1/k), so each size has mean n/k = 100 and
    # variance n p (1 - p) = 90; the sample variance of 4000 sizes lies within 10% of 90 (its own
    # standard error is ~2.2%), whereas a balanced partition's sizes have variance 0
    g = torch.Generator().manual_seed(0)
    sizes = torch.stack(
        [torch.bincount(random_partition(n, k, g, "uniform"), minlength=k) for _ in range(400)]
    )
    sizes = sizes.double()
    assert sizes.sum(1).eq(n).all() and abs(sizes.mean().item() - 100) < 1e-9
    assert 81 <= sizes.var().item() <= 99, sizes.var().item()
    assert sizes.min() < 90 and sizes.max() > 110  # not balanced
    # the covariance of two parts' sizes is -n p^2 = -10 (they compete for the same nodes)
    cov = torch.cov(sizes[:, :2].t())[0, 1].item()
    assert -16 <= cov <= -4, cov
    balanced = random_partition(n + 3, k, g, "balanced")
    counts = torch.bincount(balanced, minlength=k)
    assert counts.max() - counts.min() <= 1

    with pytest.raises(ValueError, match="partition mode must be one of balanced, uniform, got 'metis'"):
        random_partition(n, k, g, "metis")


def _node_task(partition="balanced", shuffle=False, parts=4, **extra):
    from omegaconf import OmegaConf

    from revgnn.data.synthetic import proteins_like
    from revgnn.engine.tasks import NodeTask

    ds = proteins_like(num_nodes=300, window=5, avg_degree=6, max_hops=2)
    tc = OmegaConf.create(
        dict(
            train_parts=parts,
            parts_per_step=None,
            partition=partition,
            shuffle_parts=shuffle,
            eval_views=2,
            eval_parts=3,
            test_views=3,
            test_parts=2,
            **extra,
        )
    )
    return NodeTask(ds, tc), ds


def test_tasks_follow_one_protocol_with_their_workers_given_at_construction():
    """Every task has the Task protocol's members and evaluates without collectives passed per call:
    a NodeTask sums its evaluation logits over the workers it was built with (here two made-up
    workers whose sum doubles the logits: the scores are those of the doubled logits)."""
    import inspect

    from revgnn.engine.sar_backend import SARTask
    from revgnn.engine.tasks import GraphTask, NodeTask, OneWorker, Task

    members = [m for m in vars(Task) if not m.startswith("_")]
    assert {"train_steps", "loss", "fix_eval_views", "evaluate", "final_test"} <= set(members)
    for cls in (NodeTask, GraphTask, SARTask):
        assert all(
            hasattr(cls, m) for m in ("train_steps", "loss", "fix_eval_views", "evaluate", "final_test")
        )
        for method in (cls.evaluate, cls.final_test):
            assert list(inspect.signature(method).parameters) == [
                "self",
                "model",
                "generator",
                "device",
                "autocast",
            ]

    class TwoWorkers(OneWorker):
        calls = []

        def all_reduce(self, t, what="all_reduce"):
            self.calls.append(what)
            return t * 2

    task, ds = _node_task()
    two = NodeTask(ds, task.tc, TwoWorkers())
    torch.manual_seed(0)
    model = torch.nn.Linear(ds.x.size(1), ds.num_classes)

    class Net(torch.nn.Module):
        def forward(self, x, edge_index, edge_attr=None):
            return model(x)

    net = Net()
    logits = task._predict(net, 2, 3, torch.Generator().manual_seed(1), "cpu", None)
    assert two.evaluate(net, torch.Generator().manual_seed(1), "cpu") == task.scorer(2 * logits)
    assert TwoWorkers.calls == ["all_reduce of the evaluation's logits"]


def test_shuffled_part_order_visits_every_part_once_in_the_drawn_order():
    from revgnn.data.random_parts import partition_graph

    task, ds = _node_task("uniform", shuffle=True, parts=6)
    g = torch.Generator().manual_seed(11)
    reference = partition_graph(ds.edge_index, ds.num_nodes, 6, g, "uniform")
    order = torch.randperm(6, generator=g).tolist()  # drawn after the partition
    assert sorted(order) == list(range(6)) and order != list(range(6))
    steps = list(task.train_steps(torch.Generator().manual_seed(11), "cpu"))
    assert [s.index for s in steps] == list(range(6))
    for step, p in zip(steps, order):
        (batch,) = list(step.batches)
        assert torch.equal(batch.inputs[0], ds.x[reference[p].node_idx])
    # in order without shuffling
    task, _ = _node_task("uniform", shuffle=False, parts=6)
    for step, p in zip(task.train_steps(torch.Generator().manual_seed(11), "cpu"), range(6)):
        (batch,) = list(step.batches)
        assert torch.equal(batch.inputs[0], ds.x[reference[p].node_idx])


def test_checks_of_whole_graph_tests():
    from omegaconf import OmegaConf

    from revgnn.engine.tasks import check_whole_graph_test

    check_whole_graph_test(OmegaConf.create({"test_views": None}), "backend=sar")
    check_whole_graph_test(OmegaConf.create({"test_views": 1}), "backend=sar")
    with pytest.raises(ValueError, match=r"backend=sar evaluates whole graphs.*test_views=10 cannot apply"):
        check_whole_graph_test(OmegaConf.create({"test_views": 10}), "backend=sar")
    # SAR's trainer check applies it, and wants one part per test view (backend/sar.yaml sets them)
    from conftest import compose_train

    from revgnn.engine.sar_backend import SARTask

    cfg = compose_train("unused", "backend=sar", "backend.partition_dir=unused")
    SARTask.check_trainer(cfg.trainer)
    cfg.trainer.test_views = 2
    with pytest.raises(ValueError, match="backend=sar evaluates whole graphs.*test_views=2"):
        SARTask.check_trainer(cfg.trainer)
    cfg.trainer.test_views, cfg.trainer.test_parts = 1, 3
    with pytest.raises(ValueError, match="trainer.test_parts=3 cannot apply"):
        SARTask.check_trainer(cfg.trainer)


# ---- the loop: fixed selection view, final test of best.pt ----------------------------------------

OFFICIAL = [
    "trainer=proteins_official",
    "model.group_init=copy",
    "backend.precision=fp32",
    "trainer.test_views=2",
    "trainer.test_parts=2",
]


@pytest.fixture
def fast_scores(monkeypatch):
    """OGB's ROC-AUC over 112 tasks costs seconds per evaluation here; these tests check which model
    and views are scored, not the metric, so a cheap score that every logit moves stands in."""
    from revgnn.engine.inference import Scorer

    def score(self, y_true, logits):
        return float((logits.double() * (2 * y_true.double() - 1)).mean())

    monkeypatch.setattr(Scorer, "score", score)


def _train(out_dir, *overrides):
    from conftest import compose_train

    from revgnn.cli.train import train

    return train(compose_train(out_dir, *TINY_GRAPH, *OFFICIAL, *overrides))


def test_selection_view_is_drawn_once_and_reused_every_epoch(tmp_path, monkeypatch, fast_scores):
    import revgnn.engine.inference

    seen = []
    real = revgnn.engine.inference.predict_views

    def spy(model, ds, views, *args, **kwargs):
        seen.append(views)
        return real(model, ds, views, *args, **kwargs)

    monkeypatch.setattr(revgnn.engine.inference, "predict_views", spy)
    _train(tmp_path, "trainer.epochs=3", "trainer.test_views=null")
    assert len(seen) == 3 and all(v is seen[0] for v in seen)
    (view,) = seen[0]  # 1 view x 5 parts
    assert len(view) == 5


def test_final_test_scores_the_best_checkpoint_not_the_last_model(tmp_path, monkeypatch, fast_scores):
    """The selection scores are scripted so that epoch 1 is best and epoch 3 last; the final test
    must equal an independent 2 x 2-view test of best.pt and differ from one of last.pt."""
    import csv
    import json

    from revgnn.engine.checkpoint import load_checkpoint
    from revgnn.engine.inference import Scorer, predict
    from revgnn.engine.loop import build_model
    from revgnn.engine.seeds import Stream, seed_stream
    from revgnn.engine.tasks import NodeTask

    valid = iter([0.9, 0.5, 0.1])
    monkeypatch.setattr(
        NodeTask, "evaluate", lambda self, *a, **k: {"train": 0.0, "valid": next(valid), "test": 0.0}
    )
    summary = _train(tmp_path, "trainer.epochs=3", "trainer.fixed_eval_views=false")
    assert summary["best_epoch"] == 1 and summary["epochs"] == 3
    final = summary["checkpoint_test"]
    assert final["epoch"] == 1 and (final["views"], final["parts"]) == (2, 2)

    from conftest import compose_train
    from hydra.utils import instantiate

    cfg = compose_train(tmp_path, *TINY_GRAPH, *OFFICIAL)
    ds = instantiate(cfg.data)

    def test_of(name):
        ckpt = load_checkpoint(str(tmp_path / name))
        model = build_model(cfg.model, NodeTask(ds, cfg.trainer).shapes)
        model.load_state_dict(ckpt["model"])
        g = torch.Generator().manual_seed(seed_stream(cfg.seed, 0, Stream.CHECKPOINT_TEST))
        return ckpt["epoch"], Scorer.for_dataset(ds)(predict(model, ds, 2, 2, g, mode="uniform"))

    epoch, best = test_of("best.pt")
    assert epoch == 1 and best == {k: final[k] for k in ("train", "valid", "test")}
    epoch, last = test_of("last.pt")
    assert epoch == 3 and last != best
    assert json.loads((tmp_path / "summary.json").read_text())["checkpoint_test"] == final
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [(r["epoch"], r["evaluation"]) for r in rows] == [
        ("1", "selection"),
        ("2", "selection"),
        ("3", "selection"),
        ("1", "checkpoint_test"),
    ]
    assert float(rows[-1]["test"]) == final["test"] and rows[-1]["loss"] == ""


def test_official_protocol_resumes_exactly(tmp_path, fast_scores):
    """Uniform partitions in shuffled order, the fixed view and the final test: 3 epochs equal
    1 epoch resumed for 2 more (the fixed view is drawn from the seed, not the first epoch)."""
    from revgnn.engine.checkpoint import load_checkpoint

    full = _train(tmp_path / "full", "trainer.epochs=3")
    _train(tmp_path / "half", "trainer.epochs=1")
    resumed = _train(tmp_path / "resumed", "trainer.epochs=3", f"ckpt_path={tmp_path / 'half' / 'last.pt'}")
    a, b = (load_checkpoint(str(tmp_path / d / "last.pt")) for d in ("full", "resumed"))
    timing = {"epoch_time_s", "peak_memory_mb"}
    strip = lambda hist: [{k: v for k, v in r.items() if k not in timing} for r in hist]  # noqa: E731
    assert strip(a["history"]) == strip(b["history"])
    assert full["checkpoint_test"] == resumed["checkpoint_test"] is not None


def test_reproduce_table_has_the_final_test_column_with_the_paper_number():
    from revgnn.cli import reproduce

    def summary(seed, test):
        return run_summary(
            **{
                "seed": seed,
                "epochs": 2000,
                "best_epoch": 1500,
                "highest_valid": 0.9,
                "final_test": 0.87,
                "checkpoint_test": {
                    "epoch": 1500,
                    "views": 10,
                    "parts": 3,
                    "train": 0.95,
                    "valid": 0.91,
                    "test": test,
                },
                "metric": "rocauc",
                "peak_memory_mb": 1000.0,
                "epoch_time_s": 40.0,
                "device": "cuda",
            }
        )

    table = reproduce.format_table("proteins_revgnn_deep", [summary(0, 0.88), summary(1, 0.87)], [], 2000)
    lines = table.splitlines()
    header = next(line for line in lines if line.startswith("| | valid"))
    assert "| valid | test | test of best.pt (10 × 3 views) | #params |" in header
    ours = next(line for line in lines if line.startswith("| this run |"))
    count = model_info("revgnn_deep").num_parameters
    assert f"| 90.00 ± 0.00 | 87.00 ± 0.00 | 87.50 ± 0.71 | {count:,} |" in ours
    paper = next(line for line in lines if line.startswith("| paper"))
    assert [c.strip() for c in paper.split("|")[2:5]] == ["", "", published_score("proteins_revgnn_deep")]
    assert "0: 90.00 / 87.00 / 1500 / 88.00" in table
    mixed = [summary(0, 0.88), dataclasses.replace(summary(1, 0.87), checkpoint_test=None)]
    with pytest.raises(ValueError, match="some seeds ran the final test"):
        reproduce.format_table("proteins_revgnn_deep", mixed, [], 2000)


# ---- duplicate edges --------------------------------------------------------------------------------


def test_loader_reports_duplicate_edges_and_merges_them_as_the_official_adjacency(tmp_path, caplog):
    """A fake ogbn-proteins whose edge file repeats 5 edges with other features: the loader counts
    them; merge keeps one edge per pair with the last copy's features; node features sum all copies."""
    import logging
    import os
    import shutil

    import numpy as np
    import pandas as pd

    from revgnn.data.ogbn import duplicate_edge_copies, load_ogbn
    from revgnn.testing.fake_ogb import write_fake_ogbn

    path = write_fake_ogbn(str(tmp_path / "clean"), "ogbn-proteins", num_nodes=40, avg_degree=4)
    clean = load_ogbn("ogbn-proteins", str(tmp_path / "clean"))
    base, _ = duplicate_edge_copies(clean.edge_index, clean.num_nodes)  # random pairs may repeat

    raw = os.path.join(path, "raw")
    read = lambda f: pd.read_csv(os.path.join(raw, f), header=None).values  # noqa: E731
    write = lambda f, a: pd.DataFrame(np.asarray(a)).to_csv(  # noqa: E731
        os.path.join(raw, f), header=False, index=False, compression="gzip"
    )
    edges, feats = read("edge.csv.gz"), read("edge-feat.csv.gz")
    write("edge.csv.gz", np.concatenate([edges, edges[:5]]))
    write("edge-feat.csv.gz", np.concatenate([feats, feats[:5] + 1.0]))
    write("num-edge-list.csv.gz", [len(edges) + 5])
    shutil.rmtree(os.path.join(path, "processed"))
    with caplog.at_level(logging.INFO, logger="revgnn.data.ogbn"):
        kept = load_ogbn("ogbn-proteins", str(tmp_path / "clean"))
    count, _ = duplicate_edge_copies(kept.edge_index, kept.num_nodes)
    assert count == base + 10  # 5 repeated edges, each in both directions (OGB adds the inverses)
    assert f"{count} of {kept.edge_index.size(1)} edges repeat" in caplog.text
    merged = load_ogbn("ogbn-proteins", str(tmp_path / "clean"), duplicate_edges="merge")
    assert merged.edge_index.size(1) == kept.edge_index.size(1) - count
    assert duplicate_edge_copies(merged.edge_index, merged.num_nodes)[0] == 0
    # the features of a merged edge: its last copy's (the +1.0 one); node features from every copy
    pairs = {tuple(e): a for e, a in zip(merged.edge_index.t().tolist(), merged.edge_attr.tolist())}
    src, dst = (int(v) for v in edges[0])
    assert pairs[(src, dst)] == pytest.approx((feats[0] + 1.0).tolist(), abs=1e-6)
    assert torch.equal(merged.x, kept.x) and not torch.equal(kept.x, clean.x)
    with pytest.raises(ValueError, match="duplicate_edges must be one of keep, merge, got 'drop'"):
        load_ogbn("ogbn-proteins", str(tmp_path / "clean"), duplicate_edges="drop")


@pytest.mark.parametrize(
    "experiment",
    [
        "proteins_revgnn_deep",
        "proteins_revgnn_wide",
        "proteins_resgnn_112",
        "proteins_revgnn_112",
        "proteins_wt_revgnn",
        "proteins_deq_gnn",
    ],
)
def test_paper_experiments_default_to_the_official_protocol(experiment):
    from conftest import compose_train

    cfg = compose_train("unused", f"experiment={experiment}")
    tc = cfg.trainer
    assert (tc.epochs, tc.train_parts, tc.partition.value, tc.shuffle_parts) == (2000, 10, "uniform", True)
    assert (tc.eval_every, tc.eval_views, tc.eval_parts, tc.fixed_eval_views) == (1, 1, 5, True)
    assert (tc.test_views, tc.test_parts, tc.grad_clip) == (10, 3, 1.0)
    assert cfg.backend.precision.value == "fp32" and cfg.optim.lr == 1e-3
    assert cfg.data.duplicate_edges == "merge"
    if experiment in (
        "proteins_revgnn_deep",
        "proteins_revgnn_wide",
        "proteins_revgnn_112",
        "proteins_wt_revgnn",
    ):
        assert cfg.model.group_init == "copy"
    # revgnn's own selection protocol by name
    ours = compose_train("unused", f"experiment={experiment}", "trainer=proteins_multiview").trainer
    assert (ours.partition.value, ours.eval_every, ours.eval_views, ours.eval_parts) == (
        "balanced",
        10,
        10,
        3,
    )


def test_graph_level_final_test_is_the_whole_graph_evaluation_and_refuses_more_views():
    from omegaconf import OmegaConf

    from revgnn.data.graph_dataset import mol_like
    from revgnn.engine.tasks import GraphTask

    ds = mol_like(num_graphs=40, batch_size=8)
    tc = lambda views: OmegaConf.create({"parts_per_step": None, "test_views": views})  # noqa: E731
    task = GraphTask(ds, tc(1))
    torch.manual_seed(0)
    model = create_model("revgnn_mol_small", **task.shapes)
    assert task.final_test(model, None, "cpu") == task.evaluate(model, None, "cpu")
    with pytest.raises(ValueError, match="graph-level: it evaluates whole graphs.*test_views=3"):
        GraphTask(ds, tc(3))
