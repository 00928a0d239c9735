"""`torchrun ... -m revgnn.train backend=sar`: the Hydra entry point trains on SAR workers."""

import json
import os
import re
import subprocess
import sys
import time

from conftest import run_cli

from revgnn.distributed.torchrun import STAMP_FORMAT


def _torchrun_sar(tmp_path, *overrides, timeout_s=60):
    """Partitions a 400-node ``proteins_like`` graph for 2 workers under ``tmp_path``; returns the
    ``torchrun`` command (:func:`run_cli`'s arguments) that trains a 2-layer model on it with SAR into
    ``tmp_path / "run"``."""
    from revgnn.data.synthetic import proteins_like
    from revgnn.distributed.partition import partition_dataset

    parts = tmp_path / "parts"
    partition_dataset(proteins_like(num_nodes=400), str(parts), 2, "random")
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    return [
        *torchrun,
        "-m",
        "revgnn.train",
        "backend=sar",
        f"backend.partition_dir={parts}",
        f"backend.timeout_s={timeout_s}",
        "model.num_layers=2",
        f"output_dir={tmp_path / 'run'}",
        *overrides,
    ]


def test_train_cli_with_sar_backend(tmp_path):
    cmd = _torchrun_sar(tmp_path, "backend.num_threads=1", "trainer.epochs=2")
    run_cli(*cmd, env={"OMP_NUM_THREADS": "1"})
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["backend"] == "sar" and summary["world_size"] == 2
    assert 0.0 <= summary["highest_valid"] <= 1.0 and summary["epochs"] == 2
    assert (tmp_path / "run" / "metrics.csv").read_text().count("\n") == 3
    # one log: rank 0 writes train.log, rank 1 logs only warnings and errors (to the console)
    log = (tmp_path / "run" / "train.log").read_text()
    assert log.count("epoch 2  loss") == 1 and log.count("Highest Valid") == 1, log
    assert (tmp_path / "run" / ".hydra" / "config.yaml").exists()


