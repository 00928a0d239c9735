"""revgnn-train's command line: each configuration mistake is one message and exit 2 before the data
loads, --help starts with usage and examples, a sweep job resumes as printed (paths holding = and ,),
a sweep ends with a mean ± std table."""

import json
import shlex
import subprocess
import sys

import pytest
from conftest import REPO, TINY_RUN, run_cli

from revgnn.cli.quoting import hydra_override, hydra_quote, quote_path_overrides


@pytest.mark.parametrize(
    "override, message",
    [
        ("model=revgnn_dep", "model=revgnn_dep: no such model option (did you mean revgnn_deep"),
        (
            "experiment=proteins_revgnn_dep",
            "experiment=proteins_revgnn_dep: no such experiment option (did you mean proteins_revgnn_deep",
        ),
        ("data=ogbn_protein", "data=ogbn_protein: no such data option (did you mean ogbn_proteins"),
        ("backend=lokal", "backend=lokal: no such backend option (did you mean local"),
        (
            "trainer.epoch=5",
            "unknown key trainer.epoch: revgnn-train has no such setting (did you mean trainer.epochs?)",
        ),
        ("backend.device=gpu", "backend.device=gpu: invalid value 'gpu', expected one of [auto, cpu, cuda]"),
        (
            "backend.precision=fp16",
            "backend.precision=fp16: invalid value 'fp16', expected one of [auto, fp32, bf16]",
        ),
        ("model.hidden_channels=33", "model.hidden_channels=33 must be divisible by model.num_groups=2"),
        ("optim.lr=(", "cannot read the override 'optim.lr=('"),
    ],
)
def test_a_configuration_mistake_is_one_message_exit_2_before_the_data_loads(tmp_path, override, message):
    # data.path of a file that does not exist: loading any data would fail with another message
    run = run_cli("-m", "revgnn.train", override, f"output_dir={tmp_path / 'run'}", cwd=tmp_path, expect=2)
    lines = run.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"revgnn-train: {message}"), run.output
    assert not (tmp_path / "run").exists()


def test_a_mistake_in_one_job_of_a_sweep_is_refused_before_any_job(tmp_path):
    run = run_cli("-m", "revgnn.train", "-m", "model=revgnn_small,revgnn_dep", "seed=0,1",
                  f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path, expect=2)  # fmt: skip
    assert (
        run.output.strip().splitlines() == [run.output.strip().splitlines()[0]]
        and "model=revgnn_dep: no such model option" in run.output
    ), run.output
    assert not (tmp_path / "sweep").exists()


def test_help_starts_with_usage_and_examples():
    out = subprocess.run(
        [sys.executable, "-m", "revgnn.train", "--help"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO), "REVGNN_ALLOCATOR": "system", "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith("revgnn-train: train a model"), text[:300]
    head = text[: text.index("== Configuration groups ==")]
    examples = ["experiment=proteins_revgnn_deep", "-m experiment=", "seed=0,1", "ckpt_path=", "output_dir="]
    examples += ["data=pyg_file data.path=", "data=pyg data.name=KarateClub", "--config-dir"]
    for example in examples:
        assert example in head, example


def test_path_values_are_quoted_for_hydra():
    assert hydra_quote("outputs/a/last.pt") == "outputs/a/last.pt"
    assert (
        hydra_quote("multirun/x/1_seed=1,optim.lr=0.1/last.pt")
        == "'multirun/x/1_seed=1,optim.lr=0.1/last.pt'"
    )
    assert hydra_override("ckpt_path", "m/1_seed=1/last.pt") == shlex.quote("ckpt_path='m/1_seed=1/last.pt'")
    given = ["ckpt_path=m/1_seed=1/last.pt", "seed=0,1", "output_dir='q=1'", "data.path=${oc.env:X}"]
    assert quote_path_overrides(given) == ["ckpt_path='m/1_seed=1/last.pt'", "seed=0,1", "output_dir='q=1'",
                                           "data.path=${oc.env:X}"]  # fmt: skip
    # under -m a comma sweeps, unless the value is an existing path
    assert quote_path_overrides(["ckpt_path=a.pt,b.pt"], multirun=True) == ["ckpt_path=a.pt,b.pt"]


def test_a_seed_sweep_ends_with_a_table_and_every_job_resumes_as_printed(tmp_path):
    sweep = tmp_path / "sweep"
    args = [*TINY_RUN, "trainer.train_parts=2"]
    run = run_cli("-m", "revgnn.train", "-m", *args, "seed=0,1", "optim.lr=0.01,0.02",
                  f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=600)  # fmt: skip
    table = (sweep / "results.md").read_text()
    assert table in run.stdout and f"written to {sweep / 'results.md'}" in run.stdout
    rows = [line for line in table.splitlines() if line.startswith("| optim.lr=")]
    assert len(rows) == 2, table
    row = rows[0]
    summaries = [json.loads(p.read_text()) for p in sorted(sweep.glob("*lr=0.01/summary.json"))]
    valid = [s["highest_valid"] for s in summaries]
    mean = sum(valid) / 2
    std = (sum((v - mean) ** 2 for v in valid)) ** 0.5  # unbiased over 2: sqrt(sum of squares / 1)
    assert f"| 0, 1 | {mean:.4f} ± {std:.4f} |" in row, (row, valid)
    # job 1's directory holds = and ,: resume it (one more epoch) by the command a run prints,
    # pasted into a shell as printed, and by the plain path
    (job,) = [p for p in sweep.iterdir() if p.name.startswith("2_")]
    assert "=" in job.name and "," in job.name, job.name
    words = [sys.executable, "-m", "revgnn.train", *map(shlex.quote, args), "seed=1", "optim.lr=0.01"]
    words += ["trainer.epochs=2", hydra_override("output_dir", str(job))]
    printed = " ".join(words + [hydra_override("ckpt_path", str(job / "last.pt"))])
    env = {"PYTHONPATH": f"{REPO}:{REPO / 'tests'}", "REVGNN_ALLOCATOR": "system", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        ["bash", "-c", printed], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resumed from {job / 'last.pt'} at epoch 1" in out.stdout + out.stderr, out.stdout[-2000:]
    assert json.loads((job / "summary.json").read_text())["epochs"] == 2
    run_cli("-m", "revgnn.train", *args, "seed=1", "optim.lr=0.01", "trainer.epochs=3", f"output_dir={job}",
            f"ckpt_path={job / 'last.pt'}", cwd=tmp_path)  # fmt: skip
    assert json.loads((job / "summary.json").read_text())["epochs"] == 3


def test_data_schemas_signature_names_no_machine_path():
    import inspect

    from revgnn.config.data_options import data_schemas

    assert "/" not in str(inspect.signature(data_schemas))


def test_the_printed_resume_command_quotes_paths_for_hydra_and_the_shell():
    from omegaconf import OmegaConf

    from revgnn.engine.loop import resume_command

    class Local:
        def launch_prefix(self):
            return "revgnn-train"

    path = "/runs/multirun/x/1_seed=1,optim.lr=0.01/last.pt"
    command = resume_command(OmegaConf.create({}), Local(), path)
    assert shlex.split(command) == [
        "revgnn-train",
        "output_dir='/runs/multirun/x/1_seed=1,optim.lr=0.01'",
        "ckpt_path='/runs/multirun/x/1_seed=1,optim.lr=0.01/last.pt'",
    ]
