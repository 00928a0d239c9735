"""The one training loop under ``backend=sar`` (2 workers, gloo, 127.0.0.1) and ``backend=ddp``:
checkpoints and bitwise resume, the NaN guard, signals, bf16, loggers, ``set_epoch``, and DDP equal
to one process accumulating the same parts (float64)."""

import csv
import json

import pytest
import torch
from conftest import TIMING, assert_same_run, compose_train
from loop_models import with_model
from omegaconf import OmegaConf

from revgnn.engine.checkpoint import load_checkpoint
from revgnn.testing.workers import run_workers

DATA = dict(num_nodes=400, window=5, avg_degree=6, max_hops=2)
DATA_OVERRIDES = [f"data.{k}={v}" for k, v in DATA.items()]
MODEL = ["model.num_layers=2", "model.hidden_channels=8", "trainer.eval_every=1"]


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """proteins_like (400 nodes) in 2 random parts, and the same graph in 2 other parts."""
    from revgnn.data.synthetic import proteins_like
    from revgnn.distributed.partition import partition_dataset

    root = tmp_path_factory.mktemp("parts")
    ds = proteins_like(**DATA)
    data_config = OmegaConf.to_container(compose_train(root, *DATA_OVERRIDES).data, resolve=True)
    partition_dataset(ds, str(root / "p2"), 2, "random", seed=0, data_config=data_config)
    partition_dataset(ds, str(root / "p2b"), 2, "random", seed=1, data_config=data_config)
    return root


def _sar(out_dir, parts_dir, *overrides):
    return compose_train(
        out_dir,
        "backend=sar",
        f"backend.partition_dir={parts_dir}",
        "backend.timeout_s=60",
        *MODEL,
        *DATA_OVERRIDES,
        *overrides,
    )


def _train(rank, world_size, cfg, catch=False):
    from revgnn.engine.loop import train

    if not catch:
        return train(cfg)
    try:
        train(cfg)
    except Exception as e:  # the error each worker ends with
        return f"{type(e).__name__}: {e}"
    return "no error"


def _run(cfg, world_size=2, catch=False):
    return [r.value for r in run_workers(_train, world_size, cfg, catch, timeout_s=60, wall_s=600, threads=1)]


def test_sar_resume_is_bitwise_and_checks_the_layout(tmp_path, parts):
    """4 SAR epochs == 2 epochs resumed for 2 more (dropout on: each rank's RNG state is restored);
    a checkpoint of another partitioning or world size is refused, naming both."""
    p2 = parts / "p2"
    (full,) = {
        json.dumps(s, sort_keys=True, default=str)
        for s in [
            {k: v for k, v in s.items() if k not in TIMING | {"output_dir", "epoch_time_s"}}
            for s in _run(_sar(tmp_path / "full", p2, "trainer.epochs=4"))
        ]
    }  # same on every worker
    _run(_sar(tmp_path / "half", p2, "trainer.epochs=2"))
    _run(_sar(tmp_path / "resumed", p2, "trainer.epochs=4", f"ckpt_path={tmp_path / 'half' / 'last.pt'}"))
    assert_same_run(tmp_path / "full", tmp_path / "resumed")
    summary = json.loads((tmp_path / "full" / "summary.json").read_text())
    assert summary["backend"] == "sar" and summary["world_size"] == 2 and summary["status"] == "completed"
    assert json.loads(full)["highest_valid"] == summary["highest_valid"]
    local = json.loads((tmp_path / "half" / "summary.json").read_text())
    assert set(summary) == set(local) and summary["peak_memory_mb"] > 0

    ckpt = f"ckpt_path={tmp_path / 'half' / 'last.pt'}"
    errors = _run(_sar(tmp_path / "other", parts / "p2b", "trainer.epochs=4", ckpt), catch=True)
    for e in errors:
        assert "another run layout" in e and "partition" in e, e
    # the data group must describe the partitioned graph
    for e in _run(_sar(tmp_path / "data", p2, "trainer.epochs=1", "data.num_nodes=500"), catch=True):
        assert "data.num_nodes: 400 in the partition, 500 here" in e, e
    from revgnn.cli.train import train
    from revgnn.errors import ConfigError

    one = [*MODEL, *DATA_OVERRIDES, "trainer.epochs=4", ckpt]
    # backend=local is another setting, refused before anything is built; allowed, the layout is not
    with pytest.raises(ConfigError, match=r"backend\.name: 'sar' \(checkpoint\) -> 'local' \(now\)"):
        train(compose_train(tmp_path / "one", *one))
    allow = "resume_allow=[backend.name,backend.precision,trainer.parts_per_step,trainer.train_parts]"
    with pytest.raises(RuntimeError, match=r"world_size 2 -> 1"):
        train(compose_train(tmp_path / "one", *one, allow))


