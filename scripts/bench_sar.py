#!/usr/bin/env python
"""Per-worker peak memory and epoch time of SAR vs naive domain-parallel.

For P in {1, 2, 4} workers (spawned on this host, gloo) it trains a
reversible RevGNN (GENConv max, default 64 layers x 64 channels, 2 groups)
full-graph on a generated random graph, partitioned at random (the worst
case for communication), with

* ``sar``: sequential aggregation and rematerialisation
  (:mod:`revgnn.distributed.sar`): one remote block (+1 prefetched) alive at
  a time, re-fetched in backward;
* ``naive``: domain-parallel baseline that fetches *every* remote feature a
  layer needs at once (a halo), concatenates it to the local rows and runs
  the stock PyG conv on all local edges with autograd.

Memory is each worker's peak RSS (``ru_maxrss``) and the peak *above its
idle baseline* (the process after importing torch/PyG and loading its
part), which is what the graph and the model cost. Workers run with
tcmalloc when Debian's ``libtcmalloc-minimal4`` is installed (glibc malloc
fragments and inflates RSS with depth). Output: a table on stdout, a JSON
file and a PNG plot.

    python scripts/bench_sar.py                       # defaults below
    python scripts/bench_sar.py --nodes 20000 --degree 20 --layers 64 \\
        --parts 1 2 4 --out bench_out
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))

TCMALLOC = '/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4'


# ------------------------------------------------------------ naive baseline
class _Halo(torch.autograd.Function):
    """Fetches every remote row the local edges need, all at once, and
    returns ``[x_local; halo]``; backward sends the halo gradients home."""

    @staticmethod
    def forward(ctx, graph, x):
        blocks = [b for _, b in graph.ring(x, 'naive halo')]
        ctx.graph = graph
        ctx.sizes = [b.size(0) for b in blocks]
        return torch.cat(blocks)

    @staticmethod
    def backward(ctx, g):
        graph = ctx.graph
        parts = list(g.split(ctx.sizes))
        grad_x = parts[0].clone()
        tag = graph._next_tag()
        for k in range(1, graph.world_size):
            q = (graph.rank - k) % graph.world_size
            graph.return_grads(q, parts[k].contiguous(), grad_x, tag,
                               'naive halo backward')
        return None, grad_x


class NaiveGraph:
    """Wraps a SARGraph: the local edges re-indexed into ``[x_local; halo]``
    (halo blocks in ring order)."""

    def __init__(self, graph):
        self.graph = graph
        P, r = graph.world_size, graph.rank
        src = graph.src.clone()
        base = graph.num_local
        for k in range(1, P):
            q = (r - k) % P
            a, b = graph.shard(q)
            src[a:b] += base
            base += graph.num_needed[q]
        self.edge_index = torch.stack([src, graph.dst])


def _naive_gen_conv_class():
    from torch_geometric.nn import GENConv

    class NaiveGENConv(GENConv):
        def forward(self, x, edge_index, edge_attr=None, size=None):
            if not isinstance(edge_index, NaiveGraph):
                return super().forward(x, edge_index, edge_attr, size)
            xh = _Halo.apply(edge_index.graph, x)
            return super().forward((xh, x), edge_index.edge_index, edge_attr,
                                   (xh.size(0), x.size(0)))

    return NaiveGENConv


# ---------------------------------------------------------------- one worker
def _rss_peak_mb() -> float:
    from revgnn.utils.memory import peak_rss_bytes
    return peak_rss_bytes() / 2**20


def _worker(rank, world_size, mode, part_dir, cfg):
    import torch.distributed as dist
    from torch_geometric.nn import GENConv

    from revgnn.distributed.convs import convert_to_sar
    from revgnn.distributed.partition import load_partition
    from revgnn.distributed.run import SARJob, train_step
    from revgnn.distributed.sar import SARGraph
    from revgnn.models.revgnn import RevGNN

    part = load_partition(part_dir, rank, world_size)
    graph = SARGraph(part, timeout_s=600)
    nd = part['node_data']
    torch.manual_seed(0)
    model = RevGNN(nd['x'].size(1), cfg['hidden'], nd['y'].size(1),
                   num_layers=cfg['layers'], num_groups=2, conv='gen',
                   aggr='max')
    if mode == 'sar':
        convert_to_sar(model)
        edge_index = graph
    else:
        naive_cls = _naive_gen_conv_class()
        for m in model.modules():
            if type(m) is GENConv:
                m.__class__ = naive_cls
        edge_index = NaiveGraph(graph)
    job = SARJob(graph, nd['x'], nd['y'], None,
                 {'train': torch.ones(graph.num_local, dtype=torch.bool)})

    class _Wrap(torch.nn.Module):
        """RevGNN.forward with the SAR or naive graph object in place of
        ``edge_index`` (RevGNN.forward itself sorts tensor edge indices and
        does not accept graph objects)."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x, _graph, edge_attr):
            from revgnn.nn import Shared
            m = self.model
            h = m.node_encoder(x)
            mask = m.dropout(h)
            for block in m.layers:
                h = block(h, edge_index, Shared(None), mask)
            return m.head(h)

    net = _Wrap()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    dist.barrier()
    base = _rss_peak_mb()
    times = []
    for _ in range(cfg['epochs']):
        dist.barrier()
        t = time.perf_counter()
        train_step(net, opt, job)
        dist.barrier()
        times.append(time.perf_counter() - t)
    peak = _rss_peak_mb()
    return dict(rank=rank, peak_rss_mb=peak, base_rss_mb=base,
                peak_above_base_mb=peak - base, epoch_s=min(times),
                local_nodes=graph.num_local, local_edges=graph.num_edges,
                halo_rows=sum(graph.num_needed))


