"""Spawning SAR workers on one host (tests, benchmarks, quick experiments).

Production runs use ``torchrun``; :func:`run_workers` starts ``world_size``
processes on 127.0.0.1 with a gloo process group, runs
``fn(rank, world_size, *args)`` in each and collects their results or
errors, with a hard wall-clock bound so a hung worker can never hang the
caller.
"""
from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

import torch.multiprocessing as mp

__all__ = ['WorkerResult', 'run_workers', 'free_port']


@dataclass
class WorkerResult:
    rank: int
    ok: bool
    value: Any = None
    error: Optional[str] = None  # formatted traceback
    exitcode: Optional[int] = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _entry(rank, world_size, port, timeout_s, backend, fn, args, q,
           threads):
    import torch
    import torch.distributed as dist

    from .comm import init_distributed
    # P workers on one host: oversubscribed intra-op threads spin-wait and
    # make small ops 100x slower, so split the cores.
    torch.set_num_threads(threads)
    try:
        init_distributed(backend=backend, timeout_s=timeout_s,
                         init_method=f'tcp://127.0.0.1:{port}', rank=rank,
                         world_size=world_size)
        value = fn(rank, world_size, *args)
        q.put((rank, True, value, None))
    except BaseException:
        q.put((rank, False, None, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


def run_workers(fn: Callable, world_size: int, *args,
                timeout_s: float = 60.0, wall_s: float = 300.0,
                backend: str = 'gloo', raise_on_error: bool = True,
                start_ranks: Optional[List[int]] = None,
                threads: Optional[int] = None) -> List[WorkerResult]:
    """Runs ``fn(rank, world_size, *args)`` in ``world_size`` spawned
    processes joined in one process group.

    Args:
        fn (callable): a picklable (module-level) function.
        world_size (int): number of workers.
        timeout_s (float): process-group timeout (bounds every wait).
        wall_s (float): hard bound on the whole run; workers still alive
            after it are killed and reported as failed.
        backend (str): ``"gloo"`` (default) or ``"nccl"``.
        raise_on_error (bool): raise ``RuntimeError`` with every failed
            worker's traceback. (default: ``True``)
        start_ranks (list of int, optional): start only these ranks (to
            simulate peers that never arrive). (default: all)

    Returns:
        list of :class:`WorkerResult`, one per started rank.
    """
    ctx = mp.get_context('spawn')
    q = ctx.Queue()
    port = free_port()
    ranks = list(range(world_size)) if start_ranks is None else start_ranks
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // world_size)
    procs = {r: ctx.Process(target=_entry, args=(r, world_size, port,
                                                timeout_s, backend, fn, args,
                                                q, threads), daemon=True)
             for r in ranks}
    for p in procs.values():
        p.start()
    results = {}
    deadline = time.monotonic() + wall_s
    while len(results) < len(ranks) and time.monotonic() < deadline:
        try:
            rank, ok, value, err = q.get(timeout=0.2)
            results[rank] = WorkerResult(rank, ok, value, err)
        except queue.Empty:
            pass
        for r, p in procs.items():  # died without reporting (os._exit, kill)
            if r not in results and not p.is_alive() and q.empty():
                p.join()
                results[r] = WorkerResult(
                    r, False, error=f'exited with code {p.exitcode} '
                    'without reporting', exitcode=p.exitcode)
    for r, p in procs.items():
        p.join(timeout=max(0.1, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
            results.setdefault(r, WorkerResult(
                r, False, error=f'killed after the {wall_s} s wall bound'))
        results[r].exitcode = p.exitcode
    out = [results[r] for r in ranks]
    if raise_on_error and not all(r.ok for r in out):
        msg = '\n'.join(f'--- rank {r.rank}: {r.error}' for r in out
                        if not r.ok)
        raise RuntimeError(f'SAR workers failed:\n{msg}')
    return out
