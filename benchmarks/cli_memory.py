"""Peak RSS of whole training runs through the CLI (``revgnn-train``) at several depths.

Each depth is one ``revgnn-train`` subprocess, run one after the other (never two at once), on the
same workload; only ``model.num_layers`` differs:

    revgnn-train model=revgnn_proteins_like model.num_layers=D trainer.epochs=1 trainer.eval_every=1
                 seed=0 backend.num_threads=1 logger.progress_bar=false hydra.run.dir=<tmp>/depth_D

i.e. the default run (``proteins_like`` data, 6000 nodes, RevGNN 32 channels in 2 groups, GENConv
mean aggregation, Adam, grad-norm clipping at 1.0, 2 steps per epoch) cut to one epoch with one
evaluation and the usual ``last.pt``/``best.pt`` checkpoints. Reported per depth:

* peak RSS: the figure the CLI itself reports (``peak_memory_mb`` of ``summary.json``: the process's
  ``ru_maxrss``, which includes Python, the data set, imports and the allocator's caches), and its
  ratio to the smallest depth;
* 16 B/param: parameters, gradients and Adam's two moments, 4 float32 per parameter; these grow
  with depth in any implementation (Adam needs them by definition), so "excess - 16 B/param" is
  what depth adds beyond them;
* process max RSS: ``ru_maxrss`` of the finished child from ``wait4`` (the same high-water mark,
  but to the end of the process: learning-curve plot and exit included), a cross-check.

The processes start through the CLI entry point, so they run under its default allocator
(tcmalloc when installed; ``--allocator system`` for glibc malloc). Threads are pinned to 1
(``OMP_NUM_THREADS``, ``backend.num_threads``): peak RSS does not depend on them, and the machine
may be shared. The table goes to ``bench_out/cli_memory.md``.

    python -m benchmarks.cli_memory                         # depths 8 and 1001 (~1 min on 2 cores)
    python -m benchmarks.cli_memory --depths 8,112,1001 --epochs 3
    python -m benchmarks.cli_memory --nodes 2000            # smaller graph (data.num_nodes)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ChildFailed, child_env, markdown_table, run_child, write_report

REPO = Path(__file__).resolve().parents[1]


def cli_path() -> str:
    """The ``revgnn-train`` console script of this interpreter's environment."""
    here = Path(sys.executable).parent / "revgnn-train"
    if here.exists():
        return str(here)
    found = shutil.which("revgnn-train")
    if found is None:
        raise SystemExit("revgnn-train not found; install the package (scripts/setup.sh)")
    return found


def workload(args, depth: int, run_dir: Path) -> list:
    overrides = [
        f"model={args.model}",
        f"model.num_layers={depth}",
        f"trainer.epochs={args.epochs}",
        f"trainer.eval_every={args.eval_every}",
        f"seed={args.seed}",
        f"backend.num_threads={args.threads}",
        "logger.progress_bar=false",
    ]
    if args.nodes:
        overrides.append(f"data.num_nodes={args.nodes}")
    overrides += args.override
    return overrides + [f"hydra.run.dir={run_dir}"]


def threads_env(args) -> dict:
    """The children's environment: the allocator the CLI would choose (or ``--allocator system``),
    ``args.threads`` threads."""
    threads = str(args.threads)
    return child_env(args.allocator, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)


def run_depth(args, depth: int, root: Path) -> dict:
    run_dir = root / f"depth_{depth}"
    cmd = [cli_path(), *workload(args, depth, run_dir)]
    env = threads_env(args)
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "stdout.log"
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    row = dict(depth=depth, cmd=cmd, wall_s=wall, process_max_rss_mb=usage.ru_maxrss / 1024)
    text = log_path.read_text()
    if proc.returncode != 0:
        row["error"] = f"exit {proc.returncode}: {text.strip()[-500:]}"
        return row
    summary_path = run_dir / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        row.update(
            params=summary["num_parameters"],
            peak_mb=summary["peak_memory_mb"],
            epoch_time_s=summary["epoch_time_s"],
        )
    else:  # fall back to the final log line: "... N params, ... peak M MB)"
        m = re.search(r"([\d,]+) params, .*peak (\d+) MB", text)
        if m is None:
            row["error"] = "neither summary.json nor a 'peak ... MB' log line"
            return row
        row.update(params=int(m.group(1).replace(",", "")), peak_mb=float(m.group(2)))
    return row


