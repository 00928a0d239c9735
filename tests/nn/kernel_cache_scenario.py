"""Two environments share one kernel cache root and never rebuild each other (run by
``test_kernel_cache.py`` in a fresh interpreter): ``python kernel_cache_scenario.py ROOT KERNEL``.

Environment A is this one (its build is copied from the user's cache when there, so no compile);
environment B differs by its torch version and is built once, into its own directory. Switching back
and forth rebuilds nothing, B still loads after its compiler is gone, and a fresh process of A loads
without a build."""

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from revgnn.nn import kernels


def snapshot(directory):
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir() if p.is_file()}


def main(root: Path, name: str) -> None:
    builds, messages = [], []
    compile_ = kernels._compile

    def counting(name, directory, module, verbose):
        builds.append(directory)
        return compile_(name, directory, module, verbose)

    kernels._compile = counting

    class Record(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    kernels.log.addHandler(Record())
    kernels.log.setLevel(logging.INFO)

    key_a = kernels.environment_key()
    user_a = kernels.build_dir(name, key_a)  # the user's cache (default root)
    os.environ["TORCH_EXTENSIONS_DIR"] = str(root)
    dir_a = kernels.build_dir(name, key_a)
    assert dir_a != user_a
    if (user_a / kernels.MARKER).is_file():
        shutil.copytree(user_a, dir_a)  # reuse the default key's build: no compile for A

    mod_a = kernels._build(name)  # environment A (this one)
    assert mod_a.__file__.startswith(str(dir_a)), (mod_a.__file__, dir_a)
    built_a = len(builds)
    assert built_a <= 1
    files_a = snapshot(dir_a)

    key_b = {**key_a, "torch": key_a["torch"] + ".other"}  # environment B: another torch
    kernels.environment_key = lambda: key_b
    dir_b = kernels.build_dir(name, key_b)
    assert dir_b != dir_a
    mod_b = kernels._build(name)
    assert builds[built_a:] == [dir_b], builds  # B built once, into its own directory
    assert mod_b.__file__.startswith(str(dir_b)) and mod_b.__name__ != mod_a.__name__
    assert snapshot(dir_a) == files_a  # A untouched
    files_b = snapshot(dir_b)
    starts = [m for m in messages if m.startswith("building revgnn C++ kernels")]
    assert len(starts) == built_a + 1, messages
    assert any(m.startswith(f"built revgnn C++ kernel {name} in ") for m in messages), messages

    for key, directory in [(key_a, dir_a), (key_b, dir_b), (key_a, dir_a)]:  # switch back and forth
        kernels.environment_key = lambda key=key: key
        assert kernels._build(name).__file__.startswith(str(directory))
    assert len(builds) == built_a + 1  # nothing rebuilt
    assert snapshot(dir_a) == files_a and snapshot(dir_b) == files_b

    # environment B after its compiler was removed: its finished build still loads
    key_b_nocc = {**key_b, "compiler": "c++ (not found)"}
    kernels.environment_key = lambda: key_b_nocc
    assert kernels._build(name).__file__.startswith(str(dir_b))
    assert len(builds) == built_a + 1

    # a fresh process of environment A starts without a build and without a log line of one
    code = f"from revgnn.nn import kernels; print(kernels.load({name!r}).__file__)"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert proc.stdout.strip().startswith(str(dir_a)) and "building" not in proc.stderr, proc
    assert snapshot(dir_a) == files_a
    print("scenario passed")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