def test_sar_nan_stops_every_worker_at_the_same_step(tmp_path, parts):
    """NaN logits on rank 1 only: both workers stop in epoch 2, naming the last good checkpoint,
    whose weights are finite; summary.json says the run diverged."""
    cfg = with_model(_sar(tmp_path, parts / "p2", "trainer.epochs=4"), "nan_at", at_call=2, only_rank=1)
    errors = _run(cfg, catch=True)
    for e in errors:
        assert e.startswith("TrainingDiverged: loss is nan at epoch 2, step 0"), e
        assert "last.pt (epoch 1)" in e, e
    ckpt = load_checkpoint(str(tmp_path / "last.pt"))
    assert ckpt["epoch"] == 1 and all(torch.isfinite(v).all() for v in ckpt["model"].values())
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "diverged"


def test_sar_divergence_first_seen_in_an_evaluation_stops_every_worker(tmp_path, parts):
    """optim.lr=1e30 with an evaluation every epoch (issue 24): epoch 1's one step is finite, its
    update is not, and the evaluation's gathered predictions are NaN. Every worker stops there as
    diverged (not inside OGB's evaluator, which raised scikit-learn's "Input contains NaN"),
    summary.json is written and no checkpoint of the diverged epoch is."""
    errors = _run(_sar(tmp_path, parts / "p2", "trainer.epochs=3", "optim.lr=1e30"), catch=True)
    for e in errors:
        assert e.startswith("TrainingDiverged: the evaluation's predictions are NaN or infinite (train "), e
        assert "at epoch 1: training diverged. Last good checkpoint: none (no epoch finished)" in e, e
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["epochs"] == 0
    assert not (tmp_path / "last.pt").exists()


def test_ddp_divergence_on_one_worker_stops_every_worker_at_the_same_point(tmp_path):
    """backend=ddp, a divergence on rank 1 alone: an infinite backward in epoch 2's first step (the
    summed gradients' norm is not finite on either worker), or NaN evaluation logits (summed over the
    workers before scoring). Both workers stop at the same point as diverged."""
    common = [*MODEL, *DATA_OVERRIDES, "backend=ddp", "backend.timeout_s=60", "trainer.train_parts=2"]
    common.append("trainer.eval_parts=2")  # one evaluation forward per worker
    cfg = with_model(
        compose_train(tmp_path / "grad", *common, "trainer.epochs=3"),
        "inf_gradient_at",
        at_call=2,
        only_rank=1,
    )
    for e in _run(cfg, catch=True):
        assert e.startswith("TrainingDiverged: gradient norm is "), e
        assert "at epoch 2, step 0: training diverged (no update was applied)" in e, e
        assert "last.pt (epoch 1)" in e, e
    ckpt = load_checkpoint(str(tmp_path / "grad" / "last.pt"))
    assert ckpt["epoch"] == 1 and all(torch.isfinite(v).all() for v in ckpt["model"].values())
    assert json.loads((tmp_path / "grad" / "summary.json").read_text())["status"] == "diverged"

    cfg = with_model(
        compose_train(tmp_path / "eval", *common, "trainer.epochs=3"), "nan_in_evaluation", only_rank=1
    )
    for e in _run(cfg, catch=True):
        assert e.startswith("TrainingDiverged: the evaluation's predictions are NaN or infinite"), e
        assert "at epoch 1: training diverged" in e, e
    assert json.loads((tmp_path / "eval" / "summary.json").read_text())["status"] == "diverged"


