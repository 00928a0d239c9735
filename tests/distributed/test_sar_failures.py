"""SAR failure behaviour: dead, hung or missing peers and mismatched
partitions end every worker in bounded time with an error that names the
peer and the operation.

Times are measured inside the surviving workers, from just before the
operation that waits until its error: start-up (spawn, ``import torch``/PyG:
3 s idle, 10-20 s with both cores busy) has its own bound in
:func:`run_workers`. Only lower bounds are asserted (a timeout never fires
early); that a dead peer is not waited for and a stopped one is ended by its
peers is asserted on the error and on how the worker ended, not on a clock.
"""

from __future__ import annotations

import os
import re
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
from revgnn.distributed.partition import build_partitions
from revgnn.distributed.sar import SARGraph
from revgnn.testing.workers import run_workers

N = 30
TRANSFER_S = 3.0  # the SAR transfer timeout of the hung-peer tests (the process group itself gets 60 s)
# No test bounds a time from above: on a loaded machine a worker may get a fraction of a core. What the
# code guarantees is asserted instead: a timeout never fires before its time (the clock starts before
# the transfers do); a dead peer is reported as a closed connection even when the timeout is far longer
# than the test may take (run_workers' wall_s ends a test that would wait for it); a stopped peer is
# ended by the first survivor whose wait times out, not by run_workers' kill after grace_s.
DEAD_PEER_TIMEOUT_S = 600.0
GRACE_S = 60.0  # far longer than TRANSFER_S: rank 1 ended within it was ended by a survivor


def _parts(num_parts, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, N, (2, 120), generator=g)
    return build_partitions(ei, N, num_parts, method="random", seed=seed)


def _worker_peer_fails(rank, world_size, mode):
    start = time.monotonic()  # before the setup exchange, where the transfer timeouts start
    graph = SARGraph(_parts(world_size)[rank], timeout_s=DEAD_PEER_TIMEOUT_S if mode == "die" else TRANSFER_S)
    conv = convert_to_sar(SAGEConv(4, 4, aggr="max"))
    x = torch.randn(graph.num_local, 4, requires_grad=True)
    if rank == 1:
        if mode == "die":
            os._exit(7)  # a crashed worker: no cleanup, no message
        # A hung worker: alive, connections open, no progress. The first
        # survivor whose transfer times out ends it (SIGKILL works on
        # stopped processes).
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


def test_dead_worker_is_reported_without_waiting_for_the_timeout():
    res = run_workers(
        _worker_peer_fails, 3, "die", timeout_s=60, wall_s=120, grace_s=60, raise_on_error=False, threads=1
    )
    assert res[1].exitcode == 7
    for rank, (_, msg) in _survivors(res).items():
        # The connection closes at once: the 600 s timeout is not waited for (wall_s is 120 s).
        assert "timed out" not in msg, msg
        assert "SAR max forward, ring step 1" in msg and "closed the connection" in msg, msg
        # rank 2 receives from rank 1 at step 1. rank 0 sends to rank 1 and receives from rank 2: it
        # sees rank 1's connection close, or first rank 2's, which gave up on rank 1 and exited (its
        # data for rank 0 then never came). Either way rank 1 had ended before, and is named.
        first = "receive from rank 1" if rank == 2 else ("send to rank 1", "receive from rank 2")
        assert msg.split(": ", 2)[1].startswith(first), msg
        assert re.search(r"On this host rank 1 \(pid \d+\) has ended", msg), msg


@pytest.mark.parametrize("world_size", [2, 3])
def test_hung_worker_times_out_and_is_ended_by_its_peers(world_size):
    res = run_workers(
        _worker_peer_fails,
        world_size,
        "hang",
        timeout_s=60,
        wall_s=120,
        grace_s=GRACE_S,
        raise_on_error=False,
        threads=1,
    )
    # SIGKILLed by a survivor: run_workers saw it die, it did not kill it (its error would say "killed")
    assert res[1].exitcode == -signal.SIGKILL and "killed" not in res[1].error, res[1].error
    stopped = 0
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
        failed, _, peers = msg.partition(" On this host ")
        assert f"{expect} timed out after {TRANSFER_S:g} s" in failed, msg
        assert "rank 2" not in failed.replace(f"[rank {rank}]", ""), msg
        assert "check rank 1's log" in failed and "raise backend.timeout_s" in failed, msg
        # The first survivor to look finds rank 1 stopped and ends it. Another may find it stopped
        # too, ended, or still dying (then neither, and it names no state).
        assert not peers or re.match(r"rank 1 \(pid \d+\) (is stopped \(SIGSTOP or|has ended)", peers), msg
        stopped += "is stopped" in peers and "ended it with SIGKILL" in peers
    assert stopped >= 1


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
