"""Cluster launchers (hydra/launcher=slurm|local, Hydra's submitit plugin) and revgnn-reproduce's tables:
a 2-seed sweep through the submitit local launcher end to end, the launcher configs' schema, and the
labels of a table from a run shorter than its recipe."""

import json
import subprocess
from pathlib import Path

import pytest
from conftest import CONFIG_DIR, REPO, TINY_RUN, published_score, run_cli, run_summary
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

import revgnn.cli.launcher
from revgnn.cli import reproduce
from revgnn.cli.launcher import have_submitit
from revgnn.config.store import register_configs

needs_submitit = pytest.mark.skipif(
    not have_submitit(),
    reason="Hydra's submitit launcher: pip install '.[cluster]' (part of .[dev])",
)


def _launcher(*overrides):
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(
            config_name="train", overrides=list(overrides), return_hydra_config=True
        ).hydra.launcher


@needs_submitit
def test_slurm_launcher_has_the_usual_keys_and_revgnn_defaults():
    cfg = _launcher("hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.mem_gb=32")
    assert cfg._target_.endswith("SlurmLauncher")
    assert cfg.partition == "gpu" and cfg.mem_gb == 32 and cfg.gpus_per_node == 1
    assert cfg.timeout_min > 60 and cfg.cpus_per_task >= 1 and cfg.max_num_timeout == 0
    local = _launcher("hydra/launcher=local")
    assert local._target_.endswith("LocalLauncher") and local.timeout_min == cfg.timeout_min
    # the plugin's own nodes stay reachable under their names
    assert _launcher("hydra/launcher=submitit_slurm")._target_.endswith("SlurmLauncher")


@needs_submitit
@pytest.mark.parametrize("override", ["hydra.launcher.partiton=gpu", "hydra.launcher.timeout_min=soon"])
def test_launcher_keys_are_checked(override):
    with pytest.raises(ConfigCompositionException):
        _launcher("hydra/launcher=slurm", override)


