#!/usr/bin/env python
"""Partition a data set for SAR: one file per worker plus meta.json.

    python scripts/partition.py --data proteins_like --num-parts 4 --out parts/pl4
    python scripts/partition.py --data ogbn-proteins --root data --num-parts 8 \\
        --method metis --out parts/proteins8

Then: torchrun --nproc_per_node=4 -m revgnn.distributed.run --partition-dir parts/pl4
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def load_dataset(name: str, root: str, num_nodes: int, seed: int):
    if name == 'proteins_like':
        from revgnn.data.synthetic import proteins_like
        kw = {'seed': seed}
        if num_nodes:
            kw['num_nodes'] = num_nodes
        return proteins_like(**kw)
    from revgnn.data.ogbn import load_ogbn
    return load_ogbn(name, root)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument('--data', default='proteins_like',
                   help='proteins_like, ogbn-proteins, ogbn-arxiv, ogbn-products')
    p.add_argument('--root', default='data', help='OGB data root')
    p.add_argument('--num-nodes', type=int, default=0,
                   help='proteins_like size (0: its default)')
    p.add_argument('--num-parts', type=int, required=True)
    p.add_argument('--method', default='metis', choices=['metis', 'random'])
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--out', required=True)
    args = p.parse_args(argv)

    import torch

    from revgnn.distributed.partition import build_partitions, save_partitions
    t = time.perf_counter()
    ds = load_dataset(args.data, args.root, args.num_nodes, args.seed)
    n = ds.num_nodes
    node_data = {'x': ds.x, 'y': ds.y}
    for split, idx in ds.split_idx.items():
        mask = torch.zeros(n, dtype=torch.bool)
        mask[idx] = True
        node_data[f'{split}_mask'] = mask
    parts = build_partitions(ds.edge_index, n, args.num_parts, args.method,
                             args.seed, edge_attr=ds.edge_attr,
                             node_data=node_data)
    info = dict(name=ds.name, task=ds.task, num_classes=ds.num_classes,
                evaluator=ds.evaluator,
                species_channels=ds.species_channels)
    save_partitions(parts, args.out, {'dataset': info, 'method': args.method})
    cut = sum(int(pt['src'].numel() - (pt['shard_ptr'][pt['rank'] + 1] -
                                      pt['shard_ptr'][pt['rank']]))
              for pt in parts)
    print(json.dumps({'out': args.out, 'nodes': n, 'edges': ds.num_edges,
                      'parts': args.num_parts, 'method': args.method,
                      'cut_edges': cut,
                      'part_sizes': [len(pt['node_ids']) for pt in parts],
                      'seconds': round(time.perf_counter() - t, 2)}))
    return 0


if __name__ == '__main__':
    sys.exit(main())
