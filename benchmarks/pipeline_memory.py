"""Peak memory of the whole data pipeline at a chosen fraction of a real OGB data set's size: OGB's
loader on a raw directory, the feature preparation, the checks, the protocol's random-partition
sampler, multi-view evaluation and the final test, each stage's peak RSS as a ratio to the bytes of the
final graph.

One fresh ``revgnn-train`` run (in a child process, the CLI's allocator) of a recipe on a raw
directory written by :func:`revgnn.testing.fake_ogb.write_fake_ogbn` with ``--scale`` times the real
data set's nodes and edges (``--scale 1`` is the real size; the degrees stay the real ones)::

    experiment=proteins_revgnn_112 model.num_layers=2 trainer.epochs=1 data.root=<raw>

The child wraps each stage of the run (functions of revgnn's loader, task and loop) with a probe that
resets the kernel's peak-RSS mark (``/proc/self/clear_refs``, ``5``) on entry and reads ``VmHWM`` on
exit, so every stage gets its own peak in one process; stages nest (the loader's peak covers its
sub-stages). The ratio is the stage's peak RSS over the bytes of the data set the loop trains on
(``x``, ``edge_index``, ``edge_attr``, ``y``, the split); "above start" subtracts the RSS of the
process before the data loaded (Python, torch, PyG, OGB imports), which does not scale with the
graph. The run is made twice: first on the raw files alone (OGB processes them, revgnn builds its
feature cache), then again with both caches present.

    python -m benchmarks.pipeline_memory --scale 0.125                 # proteins at 1/8 (~1 min)
    python -m benchmarks.pipeline_memory --scale 1 --root /data/big    # the real size (lead's machine)
    python -m benchmarks.pipeline_memory --dataset ogbn-products --scale 0.125
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ChildFailed, child_env, markdown_table, run_child, write_report

REPO = Path(__file__).resolve().parents[1]

#: real sizes: nodes and edges as stored in the raw files (OGB adds the reverse edges of both)
REAL_SIZES = {"ogbn-proteins": (132_534, 39_561_252), "ogbn-products": (2_449_029, 61_859_140)}

#: the run each data set's pipeline is measured with (Hydra overrides besides data.root)
RECIPES = {
    "ogbn-proteins": ["experiment=proteins_revgnn_112", "model.num_layers=2"],
    "ogbn-products": [
        "experiment=products_revgnn_112",
        "model.num_layers=2",
        "trainer.eval_parts=1",  # full-graph evaluation
        "trainer.test_views=null",
    ],
}


LOAD = "load (all of it)"


def _status(key: str) -> int:
    """``VmHWM`` / ``VmRSS`` of this process, bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


class StageProbes:
    """Per-stage peak RSS in one process: each probed call resets the kernel's high-water mark on entry
    and reads it on exit; enclosing stages fold in what their sub-stages saw."""

    def __init__(self) -> None:
        self.open: list = []  # [name, rss_before, peak] of the stages running now
        self.rows: list = []
        self.highest = 0  # the whole process's peak (each reset clears the kernel's)

    def _fold(self) -> None:
        hwm = _status("VmHWM")
        self.highest = max(self.highest, hwm)
        for stage in self.open:
            stage[2] = max(stage[2], hwm)

    def _reset(self) -> None:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    def wrap(self, owner, attr: str, name: str) -> None:
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def probed(*args, **kwargs):
            self._fold()
            self._reset()
            stage = [name, _status("VmRSS"), 0]
            self.open.append(stage)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._fold()
                self.open.remove(stage)
                self.rows.append(
                    dict(
                        stage=name,
                        depth=len(self.open),
                        rss_before=stage[1],
                        peak=stage[2],
                        rss_after=_status("VmRSS"),
                        seconds=time.perf_counter() - t0,
                    )
                )
                print(json.dumps(self.rows[-1]), flush=True)

        setattr(owner, attr, probed)


