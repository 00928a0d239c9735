"""revgnn-reproduce --smoke and revgnn-evaluate, end to end on fake OGB data; their refusals of
bad arguments."""

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


def test_evaluate_refuses_views_or_parts_below_one_and_cuda_without_cuda(capsys):
    """``--views 0`` was silently one view; ``--device cuda`` without CUDA a bare AssertionError.
    Both are errors naming the option, in a few lines (no checkpoint is read before)."""
    import pytest
    import torch

    from revgnn.cli.evaluate import main as evaluate

    cases = [
        (["--views", "0"], "argument --views: must be >= 1, got 0"),
        (["--parts", "-1"], "argument --parts: must be >= 1, got -1"),
        (["--device", "gpu"], "--device=gpu is no device; use auto, cpu, cuda or cuda:N"),
    ]
    if not torch.cuda.is_available():
        cases.append(
            (["--device", "cuda"], "--device=cuda but CUDA is not available; use --device=auto or cpu")
        )
    for args, message in cases:
        with pytest.raises(SystemExit) as e:
            evaluate(["no_such.pt", *args])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and message in err and len(err.splitlines()) <= 4, err


def test_reproduce_offers_only_experiments_with_a_published_score(capsys):
    """``mol_like_revgnn`` reproduces no published score: not among ``--experiment``'s choices (it
    was offered, then refused); every choice has a paper row."""
    import pytest

    from revgnn.cli.reproduce import build_parser, paper_score

    parser = build_parser()
    (action,) = [a for a in parser._actions if a.dest == "experiment"]
    assert "mol_like_revgnn" not in action.choices and "proteins_revgnn_deep" in action.choices
    for experiment in action.choices:
        paper_score(experiment)
    with pytest.raises(SystemExit):
        parser.parse_args(["--experiment", "mol_like_revgnn"])
    assert "invalid choice: 'mol_like_revgnn'" in capsys.readouterr().err
