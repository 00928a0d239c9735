"""revgnn-reproduce --smoke and revgnn-evaluate, end to end on fake OGB data; their refusals of
bad arguments."""

import json

from conftest import published_score, run_cli


def test_reproduce_smoke_then_evaluate_checkpoint(tmp_path):
    out = tmp_path / "repro"
    reproduce = ["-m", "revgnn.cli.reproduce", "--smoke", "--experiment", "proteins_revgnn_wide"]
    run_cli(*reproduce, "--out", out, cwd=tmp_path, timeout=600)
    table = (out / "results.md").read_text()
    assert "| this run |" in table and published_score("proteins_revgnn_wide") in table
    assert "2 seeds" in table

    evaluate = ["-m", "revgnn.cli.evaluate", out / "seed_0" / "best.pt", "--views", "2", "--parts", "2"]
    proc = run_cli(*evaluate, cwd=tmp_path)
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
        # argparse's usage (as many lines as the options need), then the one-line error; no traceback
        assert e.value.code == 2 and message in err.splitlines()[-1] and "Traceback" not in err, err


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