def test_torchrun_ranks_agree_on_rank_0s_run_directory(tmp_path):
    """Every rank names its run directory from the time stamp rank 0 publishes in the store torchrun's
    agent hosts: rank 1, started first, waits for it and takes it as it is (a stamp no clock gives, so
    no timing decides the test); rank 0 publishes its own. Only rank 0 writes Hydra's files and
    train.log (the overrides of the other ranks)."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    from revgnn.distributed.torchrun import _KEY
    from revgnn.testing.workers import free_port

    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=120))  # the agent's
    code = (
        "import json, os\n"
        "from revgnn.distributed.torchrun import worker_overrides\n"
        "print('ready', flush=True)\n"
        "print(json.dumps([worker_overrides(120), os.environ['REVGNN_RUN_STAMP']]))\n"
    )
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env.update(TORCHELASTIC_USE_AGENT_STORE="True")
    env.pop("REVGNN_RUN_STAMP", None)

    def run(rank, before_output=lambda: None):
        p = subprocess.Popen(
            [sys.executable, "-c", code], env=dict(env, RANK=str(rank)), stdout=subprocess.PIPE, text=True
        )
        assert p.stdout.readline().strip() == "ready"
        before_output()
        return json.loads(p.communicate(timeout=300)[0].splitlines()[-1])

    # rank 1 waits for the stamp (it is running when the stamp appears, whether or not it asked yet)
    over1, stamp1 = run(1, lambda: store.set(_KEY, "1999-12-31_23-59-59"))
    assert stamp1 == "1999-12-31_23-59-59" and over1 == [
        "hydra.output_subdir=null",
        "hydra/job_logging=worker",
    ]
    store.delete_key(_KEY)
    over0, stamp0 = run(0)
    assert over0 == [] and store.get(_KEY).decode() == stamp0 != stamp1
    time.strptime(stamp0, STAMP_FORMAT)


def test_sar_backend_without_partition_dir_is_a_clear_error(tmp_path):
    out = run_cli("-m", "revgnn.train", "backend=sar", f"hydra.run.dir={tmp_path}", timeout=120, expect=None)
    assert out.returncode != 0
    assert "partition_dir" in out.stderr


def _torchrun_env():
    """The variables torchrun sets for its workers, so that a command started without them is one."""
    names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
    return names + [k for k in os.environ if k.startswith("TORCHELASTIC_")]


def test_distributed_backend_without_torchrun_says_how_to_launch(tmp_path):
    """`revgnn-train backend=ddp` / `backend=sar` started as one plain process: one message saying to
    launch it with torchrun (for SAR with the partition's number of workers), before any data is read
    or any peer awaited; no traceback."""
    from revgnn.data.synthetic import proteins_like
    from revgnn.distributed.partition import partition_dataset

    parts = tmp_path / "parts"
    partition_dataset(proteins_like(num_nodes=400), str(parts), 2, "random")
    for backend, workers in (["backend=ddp"], "P"), (["backend=sar", f"backend.partition_dir={parts}"], "2"):
        cmd = ["-m", "revgnn.train", *backend, f"output_dir={tmp_path / 'run'}"]
        out = run_cli(*cmd, env={"OMP_NUM_THREADS": "1"}, unset=_torchrun_env(), timeout=120, expect=2)
        text = out.output
        assert f"launch it as `torchrun --nproc_per_node={workers} -m revgnn.train {backend[0]} ...`" in text
        assert len(text.splitlines()) <= 2 and "Traceback" not in text, text


def _loop_models_env(at_call, rank):
    return {"OMP_NUM_THREADS": "1", "LOOP_MODELS_AT_CALL": str(at_call), "LOOP_MODELS_RANK": str(rank)}


def _one_message(text, pattern):
    """The one line of ``text`` that matches ``pattern``; no traceback but torchrun's own."""
    lines = [line for line in text.splitlines() if re.search(pattern, line)]
    assert len(lines) == 1, text[-5000:]
    assert "The above exception was the direct cause" not in text, text[-5000:]
    assert "During handling of the above exception" not in text, text[-5000:]
    assert text.count("Traceback (most recent call last)") == 1, text[-5000:]  # torchrun's ChildFailedError
    return lines[0]


def test_dead_worker_under_torchrun_ends_the_job_non_zero(tmp_path):
    """Rank 1 dies (os._exit) in epoch 2: torchrun exits non-zero, reports rank 1's exit code, and
    rank 0 ends with one message naming rank 1 and the operation (no traceback, no second error
    chained on the way out); last.pt of epoch 1 stays intact."""
    from revgnn.engine.checkpoint import load_checkpoint

    cmd = _torchrun_sar(tmp_path, "trainer.epochs=3", "model._target_=loop_models.exit_at")
    out = run_cli(*cmd, env=_loop_models_env(2, 1), timeout=600, expect=None)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-3000:]
    assert "exitcode  : 3" in text or "exitcode: 3" in text, text[-3000:]
    line = _one_message(text, r"\[rank 0\]")
    assert "[revgnn.train][ERROR] - [rank 0] SAR " in line and "rank 1 closed the connection" in line, line
    assert re.search(r"rank 1 \(pid \d+\) has ended", line), line
    assert load_checkpoint(str(tmp_path / "run" / "last.pt"))["epoch"] == 1


def test_stopped_worker_under_torchrun_is_ended_by_its_peer(tmp_path):
    """Rank 1 stops (SIGSTOP) in epoch 2 while rank 0 gathers the RNG states for last.pt (issue 24).
    Rank 0's wait times out after backend.timeout_s; it names rank 1 and the operation in one message
    and ends rank 1 with SIGKILL, so torchrun does not wait its 30 s shutdown timeout for a process
    that cannot act on its SIGTERM (torchrun logs "Unable to shutdown process" when it does). The
    mechanism is asserted, not the clock: the machine's load sets how long start-up takes."""
    from revgnn.engine.checkpoint import load_checkpoint

    # epoch_stats calls: 2 per evaluated epoch, the 4th just before epoch 2's last.pt is gathered
    cmd = _torchrun_sar(
        tmp_path,
        "trainer.epochs=3",
        "trainer.eval_every=1",
        "model._target_=loop_models.stop_in_epoch_stats",
        timeout_s=30,
    )
    out = run_cli(*cmd, env=_loop_models_env(4, 1), timeout=600, expect=None)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-3000:]
    assert "Unable to shutdown process" not in text, text[-3000:]
    line = _one_message(text, r"\[rank 0\]")
    assert "[rank 0] all_gather of the RNG states for last.pt failed: rank 1 (pid " in line, line
    assert "is stopped (SIGSTOP or a debugger)" in line and "ended it with SIGKILL" in line, line
    assert "Timed out waiting 30000ms" in line, line
    assert re.search(r"exitcode\s*: -9 \(pid: \d+\)\s*\(SIGKILL\)", text), text[-3000:]
    assert load_checkpoint(str(tmp_path / "run" / "last.pt"))["epoch"] == 1
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed at epoch 2: SARCommError", summary["status"]