def test_ddp_solver_divergence_on_one_worker_stops_every_worker_at_the_same_step(tmp_path):
    """backend=ddp, a DEQ solve that diverges on rank 1 alone in epoch 2's first step: rank 0 does not
    wait in the step's all-reduce for a peer that raised; both stop there as diverged, each naming
    worker 1's solver error, and last.pt stays epoch 1's. Then in an evaluation (epoch 1's)."""
    common = [*MODEL, *DATA_OVERRIDES, "backend=ddp", "backend.timeout_s=60", "trainer.train_parts=2"]
    cfg = with_model(
        compose_train(tmp_path, *common, "trainer.eval_parts=2", "trainer.epochs=3"),
        "solver_diverges_at",
        at_call=2,
        only_rank=1,
    )
    for e in _run(cfg, catch=True):
        assert e.startswith("TrainingDiverged: worker 1: SolverDivergenceError: loop_models."), e
        assert "at epoch 2, step 0: training diverged (no update was applied)" in e, e
        assert "last.pt (epoch 1)" in e and "worker 0:" not in e, e
    assert load_checkpoint(str(tmp_path / "last.pt"))["epoch"] == 1
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "diverged"

    # the same in an evaluation: worker 1's logits are NaN in the sum every worker scores
    cfg = with_model(
        compose_train(tmp_path / "eval", *common, "trainer.eval_parts=2", "trainer.epochs=3"),
        "solver_diverges_in_evaluation",
        only_rank=1,
    )
    for e in _run(cfg, catch=True):
        assert e.startswith("TrainingDiverged: the evaluation's predictions are NaN or infinite"), e
        assert "at epoch 1: training diverged" in e, e
    assert json.loads((tmp_path / "eval" / "summary.json").read_text())["status"] == "diverged"


def test_sar_sigterm_saves_a_checkpoint_that_resumes_exactly(tmp_path, parts):
    """SIGTERM on rank 0 during epoch 2: every worker finishes the step, last.pt holds the position
    inside the epoch, the error names the resume command; resuming equals the uninterrupted run."""
    p2 = parts / "p2"
    _run(_sar(tmp_path / "full", p2, "trainer.epochs=3"))
    cfg = with_model(_sar(tmp_path / "cut", p2, "trainer.epochs=3"), "signal_at", at_call=2, only_rank=0)
    for e in _run(cfg, catch=True):
        assert (
            e.startswith("TrainingInterrupted") and "SIGTERM" in e and "torchrun" in e and "ckpt_path=" in e
        ), e
    ckpt = load_checkpoint(str(tmp_path / "cut" / "last.pt"))
    assert (ckpt["epoch"], ckpt["step"]) == (1, 1)
    assert json.loads((tmp_path / "cut" / "summary.json").read_text())["status"] == "interrupted"
    _run(
        _sar(
            tmp_path / "cut",
            p2,
            "trainer.epochs=3",
            f"ckpt_path={tmp_path / 'cut' / 'last.pt'}",
            "resume_allow=[model._target_,model.at_call,model.only_rank]",
        )
    )  # the same model, no signal
    assert_same_run(tmp_path / "full", tmp_path / "cut")


def _train_interrupted(rank, world_size, cfg):
    from revgnn.engine.interrupt import TrainingInterrupted
    from revgnn.engine.loop import train

    try:
        train(cfg)
    except TrainingInterrupted as e:
        return str(e), e.exit_code
    return "no interruption", None


def test_sigint_to_one_worker_is_reported_as_sigint_by_every_worker(tmp_path, parts):
    """SIGINT (Ctrl-C) to rank 1 alone: rank 0 got no signal of its own, yet both stop at the same
    step and exit with SIGINT's code 130 (not SIGTERM's 143), rank 0 naming the rank it was sent to."""
    cfg = _sar(tmp_path, parts / "p2", "trainer.epochs=3")
    cfg = with_model(cfg, "signal_at", at_call=2, only_rank=1, signum=2)  # SIGINT
    res = run_workers(_train_interrupted, 2, cfg, timeout_s=60, wall_s=600, threads=1)
    (msg0, code0), (msg1, code1) = [r.value for r in res]
    assert code0 == code1 == 130, (msg0, msg1)
    assert msg0.startswith("SIGINT (sent to rank 1): stopped in epoch 2 after 1 step(s)"), msg0
    assert msg1.startswith("SIGINT: stopped in epoch 2 after 1 step(s)"), msg1


