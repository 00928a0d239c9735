"""Every refusal of a backend or a task is made before the data loads (revgnn.engine.preflight): each
is run through the training loop with a data loader that fails if it is ever called, so a refusal
made after the data loads fails the test with that loader's error instead of the expected message."""

import textwrap

import pytest
from conftest import compose_train, run_cli
from omegaconf import OmegaConf, open_dict

from revgnn.errors import ConfigError

NEVER_LOADED = """
from revgnn.data.graph_dataset import GraphDataset
from revgnn.data.node_dataset import NodeDataset


def nodes() -> NodeDataset:
    raise AssertionError("the node data loaded before the refusal")


def graphs() -> GraphDataset:
    raise AssertionError("the graph data loaded before the refusal")
"""

#: what torchrun sets for a worker (rank 0 of 2), so a check made at start sees a torchrun job
TORCHRUN = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}


@pytest.fixture
def never_loaded(tmp_path, monkeypatch):
    """The module ``never_loaded`` (its loaders ``nodes`` and ``graphs`` declare their level and
    fail when called), importable; no torchrun variable in the environment."""
    (tmp_path / "never_loaded.py").write_text(textwrap.dedent(NEVER_LOADED))
    monkeypatch.syspath_prepend(str(tmp_path))
    for key in TORCHRUN:
        monkeypatch.delenv(key, raising=False)
    return tmp_path


def _refused(tmp_path, level, *overrides, env=()):
    """The message the training loop refuses ``overrides`` with, on data of ``level`` that is never
    loaded."""
    from revgnn.engine.loop import train

    cfg = compose_train(tmp_path / "run", *overrides)
    with open_dict(cfg):
        cfg.data = OmegaConf.create({"_target_": f"never_loaded.{level}"})
    with pytest.raises(ConfigError) as e:
        train(cfg)
    assert not (tmp_path / "run").exists()
    return str(e.value)


SAR = ["backend=sar", "backend.partition_dir=nowhere"]
CASES = {
    "sar compile": (
        "nodes",
        [*SAR, "trainer.compile=true"],
        {},
        "trainer.compile=true is not supported with backend=sar",
    ),
    "sar partition_dir": ("nodes", ["backend=sar"], {}, "backend=sar needs backend.partition_dir=DIR"),
    "sar parts": ("nodes", [*SAR, "trainer.test_parts=3"], {}, "trainer.test_parts=3 cannot apply"),
    "sar test views": ("nodes", [*SAR, "trainer.test_views=2"], {}, "backend=sar evaluates whole graphs"),
    "sar without torchrun": ("nodes", SAR, {}, "launch it as `torchrun --nproc_per_node=P"),
    "node parts": (
        "nodes",
        ["trainer.train_parts=10", "trainer.parts_per_step=3"],
        {},
        "trainer.train_parts=10 must be a multiple of trainer.parts_per_step=3",
    ),
    "graph parts_per_step": (
        "graphs",
        ["trainer.parts_per_step=2"],
        {},
        "trainer.parts_per_step concerns node-level partitions; graphs is graph-level",
    ),
    "graph test views": (
        "graphs",
        ["trainer.test_views=3"],
        {},
        "graphs is graph-level: it evaluates whole graphs",
    ),
    "unknown backend": ("nodes", ["backend.name=lcal"], {}, "backend.name: unknown backend 'lcal'"),
    "ddp without torchrun": ("nodes", ["backend=ddp"], {}, "backend=ddp runs one process per worker"),
    "ddp workers": (
        "nodes",
        ["backend=ddp", "trainer.parts_per_step=3", "trainer.train_parts=6"],
        TORCHRUN,
        "trainer.parts_per_step=3 must be a multiple of the 2 workers",
    ),
    "ddp graphs": (
        "graphs",
        ["backend=ddp"],
        TORCHRUN,
        "backend=ddp deals out the parts of a node-level graph",
    ),
    "ddp nccl on cpu": (
        "nodes",
        ["backend=ddp", "backend.device=cpu", "backend.dist_backend=nccl"],
        TORCHRUN,
        "backend.dist_backend=nccl moves CUDA tensors only",
    ),
    "local under torchrun": ("nodes", [], TORCHRUN, "this process is one of 2 torchrun workers"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_backend_and_task_refusal_is_made_before_the_data_loads(never_loaded, monkeypatch, case):
    level, overrides, env, message = CASES[case]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert message in _refused(never_loaded, level, *overrides)


def test_sar_refuses_a_data_group_other_than_the_partitioned_one_before_loading(never_loaded, monkeypatch):
    """``backend=sar`` compares the ``data`` group with the partition's ``meta.json`` before this
    worker loads its part (or any data)."""
    from revgnn.data.synthetic import proteins_like
    from revgnn.distributed.partition import partition_dataset

    parts = never_loaded / "parts"
    saved = {"_target_": "revgnn.data.synthetic.proteins_like", "num_nodes": 400}
    partition_dataset(proteins_like(num_nodes=400), str(parts), 2, "random", data_config=saved)
    for key, value in TORCHRUN.items():
        monkeypatch.setenv(key, value)
    text = _refused(never_loaded, "nodes", "backend=sar", f"backend.partition_dir={parts}")
    assert f"backend=sar trains on the graph in {parts}, but the data group describes another one" in text
    assert "data._target_: 'revgnn.data.synthetic.proteins_like' in the partition" in text


def test_a_task_refusal_on_the_command_line_is_one_line_exit_2_before_the_data_loads(never_loaded):
    """The whole command: a data option whose loader fails when called, refused in one line."""
    data = never_loaded / "data"
    data.mkdir()
    (data / "never.yaml").write_text("_target_: never_loaded.graphs\n")
    run = run_cli(
        "-m", "revgnn.train", "--config-dir", str(never_loaded), "data=never", "trainer.test_views=3",
        f"output_dir={never_loaded / 'run'}", cwd=never_loaded, expect=2,
    )  # fmt: skip
    lines = run.output.strip().splitlines()
    assert len(lines) == 1, run.output
    assert lines[0].startswith("revgnn-train: graphs is graph-level: it evaluates whole graphs"), run.output
    assert "trainer.test_views=3 cannot apply" in lines[0], run.output
    assert not (never_loaded / "run").exists()


def test_data_level_is_read_from_the_loaders_return_annotation():
    from revgnn.data.graph_dataset import load_ogbg, mol_like
    from revgnn.data.ogbn import load_ogbn
    from revgnn.data.pyg_data import load_pyg_file
    from revgnn.data.synthetic import proteins_like
    from revgnn.engine.tasks import data_level

    assert [data_level(f) for f in (proteins_like, load_ogbn, mol_like, load_ogbg)] == [
        "node",
        "node",
        "graph",
        "graph",
    ]
    assert data_level(load_pyg_file) is None  # either level: the task checks once the data loaded
    assert data_level(lambda: None) is None
