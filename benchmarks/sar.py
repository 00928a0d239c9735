#!/usr/bin/env python
"""SAR vs naive domain-parallel vs one process, and DDP throughput, in one run.

Every mode trains the same reversible RevGNN (2 groups, no edge features;
``--conv``, a recipe of ``benchmarks.scale.RECIPES``: ``gen_max`` by default,
``gen_mean``, ``gen_softmax``, ``sage``, ``gcn``, ``gin``, ``gat``, each
through its SAR form) with the training loop's own step,
``revgnn.engine.loop.train_step`` (Adam over the flat parameter buffer), on
one generated random graph (uniform random edges, ``--degree`` in-edges per
node on average, 80 % of the nodes labelled for training, ``--classes``
binary tasks):

* ``single``: one process, no process group: the plain PyG path of RevGNN
  on the full graph (destination-sorted ``EdgeIndex``, the conv's fused
  kernel), ``LocalBackend``;
* ``sar`` at P = ``--parts`` workers: sequential aggregation and
  rematerialisation (``convert_to_sar``, the ``SARGraph`` passed as the
  edge index, a ``SARTask`` per worker, ``DDPBackend``): one remote block
  (+1 prefetched) alive at a time, re-fetched in backward;
* ``naive`` at the same P: domain-parallel baseline that fetches *every*
  remote row a layer needs at once (a halo), concatenates it to the local
  rows and runs the stock PyG GENConv on all local edges with autograd
  (GEN recipes only);
* ``ddp`` at ``--ddp-workers`` workers: the loop's data-parallel path
  (``NodeTask`` over the whole graph on every worker, a new random partition
  into ``--ddp-parts`` parts per epoch, ``parts_per_step`` = workers, one
  part per worker per step); reported as parts (sub-graph steps) per second.

The graph is generated, written (``graph.pt``) and partitioned
(``revgnn-partition``'s :func:`~revgnn.distributed.partition.partition_dataset`,
part files in ``--out``) in a child process of its own, so that the parent,
which only starts the runs, never holds the graph: as in a user's run, every
worker loads its part file and nothing else. The partition is random for
sar / naive (``--method``; random is the worst case for communication).
Workers are spawned on this host with
``revgnn.testing.workers.run_workers`` (gloo), ``cores / workers``
intra-op threads each, with tcmalloc preloaded when Debian's
``libtcmalloc-minimal4`` is installed (glibc malloc fragments and inflates
RSS with depth). Memory is each worker's peak RSS
(:func:`~revgnn.utils.memory.peak_rss_bytes`: its own ``VmHWM``; a spawned
process's ``ru_maxrss`` would start at its parent's peak) and the
peak *above its idle baseline* (after importing torch/PyG and loading its
data and the model), which is what the graph and the training cost; epoch
times are the fastest of ``--epochs`` epochs, the slowest worker's.

ALL WORKERS SHARE THIS HOST'S CORES: the epoch times of P > 1 measure SAR's
(or DDP's) overhead, not a multi-machine speed-up. The issue's goals refer to

* SAR epoch time at P = 1 <= 1.2x the one-process (``single``) epoch time;
* SAR per-worker peak memory above idle at P = 4 <= 0.35x that at P = 1;
* at ogbn-products' size (``--nodes 2449029 --degree 50 --features 100
  --classes 47 --hidden 160``), each of 4 SAR workers' peak RSS <= 0.35x one
  process's (``single``): the ``sar P=4 / single`` ratio.

Defaults (100,000 nodes, 2,000,000 edges, RevGNN 16 layers x 64 channels,
112 tasks, 2 epochs, DDP over 10 parts) are sized for roughly 10 minutes on
2 otherwise idle cores (estimated from docs/bench/{step,layers}.md, most of
it the naive baseline's stock PyG GENConv and the 9 worker start-ups); the
memory figures and the ratios do not depend on the depth (reversible
blocks), so ``--layers`` only scales the time. On busy cores the runs with
fewer workers (more threads each) suffer most, which skews every ratio.
Output: a table (P: workers; last column: local edges of the largest part,
or DDP parts per second) and the ratios on stdout, ``bench_sar.json`` and
``bench_sar.png`` in ``--out``.

    python -m benchmarks.sar                           # full measurement
    python -m benchmarks.sar --quick                   # tiny smoke run
    python -m benchmarks.sar --modes single sar --parts 1 4 --layers 32
    python -m benchmarks.sar --modes single sar --parts 4 --conv sage
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from types import SimpleNamespace

import torch

from benchmarks.scale import RECIPES
from revgnn.engine.tasks import NodeLevelTask

TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
SHARED_CORES = (
    "all workers share this host's cores: epoch times of P > 1 measure overhead, not multi-machine speed-up"
)
QUICK = dict(nodes=3000, degree=10, layers=4, hidden=32, classes=8, epochs=2, ddp_parts=4)


# ------------------------------------------------------------ naive baseline
class _Halo(torch.autograd.Function):
    """Fetches every remote row the local edges need, all at once, and
    returns ``[x_local; halo]``; backward sends the halo gradients home."""

    @staticmethod
    def forward(ctx, graph, x):
        blocks = [b for _, b in graph.ring(x, "naive halo")]
        ctx.graph = graph
        ctx.sizes = [b.size(0) for b in blocks]
        return torch.cat(blocks)

    @staticmethod
    def backward(ctx, g):
        graph = ctx.graph
        parts = list(g.split(ctx.sizes))
        grad_x = parts[0].clone()
        tag = graph.next_tag()
        for k in range(1, graph.world_size):
            q = (graph.rank - k) % graph.world_size
            graph.return_grads(q, parts[k].contiguous(), grad_x, tag, "naive halo backward")
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
            return super().forward((xh, x), edge_index.edge_index, edge_attr, (xh.size(0), x.size(0)))

    return NaiveGENConv


# ---------------------------------------------------------------- data, task
def make_dataset(args):
    """The random graph as a NodeDataset (edges sorted by destination)."""
    from revgnn.data.node_dataset import NodeDataset

    g = torch.Generator().manual_seed(0)
    N = args.nodes
    ei = torch.randint(0, N, (2, N * args.degree), generator=g)
    perm = torch.randperm(N, generator=g)
    n_train, n_valid = int(0.8 * N), int(0.1 * N)
    return NodeDataset(
        name=f"random-{N}",
        x=torch.randn(N, args.features, generator=g),
        edge_index=ei,
        edge_attr=None,
        y=(torch.randn(N, args.classes, generator=g) > 0).float(),
        split_idx={
            "train": perm[:n_train],
            "valid": perm[n_train : n_train + n_valid],
            "test": perm[n_train + n_valid :],
        },
        task="multilabel",
        num_classes=args.classes,
        evaluator="ogbn-proteins",
    ).sorted_by_destination()


_SAVED = ("name", "x", "edge_index", "edge_attr", "y", "split_idx", "task", "num_classes", "evaluator")


def prepare(args, data_path, part_dirs):
    """Generates the graph, writes it to ``data_path`` (``single`` and ``ddp`` load it) and
    partitions it into every ``{P: directory}`` of ``part_dirs`` (``sar`` and ``naive`` load one
    part each); returns ``(nodes, edges)``. Run in a child process of its own (:func:`_in_child`),
    so that the parent never holds the graph."""
    from revgnn.distributed.partition import partition_dataset

    ds = make_dataset(args)
    torch.save({k: getattr(ds, k) for k in _SAVED}, data_path)
    for P, part_dir in part_dirs.items():
        partition_dataset(ds, part_dir, P, args.method)
    return ds.num_nodes, ds.num_edges


def _in_child(fn, *args):
    """``fn(*args)`` in one fresh spawned process: its memory (and peak RSS) is its own."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
        return ex.submit(fn, *args).result()


