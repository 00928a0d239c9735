"""The training loop: CLI smoke run, exact resume, divergence handling, clear errors."""

import csv
import json
import re

import pytest
import torch
from conftest import TIMING, TINY_GRAPH, compose, run_cli
from omegaconf import OmegaConf
from torch import nn

from revgnn.cli.train import train
from revgnn.engine.checkpoint import load_checkpoint
from revgnn.engine.divergence import TrainingDiverged
from revgnn.models import register_model

TINY = [
    *TINY_GRAPH,
    "trainer.train_parts=2",
    "trainer.eval_every=1",
    "trainer.eval_parts=2",
    "logger.progress_bar=false",
]


def _cfg(tmp_path, *overrides, tiny_data=True):
    base = TINY if tiny_data else [o for o in TINY if not o.startswith("data.")]
    cfg = compose(base + ["logger.plot=false"] + list(overrides))
    cfg.output_dir = str(tmp_path)
    return cfg


class NanAfter(nn.Module):
    """A linear model whose output turns NaN from its ``bad_step``-th training forward on."""

    def __init__(self, in_channels, out_channels, bad_step=3, **unused):
        super().__init__()
        self.lin = nn.Linear(in_channels, out_channels)
        self.bad_step, self.calls = bad_step, 0

    def forward(self, x, edge_index, edge_attr=None):
        self.calls += self.training
        out = self.lin(x)
        return out * float("nan") if self.training and self.calls >= self.bad_step else out


@register_model(NanAfter, name="test_nan_after")
def _nan_model():
    return {}


def test_cli_one_epoch_smoke(train_cli):
    """`python -m revgnn.train` end to end; outputs land in Hydra's run directory under the cwd."""
    run_dir = train_cli("smoke", *TINY, "trainer.epochs=1")
    for name in ("metrics.csv", "summary.json", "last.pt", "best.pt", "learning_curve.png", "train.log"):
        assert (run_dir / name).exists(), name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["metric"] == "rocauc" and 0.0 <= summary["final_test"] <= 1.0
    assert summary["num_parameters"] > 0 and summary["peak_memory_mb"] > 0
    assert "Final Test" in (run_dir / "train.log").read_text()


def test_resume_is_exact(tmp_path):
    full = train(_cfg(tmp_path / "full", "trainer.epochs=4"))
    train(_cfg(tmp_path / "half", "trainer.epochs=2"))
    resumed = train(
        _cfg(tmp_path / "resumed", "trainer.epochs=4", f"ckpt_path={tmp_path / 'half' / 'last.pt'}")
    )
    a, b = (
        load_checkpoint(str(tmp_path / "full" / "last.pt")),
        load_checkpoint(str(tmp_path / "resumed" / "last.pt")),
    )
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    strip = lambda hist: [{k: v for k, v in row.items() if k not in TIMING} for row in hist]  # noqa: E731
    assert strip(a["history"]) == strip(b["history"]) and a["best"] == b["best"]
    for k in ("highest_valid", "final_test", "best_epoch"):
        assert full[k] == resumed[k]
    with open(tmp_path / "resumed" / "metrics.csv") as f:
        assert [int(r["epoch"]) for r in csv.DictReader(f)] == [1, 2, 3, 4]


@pytest.mark.parametrize("split", [1, 3])
def test_resume_at_any_epoch_equals_the_uninterrupted_run(tmp_path, split):
    """5 epochs evaluated every 2 (and at the last) equal ``split`` + the rest resumed in the same
    directory: the first leg's closing evaluation of its last epoch (off the schedule; at split 3 it
    improves on epoch 2 and writes best.pt) is undone by the resume, best.pt put back."""
    every = ["trainer.eval_every=2"]
    train(_cfg(tmp_path / "full", "trainer.epochs=5", *every))
    leg = tmp_path / "legs"
    first = train(_cfg(leg, f"trainer.epochs={split}", *every))
    assert first["best_epoch"] == split  # the closing evaluation improved: the case to undo
    train(_cfg(leg, "trainer.epochs=5", *every, f"ckpt_path={leg / 'last.pt'}"))
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMING} for r in rows]  # noqa: E731
    for name in ("last.pt", "best.pt"):
        a, b = load_checkpoint(str(tmp_path / "full" / name)), load_checkpoint(str(leg / name))
        assert a["epoch"] == b["epoch"] and a["best"] == b["best"], name
        assert strip(a["history"]) == strip(b["history"]), name
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]), name
    with open(tmp_path / "full" / "metrics.csv") as f, open(leg / "metrics.csv") as g:
        assert strip(csv.DictReader(f)) == strip(csv.DictReader(g))
    assert [
        int(r["epoch"]) for r in strip(load_checkpoint(str(leg / "last.pt"))["history"]) if r["valid"] != ""
    ] == [
        2,
        4,
        5,
    ]


