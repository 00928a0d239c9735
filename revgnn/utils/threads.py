"""CPU thread defaults that degrade gracefully on busy machines and in containers.

Two things make torch's defaults fall off a cliff when other processes share the cores:

* **OpenMP spin-waiting.** torch's CPU ops and revgnn's kernels run in OpenMP parallel regions
  (libgomp in the pip wheels), thousands per training step. With nothing set, libgomp lets a
  waiting thread (for the next region, or for its team at a barrier) spin ``GOMP_SPINCOUNT=300000``
  times, about 3 ms, before it sleeps. The spinning threads look CPU-bound to the scheduler, are
  queued behind the competing processes, and every short region then waits for a time slice.
  A short spin (``GOMP_SPINCOUNT=1000``, ~10 us by libgomp's estimate) keeps most of the idle
  speed and loses the cliff; ``OMP_WAIT_POLICY=PASSIVE`` (never spin) is as good under load but
  slow idle for small graphs (a sleeping thread must be woken for every region). ``KMP_BLOCKTIME``
  is Intel/LLVM OpenMP's knob and changes nothing with libgomp; with those runtimes (conda builds,
  macOS) export ``OMP_WAIT_POLICY=PASSIVE`` or ``KMP_BLOCKTIME=0`` yourself.
* **The thread count.** torch starts one thread per core it can see, which inside a container
  is the host's, whatever its CPU quota: a team of 16 threads on a 2-CPU quota is throttled in
  every region. :func:`default_num_threads` takes the smallest of the CPU affinity mask
  (``os.sched_getaffinity``), the cgroup CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` /
  ``cpu.cfs_period_us``) rounded **down** (1.5 CPUs -> 1 thread: a team larger than the quota
  stalls at every barrier while the group is throttled, whereas one thread loses at most the
  fraction), at least 1, and never more than torch's own choice.

OpenMP reads its environment once, when its runtime starts (``import torch``), so the spin count
must be set before that: revgnn's entry points (``revgnn-train``, the scripts) set it in
:func:`revgnn.utils.allocator.use_tcmalloc`, their first call; :func:`configure_threads` sets it when
torch is not imported yet. The thread count is applied by the training backends
(``backend.num_threads``, default ``null``: :func:`default_num_threads`).

Python API users::

    from revgnn.utils.threads import configure_threads
    configure_threads()          # first thing, before `import torch` (or export GOMP_SPINCOUNT=1000)
    import torch                 # ... OpenMP and torch now use the settings above

On a machine shared with heavy jobs, ``OMP_WAIT_POLICY=PASSIVE`` is the most robust setting (at
some idle speed for small graphs); for graphs as small as the default ``proteins_like`` steps, one
thread (``backend.num_threads=1``) is the fastest under load. The figures behind these choices are in
``docs/bench/contention.md`` (``benchmarks/contention.py``).

Environment: an explicit ``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT`` or ``OMP_NUM_THREADS`` is never
overridden; ``REVGNN_THREADS=torch`` turns all of this off (torch's and OpenMP's defaults, as
before).
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, MutableMapping, Optional, Set

__all__ = [
    "configure_threads",
    "default_num_threads",
    "cgroup_cpu_quota",
    "affinity_cpus",
    "openmp_env_defaults",
    "openmp_started",
    "ThreadSettings",
    "SPIN_COUNT",
]

CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"
SPIN_COUNT = "1000"  # libgomp's spins before a waiting thread sleeps (its default: 300000, ~3 ms)
_WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
_OPENMP_LIBS = ("libgomp", "libiomp", "libomp")


def disabled(env: Optional[MutableMapping[str, str]] = None) -> bool:
    """True when ``REVGNN_THREADS=torch`` (or ``off``/``0``): leave torch's and OpenMP's defaults."""
    env = os.environ if env is None else env
    return env.get("REVGNN_THREADS", "").strip().lower() in ("torch", "off", "0", "false", "no")


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _ancestors(base: str, rel: str) -> List[str]:
    """``base/rel`` and each parent directory up to ``base`` (the limit may sit on any of them)."""
    parts = [p for p in rel.strip("/").split("/") if p and p != ".."]
    return [os.path.join(base, *parts[:i]) for i in range(len(parts), -1, -1)]


def cgroup_cpu_quota(root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP) -> Optional[float]:
    """CPUs this process's cgroup may use (e.g. ``1.5``), or :obj:`None` without a quota.

    Reads cgroup v2 ``cpu.max`` (``"<quota> <period>"`` or ``"max <period>"``) and v1
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (quota ``-1``: none) in the process's own cgroup
    (from ``proc_cgroup``) and its ancestors, and at the top of ``root`` (where a container sees
    its own group); the smallest limit wins. ``root`` and ``proc_cgroup`` are arguments so that
    tests can point them at fake files.
    """
    v2_paths, v1_paths = ["/"], ["/"]
    text = _read(proc_cgroup) or ""
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":
            v2_paths.insert(0, path)
        elif "cpu" in controllers.split(","):
            v1_paths.insert(0, path)
    limits = []
    seen: Set[str] = set()
    for rel in v2_paths:
        for d in _ancestors(root, rel):
            if d in seen:
                continue
            seen.add(d)
            fields = (_read(os.path.join(d, "cpu.max")) or "").split()
            if len(fields) == 2 and fields[0] != "max":
                try:
                    quota, period = float(fields[0]), float(fields[1])
                except ValueError:
                    continue
                if quota > 0 and period > 0:
                    limits.append(quota / period)
    for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        base = os.path.join(root, mount)
        for rel in v1_paths:
            for d in _ancestors(base, rel):
                if d in seen:
                    continue
                seen.add(d)
                quota, period = (
                    _read(os.path.join(d, "cpu.cfs_quota_us")),
                    _read(os.path.join(d, "cpu.cfs_period_us")),
                )
                try:
                    q, p = float(quota or "-1"), float(period or "0")
                except ValueError:
                    continue
                if q > 0 and p > 0:
                    limits.append(q / p)
    return min(limits) if limits else None


def affinity_cpus(getaffinity: Optional[Callable[[int], Iterable[int]]] = None) -> int:
    """CPUs this process may run on (``os.sched_getaffinity(0)``; ``os.cpu_count()`` where that
    is missing)."""
    getaffinity = getaffinity or getattr(os, "sched_getaffinity", None)
    if getaffinity is not None:
        try:
            return max(1, len(set(getaffinity(0))))
        except OSError:
            pass
    return max(1, os.cpu_count() or 1)


def default_num_threads(
    torch_default: Optional[int] = None,
    *,
    getaffinity: Optional[Callable[[int], Iterable[int]]] = None,
    cgroup_root: str = CGROUP_ROOT,
    proc_cgroup: str = PROC_CGROUP,
) -> int:
    """The thread count revgnn uses by default: ``min(affinity CPUs, floor(cgroup quota), torch_default)``,
    at least 1. A quota of 1.5 CPUs gives 1 (see the module docstring); no quota, the affinity
    count; ``torch_default`` (torch's own choice, ``torch.get_num_threads()`` before any change) is
    never exceeded."""
    n = affinity_cpus(getaffinity)
    quota = cgroup_cpu_quota(cgroup_root, proc_cgroup)
    if quota is not None:
        n = min(n, max(1, math.floor(quota + 1e-9)))
    if torch_default is not None and torch_default >= 1:
        n = min(n, torch_default)
    return max(1, n)


def openmp_started() -> bool:
    """Whether an OpenMP runtime is already loaded in this process (then it has read its
    environment, and OpenMP variables set now are ignored)."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
        return any(lib in maps for lib in _OPENMP_LIBS)
    except OSError:
        return "torch" in sys.modules


def openmp_env_defaults(env: Optional[MutableMapping[str, str]] = None) -> Dict[str, str]:
    """Sets ``GOMP_SPINCOUNT=1000`` in ``env`` (default: ``os.environ``) unless ``OMP_WAIT_POLICY``
    or ``GOMP_SPINCOUNT`` is set already or ``REVGNN_THREADS=torch``; returns the OpenMP wait
    variables now in ``env``. Effective only for an OpenMP runtime started after this (a child
    process, or this one before ``import torch``). Imports nothing."""
    env = os.environ if env is None else env
    if not disabled(env) and "OMP_WAIT_POLICY" not in env and "GOMP_SPINCOUNT" not in env:
        env["GOMP_SPINCOUNT"] = SPIN_COUNT
    return {k: env[k] for k in _WAIT_VARS if k in env}


@dataclass
class ThreadSettings:
    """What :func:`configure_threads` left in place."""

    num_threads: int  #: torch's intra-op threads now
    source: str  #: ``"argument"``, ``"OMP_NUM_THREADS"``, ``"default"`` or ``"torch"``
    openmp_env: Dict[str, str]  #: the OpenMP wait variables the runtime started with ({}: its defaults)
    openmp_env_applied: bool  #: False if the runtime had started before revgnn's could be set


def configure_threads(num_threads: Optional[int] = None, *, warn: bool = True) -> ThreadSettings:
    """Applies revgnn's CPU thread defaults to this process; returns what is in place.

    1. Unless ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is already set, sets ``GOMP_SPINCOUNT=1000``
       (:func:`openmp_env_defaults`) -- effective only if torch (OpenMP) is not imported yet, so call
       this first; otherwise, with ``warn``, warns that it must be exported before Python starts.
    2. Sets ``torch.set_num_threads``: ``num_threads`` when given; else, unless ``OMP_NUM_THREADS``
       is set (then torch already follows it), :func:`default_num_threads` (affinity mask and
       cgroup CPU quota, never above torch's choice).

    ``REVGNN_THREADS=torch`` keeps torch's and OpenMP's defaults (``num_threads`` still applies).
    The training backends call it with ``backend.num_threads``; it is idempotent.

    Raises:
        ValueError: ``num_threads < 1``.
    """
    if num_threads is not None and num_threads < 1:
        raise ValueError(f"num_threads must be >= 1 (or None for the default), got {num_threads}")
    applied = True
    if not disabled() and not any(k in os.environ for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")):
        if openmp_started():
            applied = False
            if warn:
                warnings.warn(
                    "revgnn.utils.threads.configure_threads(): torch was imported first, so "
                    "OpenMP keeps spin-waiting ~3 ms per wait (steps many times slower when other "
                    "processes share the cores); call it before `import torch`, or export "
                    f"GOMP_SPINCOUNT={SPIN_COUNT} (or OMP_WAIT_POLICY=PASSIVE)",
                    RuntimeWarning,
                    stacklevel=2,
                )
        else:
            openmp_env_defaults()
    import torch

    if num_threads is not None:
        n, source = num_threads, "argument"
    elif disabled():
        n, source = torch.get_num_threads(), "torch"
    elif os.environ.get("OMP_NUM_THREADS", "").strip():
        n, source = torch.get_num_threads(), "OMP_NUM_THREADS"
    else:
        n, source = default_num_threads(torch.get_num_threads()), "default"
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return ThreadSettings(
        num_threads=torch.get_num_threads(),
        source=source,
        openmp_env={k: os.environ[k] for k in _WAIT_VARS if k in os.environ} if applied else {},
        openmp_env_applied=applied,
    )
