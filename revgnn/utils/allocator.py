"""Start-up helpers for command-line entry points: the CPU allocator and OpenMP's wait policy.

Reversible training frees and re-allocates one activation-sized buffer per
layer and step. glibc's malloc fragments under that pattern: peak RSS grows
with depth, while with tcmalloc it stays flat and steps run faster
(``docs/bench/memory_glibc.md`` vs ``docs/bench/memory.md``). Like Intel's
CPU launchers, our entry points therefore re-execute themselves once with
tcmalloc preloaded when it is installed and not already active.

Set ``REVGNN_ALLOCATOR=system`` to keep the default allocator.

The same first call also sets ``GOMP_SPINCOUNT=1000`` (unless ``OMP_WAIT_POLICY``
or ``GOMP_SPINCOUNT`` is set, or ``REVGNN_THREADS=torch``) before torch starts its
OpenMP runtime, which reads it only then: OpenMP threads spin-waiting ~3 ms per
wait (libgomp's default) made steps several times slower when other processes
shared the cores (see :mod:`revgnn.utils.threads`, ``docs/bench/contention.md``).
It is set whether or not the
re-execution happens.
"""

from __future__ import annotations

import ctypes.util
import glob
import os
import sys
from typing import Optional

_CANDIDATES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
_SEARCH_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)


def find_tcmalloc() -> Optional[str]:
    """Path of an installed tcmalloc shared library, or None."""
    for directory in _SEARCH_DIRS:
        for name in _CANDIDATES:
            hits = glob.glob(os.path.join(directory, name))
            if hits:
                return hits[0]
    name = ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")
    return name if name and os.path.isabs(name) else None


def allocator() -> str:
    """``'tcmalloc'`` if this process has tcmalloc preloaded, else ``'system'``."""
    return "tcmalloc" if "tcmalloc" in os.environ.get("LD_PRELOAD", "") else "system"


def use_tcmalloc() -> None:
    """Re-executes the current command with tcmalloc preloaded, when possible; first sets
    revgnn's OpenMP defaults in the environment (:func:`revgnn.utils.threads.openmp_env_defaults`).

    The re-execution is a no-op when tcmalloc is already preloaded, not installed, when
    ``REVGNN_ALLOCATOR=system``, or on non-Linux platforms. Call it first thing
    in a ``main()``, before heavy imports (torch).
    """
    from revgnn.utils.threads import openmp_env_defaults

    openmp_env_defaults()  # os.environ: this process (torch not imported yet) and the re-exec
    if (
        sys.platform != "linux"
        or allocator() == "tcmalloc"
        or os.environ.get("REVGNN_ALLOCATOR", "tcmalloc") == "system"
        or os.environ.get("_REVGNN_REEXEC")
    ):
        return
    lib = find_tcmalloc()
    if lib is None:
        return
    env = dict(os.environ)
    env["LD_PRELOAD"] = f"{lib}:{env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else lib
    env["_REVGNN_REEXEC"] = "1"  # never loop, even if the preload is refused
    argv = list(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv[1:]], env)
