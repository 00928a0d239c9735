"""The kernel cache is keyed per build configuration: two environments (here: two torch versions)
build into two directories, neither rebuilds the other, and a finished build loads without the
compiler. One real build (the second key's layer_norm_relu, ~40 s); the default key's build is
copied from the user's cache when it is there (``python -m revgnn.nn.kernels`` makes it)."""

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from revgnn.nn import kernels

NAME = "layer_norm_relu"  # the quicker of the two to build


def test_key_parts_give_distinct_directories(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    key = kernels.environment_key()
    assert kernels.build_dir(NAME).parent.parent == tmp_path / "revgnn"
    dirs = {kernels.build_dir(NAME, key)}
    for part, value in [
        ("torch", "0.0.0+other"),
        ("python_abi", ".cpython-39-x86_64-linux-gnu.so"),
        ("compiler", "/usr/bin/clang++ clang 1.0"),
        ("cflags", "-O0"),
        ("cpu", "other"),
    ]:
        other = {**key, part: value}
        dirs.add(kernels.build_dir(NAME, other))
        assert kernels.module_name(NAME, other) != kernels.module_name(NAME, key)
    assert len(dirs) == 6
    for part in ("torch", "torch_git", "python_abi", "compiler", "cflags", "ldflags", "cpu"):
        assert key[part]


def test_two_environments_never_rebuild_each_other(tmp_path):
    """Runs ``kernel_cache_scenario.py`` in a fresh interpreter: an extension module already loaded by
    an earlier test of this session (same name = same key and source) is served from memory by
    CPython, whatever cache directory it is asked from, so only a new process sees the cache alone."""
    if not kernels.enabled():
        pytest.skip("REVGNN_KERNELS=0")
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler")
    script = Path(__file__).with_name("kernel_cache_scenario.py")
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path), NAME], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "scenario passed" in proc.stdout


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