def _load_dataset(path):
    from revgnn.data.node_dataset import NodeDataset

    return NodeDataset(**torch.load(path, weights_only=True))


class FullGraphTask(NodeLevelTask):
    """The whole graph as one step per epoch, with ``SARTask``'s loss (:class:`NodeLevelTask`'s):
    what SAR at P = 1 computes, without SARGraph."""

    def __init__(self, ds):
        from revgnn.engine.inference import Scorer, as_edge_index
        from revgnn.engine.tasks import labelled_entries, shapes

        super().__init__(ds.name, ds.task, Scorer.for_dataset(ds), shapes(ds))
        self.x, self.y = ds.x, ds.y
        self.mask = torch.zeros(ds.num_nodes, dtype=torch.bool)
        self.mask[ds.split_idx["train"]] = True
        self.edge_index = as_edge_index(ds.edge_index, ds.num_nodes)
        self.count = int(labelled_entries(self.y[self.mask]).sum())

    def train_steps(self, generator, device, start=0):
        from revgnn.engine.tasks import Batch, Step

        batch = Batch((self.x, self.edge_index, None), self.mask, self.y[self.mask], self.count)
        yield Step(0, iter([batch]), self.count)


# ------------------------------------------------------------------- workers
def _rss_peak_mb() -> float:
    from revgnn.utils.memory import peak_rss_bytes

    return peak_rss_bytes() / 2**20