def test_nan_loss_stops_with_clear_error_and_keeps_last_good_checkpoint(tmp_path):
    cfg = _cfg(tmp_path, "trainer.epochs=3")
    cfg.model = OmegaConf.create(
        {"_target_": "revgnn.models.create_model", "name": "test_nan_after", "bad_step": 3}
    )
    with pytest.raises(TrainingDiverged, match=r"loss is nan at epoch 2.*last\.pt \(epoch 1\)"):
        train(cfg)
    assert load_checkpoint(str(tmp_path / "last.pt"))["epoch"] == 1
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "diverged"


def test_an_infinite_gradient_norm_stops_without_an_update(tmp_path):
    """A finite loss whose backward is infinite (epoch 2's first step, the 3rd training forward):
    the step applies no update, the run stops as diverged naming the gradient norm, and last.pt of
    epoch 1 holds finite weights."""
    from conftest import compose_train
    from loop_models import with_model

    cfg = with_model(compose_train(tmp_path, *TINY, "trainer.epochs=3"), "inf_gradient_at", at_call=3)
    with pytest.raises(
        TrainingDiverged,
        match=r"gradient norm is (nan|inf) at epoch 2, step 0: training "
        r"diverged \(no update was applied\)\. Last good checkpoint: .*last\.pt \(epoch 1\)",
    ):
        train(cfg)
    ckpt = load_checkpoint(str(tmp_path / "last.pt"))
    assert ckpt["epoch"] == 1 and all(torch.isfinite(v).all() for v in ckpt["model"].values())
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "diverged"


def test_non_finite_predictions_stop_as_diverged_not_in_the_scorer(tmp_path):
    """NaN logits in evaluation only (training stays finite): epoch 1's evaluation stops the run as
    diverged, naming the splits, before OGB's evaluator sees them (scikit-learn would raise "Input
    contains NaN"); summary.json is written and no checkpoint of the diverged epoch is."""
    from conftest import compose_train
    from loop_models import with_model

    cfg = with_model(compose_train(tmp_path, *TINY, "trainer.epochs=3"), "nan_in_evaluation")
    with pytest.raises(TrainingDiverged) as info:
        train(cfg)
    msg = str(info.value)
    assert msg.startswith("the evaluation's predictions are NaN or infinite (train "), msg
    assert "at epoch 1: training diverged. Last good checkpoint: none (no epoch finished)" in msg, msg
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["epochs"] == 0
    assert not (tmp_path / "last.pt").exists()


def test_failure_summary_names_the_epoch_that_failed(tmp_path):
    """A model that raises in epoch 3 (its 5th training forward, 2 parts per epoch): summary.json
    says "failed at epoch 3" and last.pt holds epoch 2, the last one that finished."""
    from conftest import compose_train
    from loop_models import with_model

    cfg = with_model(compose_train(tmp_path, *TINY, "trainer.epochs=4"), "fail_at", at_call=5)
    with pytest.raises(RuntimeError, match="training forward 5"):
        train(cfg)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed at epoch 3: RuntimeError", summary["status"]
    assert summary["epochs"] == 2 and load_checkpoint(str(tmp_path / "last.pt"))["epoch"] == 2


def test_cli_divergence_is_one_message_and_exit_code_1(tmp_path):
    """`python -m revgnn.train` whose evaluation diverges: one error line naming what was not finite
    and the last good checkpoint, no traceback, exit code 1, summary.json written as diverged."""
    run = tmp_path / "run"
    args = [*TINY, "trainer.epochs=2", "model._target_=loop_models.nan_in_evaluation", f"output_dir={run}"]
    out = run_cli("-m", "revgnn.train", *args, timeout=600, expect=1)
    text = out.stdout + out.stderr
    errors = [line for line in text.splitlines() if "[ERROR]" in line]
    assert len(errors) == 1 and "Traceback" not in text, text[-3000:]
    assert "predictions are NaN or infinite" in errors[0] and "Last good checkpoint: none" in errors[0]
    assert json.loads((run / "summary.json").read_text())["status"] == "diverged"


