"""revgnn-reproduce --smoke and revgnn-evaluate, end to end on fake OGB data."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_reproduce_smoke_then_evaluate_checkpoint(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = tmp_path / "repro"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "revgnn.cli.reproduce",
            "--smoke",
            "--experiment",
            "proteins_revgnn_wide",
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (out / "results.md").read_text()
    assert "| this run |" in table and "88.24 ± 0.15" in table and "2 seeds" in table

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "revgnn.cli.evaluate",
            str(out / "seed_0" / "best.pt"),
            "--views",
            "2",
            "--parts",
            "2",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert result["metric"] == "rocauc" and result["views"] == 2 and 0 <= result["test"] <= 1
    summary = json.loads((out / "seed_0" / "summary.json").read_text())
    # same checkpoint, same views/parts as training's evaluation -> same score
    assert abs(result["valid"] - summary["highest_valid"]) < 1e-6