def table(rows: list) -> str:
    base = next((r for r in rows if "peak_mb" in r), None)
    header = ["depth", "params", "16 B/param (MB)", "peak RSS (MB)"]
    header += ["ratio vs " + (f"depth {base['depth']}" if base else "base"), "excess (MB)"]
    header += ["excess - 16 B/param (MB)", "process max RSS (MB)", "ratio", "wall (s)"]

    def cells(r):
        if "error" in r:
            return [r["depth"], f"failed: {r['error'][:200]!r}"] + [""] * 8
        state = 16 * r["params"] / 2**20
        excess = r["peak_mb"] - base["peak_mb"]
        extra = excess - (state - 16 * base["params"] / 2**20)
        return [
            r["depth"],
            f"{r['params']:,}",
            f"{state:.1f}",
            f"{r['peak_mb']:.1f}",
            f"{r['peak_mb'] / base['peak_mb']:.3f}x",
            f"{excess:+.1f}",
            f"{extra:+.1f}",
            f"{r['process_max_rss_mb']:.1f}",
            f"{r['process_max_rss_mb'] / base['process_max_rss_mb']:.3f}x",
            f"{r['wall_s']:.0f}",
        ]

    return "\n".join(markdown_table(header, map(cells, rows), align="r" * len(header)))


PHASES = ("build_model", "forward", "backward", "clip", "optimizer step", "evaluate", "checkpoint")


def breakdown_child(args, depth: int) -> None:
    """Runs :func:`revgnn.cli.train.train` in this process (the loop the CLI runs, same overrides)
    with probes around its phases; prints one JSON line per phase call and a final summary."""
    import functools

    import torch
    from hydra import compose, initialize_config_module

    import revgnn.engine.checkpoint
    import revgnn.engine.loop
    import revgnn.engine.run
    import revgnn.engine.tasks
    from revgnn.config.store import register_configs
    from revgnn.utils.allocator import allocator
    from revgnn.utils.memory import peak_rss_bytes

    register_configs()  # the schemas that train.yaml's groups select

    def rss() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    def peak() -> float:
        return peak_rss_bytes() / 2**20

    def probe(owner, name: str, phase: str, when=lambda: True) -> None:
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def wrapper(*a, **k):
            if not when():
                return fn(*a, **k)
            r0, p0 = rss(), peak()
            out = fn(*a, **k)
            print(
                json.dumps(
                    dict(phase=phase, rss_before=r0, rss_after=rss(), peak_before=p0, peak_after=peak())
                ),
                flush=True,
            )
            return out

        setattr(owner, name, wrapper)

    build = revgnn.engine.loop.build_model

    def build_model(*a, **k):
        r0, p0 = rss(), peak()
        model = build(*a, **k)
        print(
            json.dumps(
                dict(
                    phase="build_model",
                    rss_before=r0,
                    rss_after=rss(),
                    peak_before=p0,
                    peak_after=peak(),
                    params=sum(p.numel() for p in model.parameters()),
                    param_tensors=sum(1 for _ in model.parameters()),
                    modules=sum(1 for _ in model.modules()),
                )
            ),
            flush=True,
        )
        # an instance attribute, which nn.Module.__call__ finds; training steps only (evaluation's
        # forward passes belong to "evaluate")
        probe(model, "forward", "forward", when=lambda: model.training)
        return model

    revgnn.engine.loop.build_model = build_model
    probe(torch.Tensor, "backward", "backward")
    probe(torch.nn.utils, "clip_grad_norm_", "clip")
    probe(torch.optim.Adam, "step", "optimizer step")
    probe(revgnn.engine.tasks.NodeTask, "evaluate", "evaluate")
    probe(revgnn.engine.run, "save_checkpoint", "checkpoint")
    probe(revgnn.engine.run, "atomic_copy", "checkpoint")
    root = Path(tempfile.mkdtemp(prefix="revgnn_cli_memory_breakdown_"))
    overrides = [o for o in workload(args, depth, root) if not o.startswith("hydra.")]
    try:
        with initialize_config_module("revgnn.configs", version_base="1.3"):
            cfg = compose("train", overrides=overrides + [f"output_dir={root}", "logger.plot=false"])
        summary = revgnn.engine.loop.train(cfg)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        json.dumps(
            dict(
                phase="end",
                peak_mb=summary["peak_memory_mb"],
                allocator=allocator(),
                threads=torch.get_num_threads(),
            )
        ),
        flush=True,
    )


