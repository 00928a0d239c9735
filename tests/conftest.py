"""Test-wide settings and fixtures."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# The tests use tiny graphs: one thread avoids OpenMP spin-waiting, which makes
# small ops 10-100x slower when the two cores are shared with other processes.
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def train_cli(tmp_path):
    """``run(name, *overrides)``: ``python -m revgnn.train *overrides name=NAME`` in ``tmp_path``,
    asserted to succeed; returns Hydra's run directory for it."""

    def run(name, *overrides):
        env = dict(os.environ, PYTHONPATH=str(REPO))
        proc = subprocess.run(
            [sys.executable, "-m", "revgnn.train", *overrides, f"name={name}"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        (run_dir,) = (tmp_path / "outputs" / name).iterdir()
        return run_dir

    return run


CONFIG_DIR = str(REPO / "revgnn" / "configs")


def compose_train(out_dir, *overrides):
    """The composed ``train.yaml`` with ``overrides`` and ``output_dir=out_dir`` (no plot, no bar)."""
    from hydra import compose, initialize_config_dir

    import revgnn.config  # noqa: F401  (registers the schemas)

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(
            config_name="train", overrides=["logger.plot=false", "logger.progress_bar=false", *overrides]
        )
    cfg.output_dir = str(out_dir)
    return cfg
