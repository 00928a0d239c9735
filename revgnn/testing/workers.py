"""Spawning SAR workers on one host (tests, benchmarks, quick experiments).

Production runs use ``torchrun``; :func:`run_workers` starts ``world_size``
processes on 127.0.0.1 with a gloo process group, runs
``fn(rank, world_size, *args)`` in each and collects their results or
errors. Every phase is bounded so a hung worker can never hang the caller,
and each bound covers one thing:

* start-up (spawn, ``import torch``/PyG, joining the group) by
  ``startup_s``: it takes seconds idle and many times longer when the cores
  are busy (``docs/bench/contention.md``), so it must not eat the bound of
  the run itself;
* the run by ``wall_s``, counted from when every worker has joined;
* once a worker has ended (returned, failed or died), the others get
  ``grace_s`` to end too and are then killed, as ``torchrun`` does after a
  failure: workers of one job end together, and one waiting on an ended or
  hung peer gives up within its own timeouts.
"""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch.multiprocessing as mp

__all__ = ["WorkerResult", "run_workers", "free_port"]


@dataclass
class WorkerResult:
    r"""What one worker did.

    Attributes:
        rank (int), ok (bool), value (the return value of ``fn``),
        error (formatted traceback or why it was killed), exitcode,
        times (dict): seconds since the spawn at which the worker reached
            ``"imported"`` (imports done, before joining), ``"ready"``
            (joined the process group, ``fn`` starts) and ``"end"``
            (``fn`` returned or raised), measured in the worker.
    """

    rank: int
    ok: bool
    value: Any = None
    error: Optional[str] = None  # formatted traceback
    exitcode: Optional[int] = None
    times: Dict[str, float] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world_size, port, timeout_s, backend, fn, args, q, threads, go, startup_s):
    # CLOCK_MONOTONIC is system-wide on Linux: the parent compares the stamps.
    import torch
    import torch.distributed as dist

    from revgnn.distributed.comm import init_distributed

    # P workers on one host: oversubscribed intra-op threads spin-wait and
    # make small ops many times slower, so split the cores.
    torch.set_num_threads(threads)
    try:
        q.put(("imported", rank, time.monotonic()))
        # Join only once every worker has imported: under load imports take
        # tens of seconds and differ between workers, which must not count
        # against the rendezvous timeout.
        if not go.wait(startup_s):
            raise RuntimeError(f"the other workers did not start within {startup_s} s")
        init_distributed(
            backend=backend,
            timeout_s=timeout_s,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
        )
        q.put(("ready", rank, time.monotonic()))
        value = fn(rank, world_size, *args)
        q.put(("done", rank, time.monotonic(), True, value, None))
    except BaseException:
        q.put(("done", rank, time.monotonic(), False, None, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


def run_workers(
    fn: Callable,
    world_size: int,
    *args,
    timeout_s: float = 60.0,
    wall_s: float = 300.0,
    backend: str = "gloo",
    raise_on_error: bool = True,
    start_ranks: Optional[List[int]] = None,
    threads: Optional[int] = None,
    startup_s: float = 600.0,
    grace_s: Optional[float] = None,
) -> List[WorkerResult]:
    """Runs ``fn(rank, world_size, *args)`` in ``world_size`` spawned
    processes joined in one process group.

    Args:
        fn (callable): a picklable (module-level) function. Its module is
            imported during start-up; imports inside ``fn`` count towards
            ``wall_s``.
        world_size (int): number of workers.
        timeout_s (float): process-group timeout (rendezvous once every
            worker has imported, collectives, transfers without their own
            timeout). (default: ``60``)
        wall_s (float): bound on the run, from when every started worker has
            joined; workers still alive after it are killed and reported as
            failed. (default: ``300``)
        backend (str): ``"gloo"`` (default) or ``"nccl"``.
        raise_on_error (bool): raise ``RuntimeError`` with every failed
            worker's traceback. (default: ``True``)
        start_ranks (list of int, optional): start only these ranks (to
            simulate peers that never arrive). (default: all)
        threads (int, optional): intra-op threads per worker.
            (default: cores / ``world_size``)
        startup_s (float): bound on start-up (spawn, imports, joining).
            (default: ``600``)
        grace_s (float, optional): once a worker has ended (returned,
            failed or died), the others are killed after this long: workers
            of one job end together, and one that waits on an ended peer
            gives up within its timeouts. (default: ``timeout_s + 30``)

    Returns:
        list of :class:`WorkerResult`, one per started rank.
    """
    ctx = mp.get_context("spawn")
    q, go = ctx.Queue(), ctx.Event()
    port = free_port()
    ranks = list(range(world_size)) if start_ranks is None else start_ranks
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // world_size)
    if grace_s is None:
        grace_s = timeout_s + 30.0
    procs = {
        r: ctx.Process(
            target=_entry,
            args=(r, world_size, port, timeout_s, backend, fn, args, q, threads, go, startup_s),
            daemon=True,
        )
        for r in ranks
    }
    t0 = time.monotonic()
    for p in procs.values():
        p.start()
    times = {r: {} for r in ranks}
    results: Dict[int, WorkerResult] = {}
    # One deadline: start-up, then the wall bound once all are ready, then
    # (never later) the grace once one has ended.
    phase, deadline = "start", t0 + startup_s
    why = {
        "start": f"did not start within {startup_s} s",
        "run": f"still running at the {wall_s} s wall bound",
    }

    def reached(stage: str) -> bool:
        return all(stage in times[r] or r in results for r in ranks)

    while len(results) < len(ranks) and time.monotonic() < deadline:
        try:
            kind, rank, stamp, *rest = q.get(timeout=max(0.01, min(0.2, deadline - time.monotonic())))
            times[rank]["end" if kind == "done" else kind] = stamp - t0
            if kind == "done":
                results[rank] = WorkerResult(rank, *rest)
        except queue.Empty:
            pass
        for r, p in procs.items():  # died without reporting (os._exit, kill)
            if r not in results and not p.is_alive() and q.empty():
                p.join()
                results[r] = WorkerResult(
                    r, False, error=f"exited with code {p.exitcode} without reporting", exitcode=p.exitcode
                )
        now = time.monotonic()
        if not go.is_set() and reached("imported"):
            go.set()
        if phase == "start" and reached("ready"):
            phase, deadline = "run", now + wall_s
        if results and phase != "grace":
            r = next(iter(results))
            phase, deadline = "grace", min(deadline, now + grace_s)
            why["grace"] = (
                f"still running {grace_s} s after rank {r} {'returned' if results[r].ok else 'failed'}"
            )
    for r, p in procs.items():
        # Reported workers may still be tearing down the process group.
        p.join(timeout=max(0.1, min(deadline, time.monotonic() + grace_s) - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
            results.setdefault(r, WorkerResult(r, False, error=f"killed: {why[phase]}"))
        results[r].exitcode = p.exitcode
        results[r].times = times[r]
    out = [results[r] for r in ranks]
    if raise_on_error and not all(r.ok for r in out):
        msg = "\n".join(f"--- rank {r.rank}: {r.error}" for r in out if not r.ok)
        raise RuntimeError(f"SAR workers failed:\n{msg}")
    return out
