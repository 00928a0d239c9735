"""`torchrun ... -m revgnn.train backend=sar`: the Hydra entry point trains on SAR workers."""
import json
import os
import subprocess
import sys


def test_train_cli_with_sar_backend(tmp_path):
    from revgnn.data.synthetic import proteins_like
    from revgnn.distributed.partition import partition_dataset

    parts = tmp_path / "parts"
    partition_dataset(proteins_like(num_nodes=400), str(parts), 2, "random")
    env = dict(os.environ, OMP_NUM_THREADS="1", REVGNN_ALLOCATOR="system")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "revgnn.train", "backend=sar", f"backend.partition_dir={parts}",
           "backend.timeout_s=60", "backend.num_threads=1", "trainer.epochs=2",
           "model.num_layers=2", f"output_dir={tmp_path / 'run'}",
           f"hydra.run.dir={tmp_path / 'hydra'}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["backend"] == "sar" and summary["world_size"] == 2
    assert 0.0 <= summary["highest_valid"] <= 1.0 and summary["epochs"] == 2
    assert (tmp_path / "run" / "metrics.csv").read_text().count("\n") == 3


def test_sar_backend_without_partition_dir_is_a_clear_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "revgnn.train", "backend=sar",
                          f"hydra.run.dir={tmp_path}"], capture_output=True, text=True,
                         env=dict(os.environ, REVGNN_ALLOCATOR="system"), timeout=120)
    assert out.returncode != 0
    assert "partition_dir" in out.stderr
