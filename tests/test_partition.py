"""Partitioning for SAR: contiguous relabelling, shards, files, mismatch
errors, and the partition command."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from revgnn.distributed.partition import (PartitionMismatchError,
                                          build_partitions, load_partition,
                                          partition_nodes, save_partitions)


def _graph(n=60, e=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (2, e), generator=g), n


@pytest.mark.parametrize('method', ['metis', 'random'])
@pytest.mark.parametrize('num_parts', [1, 2, 3, 4])
def test_parts_cover_graph_exactly(method, num_parts):
    ei, n = _graph()
    ea = torch.randn(ei.size(1), 3)
    x = torch.randn(n, 5)
    parts = build_partitions(ei, n, num_parts, method, edge_attr=ea,
                             node_data={'x': x})
    offsets = parts[0]['offsets']
    seen_nodes, seen_edges = [], []
    for p, part in enumerate(parts):
        lo, hi = int(offsets[p]), int(offsets[p + 1])
        assert part['node_ids'].numel() == hi - lo
        assert torch.equal(part['node_data']['x'], x[part['node_ids']])
        eids = part['edge_ids']
        seen_nodes.append(part['node_ids'])
        seen_edges.append(eids)
        # every local edge points into this part; sources sorted by shard
        new_id = torch.empty(n, dtype=torch.long)
        for q, pq in enumerate(parts):
            new_id[pq['node_ids']] = torch.arange(int(offsets[q]),
                                                  int(offsets[q + 1]))
        assert torch.equal(part['dst'] + lo, new_id[ei[1, eids]])
        assert torch.equal(part['src'], new_id[ei[0, eids]])
        assert torch.equal(part['edge_attr'], ea[eids])
        ptr = part['shard_ptr']
        for q in range(num_parts):
            src = part['src'][ptr[q]:ptr[q + 1]]
            assert bool(((src >= offsets[q]) & (src < offsets[q + 1])).all())
    assert torch.equal(torch.sort(torch.cat(seen_nodes))[0], torch.arange(n))
    assert torch.equal(torch.sort(torch.cat(seen_edges))[0],
                       torch.arange(ei.size(1)))


def test_metis_cuts_fewer_edges_than_random():
    # two dense communities joined by a few edges
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 50, (2, 400), generator=g)
    b = torch.randint(50, 100, (2, 400), generator=g)
    bridge = torch.tensor([[0, 60], [70, 10]])
    ei = torch.cat([a, b, bridge], 1)

    def cut(parts):
        return int((parts[ei[0]] != parts[ei[1]]).sum())

    metis = partition_nodes(ei, 100, 2, 'metis')
    rand = partition_nodes(ei, 100, 2, 'random')
    assert cut(metis) <= 2 < cut(rand)


def test_save_load_and_mismatch_errors(tmp_path):
    ei, n = _graph()
    parts = build_partitions(ei, n, 3, 'random')
    save_partitions(parts, str(tmp_path / 'p3'), {'dataset': {'task': 'x'}})
    meta = json.loads((tmp_path / 'p3' / 'meta.json').read_text())
    assert meta['num_parts'] == 3 and meta['dataset'] == {'task': 'x'}
    part = load_partition(str(tmp_path / 'p3'), 1, 3)
    assert torch.equal(part['src'], parts[1]['src'])
    with pytest.raises(PartitionMismatchError, match='holds 3 parts but the '
                       'job runs 4 workers'):
        load_partition(str(tmp_path / 'p3'), 1, 4)
    with pytest.raises(PartitionMismatchError, match='partition the graph'):
        load_partition(str(tmp_path / 'nothing'), 0, 3)
    # a part file from another partitioning dropped into the directory
    other = build_partitions(ei, n, 3, 'random', seed=5)
    torch.save(other[2], tmp_path / 'p3' / 'part_2.pt')
    with pytest.raises(PartitionMismatchError, match='does not belong'):
        load_partition(str(tmp_path / 'p3'), 2, 3)


def test_invalid_inputs():
    ei, n = _graph()
    with pytest.raises(ValueError, match='part id'):
        build_partitions(ei, n, 2, parts=torch.full((n, ), 2))
    with pytest.raises(ValueError, match='Unknown partition method'):
        partition_nodes(ei, n, 2, 'spectral')
    with pytest.raises(ValueError, match='num_nodes'):
        build_partitions(ei, 10, 2)


def test_partition_command(tmp_path):
    out = tmp_path / 'pl2'
    res = subprocess.run(
        [sys.executable, 'scripts/partition.py', '--data', 'proteins_like',
         '--num-nodes', '800', '--num-parts', '2', '--method', 'random',
         '--out', str(out)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary['parts'] == 2 and sum(summary['part_sizes']) == 800
    meta = json.loads((out / 'meta.json').read_text())
    assert meta['dataset']['evaluator'] == 'ogbn-proteins'
    part = load_partition(str(out), 0, 2)
    assert {'x', 'y', 'train_mask', 'valid_mask', 'test_mask'} <= set(
        part['node_data'])
