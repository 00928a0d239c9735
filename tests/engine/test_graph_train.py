"""Graph-level training through the one loop (revgnn-train): CLI smoke run, exact resume, configs."""

import json

import pytest
import torch
from conftest import CONFIG_DIR
from hydra import compose, initialize_config_dir

from revgnn.cli.train import train
from revgnn.engine.checkpoint import load_checkpoint
from revgnn.models.paper import MOLHIV
from revgnn.models.registry import paper_result

TINY = [
    "experiment=mol_like_revgnn",
    "data.num_graphs=120",
    "data.batch_size=16",
    "model.num_layers=3",
    "model.hidden_channels=16",
    "logger.progress_bar=false",
    "logger.plot=false",
]


def _cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=TINY + list(overrides))
    cfg.output_dir = str(tmp_path)
    return cfg


def test_cli_one_epoch_smoke_on_generated_molecules(train_cli):
    run_dir = train_cli("mol_smoke", *TINY, "trainer.epochs=1")
    for name in ("metrics.csv", "summary.json", "last.pt", "best.pt"):
        assert (run_dir / name).exists(), name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["data"] == "mol_like" and summary["model"] == "revgnn_mol_small"
    assert summary["metric"] == "rocauc" and summary["epochs"] == 1
    assert 0.0 <= summary["highest_valid"] <= 1.0


def test_graph_training_resumes_exactly(tmp_path):
    """3 epochs in one go == 2 epochs, then resume for 1 more (shuffling is a function of seed and epoch)."""
    full = train(_cfg(tmp_path / "full", "trainer.epochs=3"))
    train(_cfg(tmp_path / "part", "trainer.epochs=2"))
    resumed = train(
        _cfg(tmp_path / "resumed", "trainer.epochs=3", f"ckpt_path={tmp_path / 'part' / 'last.pt'}")
    )
    assert resumed["highest_valid"] == full["highest_valid"] and resumed["final_test"] == full["final_test"]
    a = load_checkpoint(str(tmp_path / "full" / "last.pt"))["model"]
    b = load_checkpoint(str(tmp_path / "resumed" / "last.pt"))["model"]
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize(
    "experiment,norm,params",
    [
        (experiment, norm, paper_result(experiment)[0].num_parameters)  # the registry's exact count
        for experiment, norm in (("molhiv_revgnn_graphnorm", "graph"), ("molhiv_revgnn_batchnorm", "batch"))
    ],
)
def test_molhiv_experiments_have_the_paper_model(experiment, norm, params):
    from revgnn.data.graph_dataset import GraphDataset
    from revgnn.engine.loop import build_model
    from revgnn.engine.tasks import shapes as data_shapes
    from revgnn.models import count_parameters, model_info

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"experiment={experiment}"])
    assert cfg.data._target_ == "revgnn.data.graph_dataset.load_ogbg" and cfg.data.name == "ogbg-molhiv"
    assert model_info(cfg.model.name).defaults["norm"] == norm
    assert cfg.data.batch_size == 32 and cfg.trainer.epochs == 300
    shapes = GraphDataset(
        name="ogbg-molhiv",
        graphs=[],
        split_idx={k: torch.zeros(0, dtype=torch.long) for k in ("train", "valid", "test")},
        task="multilabel",
        num_classes=MOLHIV["out_channels"],
        evaluator="ogbg-molhiv",
        in_channels=MOLHIV["in_channels"],
        edge_channels=MOLHIV["edge_channels"],
    )
    assert count_parameters(build_model(cfg.model, data_shapes(shapes))) == params