def replot(json_path: str) -> None:
    """Redraws the PNG next to a bench_sar.json."""
    with open(json_path) as f:
        summary = json.load(f)
    _plot(summary['rows'], argparse.Namespace(**summary['args']),
          json_path.replace('.json', '.png'))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument('--nodes', type=int, default=12000)
    p.add_argument('--degree', type=int, default=20,
                   help='average in-degree of the random graph')
    p.add_argument('--features', type=int, default=16)
    p.add_argument('--hidden', type=int, default=64)
    p.add_argument('--layers', type=int, default=64)
    p.add_argument('--epochs', type=int, default=2,
                   help='epochs per run; the fastest is reported')
    p.add_argument('--parts', type=int, nargs='+', default=[1, 2, 4])
    p.add_argument('--modes', nargs='+', default=['sar', 'naive'])
    p.add_argument('--threads', type=int, default=0,
                   help='intra-op threads per worker (0: cores / P)')
    p.add_argument('--out', default='bench_out/sar')
    args = p.parse_args(argv)

    from revgnn.distributed.launch import run_workers
    from revgnn.distributed.partition import build_partitions, save_partitions

    if os.path.exists(TCMALLOC) and 'tcmalloc' not in os.environ.get(
            'LD_PRELOAD', ''):
        os.environ['LD_PRELOAD'] = TCMALLOC  # inherited by spawned workers
    os.makedirs(args.out, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    N, E = args.nodes, args.nodes * args.degree
    ei = torch.randint(0, N, (2, E), generator=g)
    x = torch.randn(N, args.features, generator=g)
    y = (torch.randn(N, 8, generator=g) > 0).float()
    cfg = dict(hidden=args.hidden, layers=args.layers, epochs=args.epochs)
    rows = []
    print(f'graph: {N} nodes, {E} edges, random partition; RevGNN '
          f'{args.layers} layers x {args.hidden}, GENConv max, 2 groups',
          flush=True)
    print(f"{'mode':6} {'P':>2} {'epoch s':>8} {'peak RSS MB':>12} "
          f"{'above idle MB':>14} {'local edges':>12}", flush=True)
    for P in args.parts:
        part_dir = os.path.join(args.out, f'parts{P}')
        save_partitions(build_partitions(ei, N, P, 'random', node_data={
            'x': x, 'y': y}), part_dir)
        for mode in args.modes:
            res = run_workers(_worker, P, mode, part_dir, cfg,
                              timeout_s=1200, wall_s=3600,
                              threads=args.threads or None)
            vals = [r.value for r in res]
            row = dict(mode=mode, P=P,
                       epoch_s=max(v['epoch_s'] for v in vals),
                       peak_rss_mb=max(v['peak_rss_mb'] for v in vals),
                       peak_above_base_mb=max(v['peak_above_base_mb']
                                              for v in vals),
                       workers=vals)
            rows.append(row)
            print(f"{mode:6} {P:>2} {row['epoch_s']:8.2f} "
                  f"{row['peak_rss_mb']:12.0f} "
                  f"{row['peak_above_base_mb']:14.0f} "
                  f"{max(v['local_edges'] for v in vals):12d}", flush=True)
    summary = {'args': vars(args), 'rows': rows}
    for mode in args.modes:
        by_p = {r['P']: r for r in rows if r['mode'] == mode}
        if 1 in by_p and 4 in by_p:
            ratio = (by_p[4]['peak_above_base_mb'] /
                     by_p[1]['peak_above_base_mb'])
            ratio_rss = by_p[4]['peak_rss_mb'] / by_p[1]['peak_rss_mb']
            summary[f'{mode}_p4_over_p1'] = dict(above_idle=ratio,
                                                 rss=ratio_rss)
            print(f'{mode}: per-worker peak P=4 / P=1 = {ratio:.3f} above '
                  f'idle ({ratio_rss:.3f} in total RSS)', flush=True)
    with open(os.path.join(args.out, 'bench_sar.json'), 'w') as f:
        json.dump(summary, f, indent=2)
    _plot(rows, args, os.path.join(args.out, 'bench_sar.png'))
    print('(epoch times: all workers share this host\'s cores, so they '
          'measure overhead, not multi-machine speed-up)')
    print(f"wrote {args.out}/bench_sar.json and bench_sar.png")
    return 0


def _plot(rows, args, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for mode, style, color in (('sar', 'o-', 'tab:blue'),
                               ('naive', 's--', 'tab:orange')):
        rs = sorted((r for r in rows if r['mode'] == mode),
                    key=lambda r: r['P'])
        if not rs:
            continue
        ps = [r['P'] for r in rs]
        ax[0].plot(ps, [r['peak_above_base_mb'] for r in rs], style,
                   color=color, label=f'{mode} (above idle)')
        ax[0].plot(ps, [r['peak_rss_mb'] for r in rs], style, alpha=0.35,
                   color=color, label=f'{mode} (total RSS)')
        ax[1].plot(ps, [r['epoch_s'] for r in rs], style, color=color,
                   label=mode)
    ax[0].set(xlabel='workers P', ylabel='per-worker peak memory (MB)',
              title=f'RevGNN {args.layers}x{args.hidden}, '
              f'{args.nodes * args.degree} edges', xticks=args.parts)
    ax[1].set(xlabel='workers P', ylabel='epoch time (s)',
              title='epoch time (workers share this host)',
              xticks=args.parts)
    for a in ax:
        a.grid(alpha=0.3)
        a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == '__main__':
    sys.exit(main())