def test_missing_checkpoint_and_data_path_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        train(_cfg(tmp_path, "trainer.epochs=1", f"ckpt_path={tmp_path / 'nope.pt'}"))
    from hydra.errors import InstantiationException

    with pytest.raises(InstantiationException, match=r"no_such_dir.*proteins\.zip"):
        train(_cfg(tmp_path, "data=ogbn_proteins", f"data.root={tmp_path / 'no_such_dir'}", tiny_data=False))


def test_incompatible_checkpoint_is_explained(tmp_path):
    train(_cfg(tmp_path / "a", "trainer.epochs=1"))
    ckpt = f"ckpt_path={tmp_path / 'a' / 'last.pt'}"
    with pytest.raises(ValueError, match=r"model.hidden_channels: 8 \(checkpoint\) -> 16 \(now\)"):
        train(_cfg(tmp_path / "b", "trainer.epochs=2", "model.hidden_channels=16", ckpt))
    with pytest.raises(RuntimeError, match="does not fit model"):
        train(
            _cfg(
                tmp_path / "b",
                "trainer.epochs=2",
                "model.hidden_channels=16",
                ckpt,
                "resume_allow=[model.hidden_channels]",
            )
        )


def test_resume_refuses_changed_settings_unless_allowed(tmp_path):
    """A resume lists every setting that differs from the checkpoint's (seed, optim.lr, ...); an
    allowed lr change reaches the restored optimiser; extending trainer.epochs is always fine."""
    train(_cfg(tmp_path / "a", "trainer.epochs=1"))
    ckpt = f"ckpt_path={tmp_path / 'a' / 'last.pt'}"
    with pytest.raises(
        ValueError, match=r"(?s)optim.lr: 0.005 \(checkpoint\) -> 0.5.*seed: 0 \(checkpoint\) -> 7"
    ):
        train(_cfg(tmp_path / "b", "trainer.epochs=2", "optim.lr=0.5", "seed=7", ckpt))
    with pytest.raises(ValueError, match="resume_allow names optim.learning_rate"):
        train(_cfg(tmp_path / "b", "trainer.epochs=2", ckpt, "resume_allow=[optim.learning_rate]"))
    train(_cfg(tmp_path / "b", "trainer.epochs=2", "optim.lr=0.5", ckpt, "resume_allow=[optim.lr]"))
    saved = load_checkpoint(str(tmp_path / "b" / "last.pt"))
    assert saved["epoch"] == 2 and {g["lr"] for g in saved["optimizer"]["param_groups"]} == {0.5}
    assert saved["history"][-1]["lr"] == 0.5


@pytest.mark.parametrize(
    "override,message",
    [
        ("trainer.grad_clip=-1", "trainer.grad_clip must be >= 0, got -1"),
        ("backend.num_threads=0", "backend.num_threads must be >= 1, got 0"),
        ("backend.num_threads=-2", "backend.num_threads must be >= 1, got -2"),
        ("optim.lr=0", "optim.lr must be > 0, got 0"),
        ("model.dropout=1.5", "model.dropout must be >= 0 and < 1, got 1.5"),
        ("data.num_nodes=0", "data.num_nodes must be >= 1, got 0"),
        ("trainer.parts_per_step=0", "trainer.parts_per_step must be >= 1, got 0"),
        ("backend.timeout_s=0", "backend.timeout_s must be > 0, got 0"),
    ],
)
def test_out_of_range_settings_are_named(tmp_path, override, message):
    from revgnn.errors import ConfigError

    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        train(_cfg(tmp_path, "trainer.epochs=1", override))


def _refused(args, tmp_path):
    """``python -m revgnn.train *args``: its exit status and whole output (stdout and stderr)."""
    out = run_cli("-m", "revgnn.train", *args, cwd=tmp_path, expect=None)
    return out.returncode, out.output