def run_breakdown(args, depth: int) -> dict:
    cmd = [
        sys.executable,
        "-m",
        __spec__.name,
        "--child-breakdown",
        str(depth),
        "--epochs",
        str(args.epochs),
        "--eval-every",
        str(args.eval_every),
        "--model",
        args.model,
        "--seed",
        str(args.seed),
        "--threads",
        str(args.threads),
        "--allocator",
        args.allocator,
        *(["--nodes", str(args.nodes)] if args.nodes else []),
        *[f"--override={o}" for o in args.override],
    ]
    try:
        events = [e for e in run_child(cmd, threads_env(args), cwd=REPO) if isinstance(e, dict)]
    except ChildFailed as e:
        raise SystemExit(f"breakdown at depth {depth} failed:\n{e.stderr[-2000:]}") from e
    result = dict(depth=depth, calls={})
    for e in events:
        if e["phase"] == "build_model":
            result.update(params=e["params"], param_tensors=e["param_tensors"], modules=e["modules"])
        if e["phase"] == "end":
            result.update(peak_mb=e["peak_mb"], allocator=e["allocator"])
            continue
        result["calls"].setdefault(e["phase"], []).append(e)
    return result


def breakdown_table(results: list) -> str:
    """Per phase: RSS growth of its first call (what it leaves allocated or cached) and the most any
    call raised the process's peak; the last column is the deepest run minus the first."""
    a, b = results[0], results[-1]
    header = ["phase"]
    for r in (a, b):
        header += [
            f"depth {r['depth']}: RSS growth, first call (MB)",
            f"depth {r['depth']}: peak raised (MB)",
        ]
    rows = []
    for phase in PHASES:
        cells, raised = [], []
        for r in (a, b):
            calls = r["calls"].get(phase, [])
            grow = calls[0]["rss_after"] - calls[0]["rss_before"] if calls else 0.0
            up = sum(c["peak_after"] - c["peak_before"] for c in calls)
            raised.append(up)
            cells += [f"{grow:+.1f}", f"{up:+.1f}"]
        rows.append([phase, *cells, f"{raised[1] - raised[0]:+.1f}"])
    peaks = [f"{a['peak_mb']:.1f}", f"{b['peak_mb']:.1f}", f"{b['peak_mb'] - a['peak_mb']:+.1f}"]
    rows.append(["**peak RSS**", "", peaks[0], "", *peaks[1:]])
    lines = markdown_table([*header, "peak raised, difference (MB)"], rows, align="lrrrrr")
    facts = []
    for r in (a, b):
        facts.append(
            f"depth {r['depth']}: {r['params']:,} parameters ({4 * r['params'] / 2**20:.1f} MB "
            f"float32) in {r['param_tensors']:,} tensors, {r['modules']:,} modules"
        )
    return "\n".join(lines) + "\n\n" + "; ".join(facts) + "."


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="8,1001", help="comma list; the first is the baseline")
    parser.add_argument("--model", default="revgnn_proteins_like")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=1)
    parser.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="data.num_nodes (default: the data config's, 6000 for proteins_like)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--allocator",
        choices=("default", "system"),
        default="default",
        help="default: whatever revgnn-train picks (tcmalloc when installed)",
    )
    parser.add_argument(
        "--override", action="append", default=[], help="extra Hydra override for every run (repeatable)"
    )
    parser.add_argument("--out", default=str(REPO / "bench_out" / "cli_memory.md"))
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also run the training loop in-process at the first and last depth with "
        "probes around its phases (model build, forward, backward, clip, Adam "
        "step, evaluation, checkpoint) and tabulate their memory",
    )
    parser.add_argument("--child-breakdown", type=int, help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.child_breakdown is not None:
        from revgnn.utils.allocator import use_tcmalloc

        if args.allocator != "system":
            use_tcmalloc()  # as the CLI does (re-executes this child once)
        return breakdown_child(args, args.child_breakdown)
    depths = [int(d) for d in args.depths.split(",") if d]

    root = Path(tempfile.mkdtemp(prefix="revgnn_cli_memory_"))
    rows = []
    try:
        for depth in depths:
            row = run_depth(args, depth, root)
            rows.append(row)
            shown = {k: v for k, v in row.items() if k != "cmd"}
            print(json.dumps(shown), flush=True)
    finally:
        if args.keep:
            print(f"run directories kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    import torch

    from revgnn.utils.allocator import find_tcmalloc

    alloc = (
        "glibc malloc (REVGNN_ALLOCATOR=system)"
        if args.allocator == "system"
        else "the CLI's default: "
        + (f"tcmalloc ({find_tcmalloc()})" if find_tcmalloc() else "glibc malloc (no tcmalloc found)")
    )
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        commit += "+changes" if dirty else ""
    except OSError:
        commit = "?"
    example = next((r["cmd"] for r in rows), [])
    shown_cmd = " ".join(shlex.quote(c) for c in [Path(example[0]).name, *example[1:-1]]) if example else ""
    nodes = f"data.num_nodes={args.nodes} (reduced)" if args.nodes else "data.num_nodes as configured (6000)"
    breakdown = ""
    if args.breakdown and len(depths) > 1:
        results = [run_breakdown(args, d) for d in (depths[0], depths[-1])]
        breakdown = "\n".join(
            [
                "",
                "Where it goes (`--breakdown`): the same loop, `revgnn.cli.train.train` with the same "
                "overrides, "
                "run in one process per depth with probes around its phases (RSS growth: resident memory "
                "the phase's first call left allocated or cached; peak raised: how far its calls pushed "
                "ru_maxrss; phases in loop order, so a later phase raises the peak only by what earlier "
                "ones' freed memory cannot cover):",
                "",
                breakdown_table(results),
                "",
            ]
        )
    report = "\n".join(
        [
            f"# Peak RSS of a CLI training run vs depth ({time.strftime('%Y-%m-%d')}, commit {commit}, "
            f"torch {torch.__version__}, {os.cpu_count()} cores)",
            "",
            "Workload, one `revgnn-train` process per depth (only `model.num_layers` differs; "
            f"`OMP_NUM_THREADS={args.threads}`; {nodes}):",
            "",
            f"    {shown_cmd}",
            "",
            f"Allocator: {alloc}. peak RSS = `peak_memory_mb` of the run's summary.json (ru_maxrss); "
            "16 B/param = parameters + gradients + Adam's exp_avg and exp_avg_sq in float32; "
            "process max RSS = ru_maxrss of the child from wait4 (to process exit, learning-curve plot "
            "included).",
            "",
            table(rows),
            breakdown,
            "",
            f"Reproduce: `python -m benchmarks.cli_memory {' '.join(shlex.quote(a) for a in argv)}`".replace(
                " `", "`"
            ),
            "",
        ]
    )
    write_report(report, args.out)
    if any("error" in r for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
