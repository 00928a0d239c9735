"""The README's commands work from an installed wheel, not only from the repository.

Builds the wheel from a copy of the package sources, installs it (``--no-deps``) into a fresh venv
whose dependencies come from this venv's site-packages through a ``.pth`` line (no torch download;
``.pth`` files there, among them the repository's editable install, are not processed), checks that
``revgnn`` is imported from the wheel, then runs the console scripts from directories outside the
repository: ``revgnn-train`` (one short epoch), ``revgnn-evaluate`` of its ``best.pt`` and the
``--help`` of ``revgnn-reproduce`` and ``revgnn-partition``.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, TINY_RUN


def _run(cmd, cwd, env, timeout=300):
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_wheel_installs_and_its_console_scripts_train_and_evaluate(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}

    # ---- build the wheel from a copy of what it ships (the repository stays untouched) ----
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "revgnn", src / "revgnn", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    wheels = tmp_path / "wheels"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            wheels,
            src,
        ],
        cwd=tmp_path,
        env=env,
    )
    (wheel,) = wheels.glob("revgnn-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for shipped in (
        "revgnn/configs/train.yaml",
        "revgnn/configs/hydra/launcher/slurm.yaml",
        "revgnn/configs/hydra/launcher/local.yaml",
        "revgnn/csrc/gen_max.cpp",
        "revgnn/cli/evaluate.py",
        "revgnn/cli/reproduce.py",
    ):
        assert shipped in names, f"{shipped} missing from {wheel.name}"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    for script in ("revgnn-train", "revgnn-evaluate", "revgnn-reproduce", "revgnn-partition"):
        assert f"{script} = " in scripts

    # ---- a fresh venv: revgnn from the wheel, the dependencies from this venv ----
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path, env=env)
    python = venv / "bin" / "python"
    _run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel],
        cwd=tmp_path,
        env=env,
    )
    site = _run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path, env=env
    ).stdout.strip()
    (Path(site) / "_revgnn_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = json.loads(
        _run(
            [
                python,
                "-c",
                "import json, revgnn, importlib.metadata as m; print(json.dumps("
                "[revgnn.__file__, str(m.distribution('revgnn').locate_file(''))]))",
            ],
            cwd=tmp_path,
            env=env,
        ).stdout
    )
    for path in where:
        assert Path(path).resolve().is_relative_to(venv.resolve()), f"revgnn not from the wheel: {where}"

    # ---- train with the installed console script, evaluate from another directory ----
    run_dir = tmp_path / "run"
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    _run([venv / "bin" / "revgnn-train", *TINY_RUN, f"output_dir={run_dir}"], cwd=work, env=env)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs"] == 1
    proc = _run([venv / "bin" / "revgnn-evaluate", run_dir / "best.pt"], cwd=elsewhere, env=env)
    result = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert result["epoch"] == 1 and result["metric"] == summary["metric"]
    # same checkpoint, same views / parts and seed as training's evaluation -> the logged score
    assert abs(result["valid"] - summary["highest_valid"]) < 1e-6

    proc = _run([venv / "bin" / "revgnn-reproduce", "--help"], cwd=elsewhere, env=env)
    assert "--launcher" in proc.stdout and "--smoke" in proc.stdout
    # the entry point names an importable module (pyproject's revgnn.cli.partition:main)
    proc = _run([venv / "bin" / "revgnn-partition", "--help"], cwd=elsewhere, env=env)
    assert proc.stdout.startswith("revgnn-partition: partition a node-level data set")
