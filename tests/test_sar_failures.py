"""SAR failure behaviour: dead, hung or missing peers and mismatched
partitions end every worker in bounded time with an error that names the
peer and the operation.

Times are measured inside the surviving workers, from just before the
operation that waits until its error, so the bounds hold on a loaded
machine: start-up (spawn, ``import torch``/PyG: 3 s idle, 10-20 s with both
cores busy) has its own bound in :func:`run_workers`.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

# Imported here so that the spawned workers import PyG during start-up
# (unpickling the worker function imports this module), not inside the
# timed part.
from torch_geometric.nn import SAGEConv

from revgnn.distributed.comm import SARCommError
from revgnn.distributed.convs import convert_to_sar
from revgnn.distributed.sar import SARGraph
from revgnn.distributed.sar_partition import build_partitions
from revgnn.testing.workers import run_workers

N = 30
TRANSFER_S = 3.0  # the SAR transfer timeout under test (the process group itself gets 60 s)
# The hung-peer tests bound from below what the code guarantees (a timeout never fires before its time:
# the clock starts before the transfers do). The dead-peer test keeps its generous upper bound: a worker
# may get a fraction of a core on a loaded machine.
SLACK_S = 20.0


def _parts(num_parts, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, N, (2, 120), generator=g)
    return build_partitions(ei, N, num_parts, method="random", seed=seed)


def _worker_peer_fails(rank, world_size, mode):
    start = time.monotonic()  # before the setup exchange, where the transfer timeouts start
    graph = SARGraph(_parts(world_size)[rank], timeout_s=TRANSFER_S)
    conv = convert_to_sar(SAGEConv(4, 4, aggr="max"))
    x = torch.randn(graph.num_local, 4, requires_grad=True)
    if rank == 1:
        if mode == "die":
            os._exit(7)  # a crashed worker: no cleanup, no message
        # A hung worker: alive, connections open, no progress. run_workers
        # kills it (SIGKILL works on stopped processes).
        os.kill(os.getpid(), signal.SIGSTOP)
    try:
        for _ in range(3):  # rank 0 and 2 must not hang on rank 1
            conv(x, graph).sum().backward()
    except SARCommError as e:
        return time.monotonic() - start, str(e)
    return time.monotonic() - start, None


def _survivors(res):
    assert not res[1].ok
    out = {}
    for r in res:
        if r.rank != 1:
            assert r.ok, r.error
            elapsed, msg = r.value
            assert msg is not None, f"rank {r.rank} finished despite rank 1"
            out[r.rank] = elapsed, msg
    return out


def test_dead_worker_ends_in_bounded_time():
    res = run_workers(
        _worker_peer_fails, 3, "die", timeout_s=60, wall_s=120, grace_s=60, raise_on_error=False, threads=1
    )
    assert res[1].exitcode == 7
    for rank, (elapsed, msg) in _survivors(res).items():
        # The connection closes at once: no need to wait for a timeout.
        assert elapsed < TRANSFER_S + SLACK_S, (elapsed, msg)
        assert "SAR max forward, ring step 1" in msg, msg
        # rank 0 sends to rank 1 at step 1, rank 2 receives from it.
        assert ("send to rank 1" if rank == 0 else "receive from rank 1") in msg, msg
        assert "closed the connection" in msg and "rank 1's log" in msg, msg


@pytest.mark.parametrize("world_size", [2, 3])
def test_hung_worker_times_out(world_size):
    # Rank 1 stays stopped until run_workers kills it, grace_s after the
    # first survivor returned (the survivors' timeouts start together, at the
    # end of the setup exchange, so they return together).
    res = run_workers(
        _worker_peer_fails,
        world_size,
        "hang",
        timeout_s=60,
        wall_s=120,
        grace_s=10,
        raise_on_error=False,
        threads=1,
    )
    assert "killed" in res[1].error
    for rank, (elapsed, msg) in _survivors(res).items():
        assert elapsed >= TRANSFER_S, (elapsed, msg)  # never before its time; no upper bound (load)
        assert f"[rank {rank}] SAR max forward, ring step 1" in msg, msg
        # Measured with gloo: a send to a stopped peer waits for its receive
        # and times out like the receive from it. At P = 2 rank 0 does both
        # with rank 1 (the receive is waited first); at P = 3 rank 0 only
        # sends to rank 1 and rank 2 only receives from it, and their other
        # work (with each other) completes.
        expect = {(2, 0): "receive from rank 1", (3, 0): "send to rank 1", (3, 2): "receive from rank 1"}[
            world_size, rank
        ]
        assert f"{expect} timed out after {TRANSFER_S:g} s" in msg, msg
        assert "rank 2" not in msg.replace(f"[rank {rank}]", ""), msg
        assert "check rank 1's log" in msg, msg
        assert "raise backend.timeout_s" in msg, msg


def _worker_never(rank, world_size):
    return "unreachable"


def test_peer_that_never_arrives():
    res = run_workers(
        _worker_never, 2, timeout_s=TRANSFER_S, wall_s=60, raise_on_error=False, start_ranks=[0], threads=1
    )
    r = res[0]
    assert not r.ok and "SARCommError" in r.error
    assert (
        "[rank 0] Could not join the process group of 2 workers" in r.error and "never arrived" in r.error
    ), r.error
    # From the end of its imports (the rendezvous starts right after): not given up before its time.
    joined = r.times["end"] - r.times["imported"]
    assert joined >= TRANSFER_S * 0.99, r.times  # the two stamps and the rendezvous clock may differ by ms


def _worker_mixed_parts(rank, world_size):
    # rank 1 loads a part of a different partitioning (another seed)
    part = _parts(world_size, seed=rank)[rank]
    SARGraph(part, timeout_s=10)
    return "built"


def test_mixed_partitions_are_rejected_on_every_worker():
    res = run_workers(_worker_mixed_parts, 2, timeout_s=60, wall_s=60, raise_on_error=False, threads=1)
    for r in res:
        assert not r.ok and "PartitionMismatchError" in r.error, r.error
