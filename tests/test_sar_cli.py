"""`torchrun ... -m revgnn.train backend=sar`: the Hydra entry point trains on SAR workers."""

import json
import os
import subprocess
import sys
import time


def _torchrun_sar(tmp_path, *overrides):
    """Partitions a 400-node ``proteins_like`` graph for 2 workers under ``tmp_path``; returns the
    ``torchrun`` command that trains a 2-layer model on it with SAR into ``tmp_path / "run"``."""
    from revgnn.data.synthetic import proteins_like
    from revgnn.distributed.sar_partition import partition_dataset

    parts = tmp_path / "parts"
    partition_dataset(proteins_like(num_nodes=400), str(parts), 2, "random")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    return [
        *torchrun,
        "-m",
        "revgnn.train",
        "backend=sar",
        f"backend.partition_dir={parts}",
        "backend.timeout_s=60",
        "model.num_layers=2",
        f"output_dir={tmp_path / 'run'}",
        *overrides,
    ]


def test_train_cli_with_sar_backend(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", REVGNN_ALLOCATOR="system")
    cmd = _torchrun_sar(tmp_path, "backend.num_threads=1", "trainer.epochs=2")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["backend"] == "sar" and summary["world_size"] == 2
    assert 0.0 <= summary["highest_valid"] <= 1.0 and summary["epochs"] == 2
    assert (tmp_path / "run" / "metrics.csv").read_text().count("\n") == 3
    # one log: rank 0 writes train.log, rank 1 logs only warnings and errors (to the console)
    log = (tmp_path / "run" / "train.log").read_text()
    assert log.count("epoch 2  loss") == 1 and log.count("Highest Valid") == 1, log
    assert (tmp_path / "run" / ".hydra" / "config.yaml").exists()


def test_torchrun_ranks_agree_on_rank_0s_run_directory(tmp_path):
    """Ranks that start in different seconds name one run directory: rank 0's start time, read from
    the store torchrun's agent hosts; only rank 0 writes Hydra's files and train.log."""
    from datetime import timedelta

    from torch.distributed import TCPStore

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

    def start(rank):
        return subprocess.Popen(
            [sys.executable, "-c", code], env=dict(env, RANK=str(rank)), stdout=subprocess.PIPE, text=True
        )

    # rank 1 starts first and must wait for rank 0, which is started only once rank 1 is about to ask
    # for the stamp (the order is fixed by the handshake, whatever the machine's load), and more than a
    # second later (a sleep is never shorter than asked), so the two start in different seconds
    first = start(1)
    assert first.stdout.readline().strip() == "ready"
    time.sleep(1.1)
    second = start(0)
    outs = [p.communicate(timeout=300)[0].splitlines()[-1] for p in (first, second)]  # after 'ready'
    (over1, stamp1), (over0, stamp0) = [json.loads(line) for line in outs]
    assert stamp0 == stamp1, (stamp0, stamp1)
    assert over0 == [] and over1 == ["hydra.output_subdir=null", "hydra/job_logging=worker"]
    del store


def test_sar_backend_without_partition_dir_is_a_clear_error(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "revgnn.train", "backend=sar", f"hydra.run.dir={tmp_path}"],
        capture_output=True,
        text=True,
        env=dict(os.environ, REVGNN_ALLOCATOR="system"),
        timeout=120,
    )
    assert out.returncode != 0
    assert "partition_dir" in out.stderr


def _without_torchrun_env():
    env = dict(os.environ, REVGNN_ALLOCATOR="system", OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return {k: v for k, v in env.items() if not k.startswith("TORCHELASTIC_")}


def test_distributed_backend_without_torchrun_says_how_to_launch(tmp_path):
    """`revgnn-train backend=ddp` / `backend=sar` started as one plain process: one message saying to
    launch it with torchrun (for SAR with the partition's number of workers), before any data is read
    or any peer awaited; no traceback."""
    from revgnn.data.synthetic import proteins_like
    from revgnn.distributed.sar_partition import partition_dataset

    parts = tmp_path / "parts"
    partition_dataset(proteins_like(num_nodes=400), str(parts), 2, "random")
    for backend, workers in (["backend=ddp"], "P"), (["backend=sar", f"backend.partition_dir={parts}"], "2"):
        out = subprocess.run(
            [sys.executable, "-m", "revgnn.train", *backend, f"output_dir={tmp_path / 'run'}"],
            capture_output=True,
            text=True,
            env=_without_torchrun_env(),
            timeout=120,
        )
        text = (out.stdout + out.stderr).strip()
        assert out.returncode == 2, text
        assert f"launch it as `torchrun --nproc_per_node={workers} -m revgnn.train {backend[0]} ...`" in text
        assert len(text.splitlines()) <= 2 and "Traceback" not in text, text


def test_dead_worker_under_torchrun_ends_the_job_non_zero(tmp_path):
    """Rank 1 dies (os._exit) in epoch 2: torchrun exits non-zero, reports rank 1's exit code, and
    rank 0 ends with one clear error (no second error chained on the way out); last.pt of epoch 1
    stays intact."""
    from conftest import REPO

    from revgnn.engine.checkpoint import load_checkpoint

    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        REVGNN_ALLOCATOR="system",
        LOOP_MODELS_AT_CALL="2",
        LOOP_MODELS_RANK="1",
        PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}",
    )
    cmd = _torchrun_sar(tmp_path, "trainer.epochs=3", "model._target_=loop_models.exit_at")
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-3000:]
    assert "exitcode  : 3" in text or "exitcode: 3" in text, text[-3000:]
    assert "During handling of the above exception" not in text, text[-5000:]
    assert load_checkpoint(str(tmp_path / "run" / "last.pt"))["epoch"] == 1
    print(f"dead-worker job ended after {time.monotonic() - start:.1f} s")