@needs_submitit
@pytest.mark.slow
def test_two_seed_sweep_through_submitit_local(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli(
        "-m",
        "revgnn.train",
        "-m",
        "hydra/launcher=local",
        "seed=0,1",
        *TINY_RUN,
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
        timeout=420,
    )
    assert "Submitit 'local' sweep output dir" in proc.stdout + proc.stderr
    # the jobs run in submitit's processes, yet their directories are named by the swept values
    # alone, as under the basic launcher; no literal `%j` folder
    names = sorted(p.name for p in sweep.iterdir())
    assert names == [".submitit", "0_seed=0", "1_seed=1", "multirun.yaml", "results.md"]  # + the sweep table
    assert not [p for p in sweep.rglob("*") if "%" in p.name]
    summaries = sorted(sweep.rglob("summary.json"))
    assert [p.parent.name for p in summaries] == ["0_seed=0", "1_seed=1"]
    seeds = set()
    for path in summaries:
        summary = json.loads(path.read_text())
        assert summary["status"] == "completed" and summary["epochs"] == 1
        assert Path(summary["output_dir"]).resolve() == path.parent.resolve()
        lines = (path.parent / "metrics.csv").read_text().splitlines()
        assert lines[0].startswith("epoch,") and len(lines) == 2
        assert (path.parent / "best.pt").exists() and (path.parent / ".hydra" / "config.yaml").exists()
        seeds.add(summary["seed"])
    assert seeds == {0, 1}
    assert len(list((sweep / ".submitit").glob("*_log.out"))) == 2  # each job ran as a submitit job


def test_a_submitit_launcher_without_the_cluster_extra_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    """Without Hydra's submitit plugin, hydra/launcher=local|slurm (and the plugin's own names) is one
    line naming the cluster extra and how to install it, before Hydra starts (no multirun/ left),
    from revgnn-train and from revgnn-reproduce --launcher."""
    hide = "import sys; sys.modules['hydra_plugins.hydra_submitit_launcher'] = None; "
    for launcher in ("local", "slurm", "submitit_local"):
        argv = ["revgnn-train", "-m", f"hydra/launcher={launcher}", "seed=0,1", "trainer.epochs=1"]
        code = f"{hide}sys.argv = {argv!r}; from revgnn.train import cli; cli()"
        text = run_cli("-c", code, cwd=tmp_path, timeout=120, expect=2).output
        assert len(text.splitlines()) == 1, text
        assert text.startswith(f"revgnn-train: hydra/launcher={launcher} is Hydra's submitit launcher"), text
        assert "cluster extra" in text and 'pip install "revgnn[cluster]"' in text, text
        assert list(tmp_path.iterdir()) == [], text

    monkeypatch.setattr(revgnn.cli.launcher, "have_submitit", lambda: False)
    with pytest.raises(SystemExit) as e:
        reproduce.main(["--out", str(tmp_path / "r"), "--launcher", "local"])
    assert "--launcher local: hydra/launcher=local is Hydra's submitit launcher" in str(e.value)
    assert 'cluster extra, pip install "revgnn[cluster]"' in str(e.value)


def test_reproduce_offers_the_launchers_the_guide_names(capsys):
    """--launcher takes revgnn's launcher options, slurm and local, as the guide and --help say."""
    assert reproduce.LAUNCHERS == ("local", "slurm")
    with pytest.raises(SystemExit):
        reproduce.build_parser().parse_args(["--help"])
    usage = " ".join(capsys.readouterr().out.split())
    assert "--launcher {local,slurm}" in usage and "submitit_slurm" not in usage
    with pytest.raises(SystemExit) as e:
        reproduce.build_parser().parse_args(["--launcher", "submitit_slurm"])
    assert e.value.code == 2
    assert "invalid choice: 'submitit_slurm'" in capsys.readouterr().err
    guide = (REPO / "docs" / "guides" / "training.md").read_text()
    assert "`revgnn-reproduce --launcher slurm|local`" in guide


def _summary(seed, epochs, valid=0.8, test=0.79):
    return run_summary(seed=seed, epochs=epochs, best_epoch=epochs, highest_valid=valid, final_test=test)


def _this_run_cells(table):
    row = next(line for line in table.splitlines() if line.startswith("| this run |"))
    return [c.strip() for c in row.strip("|").split("|")][1:]


def test_table_of_a_short_run_says_so_in_the_title_and_beside_each_number():
    assert reproduce.recipe_epochs("proteins_revgnn_deep") == 2000
    table = reproduce.format_table(
        "proteins_revgnn_deep", [_summary(0, 50), _summary(1, 50, 0.81)], ["trainer.epochs=50"], recipe=2000
    )
    title = table.splitlines()[0]
    assert "short run: 50 of 2000 epochs" in title and "not comparable" in title
    cells = _this_run_cells(table)
    assert len(cells) == 5 and all(c.endswith("(50 of 2000 epochs)") for c in cells), cells
    per_seed = next(line for line in table.splitlines() if line.startswith("Per seed"))
    assert per_seed.count("(50 of 2000 epochs)") == 2
    assert f"| {published_score('proteins_revgnn_deep')} |" in table  # the paper's row carries no label

    smoke = reproduce.format_table("proteins_revgnn_deep", [_summary(0, 1)], [], recipe=2000, smoke=True)
    assert "smoke" in smoke.splitlines()[0] and "1 of 2000 epochs" in smoke.splitlines()[0]
    assert all("(smoke, 1 of 2000 epochs)" in c for c in _this_run_cells(smoke))

    full = reproduce.format_table(
        "proteins_revgnn_deep", [_summary(0, 2000), _summary(1, 2000)], [], recipe=2000
    )
    assert full.splitlines()[0] == "# proteins_revgnn_deep"
    assert not any("epochs)" in c for c in _this_run_cells(full))


def test_table_of_a_changed_model_says_it_is_not_the_papers_configuration():
    """``model.num_layers=2`` (or any change to the model, data, optimiser or trainer) over the whole
    recipe: the title says "not the paper's configuration" and every number carries the change;
    where the data is (data.root) changes nothing."""
    summaries = [_summary(0, 2000), _summary(1, 2000)]
    table = reproduce.format_table(
        "proteins_revgnn_deep", summaries, ["data.root=/data", "model.num_layers=2"], recipe=2000
    )
    title = table.splitlines()[0]
    assert "not the paper's configuration: model.num_layers=2" in title and "not comparable" in title
    cells = _this_run_cells(table)
    assert all(c.endswith("(changed: model.num_layers=2)") for c in cells), cells
    assert f"| {published_score('proteins_revgnn_deep')} |" in table
    short = reproduce.format_table(
        "proteins_revgnn_deep", [_summary(0, 50)], ["trainer.epochs=50", "optim.lr=0.01"], recipe=2000
    )
    assert "(not the paper's configuration: optim.lr=0.01, 50 of 2000 epochs" in short.splitlines()[0]
    assert all(c.endswith("(50 of 2000 epochs, changed: optim.lr=0.01)") for c in _this_run_cells(short))
    plain = reproduce.format_table("proteins_revgnn_deep", summaries, ["data.root=/data"], recipe=2000)
    assert plain.splitlines()[0] == "# proteins_revgnn_deep"


def test_reproduce_with_a_launcher_runs_one_sweep_and_tables_every_seed(tmp_path, monkeypatch):
    """``--launcher``: one ``revgnn.train -m`` over the seeds (the launcher's overrides passed on), and the
    table gathers each job's summary from the sweep directory whatever the job directories are named."""
    calls = []

    def fake_run(cmd, check):
        calls.append(cmd)
        sweep = Path(next(c for c in cmd if c.startswith("hydra.sweep.dir=")).split("=", 1)[1])
        for job, seed in enumerate((0, 1, 2)):
            (sweep / f"{job}_seed={seed}").mkdir(parents=True)
            (sweep / f"{job}_seed={seed}" / "summary.json").write_text(
                json.dumps(_summary(seed, 3).to_dict())
            )
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(reproduce.subprocess, "run", fake_run)
    out = tmp_path / "out"
    reproduce.main(
        [
            "--experiment",
            "proteins_revgnn_wide",
            "--seeds",
            "3",
            "--out",
            str(out),
            "--launcher",
            "slurm",
            "hydra.launcher.partition=gpu",
            "trainer.epochs=3",
        ]
    )
    (cmd,) = calls
    assert cmd[1:5] == ["-m", "revgnn.train", "-m", "hydra/launcher=slurm"]
    assert "seed=0,1,2" in cmd and "hydra.launcher.partition=gpu" in cmd and "trainer.epochs=3" in cmd
    table = (out / "results.md").read_text()
    assert "3 seeds" in table and "short run: 3 of 2000 epochs" in table
    assert published_score("proteins_revgnn_wide") in table

    with pytest.raises(SystemExit, match="without --launcher"):
        reproduce.main(["--out", str(out), "hydra.launcher.partition=gpu"])