def graph_bytes(ds) -> int:
    """Bytes of the tensors of a :class:`~revgnn.data.node_dataset.NodeDataset`."""
    tensors = [ds.x, ds.edge_index, ds.edge_attr, ds.y, *ds.split_idx.values()]
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def child(args) -> None:
    """Runs the recipe's training loop in this process with probes around its stages."""
    import dataclasses

    from hydra import compose, initialize_config_module

    import revgnn.data.node_dataset as node_dataset
    import revgnn.data.ogbn as ogbn
    import revgnn.data.random_parts as random_parts
    import revgnn.engine.loop as loop
    import revgnn.engine.tasks as tasks
    from revgnn.config.store import register_configs

    probes = StageProbes()
    spec = ogbn.OGBN_SPECS[args.dataset]
    probes.wrap(ogbn, "load_ogbn", LOAD)
    probes.wrap(ogbn, "load_ogb_dataset", "  OGB's loader")
    wrapped = type("Holder", (), {"prepare": staticmethod(spec.prepare)})
    probes.wrap(wrapped, "prepare", "  features")
    ogbn.OGBN_SPECS[args.dataset] = dataclasses.replace(spec, prepare=wrapped.prepare)
    probes.wrap(ogbn, "_handle_duplicates", "  duplicate edges")
    probes.wrap(node_dataset.NodeDataset, "validate", "  checks")
    probes.wrap(node_dataset.NodeDataset, "sorted_by_destination", "  destination sort")
    probes.wrap(tasks, "make_task", "task")
    probes.wrap(loop, "build_model", "model")
    probes.wrap(tasks.NodeTask, "fix_eval_views", "evaluation views")
    probes.wrap(loop, "_train_epoch", "training epoch")
    probes.wrap(random_parts.Partition, "__init__", "  partition")
    probes.wrap(tasks.NodeTask, "evaluate", "evaluation")
    probes.wrap(loop, "checkpoint_test", "final test")
    size = {}
    make_task = tasks.make_task

    def recording(ds, *a, **k):
        size.update(graph_bytes=graph_bytes(ds), nodes=ds.num_nodes, edges=ds.num_edges)
        return make_task(ds, *a, **k)

    tasks.make_task = recording
    out = Path(tempfile.mkdtemp(prefix="revgnn_pipeline_"))
    overrides = [*RECIPES[args.dataset], f"data.root={args.root}", "trainer.epochs=1", *args.override]
    try:
        register_configs()
        with initialize_config_module("revgnn.configs", version_base="1.3"):
            cfg = compose("train", overrides=overrides + [f"output_dir={out}", "logger.plot=false"])
        loop.train(cfg)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    probes._fold()
    from revgnn.utils.allocator import allocator

    end = dict(stage="end", peak_all=probes.highest, allocator=allocator(), **size)
    print(json.dumps(end), flush=True)


def write_raw(dataset: str, scale: float, root: Path) -> float:
    """Writes the raw data set at ``scale`` of its real nodes and edges; returns the seconds taken."""
    from revgnn.testing.fake_ogb import write_fake_ogbn

    nodes, edges = REAL_SIZES[dataset]
    t0 = time.perf_counter()
    write_fake_ogbn(
        str(root), dataset, num_nodes=max(16, round(nodes * scale)), num_edges=max(1, round(edges * scale))
    )
    return time.perf_counter() - t0


