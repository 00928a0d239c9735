"""Every config composes against its schema, and every experiment's model and data instantiate."""

from pathlib import Path

import pytest
import torch
from conftest import CONFIG_DIR, REPO, compose, run_cli
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from revgnn.config.store import builtin_model_names
from revgnn.engine.inference import as_edge_index
from revgnn.engine.loop import build_model
from revgnn.engine.tasks import make_task, shapes
from revgnn.models.paper import PROTEINS
from revgnn.testing.fake_ogb import write_fake_ogbg, write_fake_ogbn

EXPERIMENTS = sorted(p.stem for p in Path(CONFIG_DIR, "experiment").glob("*.yaml"))
MODELS = builtin_model_names()  # the `model=` options (tests/models/test_zoo.py)
TINY = {"num_layers": 2, "hidden_channels": 8}


def test_top_level_configs_symlink_points_at_package_configs():
    assert (REPO / "configs").resolve() == Path(CONFIG_DIR).resolve()


def test_paper_experiments_exist():
    assert {
        "proteins_revgnn_deep",
        "proteins_revgnn_wide",
        "proteins_resgnn_112",
        "proteins_revgnn_112",
        "proteins_wt_revgnn",
        "products_revgnn_112",
        "arxiv_revgat",
    } <= set(EXPERIMENTS)


@pytest.fixture(scope="module")
def fake_ogb_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("ogb")
    for name in ("ogbn-proteins", "ogbn-arxiv", "ogbn-products"):
        write_fake_ogbn(str(root), name, num_nodes=40, avg_degree=4)
    write_fake_ogbg(str(root), "ogbg-molhiv", num_graphs=40)
    return str(root)


def _tiny_model(cfg):
    """Shrinks the model to the TINY sizes its class has (a model config holds only the name)."""
    from revgnn.models import list_models, model_arguments

    if cfg.model.name in list_models():
        for key, value in TINY.items():
            if key in model_arguments(cfg.model.name):
                cfg.model[key] = value


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_instantiates_model_and_data(experiment, fake_ogb_root, monkeypatch):
    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("OGB prompted"))
    cfg = compose([f"experiment={experiment}"])
    assert cfg.name == experiment
    if "root" in cfg.data:
        cfg.data.root = fake_ogb_root
    _tiny_model(cfg)
    from revgnn.models import list_models

    if cfg.model.name not in list_models():
        pytest.xfail(
            f"model {cfg.model.name!r} is not registered: revgnn/models/__init__.py must import its module"
        )
    from hydra.utils import instantiate

    ds = instantiate(cfg.data)
    model = build_model(cfg.model, shapes(ds))
    model.eval()
    with torch.no_grad():
        if hasattr(ds, "graphs"):  # graph-level data: one batch of graphs, one output row per graph
            batch = next(
                iter(next(iter(make_task(ds, cfg.trainer).train_steps(torch.Generator(), "cpu"))).batches)
            )
            out = model(*batch.inputs)
            assert out.shape == (batch.y.size(0), ds.num_classes)
        else:
            out = model(ds.x, as_edge_index(ds.edge_index, ds.num_nodes), ds.edge_attr)
            assert out.shape == (ds.num_nodes, ds.num_classes)
    assert torch.isfinite(out).all()
    optimizer = instantiate(cfg.optim)(model.parameters())
    assert isinstance(optimizer, torch.optim.Optimizer)


@pytest.mark.parametrize("model", MODELS)
def test_every_model_config_builds_on_proteins_like(model):
    cfg = compose(
        [f"model={model}", "data.num_nodes=400", "data.window=5", "data.avg_degree=6", "data.max_hops=2"]
    )
    _tiny_model(cfg)
    if cfg.model.name.startswith("revgnn_mol"):
        pytest.skip("graph-level model: built on graph data in test_experiment_* and tests/*/test_graph_*.py")
    from hydra.utils import instantiate

    ds = instantiate(cfg.data)
    out = build_model(cfg.model, shapes(ds))(ds.x, as_edge_index(ds.edge_index, ds.num_nodes), ds.edge_attr)
    assert out.shape == (400, 112)


@pytest.mark.parametrize(
    "override,key",
    [
        ("trainer.epoch=3", "epoch"),  # typo in a fixed group
        ("data.num_nodse=10", "num_nodse"),  # typo in a data option's schema
        ("optim.learning_rate=0.1", "learning_rate"),
    ],
)
def test_typos_are_errors_naming_the_key(override, key):
    """Fixed groups and data options fail at composition; a model key is checked against its class
    when the run starts (tests/models/test_zoo.py)."""
    with pytest.raises(ConfigCompositionException) as err:
        compose([override])
    assert key in str(err.value) + str(err.value.__cause__)


@pytest.mark.parametrize(
    "override,key",
    [("trainer.epochs=many", "epochs"), ("backend.device=tpu", "device"), ("data.seed=1.5", "seed")],
)
def test_wrong_types_are_errors_naming_the_key(override, key):
    with pytest.raises(ConfigCompositionException) as err:
        compose([override])
    assert key in str(err.value) + str(err.value.__cause__)


def test_unknown_model_key_is_rejected_by_the_registry_when_built():
    cfg = compose(["data.num_nodes=400", "data.window=5", "data.avg_degree=6"])
    kwargs = OmegaConf.to_container(cfg.model)
    kwargs["num_layerz"] = 3  # a typo that bypassed check_model_config still fails at build time
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    with pytest.raises((TypeError, InstantiationException), match="num_layerz"):
        instantiate(kwargs, **PROTEINS)


def _run(args, cwd):
    code = (
        "import sys, runpy; sys.argv = ['revgnn-train'] + sys.argv[1:]; "
        "runpy.run_module('revgnn.train', run_name='__main__')"
    )
    return run_cli("-X", "importtime", "-c", code, *args, cwd=cwd, timeout=120)


@pytest.mark.parametrize("args", [["--help"], ["--cfg", "job", "experiment=proteins_revgnn_deep"]])
def test_help_and_cfg_do_not_import_torch_geometric(args, tmp_path):
    proc = _run(args, tmp_path)
    assert "proteins_like" in proc.stdout or "proteins_revgnn_deep" in proc.stdout
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert "torch_geometric" not in imported and "torch" not in imported


def test_importing_the_config_layer_stores_nothing_until_register_configs():
    """``import revgnn.config`` has no side effect on Hydra's ConfigStore (nor imports torch);
    :func:`revgnn.config.store.register_configs` stores the schemas, the model options and the
    run-directory resolvers, and calling it again changes nothing. A fresh interpreter, so that
    nothing registered earlier in the test session counts."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from hydra.core.config_store import ConfigStore\n"
        "from omegaconf import OmegaConf\n"
        "repo = ConfigStore.instance().repo\n"
        "hydra_own = sorted(repo)\n"
        "import revgnn.config\n"
        "print(sorted(repo) == hydra_own, OmegaConf.has_resolver('revgnn.job_dir'), 'torch' in sys.modules)\n"
        "revgnn.config.register_configs()\n"
        "first = (sorted(repo), sorted(repo['model']))\n"
        "revgnn.config.register_configs()\n"
        "print(first == (sorted(repo), sorted(repo['model'])), OmegaConf.has_resolver('revgnn.job_dir'))\n"
        "print(sorted(repo['model']) == sorted(n + '.yaml' for n in revgnn.config.builtin_model_names()))\n"
        "print('train_schema.yaml' in repo, sorted(repo['schema']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    before, same, models, stored = out.strip().splitlines()
    assert before == "True False False", out
    assert same == "True True" and models == "True", out
    assert stored == "True ['data', 'model', 'optim']", out