def test_configuration_errors_are_one_message_before_anything_starts(tmp_path, monkeypatch):
    """A value out of range, a misspelt model key and a resume whose checkpoint was trained with
    other settings: exit status 2, the message alone (no traceback) naming the key, and no run
    directory left behind. The resume is refused before the backend builds the data and model."""
    from revgnn.engine import loop
    from revgnn.errors import ConfigError

    run = tmp_path / "run"
    for override, message in (
        ("optim.lr=-0.01", "revgnn-train: optim.lr must be > 0, got -0.01"),
        (
            "model.hiden_channels=8",
            "RevGNN has no argument(s) 'model.hiden_channels' (did you mean model.hidden_channels?); valid",
        ),
        ("ckpt_path=nope.pt", "checkpoint 'nope.pt' does not exist: ckpt_path names no file"),
    ):
        rc, text = _refused([override, f"output_dir={run}"], tmp_path)
        assert rc == 2 and message in text and "Traceback" not in text, text
        assert len(text.splitlines()) == 1, text
        assert not run.exists() and sorted(p.name for p in tmp_path.iterdir()) == [], text
    # a sweep's shared settings: refused before any job starts, no sweep directory
    rc, text = _refused(["-m", "optim.lr=-1", "seed=0,1", f"hydra.sweep.dir={run}"], tmp_path)
    assert rc == 2 and text == "revgnn-train: optim.lr must be > 0, got -1.0" and not run.exists(), text

    first = tmp_path / "first"
    train(_cfg(first, "trainer.epochs=1"))
    ckpt = first / "last.pt"
    rc, text = _refused(
        [*TINY, "logger.plot=false", "trainer.epochs=2", "seed=7", f"ckpt_path={ckpt}", f"output_dir={run}"],
        tmp_path,
    )
    assert rc == 2 and "Traceback" not in text, text
    assert text.startswith(f"revgnn-train: checkpoint {ckpt} was trained with other settings:"), text
    assert "  seed: 0 (checkpoint) -> 7 (now)" in text and len(text.splitlines()) <= 4, text
    assert not run.exists()

    def no_backend(cfg):
        raise AssertionError("the run built its backend although the resume is refused")

    monkeypatch.setattr(loop, "make_backend", no_backend)
    with pytest.raises(ConfigError, match=r"seed: 0 \(checkpoint\) -> 7"):
        train(_cfg(run, "trainer.epochs=2", "seed=7", f"ckpt_path={ckpt}"))


