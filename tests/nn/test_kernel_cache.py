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
from conftest import require_kernel

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
        assert kernels._built.__wrapped__(NAME) is None
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "slower PyTorch path" in messages[0] and "build stopped" in messages[0]
    assert not (kernels.build_dir(NAME, key) / kernels.MARKER).exists()


def test_kernel_arch_is_part_of_the_key(monkeypatch, tmp_path):
    """``REVGNN_KERNEL_ARCH`` picks the ``-march`` level: its own build directory, and for a portable
    level a key without this CPU's flags (a build on one node serves every node of that level)."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.delenv("REVGNN_KERNEL_ARCH", raising=False)
    native = kernels.environment_key()
    assert "-march=native" in native["cflags"] and native["cpu"] != "any"
    monkeypatch.setattr(
        kernels, "_cpu_flags", lambda: "flags\t: " + " ".join(sum(kernels.ARCHES.values(), ()))
    )
    keys = {}
    for level in ("x86-64-v2", "x86-64-v3", "x86-64-v4"):
        monkeypatch.setenv("REVGNN_KERNEL_ARCH", level)
        keys[level] = kernels.environment_key()
        assert f"-march={level}" in keys[level]["cflags"].split() and keys[level]["cpu"] == "any"
    dirs = {kernels.build_dir(NAME, k) for k in [native, *keys.values()]}
    assert len(dirs) == 4


def test_kernel_arch_errors_name_the_level_and_the_missing_flags(monkeypatch):
    monkeypatch.setenv("REVGNN_KERNEL_ARCH", "x86-64-v9")
    with pytest.raises(ValueError, match=r"x86-64-v9.*choose one of \['native', 'x86-64-v2'"):
        kernels.arch()
    monkeypatch.setenv("REVGNN_KERNELS", "1")
    with pytest.raises(ValueError, match="x86-64-v9"):  # an error, not a silent fallback to PyTorch
        kernels._built.__wrapped__(NAME)
    monkeypatch.setenv("REVGNN_KERNEL_ARCH", "x86-64-v3")
    monkeypatch.setattr(kernels.platform, "machine", lambda: "x86_64")
    v2_only = "flags\t: " + " ".join(kernels.ARCHES["x86-64-v2"] + ("avx",))
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: v2_only)
    with pytest.raises(ValueError, match=r"x86-64-v3: this CPU lacks avx2, bmi1, bmi2, f16c, fma"):
        kernels.arch()


def test_kernels_come_back_when_re_enabled_in_a_process(monkeypatch):
    """``REVGNN_KERNELS`` is read on every call: a ``0`` seen first is not remembered once it is set
    back (the loaded module is, so no rebuild)."""
    require_kernel(NAME)
    monkeypatch.setenv("REVGNN_KERNELS", "0")
    assert kernels.load(NAME) is None
    monkeypatch.setenv("REVGNN_KERNELS", "1")
    assert kernels.load(NAME) is not None