def _model(shapes, cfg):
    from revgnn.models.revgnn import RevGNN

    conv, options = RECIPES[cfg["conv"]]
    torch.manual_seed(0)  # the same initial parameters on every worker
    return RevGNN(
        hidden_channels=cfg["hidden"],
        num_layers=cfg["layers"],
        num_groups=2,
        conv=conv,
        **options,
        **shapes,
    )


def _epochs(model, task, backend, cfg, barrier=None):
    """``cfg['epochs']`` epochs of the loop's ``train_step``; returns
    (idle peak RSS, peak RSS, fastest epoch s)."""
    from revgnn.engine.loop import train_step
    from revgnn.engine.run import Run
    from revgnn.engine.seeds import Stream, seed_stream
    from revgnn.utils.optimizer import ModelOptimizer

    run = Run(model, task, ModelOptimizer(model, lambda ps: torch.optim.Adam(ps, lr=1e-3)), backend)
    sync = barrier or (lambda: None)
    sync()
    base, times = _rss_peak_mb(), []
    for epoch in range(1, cfg["epochs"] + 1):
        gen = torch.Generator().manual_seed(seed_stream(0, epoch, Stream.TRAIN_BATCHES))
        sync()
        t = time.perf_counter()
        for step in task.train_steps(gen, "cpu"):
            train_step(run, step)
        sync()
        times.append(time.perf_counter() - t)
    return base, _rss_peak_mb(), min(times)


def _worker_row(rank, base, peak, epoch_s, **extra):
    """One worker's figures: its idle and peak RSS, the growth between them and its fastest epoch."""
    return dict(
        rank=rank,
        base_rss_mb=base,
        peak_rss_mb=peak,
        peak_above_base_mb=peak - base,
        epoch_s=epoch_s,
        **extra,
    )


def _single_worker(data_path, cfg, threads):
    from revgnn.engine.backends import LocalBackend

    torch.set_num_threads(threads)
    task = FullGraphTask(_load_dataset(data_path))
    figures = _epochs(_model(task.shapes, cfg), task, LocalBackend(None), cfg)
    return _worker_row(
        0,
        *figures,
        local_nodes=task.x.size(0),
        local_edges=task.edge_index.size(1),
        halo_rows=0,
    )