def measure(args, root: Path) -> dict:
    """One child run of the recipe on ``root``: its stage rows and the end row."""
    cmd = [sys.executable, "-m", __spec__.name, "--child", "--dataset", args.dataset, "--root", str(root)]
    cmd += [f"--override={o}" for o in args.override]
    cmd += ["--override=backend.num_threads=1", "--override=logger.progress_bar=false"]
    env = child_env(args.allocator, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    try:
        rows = [r for r in run_child(cmd, env, cwd=REPO) if isinstance(r, dict) and "stage" in r]
    except ChildFailed as e:
        raise SystemExit(f"the pipeline failed:\n{e.stderr[-3000:]}") from e
    return dict(stages=[r for r in rows if r["stage"] != "end"], end=rows[-1])


def table(run: dict) -> str:
    """Per stage (in the order they ended, a repeated stage once with its count): peak RSS, its
    ratio to the graph's bytes, the same above the process's RSS before loading, and seconds."""
    end = run["end"]
    graph, start = end["graph_bytes"], run["start"]
    merged: dict = {}
    for r in run["stages"]:
        m = merged.setdefault(r["stage"], dict(r, calls=0, seconds=0.0))
        m["peak"] = max(m["peak"], r["peak"])
        m["calls"] += 1
        m["seconds"] += r["seconds"]
    rows = [
        [
            name + (f" (x{m['calls']})" if m["calls"] > 1 else ""),
            f"{m['peak'] / 2**20:,.0f}",
            f"{m['peak'] / graph:.2f}",
            f"{(m['peak'] - start) / graph:.2f}",
            f"{m['seconds']:.1f}",
        ]
        for name, m in merged.items()
    ]
    rows.append(
        [
            "**whole run**",
            f"{end['peak_all'] / 2**20:,.0f}",
            f"{end['peak_all'] / graph:.2f}",
            f"{(end['peak_all'] - start) / graph:.2f}",
            "",
        ]
    )
    header = ["stage", "peak RSS (MB)", "/ graph bytes", "above start / graph bytes", "s"]
    return "\n".join(markdown_table(header, rows, align="lrrrr"))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=sorted(REAL_SIZES), default="ogbn-proteins")
    parser.add_argument("--scale", type=float, default=0.125, help="fraction of the real nodes and edges")
    parser.add_argument(
        "--root", help="data.root to use (a raw directory is written there when it lacks the data set)"
    )
    parser.add_argument("--override", action="append", default=[], help="extra Hydra override (repeatable)")
    parser.add_argument(
        "--allocator",
        choices=("default", "system"),
        default="default",
        help="default: whatever revgnn-train picks (tcmalloc when installed)",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="delete <root>/<data set>/processed first, so the first run processes the raw files",
    )
    parser.add_argument("--out", default=str(REPO / "bench_out" / "pipeline_memory.md"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.child:
        if args.allocator != "system":
            from revgnn.utils.allocator import use_tcmalloc

            use_tcmalloc()  # as the CLI does (re-executes this child once)
        return child(args)
    if not 0 < args.scale <= 1:
        parser.error(f"--scale must be in (0, 1], got {args.scale}")
    own = args.root is None
    root = Path(args.root or tempfile.mkdtemp(prefix="revgnn_pipeline_raw_"))
    directory = root / args.dataset.replace("-", "_")
    wrote = None
    if not (directory / "raw").is_dir():
        wrote = write_raw(args.dataset, args.scale, root)
        print(f"wrote {directory} in {wrote:.0f} s", flush=True)
    elif args.fresh:
        shutil.rmtree(directory / "processed", ignore_errors=True)
    runs = {}
    try:
        for when in ("first load", "cached"):
            run = measure(args, root)
            run["start"] = next(r["rss_before"] for r in run["stages"] if r["stage"] == LOAD)
            runs[when] = run
            print(f"{when}: peak {run['end']['peak_all'] / 2**20:,.0f} MB", flush=True)
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
    import torch

    end = runs["cached"]["end"]
    sections = []
    for when, run in runs.items():
        what = (
            "OGB processes the raw files, revgnn builds its feature cache"
            if when == "first load"
            else ("OGB's processed file and revgnn's feature cache exist")
        )
        sections += [f"## {when} ({what})", "", table(run), ""]
    command = " ".join(["python -m benchmarks.pipeline_memory", *map(shlex.quote, argv)])
    report = "\n".join(
        [
            f"# Pipeline memory: {args.dataset} at {args.scale:g} of its real size "
            f"({time.strftime('%Y-%m-%d')}, torch {torch.__version__}, {os.cpu_count()} cores)",
            "",
            f"{end['nodes']:,} nodes, {end['edges']:,} directed edges; the data set the loop trains on holds "
            f"{end['graph_bytes'] / 2**20:,.0f} MB (graph bytes); RSS before loading (imports) "
            f"{runs['cached']['start'] / 2**20:,.0f} MB; allocator {end['allocator']}"
            + (f"; raw directory written in {wrote:.0f} s" if wrote is not None else "")
            + ". Run: `revgnn-train "
            + " ".join([*RECIPES[args.dataset], "trainer.epochs=1", *args.override])
            + "`, stages nested under the one above them.",
            "",
            *sections,
            f"Reproduce: `{command}`",
            "",
        ]
    )
    write_report(report, args.out)


if __name__ == "__main__":
    main()
