"""SAR failure behaviour: dead, hung or missing peers and mismatched
partitions end every worker in bounded time with a clear error."""
from __future__ import annotations

import os
import time

import torch

from revgnn.distributed.launch import run_workers
from revgnn.distributed.partition import build_partitions

N = 30


def _parts(num_parts, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, N, (2, 120), generator=g)
    return build_partitions(ei, N, num_parts, method='random', seed=seed)


def _worker_peer_fails(rank, world_size, mode):
    from torch_geometric.nn import SAGEConv

    from revgnn.distributed.convs import convert_to_sar
    from revgnn.distributed.sar import SARGraph
    graph = SARGraph(_parts(world_size)[rank], timeout_s=3)
    conv = convert_to_sar(SAGEConv(4, 4, aggr='max'))
    x = torch.randn(graph.num_local, 4, requires_grad=True)
    if rank == 1:
        if mode == 'die':
            os._exit(7)  # a crashed worker: no cleanup, no message
        time.sleep(8)  # a hung worker (longer than the 3 s timeout)
    start = time.monotonic()
    for _ in range(3):  # rank 0 and 2 must not hang on rank 1
        conv(x, graph).sum().backward()
    return time.monotonic() - start


def _assert_clear_failure(results, elapsed, bound):
    assert elapsed < bound, f'took {elapsed:.1f} s'
    for r in results:
        if r.rank == 1:
            assert not r.ok
            continue
        assert not r.ok, f'rank {r.rank} finished despite a dead peer'
        assert 'SARCommError' in r.error, r.error
        assert 'peer worker died' in r.error


def test_dead_worker_ends_in_bounded_time():
    start = time.monotonic()
    res = run_workers(_worker_peer_fails, 3, 'die', timeout_s=3, wall_s=60,
                      raise_on_error=False, threads=1)
    _assert_clear_failure(res, time.monotonic() - start, 45)
    assert res[1].exitcode == 7


def test_hung_worker_times_out():
    start = time.monotonic()
    res = run_workers(_worker_peer_fails, 2, 'hang', timeout_s=3, wall_s=20,
                      raise_on_error=False, threads=1)
    # rank 1 sleeps past the wall bound and is killed; rank 0 gives up after
    # its 3 s transfer timeout with a clear error.
    _assert_clear_failure(res, time.monotonic() - start, 30)
    assert 'Timed out' in res[0].error or 'timeout' in res[0].error.lower()


def _worker_never(rank, world_size):
    return 'unreachable'


def test_peer_that_never_arrives():
    start = time.monotonic()
    res = run_workers(_worker_never, 2, timeout_s=3, wall_s=40,
                      raise_on_error=False, start_ranks=[0], threads=1)
    assert time.monotonic() - start < 35
    assert not res[0].ok and 'SARCommError' in res[0].error
    assert 'never arrived' in res[0].error


def _worker_mixed_parts(rank, world_size):
    from revgnn.distributed.sar import SARGraph
    # rank 1 loads a part of a different partitioning (another seed)
    part = _parts(world_size, seed=rank)[rank]
    SARGraph(part, timeout_s=10)
    return 'built'


def test_mixed_partitions_are_rejected_on_every_worker():
    res = run_workers(_worker_mixed_parts, 2, timeout_s=10, wall_s=60,
                      raise_on_error=False, threads=1)
    for r in res:
        assert not r.ok and 'PartitionMismatchError' in r.error, r.error