def _sar_worker(rank, world_size, mode, part_dir, cfg):
    import torch.distributed as dist
    from torch_geometric.nn import GENConv

    from revgnn.distributed.convs import convert_to_sar
    from revgnn.distributed.part_files import load_meta, load_partition
    from revgnn.distributed.sar import SARGraph
    from revgnn.engine.backends import DDPBackend
    from revgnn.engine.sar_backend import SARTask

    graph = SARGraph(load_partition(part_dir, rank, world_size), timeout_s=600)
    backend = DDPBackend(None)  # all_reduce / reduce_gradients over the group
    task = SARTask(graph, load_meta(part_dir), backend, "cpu")
    model = _model(task.shapes, cfg)
    if mode == "sar":
        convert_to_sar(model)  # RevGNN.forward takes the SARGraph as it is
    else:
        naive_cls = _naive_gen_conv_class()
        for m in model.modules():
            if type(m) is GENConv:
                m.__class__ = naive_cls
        task.graph = NaiveGraph(graph)  # the step's edge_index input
    figures = _epochs(model, task, backend, cfg, dist.barrier)
    return _worker_row(
        rank,
        *figures,
        local_nodes=graph.num_local,
        local_edges=graph.num_edges,
        halo_rows=sum(graph.num_needed),
    )


def _ddp_worker(rank, world_size, data_path, cfg):
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from revgnn.distributed.comm import broadcast_parameters
    from revgnn.engine.backends import DDPBackend
    from revgnn.engine.tasks import NodeTask

    tc = OmegaConf.create(
        dict(train_parts=cfg["ddp_parts"], parts_per_step=world_size, eval_views=1, eval_parts=1)
    )
    backend = DDPBackend(None)  # all_reduce / reduce_gradients over the group
    backend.rank, backend.world_size = rank, world_size
    task = NodeTask(_load_dataset(data_path), tc, backend)
    model = _model(task.shapes, cfg)
    broadcast_parameters(model)
    base, peak, epoch_s = _epochs(model, task, backend, cfg, dist.barrier)
    return _worker_row(rank, base, peak, epoch_s, parts_per_s=cfg["ddp_parts"] / epoch_s)


# ---------------------------------------------------------------------- main
def _row(mode, P, results):
    """One table row: the slowest epoch and the largest peaks of the workers."""
    bad = [(r.rank, r.exitcode) for r in results if r.exitcode]
    if bad:  # results came back; a worker then failed to exit cleanly
        print(f"warning: {mode} P={P}: (rank, exit code) {bad}", flush=True)
    vals = [r.value for r in results]
    row = dict(
        mode=mode,
        P=P,
        epoch_s=max(v["epoch_s"] for v in vals),
        peak_rss_mb=max(v["peak_rss_mb"] for v in vals),
        peak_above_base_mb=max(v["peak_above_base_mb"] for v in vals),
        workers=vals,
    )
    if mode == "ddp":
        row["parts_per_s"] = min(v["parts_per_s"] for v in vals)
    else:
        row["local_edges"] = max(v["local_edges"] for v in vals)
    return row


def _print_row(r):
    extra = f"{r['parts_per_s']:>9.2f} parts/s" if r["mode"] == "ddp" else f"{r['local_edges']:>9d} edges"
    print(
        f"{r['mode']:6} {r['P']:>2} {r['epoch_s']:8.2f} "
        f"{r['peak_rss_mb']:9.0f} {r['peak_above_base_mb']:11.0f}  {extra}",
        flush=True,
    )


def ratios(rows):
    """The issue's figures (and the naive baseline's side by side)."""
    at = {(r["mode"], r["P"]): r for r in rows}
    out = {}

    def put(name, a, b, key):
        if a in at and b in at and at[b][key] > 0:
            out[name] = at[a][key] / at[b][key]

    put("sar_p1_over_single_epoch", ("sar", 1), ("single", 1), "epoch_s")
    put("naive_p1_over_single_epoch", ("naive", 1), ("single", 1), "epoch_s")
    for mode in ("sar", "naive"):
        put(f"{mode}_p4_over_p1_above_idle", (mode, 4), (mode, 1), "peak_above_base_mb")
        put(f"{mode}_p4_over_p1_rss", (mode, 4), (mode, 1), "peak_rss_mb")
    put("sar_p4_over_single_rss", ("sar", 4), ("single", 1), "peak_rss_mb")
    put("ddp_w2_over_w1_parts_per_s", ("ddp", 2), ("ddp", 1), "parts_per_s")
    return out