def test_sar_honours_precision_loggers_and_set_epoch(tmp_path, parts):
    """bf16 autocast changes the SAR loss; TensorBoard events, the learning curve and one metrics
    row per epoch are written; the model's set_epoch is called every epoch; the final test of
    best.pt runs on every worker (full graph) and scores what the best epoch's evaluation scored."""
    p2 = parts / "p2"
    _run(_sar(tmp_path / "fp32", p2, "trainer.epochs=1"))
    cfg = with_model(
        _sar(
            tmp_path / "bf16",
            p2,
            "trainer.epochs=3",
            "backend.precision=bf16",
            "logger.tensorboard=true",
            "logger.plot=true",
            "trainer.test_views=1",
        ),
        "epoch_recorder",
    )
    (summary, other) = _run(cfg)
    run = tmp_path / "bf16"
    assert summary["bf16"] and (run / "learning_curve.png").exists() and any((run / "tensorboard").iterdir())
    *rows, final = list(csv.DictReader(open(run / "metrics.csv")))
    fp32 = list(csv.DictReader(open(tmp_path / "fp32" / "metrics.csv")))
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3]
    tested = summary["checkpoint_test"]
    assert tested == other["checkpoint_test"] and tested["epoch"] == summary["best_epoch"]
    best = rows[summary["best_epoch"] - 1]
    assert final["evaluation"] == "checkpoint_test" and final["epoch"] == best["epoch"]
    assert all(tested[k] == float(best[k]) == float(final[k]) for k in ("train", "valid", "test"))
    assert rows[0]["loss"] != fp32[0]["loss"] and abs(float(rows[0]["loss"]) - float(fp32[0]["loss"])) < 0.05
    assert load_checkpoint(str(run / "last.pt"))["model"]["epochs_seen"].tolist() == [0.0, 1.0, 2.0]


def test_ddp_equals_one_process_accumulating_the_same_parts(tmp_path):
    """backend=ddp with 2 workers (one part each per step) == one process with parts_per_step=2, in
    float64: losses and parameters after 2 epochs x 2 steps (uniform partitions, parts in shuffled
    order: the workers deal out the same shuffled parts)."""
    common = [
        *MODEL,
        *DATA_OVERRIDES,
        "model.dropout=0.0",
        "trainer.partition=uniform",
        "trainer.shuffle_parts=true",
        "trainer.train_parts=4",
        "trainer.epochs=2",
        "trainer.eval_parts=2",
    ]
    _run(
        with_model(compose_train(tmp_path / "ddp", "backend=ddp", "backend.timeout_s=60", *common), "float64")
    )
    from revgnn.cli.train import train

    train(with_model(compose_train(tmp_path / "local", "trainer.parts_per_step=2", *common), "float64"))
    a, b = (
        load_checkpoint(str(tmp_path / "ddp" / "last.pt")),
        load_checkpoint(str(tmp_path / "local" / "last.pt")),
    )
    assert a["backend"]["world_size"] == 2 and a["backend"]["backend"] == "ddp"
    for key, value in b["model"].items():
        assert value.dtype == torch.float64
        moved = (a["model"][key] - value).norm() / value.norm().clamp_min(1e-12)
        assert moved <= 1e-10, (key, float(moved))
    for ra, rb in zip(a["history"], b["history"]):
        assert abs(ra["loss"] - rb["loss"]) <= 1e-10 * abs(rb["loss"])
    for e in _run(
        compose_train(tmp_path / "bad", "backend=ddp", "trainer.parts_per_step=3", *common), catch=True
    ):
        assert "parts_per_step=3 must be a multiple of the 2 workers" in e, e
