"""The kernel cache is keyed per build configuration: two environments (here: two torch versions)
build into two directories, neither rebuilds the other, and a finished build loads without the
compiler. One real build (the second key's layer_norm_relu, ~40 s); the default key's build is
copied from the user's cache when it is there (``python -m revgnn.nn.kernels`` makes it)."""
import os
import shutil
import subprocess
import sys
import warnings

import pytest

from revgnn.nn import kernels

NAME = "layer_norm_relu"  # the quicker of the two to build


def snapshot(directory):
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir() if p.is_file()}


@pytest.fixture
def builds(monkeypatch):
    """Counts the compiler runs (each call of ``kernels._compile``)."""
    calls = []
    compile_ = kernels._compile

    def counting(name, directory, module, verbose):
        calls.append(directory)
        return compile_(name, directory, module, verbose)
    monkeypatch.setattr(kernels, "_compile", counting)
    return calls


def test_key_parts_give_distinct_directories(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    key = kernels.environment_key()
    assert kernels.build_dir(NAME).parent.parent == tmp_path / "revgnn"
    dirs = {kernels.build_dir(NAME, key)}
    for part, value in [("torch", "0.0.0+other"), ("python_abi", ".cpython-39-x86_64-linux-gnu.so"),
                        ("compiler", "/usr/bin/clang++ clang 1.0"), ("cflags", "-O0"), ("cpu", "other")]:
        other = {**key, part: value}
        dirs.add(kernels.build_dir(NAME, other))
        assert kernels.module_name(NAME, other) != kernels.module_name(NAME, key)
    assert len(dirs) == 6
    for part in ("torch", "torch_git", "python_abi", "compiler", "cflags", "ldflags", "cpu"):
        assert key[part]


def test_two_environments_never_rebuild_each_other(tmp_path, monkeypatch, builds, caplog):
    if not kernels.enabled():
        pytest.skip("REVGNN_KERNELS=0")
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler")
    caplog.set_level("INFO", logger="revgnn.nn.kernels")
    key_a = kernels.environment_key()
    user_a = kernels.build_dir(NAME, key_a)  # the user's cache (default root)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    dir_a = kernels.build_dir(NAME, key_a)
    if (user_a / kernels.MARKER).is_file():
        shutil.copytree(user_a, dir_a)  # reuse the default key's build: no compile for A

    mod_a = kernels._build(NAME)  # environment A (this one)
    assert mod_a.__file__.startswith(str(dir_a))
    built_a = len(builds)
    assert built_a <= 1
    files_a = snapshot(dir_a)

    key_b = {**key_a, "torch": key_a["torch"] + ".other"}  # environment B: another torch
    monkeypatch.setattr(kernels, "environment_key", lambda: key_b)
    dir_b = kernels.build_dir(NAME, key_b)
    assert dir_b != dir_a
    mod_b = kernels._build(NAME)
    assert builds[built_a:] == [dir_b]  # B built once, into its own directory
    assert mod_b.__file__.startswith(str(dir_b)) and mod_b.__name__ != mod_a.__name__
    assert snapshot(dir_a) == files_a  # A untouched
    files_b = snapshot(dir_b)
    starts = [r.getMessage() for r in caplog.records if r.getMessage().startswith("building revgnn C++ kernels")]
    assert len(starts) == built_a + 1
    assert any(r.getMessage().startswith(f"built revgnn C++ kernel {NAME} in ") for r in caplog.records)

    for key, directory in [(key_a, dir_a), (key_b, dir_b), (key_a, dir_a)]:  # switch back and forth
        monkeypatch.setattr(kernels, "environment_key", lambda key=key: key)
        assert kernels._build(NAME).__file__.startswith(str(directory))
    assert len(builds) == built_a + 1  # nothing rebuilt
    assert snapshot(dir_a) == files_a and snapshot(dir_b) == files_b

    # environment B after its compiler was removed: its finished build still loads
    key_b_nocc = {**key_b, "compiler": "c++ (not found)"}
    monkeypatch.setattr(kernels, "environment_key", lambda: key_b_nocc)
    assert kernels._build(NAME).__file__.startswith(str(dir_b))
    assert len(builds) == built_a + 1

    # a fresh process of environment A starts without a build and without a log line of one
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path))
    code = f"from revgnn.nn import kernels; print(kernels.{NAME}().__file__)"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    assert proc.stdout.strip().startswith(str(dir_a)) and "building" not in proc.stderr
    assert snapshot(dir_a) == files_a


def test_failed_build_falls_back_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("REVGNN_KERNELS", "1")
    key = {**kernels.environment_key(), "torch": "0.0.0+broken", "compiler": "/usr/bin/c++ fake"}
    monkeypatch.setattr(kernels, "environment_key", lambda: key)

    def fail(name, directory, module, verbose):
        raise RuntimeError("Error building extension 'x'\nninja: build stopped: subcommand failed.")
    monkeypatch.setattr(kernels, "_compile", fail)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert kernels._load.__wrapped__(NAME) is None
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "slower PyTorch path" in messages[0] and "build stopped" in messages[0]
    assert not (kernels.build_dir(NAME, key) / kernels.MARKER).exists()
