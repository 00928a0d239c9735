"""A multirun checks every job with its swept values before the first starts (issue 24, item 10's
follow-up): a bad value in one job of a sweep is one message naming the job, exit status 2, and no
sweep directory, also for ``range``/``choice`` sweeps and keys added with ``+``."""

import os
import subprocess
import sys


def _multirun(tmp_path, *overrides):
    out = subprocess.run(
        [sys.executable, "-m", "revgnn.train", "-m", *overrides, f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        capture_output=True,
        text=True,
        env=dict(os.environ, REVGNN_ALLOCATOR="system"),
        cwd=tmp_path,
        timeout=300,
    )
    return out.returncode, (out.stdout + out.stderr).strip()


def test_a_bad_swept_value_is_refused_before_any_job(tmp_path):
    rc, text = _multirun(
        tmp_path,
        "seed=range(0,2)",
        "model.hidden_channels=8,abc",
        "optim.lr=choice(0.01)",
        "trainer.epochs=1",
    )
    assert rc == 2 and "Traceback" not in text, text
    assert text == (
        "revgnn-train: sweep job 1 (seed=0 model.hidden_channels=abc optim.lr=0.01): "
        "model.hidden_channels must be an int, got 'abc'"
    ), text
    assert sorted(p.name for p in tmp_path.iterdir()) == [], text
