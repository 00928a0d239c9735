r"""Graph partitioning for SAR (sequential aggregation and rematerialisation).

A graph with :math:`N` nodes is cut into :math:`P` parts. Nodes are relabelled
so that part :math:`p` owns the contiguous range
:math:`[\mathrm{offsets}_p, \mathrm{offsets}_{p+1})` of new ids. Worker
:math:`p` stores every edge :math:`j \to i` whose *target* :math:`i` it owns
(so all messages into its nodes are computed locally), split into :math:`P`
shards by the part that owns the *source* :math:`j`:

.. math::
    \mathcal{E}_p = \bigcup_{q=0}^{P-1} \mathcal{E}_{q \to p}, \qquad
    \mathcal{E}_{q \to p} = \{ (j, i) \in \mathcal{E} :
    \pi(j) = q,\ \pi(i) = p \}.

Edges are stored shard by shard (``shard_ptr``), each shard sorted by target
then source, together with the original edge ids and the sliced edge
attributes. Parts are written one file per worker (``part_{p}.pt``) plus a
``meta.json`` so a worker reads only its own share.

Example::

    parts = build_partitions(edge_index, num_nodes, num_parts=4,
                             edge_attr=edge_attr, node_data={'x': x, 'y': y})
    save_partitions(parts, 'out/parts4')
    part = load_partition('out/parts4', rank=1, world_size=4)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from typing import Dict, List, Optional

import torch
from torch import Tensor

__all__ = [
    'PartitionMismatchError', 'partition_nodes', 'build_partitions',
    'save_partitions', 'load_partition', 'partition_fingerprint', 'main'
]

FORMAT_VERSION = 1


class PartitionMismatchError(RuntimeError):
    """Partition files do not fit the running job (world size, rank, or a
    mix of files from different partitionings)."""


def _metis_parts(edge_index: Tensor, num_nodes: int, num_parts: int,
                 seed: int) -> Tensor:
    import pymetis

    row, col = edge_index
    keep = row != col
    row, col = row[keep], col[keep]
    # METIS wants a symmetric adjacency without duplicates or self loops.
    sym = torch.cat([torch.stack([row, col]), torch.stack([col, row])], 1)
    key = torch.unique(sym[0] * num_nodes + sym[1])
    src, dst = key // num_nodes, key % num_nodes
    xadj = torch.zeros(num_nodes + 1, dtype=torch.long)
    xadj[1:] = torch.cumsum(torch.bincount(src, minlength=num_nodes), 0)
    opts = pymetis.Options(seed=seed)
    if hasattr(pymetis, 'CSRAdjacency'):  # pymetis >= 2025.2
        adj = pymetis.CSRAdjacency(xadj.numpy(), dst.numpy())
        _, membership = pymetis.part_graph(num_parts, adj, options=opts)
    else:
        _, membership = pymetis.part_graph(num_parts, xadj=xadj.numpy(),
                                           adjncy=dst.numpy(), options=opts)
    return torch.as_tensor(membership, dtype=torch.long)


def partition_nodes(edge_index: Tensor, num_nodes: int, num_parts: int,
                    method: str = 'metis', seed: int = 0) -> Tensor:
    r"""Assigns every node to one of ``num_parts`` parts.

    Args:
        edge_index (torch.Tensor): ``[2, E]`` edges (source, target).
        num_nodes (int): number of nodes :math:`N`.
        num_parts (int): number of parts :math:`P`.
        method (str, optional): ``"metis"`` (minimise the edge cut with
            METIS via ``pymetis``) or ``"random"`` (uniform, balanced in
            expectation). (default: ``"metis"``)
        seed (int, optional): random seed. (default: ``0``)

    Returns:
        torch.Tensor: ``[N]`` part id of each node.
    """
    if num_parts < 1:
        raise ValueError(f'num_parts must be >= 1, got {num_parts}')
    if num_parts == 1:
        return torch.zeros(num_nodes, dtype=torch.long)
    if method == 'metis':
        return _metis_parts(edge_index, num_nodes, num_parts, seed)
    if method == 'random':
        gen = torch.Generator().manual_seed(seed)
        return torch.randint(0, num_parts, (num_nodes, ), generator=gen)
    raise ValueError(
        f"Unknown partition method '{method}' (use 'metis' or 'random')")


def partition_fingerprint(num_nodes: int, num_edges: int,
                          offsets: Tensor) -> str:
    """A short hash identifying one partitioning; all workers must agree."""
    h = hashlib.sha1()
    h.update(f'{FORMAT_VERSION}:{num_nodes}:{num_edges}:'.encode())
    h.update(','.join(map(str, offsets.tolist())).encode())
    return h.hexdigest()[:16]


def build_partitions(edge_index: Tensor, num_nodes: int, num_parts: int,
                     method: str = 'metis', seed: int = 0,
                     parts: Optional[Tensor] = None,
                     edge_attr: Optional[Tensor] = None,
                     node_data: Optional[Dict[str, Tensor]] = None,
                     ) -> List[dict]:
    r"""Partitions a graph and builds one self-contained dict per worker.

    Args:
        edge_index (torch.Tensor): ``[2, E]`` edges :math:`j \to i` in PyG's
            (source, target) convention.
        num_nodes (int): number of nodes.
        num_parts (int): number of workers :math:`P`.
        method (str, optional): see :func:`partition_nodes`.
            (default: ``"metis"``)
        seed (int, optional): random seed. (default: ``0``)
        parts (torch.Tensor, optional): a precomputed ``[N]`` assignment;
            overrides ``method``. Parts may be empty. (default: ``None``)
        edge_attr (torch.Tensor, optional): ``[E, ...]`` edge attributes,
            sliced into the shards. (default: ``None``)
        node_data (dict, optional): ``[N, ...]`` node tensors (features,
            labels, masks) sliced to each part. (default: ``None``)

    Returns:
        list of dict: entry ``p`` holds ``rank``, ``num_parts``, ``num_nodes``,
        ``offsets`` (``[P+1]``), ``node_ids`` (original ids of the local nodes
        in new order), ``src`` (new global id of each local edge's source),
        ``dst`` (local id of its target), ``shard_ptr`` (``[P+1]``),
        ``edge_ids`` (original edge ids), ``edge_attr``, ``node_data`` and
        ``fingerprint``.
    """
    edge_index = edge_index.long()
    E = edge_index.size(1)
    if edge_index.numel() and int(edge_index.max()) >= num_nodes:
        raise ValueError('edge_index refers to a node id >= num_nodes')
    method_used = method if parts is None else 'given'
    if parts is None:
        parts = partition_nodes(edge_index, num_nodes, num_parts, method,
                                seed)
    parts = parts.long()
    if parts.numel() != num_nodes or (num_nodes and (
            int(parts.min()) < 0 or int(parts.max()) >= num_parts)):
        raise ValueError('parts must hold a part id in [0, num_parts) '
                         'for every node')
    if edge_attr is not None and edge_attr.size(0) != E:
        raise ValueError('edge_attr must have one row per edge')

    # New ids: ordered by (part, original id) -> contiguous ranges.
    order = torch.argsort(parts * num_nodes + torch.arange(num_nodes))
    new_id = torch.empty(num_nodes, dtype=torch.long)
    new_id[order] = torch.arange(num_nodes)
    counts = torch.bincount(parts, minlength=num_parts)
    offsets = torch.zeros(num_parts + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(counts, 0)
    fingerprint = partition_fingerprint(num_nodes, E, offsets)

    src_new, dst_new = new_id[edge_index[0]], new_id[edge_index[1]]
    src_part, dst_part = parts[edge_index[0]], parts[edge_index[1]]

    out = []
    for p in range(num_parts):
        lo, hi = int(offsets[p]), int(offsets[p + 1])
        eids = (dst_part == p).nonzero().view(-1)
        # Sort by (source part, target, source): shard-major, CSR-friendly.
        key = ((src_part[eids] * (num_nodes + 1) + (dst_new[eids] - lo)) *
               (num_nodes + 1) + src_new[eids])
        eids = eids[torch.argsort(key)]
        shard_ptr = torch.zeros(num_parts + 1, dtype=torch.long)
        shard_ptr[1:] = torch.cumsum(
            torch.bincount(src_part[eids], minlength=num_parts), 0)
        local_nodes = order[lo:hi]
        part = {
            'format_version': FORMAT_VERSION,
            'rank': p,
            'num_parts': num_parts,
            'num_nodes': num_nodes,
            'num_edges': E,
            'method': method_used,
            'offsets': offsets.clone(),
            'node_ids': local_nodes,
            'src': src_new[eids],
            'dst': dst_new[eids] - lo,
            'shard_ptr': shard_ptr,
            'edge_ids': eids,
            'edge_attr': None if edge_attr is None else edge_attr[eids],
            'node_data': {k: v[local_nodes]
                          for k, v in (node_data or {}).items()},
            'fingerprint': fingerprint,
        }
        out.append(part)
    return out


def save_partitions(parts: List[dict], root: str,
                    extra_meta: Optional[dict] = None) -> None:
    """Writes ``part_{p}.pt`` for every worker and ``meta.json`` (with
    ``extra_meta`` merged in, e.g. the dataset's task and evaluator)."""
    os.makedirs(root, exist_ok=True)
    for part in parts:
        torch.save(part, os.path.join(root, f"part_{part['rank']}.pt"))
    first = parts[0]
    meta = {
        'format_version': FORMAT_VERSION,
        'num_parts': first['num_parts'],
        'num_nodes': first['num_nodes'],
        'num_edges': first['num_edges'],
        'fingerprint': first['fingerprint'],
        'part_sizes': (first['offsets'][1:] - first['offsets'][:-1]).tolist(),
        'edges_per_part': [int(p['src'].numel()) for p in parts],
        'node_data': sorted(first['node_data']),
        'edge_attr': first['edge_attr'] is not None,
        **(extra_meta or {}),
    }
    with open(os.path.join(root, 'meta.json'), 'w') as f:
        json.dump(meta, f, indent=2)


def load_partition(root: str, rank: int, world_size: int) -> dict:
    """Loads worker ``rank``'s part and checks it fits a job of
    ``world_size`` workers; raises :class:`PartitionMismatchError` if not.

    Cross-worker consistency (every worker read the same partitioning) is
    checked again collectively when the :class:`~revgnn.distributed.sar.SARGraph`
    is built.
    """
    meta_path = os.path.join(root, 'meta.json')
    if not os.path.exists(meta_path):
        raise PartitionMismatchError(
            f'{meta_path} not found: partition the graph first '
            f'(scripts/partition.py --num-parts {world_size} ...)')
    with open(meta_path) as f:
        meta = json.load(f)
    if meta['num_parts'] != world_size:
        raise PartitionMismatchError(
            f"{root} holds {meta['num_parts']} parts but the job runs "
            f'{world_size} workers; re-partition with --num-parts '
            f'{world_size} or launch {meta["num_parts"]} workers')
    path = os.path.join(root, f'part_{rank}.pt')
    if not os.path.exists(path):
        raise PartitionMismatchError(f'{path} is missing')
    part = torch.load(path, weights_only=False)
    if part.get('format_version') != FORMAT_VERSION:
        raise PartitionMismatchError(
            f'{path} has format {part.get("format_version")}, expected '
            f'{FORMAT_VERSION}; re-partition')
    if part['rank'] != rank or part['num_parts'] != world_size:
        raise PartitionMismatchError(
            f"{path} is part {part['rank']} of {part['num_parts']}, but "
            f'this worker is rank {rank} of {world_size}')
    if part['fingerprint'] != meta['fingerprint']:
        raise PartitionMismatchError(
            f'{path} (fingerprint {part["fingerprint"]}) does not belong '
            f"to the partitioning in {meta_path} ({meta['fingerprint']})")
    return part


_CLI_DOC = """Partition a data set for SAR: one file per worker plus meta.json.

    revgnn-partition --data proteins_like --num-parts 4 --out parts/pl4
    revgnn-partition --data ogbn-proteins --root data --num-parts 8 \\
        --method metis --out parts/proteins8

Then: torchrun --nproc_per_node=4 -m revgnn.distributed.run --partition-dir parts/pl4
"""


def _load_dataset(name: str, root: str, num_nodes: int, seed: int):
    if name == 'proteins_like':
        from revgnn.data.synthetic import proteins_like
        kw = {'seed': seed}
        if num_nodes:
            kw['num_nodes'] = num_nodes
        return proteins_like(**kw)
    from revgnn.data.ogbn import load_ogbn
    return load_ogbn(name, root)


def main(argv=None) -> int:
    """``revgnn-partition``: partition a data set, one file per worker."""
    p = argparse.ArgumentParser(description=_CLI_DOC,
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

    t = time.perf_counter()
    ds = _load_dataset(args.data, args.root, args.num_nodes, args.seed)
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