def _print_ratios(rat):
    def f(key):
        return f"{rat[key]:7.3f}" if key in rat else f"{'-':>7}"

    print(f"\n{'ratio':44} {'sar':>7} {'naive':>7}  goal", flush=True)
    print(
        f"{'epoch time P=1 / single':44} {f('sar_p1_over_single_epoch')} "
        f"{f('naive_p1_over_single_epoch')}  sar <= 1.2"
    )
    print(
        f"{'per-worker peak above idle P=4 / P=1':44} "
        f"{f('sar_p4_over_p1_above_idle')} "
        f"{f('naive_p4_over_p1_above_idle')}  sar <= 0.35"
    )
    print(
        f"{'per-worker peak RSS (total) P=4 / P=1':44} {f('sar_p4_over_p1_rss')} {f('naive_p4_over_p1_rss')}"
    )
    print(
        f"{'per-worker peak RSS (total) P=4 / single':44} {f('sar_p4_over_single_rss')} {'':>7}  sar <= 0.35"
    )
    print(f"{'DDP parts/s, 2 workers / 1 worker':44} {f('ddp_w2_over_w1_parts_per_s')}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=100_000)
    p.add_argument("--degree", type=int, default=20, help="average in-degree of the random graph")
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--classes", type=int, default=112, help="binary tasks (multilabel, as ogbn-proteins)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument(
        "--conv",
        default="gen_max",
        choices=list(RECIPES),
        help="the RevGNN's conv recipe (benchmarks.scale.RECIPES), run through its SAR form",
    )
    p.add_argument("--layers", type=int, default=16)
    p.add_argument(
        "--epochs",
        type=int,
        default=2,
        help="epochs per run; the fastest is reported (the first includes one-off warm-up)",
    )
    p.add_argument(
        "--modes",
        nargs="+",
        default=["single", "sar", "naive", "ddp"],
        choices=["single", "sar", "naive", "ddp"],
    )
    p.add_argument("--parts", type=int, nargs="+", default=[1, 2, 4], help="SAR / naive workers P")
    p.add_argument(
        "--method", default="random", choices=["random", "metis"], help="node partition of SAR / naive"
    )
    p.add_argument("--ddp-workers", type=int, nargs="+", default=[1, 2])
    p.add_argument(
        "--ddp-parts", type=int, default=10, help="DDP: random parts per epoch (trainer.train_parts)"
    )
    p.add_argument("--threads", type=int, default=0, help="intra-op threads per worker (0: cores / workers)")
    p.add_argument("--out", default="bench_out/sar")
    p.add_argument("--quick", action="store_true", help=f"tiny smoke run: defaults {QUICK}")
    args = p.parse_args(argv)
    if args.quick:  # explicit flags still win
        p.set_defaults(**QUICK)
        args = p.parse_args(argv)
    if "naive" in args.modes and RECIPES[args.conv][0] != "gen":
        p.error(f"--modes naive runs PyG's GENConv on a halo: a gen_* --conv, not {args.conv}")

    from revgnn.testing.workers import run_workers

    if os.path.exists(TCMALLOC) and "tcmalloc" not in os.environ.get("LD_PRELOAD", ""):
        os.environ["LD_PRELOAD"] = TCMALLOC  # inherited by spawned workers
    cores = len(os.sched_getaffinity(0))

    def threads(workers):
        return args.threads or max(1, cores // workers)

    os.makedirs(args.out, exist_ok=True)
    data_path = os.path.join(args.out, "graph.pt")
    parts = args.parts if {"sar", "naive"} & set(args.modes) else []
    part_dirs = {P: os.path.join(args.out, f"parts{P}") for P in parts}
    nodes, edges = _in_child(prepare, args, data_path, part_dirs)
    cfg = dict(
        hidden=args.hidden, layers=args.layers, epochs=args.epochs, ddp_parts=args.ddp_parts, conv=args.conv
    )
    print(
        f"graph: {nodes} nodes, {edges} edges, "
        f"{args.classes} tasks; RevGNN {args.layers} layers x "
        f"{args.hidden}, {args.conv}, 2 groups; {cores} cores, "
        f"{args.method} partition for sar/naive\n({SHARED_CORES})\n",
        flush=True,
    )
    print(
        f"{'mode':6} {'P':>2} {'epoch s':>8} {'peak MB':>9} {'above idle':>11}  {'per worker':>9}", flush=True
    )
    rows = []
    bounds = dict(timeout_s=1200, wall_s=3600)

    if "single" in args.modes:
        val = _in_child(_single_worker, data_path, cfg, threads(1))
        rows.append(_row("single", 1, [SimpleNamespace(rank=0, exitcode=0, value=val)]))
        _print_row(rows[-1])
    for P, part_dir in part_dirs.items():
        for mode in [m for m in ("sar", "naive") if m in args.modes]:
            res = run_workers(_sar_worker, P, mode, part_dir, cfg, threads=threads(P), **bounds)
            rows.append(_row(mode, P, res))
            _print_row(rows[-1])
    for W in args.ddp_workers if "ddp" in args.modes else []:
        res = run_workers(_ddp_worker, W, data_path, cfg, threads=threads(W), **bounds)
        rows.append(_row("ddp", W, res))
        _print_row(rows[-1])

    rat = ratios(rows)
    _print_ratios(rat)
    summary = {"args": vars(args), "cores": cores, "note": SHARED_CORES, "rows": rows, "ratios": rat}
    with open(os.path.join(args.out, "bench_sar.json"), "w") as f:
        json.dump(summary, f, indent=2)
    _plot(rows, args, os.path.join(args.out, "bench_sar.png"))
    print(f"\n({SHARED_CORES})\nwrote {args.out}/bench_sar.json and bench_sar.png", flush=True)
    return 0


def replot(json_path: str) -> None:
    """Redraws the PNG next to a bench_sar.json."""
    with open(json_path) as f:
        summary = json.load(f)
    _plot(summary["rows"], argparse.Namespace(**summary["args"]), json_path.replace(".json", ".png"))


def _plot(rows, args, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conv = getattr(args, "conv", "gen_max")  # a JSON written before --conv existed
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    single = [r for r in rows if r["mode"] == "single"]
    for mode, style, color in (("sar", "o-", "tab:blue"), ("naive", "s--", "tab:orange")):
        rs = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["P"])
        if not rs:
            continue
        ps = [r["P"] for r in rs]
        ax[0].plot(
            ps, [r["peak_above_base_mb"] for r in rs], style, color=color, label=f"{mode} (above idle)"
        )
        ax[0].plot(
            ps, [r["peak_rss_mb"] for r in rs], style, alpha=0.35, color=color, label=f"{mode} (total RSS)"
        )
        ax[1].plot(ps, [r["epoch_s"] for r in rs], style, color=color, label=mode)
    for r in single:
        ax[0].axhline(r["peak_above_base_mb"], color="k", ls=":", label="one process (above idle)")
        ax[1].axhline(r["epoch_s"], color="k", ls=":", label="one process")
        ax[1].axhline(
            1.2 * r["epoch_s"], color="tab:red", ls=":", lw=0.8, label="1.2x one process (goal at P=1)"
        )
    ddp = sorted((r for r in rows if r["mode"] == "ddp"), key=lambda r: r["P"])
    ax[2].bar([str(r["P"]) for r in ddp], [r["parts_per_s"] for r in ddp], color="tab:green")
    ax[0].set(
        xlabel="workers P",
        ylabel="per-worker peak memory (MB)",
        title=f"RevGNN {args.layers}x{args.hidden} {conv}, {args.nodes} nodes, "
        f"{args.nodes * args.degree} edges",
        xticks=args.parts,
    )
    ax[1].set(
        xlabel="workers P",
        ylabel="epoch time (s)",
        title="epoch time (workers share this host)",
        xticks=args.parts,
    )
    ax[2].set(
        xlabel="DDP workers",
        ylabel="parts (sub-graph steps) / s",
        title=f"DDP, {args.ddp_parts} parts per epoch (shared host)",
    )
    for a in ax:
        a.grid(alpha=0.3)
    for a in ax[:2]:
        if a.lines:
            a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