def test_unknown_keys_are_named(tmp_path):
    """Hydra's `+key=value` adds a key composition would refuse; the run refuses it before it starts,
    naming it (and the closest real key), in one line of output and exit status 2."""
    for override, message in (
        ("+foo=1", "unknown key foo: revgnn-train has no such setting; the top level takes model,"),
        ("+trainer.epoch=3", "unknown key trainer.epoch: revgnn-train has no such setting (did you mean "),
        ("+backend.timeout=3", "unknown key backend.timeout: "),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            train(_cfg(tmp_path, "trainer.epochs=1", override))
    text = run_cli(
        "-m", "revgnn.train", "+foo=1", f"output_dir={tmp_path / 'cli'}", timeout=120, expect=2
    ).output
    assert "unknown key foo" in text, text
    assert len(text.splitlines()) <= 2 and "Traceback" not in text, text
    assert not (tmp_path / "cli").exists()  # refused before Hydra creates the run directory


def test_cli_output_dir_holds_the_whole_run_and_sweeps_keep_every_job(tmp_path):
    """output_dir=X: checkpoints, metrics, .hydra/ and train.log all in X, nothing under the cwd's
    outputs/. A multirun over a non-seed key gives every job its own directory, named by job
    number and overrides."""
    run = tmp_path / "run"
    run_cli("-m", "revgnn.train", *TINY, "trainer.epochs=1", f"output_dir={run}", cwd=tmp_path, timeout=600)
    for name in ("last.pt", "metrics.csv", "summary.json", "train.log", ".hydra/config.yaml"):
        assert (run / name).exists(), name
    assert not (tmp_path / "outputs").exists()
    sweep = tmp_path / "sweep"
    sweep_args = [*TINY, "trainer.epochs=1", "optim.lr=0.001,0.01", f"output_dir={sweep}"]
    run_cli("-m", "revgnn.train", "-m", *sweep_args, cwd=tmp_path, timeout=600)
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert len(jobs) == 2 and jobs[0].startswith("0_") and jobs[1].startswith("1_"), jobs
    assert "optim.lr=0.001" in jobs[0] and "optim.lr=0.01" in jobs[1], jobs
    lrs = [
        json.loads((sweep / j / "summary.json").read_text())
        and load_checkpoint(str(sweep / j / "last.pt"))["history"][-1]["lr"]
        for j in jobs
    ]
    assert lrs == [0.001, 0.01]


def test_a_second_run_into_an_output_dir_is_refused_unless_it_resumes_or_overwrites(tmp_path):
    """A run into a directory that holds an earlier run is refused, naming it, and the earlier run's
    files stay as they were; resuming from a checkpoint there continues it; overwrite=true replaces
    it. From the command line: one line, before Hydra writes .hydra/ or train.log."""
    from conftest import TINY_RUN

    from revgnn.errors import ConfigError

    a, b = tmp_path / "a", tmp_path / "b"
    files = ("last.pt", "best.pt", "metrics.csv", "summary.json")
    train(_cfg(a, "trainer.epochs=1"))
    before = {f: (a / f).read_bytes() for f in files}
    refusal = f"output directory {a} holds an earlier run (last.pt, best.pt, metrics.csv, summary.json): "
    with pytest.raises(ConfigError, match=re.escape(refusal + "pass overwrite=true to replace it, resume")):
        train(_cfg(a, "trainer.epochs=1", "seed=1"))
    assert {f: (a / f).read_bytes() for f in files} == before
    train(_cfg(b, "trainer.epochs=1"))
    with pytest.raises(ConfigError, match=re.escape(refusal)):  # another run's checkpoint: still a new run
        train(_cfg(a, "trainer.epochs=2", f"ckpt_path={b / 'last.pt'}"))
    train(_cfg(a, "trainer.epochs=2", f"ckpt_path={a / 'last.pt'}"))  # resuming the run that is there
    assert load_checkpoint(str(a / "last.pt"))["epoch"] == 2
    train(_cfg(a, "trainer.epochs=1", "seed=1", "overwrite=true"))
    assert load_checkpoint(str(a / "last.pt"))["config"]["seed"] == 1

    run = tmp_path / "cli"
    cmd = ["-m", "revgnn.train", *TINY_RUN, f"output_dir={run}"]
    run_cli(*cmd)
    kept = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    text = run_cli(*cmd, "seed=1", expect=2).output
    assert f"output directory {run} holds an earlier run" in text, text
    assert len(text.splitlines()) <= 2 and "Traceback" not in text, text
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == kept  # .hydra/, train.log too


def test_checkpoint_writer_saves_what_torch_save_of_state_dict_saves(tmp_path):
    """atomic_save (memo-free pickler; parameters written detached) round-trips to exactly what
    ``torch.save`` of ``state_dict()`` gives: same keys, values, plain tensors, optimizer state."""
    from revgnn.engine.checkpoint import atomic_copy, atomic_save
    from revgnn.models import create_model

    torch.manual_seed(0)
    model = create_model(
        "revgnn_small", num_layers=3, hidden_channels=8, in_channels=16, out_channels=4, edge_channels=8
    )
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    history = [{"epoch": 1, "valid": 0.5}]
    state = {
        "model": model.state_dict(keep_vars=True),
        "optimizer": opt.state_dict(),
        "history": history,
        "best": dict(history[0]),
        "rng": {"torch": torch.get_rng_state()},
        "epoch": 1,
        "config": {},
    }
    atomic_save(state, str(tmp_path / "ours.pt"))
    torch.save({**state, "model": model.state_dict()}, tmp_path / "torch.pt")
    atomic_copy(str(tmp_path / "ours.pt"), str(tmp_path / "copy.pt"))
    assert (tmp_path / "copy.pt").read_bytes() == (tmp_path / "ours.pt").read_bytes()
    assert not any(p.name.startswith(("ours.pt.tmp", "copy.pt.tmp")) for p in tmp_path.iterdir())
    ours, ref = load_checkpoint(str(tmp_path / "ours.pt")), load_checkpoint(str(tmp_path / "torch.pt"))
    assert list(ours["model"]) == list(ref["model"])
    for key, value in ours["model"].items():
        assert type(value) is torch.Tensor and not value.requires_grad, key
        assert torch.equal(value, ref["model"][key]), key
    assert ours["model"]._metadata == ref["model"]._metadata
    assert ours["optimizer"]["param_groups"] == ref["optimizer"]["param_groups"]
    for i, entry in ref["optimizer"]["state"].items():
        for k, v in entry.items():
            assert torch.equal(ours["optimizer"]["state"][i][k], v), (i, k)
    assert ours["history"] == history and torch.equal(ours["rng"]["torch"], ref["rng"]["torch"])
    # tensors that share a storage still share it after loading (torch.save tracks storages)
    base = torch.arange(6.0)
    atomic_save({"a": base[:3], "b": base[3:]}, str(tmp_path / "views.pt"))
    views = torch.load(tmp_path / "views.pt", weights_only=True)
    assert views["a"].untyped_storage().data_ptr() == views["b"].untyped_storage().data_ptr()


def test_a_file_that_is_no_checkpoint_or_a_truncated_one_is_named(tmp_path, capsys):
    """A text file, a torch file of other content and a truncated last.pt given to train's resume and
    to revgnn-evaluate: "not a revgnn checkpoint: <path>" / "truncated or corrupt checkpoint: <path>",
    one line from each command."""
    from revgnn.cli.evaluate import main as evaluate
    from revgnn.engine.checkpoint import CheckpointError

    train(_cfg(tmp_path / "a", "trainer.epochs=1"))
    text, other, cut = tmp_path / "notes.pt", tmp_path / "weights.pt", tmp_path / "cut.pt"
    text.write_text("not a checkpoint\n")
    torch.save({"weight": torch.ones(3)}, other)
    whole = (tmp_path / "a" / "last.pt").read_bytes()
    cut.write_bytes(whole[: len(whole) // 2])
    cases = [
        (text, f"not a revgnn checkpoint: {text} (not written by torch.save)"),
        (other, f"not a revgnn checkpoint: {other} (no model, optimizer, epoch, history, best, config, rng"),
        (cut, f"truncated or corrupt checkpoint: {cut} ("),
    ]
    for path, message in cases:
        with pytest.raises(CheckpointError, match=re.escape(message)):
            train(_cfg(tmp_path / "b", "trainer.epochs=2", f"ckpt_path={path}"))
        with pytest.raises(SystemExit) as e:
            evaluate([str(path)])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) <= 2, err
    cmd = ["-m", "revgnn.train", f"ckpt_path={cut}", f"output_dir={tmp_path / 'cli'}"]
    output = run_cli(*cmd, timeout=120, expect=2).output
    assert f"truncated or corrupt checkpoint: {cut}" in output, output
    assert len(output.splitlines()) <= 2 and "Traceback" not in output, output


def test_flat_parameters_train_as_per_tensor_parameters_do(tmp_path):
    """trainer.flat_params (the default) trains to the same weights and scores as per-tensor
    parameters (equal up to the rounding order of the clipping norm), and a checkpoint resumes
    only with the layout its optimiser state was written for."""
    flat = train(_cfg(tmp_path / "flat", "trainer.epochs=2"))
    plain = train(_cfg(tmp_path / "plain", "trainer.epochs=2", "trainer.flat_params=false"))
    a, b = (
        load_checkpoint(str(tmp_path / "flat" / "last.pt")),
        load_checkpoint(str(tmp_path / "plain" / "last.pt")),
    )
    assert a["flat_params"] and not b["flat_params"]
    for key in b["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=1e-5, atol=1e-6)
    for k in ("highest_valid", "final_test"):
        assert flat[k] == pytest.approx(plain[k], abs=1e-4)
    assert len(a["optimizer"]["state"]) == 1 and len(b["optimizer"]["state"]) > 10
    with pytest.raises(ValueError, match=r"trainer.flat_params: False \(checkpoint\) -> True"):
        train(_cfg(tmp_path / "c", "trainer.epochs=3", f"ckpt_path={tmp_path / 'plain' / 'last.pt'}"))
    with pytest.raises(RuntimeError, match="trainer.flat_params=false"):
        train(
            _cfg(
                tmp_path / "c",
                "trainer.epochs=3",
                f"ckpt_path={tmp_path / 'plain' / 'last.pt'}",
                "resume_allow=[trainer.flat_params]",
            )
        )
    import revgnn.utils.flat as flat_module  # another chunking: the saved moments cannot be matched

    chunk = flat_module.CHUNK_BYTES
    try:
        flat_module.CHUNK_BYTES = 256
        with pytest.raises(RuntimeError, match="another parameter layout"):
            train(_cfg(tmp_path / "e", "trainer.epochs=3", f"ckpt_path={tmp_path / 'flat' / 'last.pt'}"))
    finally:
        flat_module.CHUNK_BYTES = chunk
    with pytest.raises(ValueError, match="not a known element-wise"):
        train(_cfg(tmp_path / "d", "trainer.epochs=1", "optim._target_=torch.optim.Adafactor"))


def test_signal_mid_epoch_saves_and_resumes_exactly(tmp_path):
    """SIGTERM during epoch 2 (a real signal, sent by the model at its 3rd training forward): the
    step finishes, last.pt holds the position inside the epoch, summary.json says interrupted and
    the error names the resume command; resuming equals the uninterrupted run bitwise."""
    from conftest import assert_same_run, compose_train
    from loop_models import with_model

    from revgnn.engine.interrupt import TrainingInterrupted

    common = [*TINY, "trainer.epochs=3"]
    train(compose_train(tmp_path / "full", *common))
    cut = with_model(compose_train(tmp_path / "cut", *common), "signal_at", at_call=3)
    with pytest.raises(
        TrainingInterrupted, match=r"(?s)SIGTERM: stopped in epoch 2 after 1 step.*revgnn-train .*ckpt_path="
    ) as e:
        train(cut)
    assert e.value.exit_code == 143
    ckpt = load_checkpoint(str(tmp_path / "cut" / "last.pt"))
    assert (ckpt["epoch"], ckpt["step"]) == (1, 1)
    assert json.loads((tmp_path / "cut" / "summary.json").read_text())["status"] == "interrupted"
    train(
        compose_train(
            tmp_path / "cut",
            *common,
            f"ckpt_path={tmp_path / 'cut' / 'last.pt'}",
            "resume_allow=[model._target_,model.at_call]",
        )
    )  # the same model, without the signal
    assert_same_run(tmp_path / "full", tmp_path / "cut")


def test_cli_sigterm_exits_non_zero_with_a_resume_command_that_works(tmp_path):
    """`python -m revgnn.train` gets SIGTERM in epoch 2: exit code 143, last.pt and summary.json
    written, and the printed command resumes the run to its end."""
    import shlex

    run = tmp_path / "run"
    args = [*TINY, "trainer.epochs=3", "model._target_=loop_models.signal_at", f"output_dir={run}"]
    out = run_cli("-m", "revgnn.train", *args, env={"LOOP_MODELS_AT_CALL": "3"}, timeout=600, expect=143)
    assert json.loads((run / "summary.json").read_text())["status"] == "interrupted"
    command = (out.stdout + out.stderr).split("Resume with:")[1].strip().splitlines()[0].strip()
    head, *overrides = shlex.split(command)
    assert head == "revgnn-train" and f"ckpt_path={run / 'last.pt'}" in overrides
    run_cli("-m", "revgnn.train", *overrides, timeout=600)  # without LOOP_MODELS_AT_CALL: no signal
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs"] == 3


def test_deq_convergence_is_reported_per_epoch_not_per_step(tmp_path, caplog):
    """DEQ-GNN with a budget too small to converge: one warning line per epoch (with its count)
    instead of one per solve, and the convergence statistics in metrics.csv and summary.json."""
    from conftest import compose_train

    keep = [o for o in TINY if not o.startswith("model.")]
    cfg = compose_train(
        tmp_path,
        *keep,
        "trainer.epochs=2",
        "trainer.train_parts=4",
        "model=deq_gnn",
        "model.hidden_channels=8",
        "model.max_iter=2",
        "model.tol=1e-12",
    )
    with caplog.at_level("WARNING", logger="revgnn.train"):
        summary = train(cfg)
    lines = [r.getMessage() for r in caplog.records if "DEQConvergenceWarning" in r.getMessage()]
    # one line per warning site and epoch: forward (4 training + 2 evaluation solves), backward (4)
    assert sorted(m.split(":")[0] for m in lines) == [
        "DEQConvergenceWarning x4 in epoch 1",
        "DEQConvergenceWarning x4 in epoch 2",
        "DEQConvergenceWarning x6 in epoch 1",
        "DEQConvergenceWarning x6 in epoch 2",
    ], lines
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    for key in (
        "deq_forward_steps_mean",
        "deq_forward_steps_max",
        "deq_forward_residual_max",
        "deq_forward_converged",
        "deq_backward_steps_mean",
        "deq_backward_converged",
    ):
        assert all(r[key] != "" for r in rows), key
        assert key in summary
    assert float(rows[0]["deq_forward_steps_max"]) == 2 and float(rows[0]["deq_forward_converged"]) == 0.0
