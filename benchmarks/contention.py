"""Step time idle and under a competing CPU load, for revgnn's thread/wait-policy configurations.

For each model and configuration, two fresh subprocesses run the same training: one on the machine
as it is ("idle"), one while this script keeps ``--load-per-core`` processes spinning on every CPU
it may use ("loaded"; the spinners are started by this script, bounded in time by their own
deadline, and ended by their PIDs as soon as the measured run ends). It prints loaded / idle side
by side; a fair share of the cores under one spinner per core is 2x.

Models:

* ``small``: ``revgnn-train``'s default (revgnn_proteins_like, 8 x 32, on proteins_like, 2 parts per epoch),
  run through the real entry point (``python -m revgnn.train``); the figure is the median epoch
  time (2 steps) after the first epoch, from its ``metrics.csv``.
* ``deep``: RevGNN-Deep (80 channels, 2 groups) at ``--deep-layers`` layers on a proteins-sized
  generated sub-graph (13.2k nodes, 790k edges; ``benchmarks/step.py``'s), median of
  ``--deep-steps`` steps after one warm-up, with the entry points' start-up
  (``revgnn.utils.allocator.use_tcmalloc``) and the backends' thread setting
  (``revgnn.utils.threads.configure_threads``).

Configurations (``--configs``; ``--extra`` adds ``passive`` to ``fix_threads1``):

* ``before``: the defaults before the fix (``REVGNN_THREADS=torch``: torch's thread count,
  OpenMP's default wait policy, i.e. spin then sleep);
* ``threads1``: as ``before`` with one thread (``backend.num_threads=1``);
* ``kernels0``: as ``before`` with ``REVGNN_KERNELS=0`` (the PyTorch path);
* ``fix``: the defaults now (``GOMP_SPINCOUNT=1000`` from the launcher, thread count from the
  affinity mask and cgroup quota);
* ``passive``: as ``before`` with ``OMP_WAIT_POLICY=PASSIVE`` (never spin);
* ``spin10k``: as ``before`` with ``GOMP_SPINCOUNT=10000`` (shorter spinning);
* ``blocktime0``: as ``before`` with ``KMP_BLOCKTIME=0`` (Intel OpenMP's knob: no effect on libgomp);
* ``fix_threads1``: ``fix`` with one thread;
* ``spin100``, ``spin1k``, ``spin3k`` (only by name): as ``spin10k`` with 100, 1000, 3000;
* ``glibc``, ``fix_glibc`` (only by name): ``before`` and ``fix`` with glibc's malloc
  (``REVGNN_ALLOCATOR=system``) instead of tcmalloc.

    python -m benchmarks.contention                       # both models, the 4 configurations
    python -m benchmarks.contention --quick               # small sizes, to check the script
    python -m benchmarks.contention --models deep --extra --out docs/bench/contention.md
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from benchmarks.common import (
    child_env,
    markdown_table,
    median_after,
    proteins_subgraph,
    run_child,
    time_calls,
)

REPO = Path(__file__).resolve().parents[1]
BEFORE = {"REVGNN_THREADS": "torch"}
CONFIGS: Dict[str, Dict] = {
    "before": {"env": BEFORE},
    "threads1": {"env": BEFORE, "threads": 1},
    "kernels0": {"env": {**BEFORE, "REVGNN_KERNELS": "0"}},
    "fix": {"env": {}},
    "passive": {"env": {**BEFORE, "OMP_WAIT_POLICY": "PASSIVE"}},
    "spin10k": {"env": {**BEFORE, "GOMP_SPINCOUNT": "10000"}},
    "blocktime0": {"env": {**BEFORE, "KMP_BLOCKTIME": "0"}},
    "fix_threads1": {"env": {}, "threads": 1},
    "glibc": {"env": {**BEFORE, "REVGNN_ALLOCATOR": "system"}},
    "fix_glibc": {"env": {"REVGNN_ALLOCATOR": "system"}},
    "spin1k": {"env": {**BEFORE, "GOMP_SPINCOUNT": "1000"}},
    "spin3k": {"env": {**BEFORE, "GOMP_SPINCOUNT": "3000"}},
    "spin100": {"env": {**BEFORE, "GOMP_SPINCOUNT": "100"}},
}
MAIN_CONFIGS = ["before", "threads1", "kernels0", "fix"]
EXTRA_CONFIGS = ["passive", "spin10k", "blocktime0", "fix_threads1"]
# what the parent's environment must not hand to the children (each child starts as a user would)
_STRIP = (
    "REVGNN_ALLOCATOR",
    "OMP_WAIT_POLICY",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "GOMP_SPINCOUNT",
    "KMP_BLOCKTIME",
    "REVGNN_THREADS",
    "REVGNN_KERNELS",
    "_REVGNN_REEXEC",
    "LD_PRELOAD",
)
SPIN = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"


# ---- the competing load --------------------------------------------------------------------------


class Load:
    """``per_core`` spinning processes per CPU of this process's affinity mask, each ending by itself
    after ``seconds`` at the latest; :meth:`stop` ends them by PID (also on exit of the ``with``)."""

    def __init__(self, per_core: int, seconds: float):
        ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        self.count, self.seconds = per_core * ncpu, seconds
        self.procs: List[subprocess.Popen] = []

    def __enter__(self) -> "Load":
        code = SPIN.format(seconds=self.seconds)
        for _ in range(self.count):
            self.procs.append(subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL))
        time.sleep(1.0)  # let them reach the loop
        return self

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            p.wait()
        self.procs = []

    def __exit__(self, *exc) -> None:
        self.stop()


def _on_signal(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through Load.__exit__


# ---- one measured run (parent side) --------------------------------------------------------------


def config_env(extra: Dict[str, str]) -> Dict[str, str]:
    """A child's environment: as a user's shell would start it (:data:`_STRIP` removed), revgnn
    importable, then the configuration's variables."""
    pythonpath = [str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    return child_env(strip=_STRIP, PYTHONPATH=os.pathsep.join(pythonpath), **extra)


def run_small(config: Dict, args, workdir: str) -> Dict:
    out_dir = os.path.join(workdir, "run")
    cmd = [
        sys.executable,
        "-m",
        "revgnn.train",
        f"trainer.epochs={args.small_epochs}",
        "trainer.eval_every=1000000",
        f"output_dir={out_dir}",
        "overwrite=true",  # one scratch directory for every configuration and repeat
        "logger.plot=false",
        "logger.progress_bar=false",
        "name=bench_contention",
    ]
    if config.get("threads"):
        cmd.append(f"backend.num_threads={config['threads']}")
    if args.small_nodes:
        cmd += [f"data.num_nodes={args.small_nodes}"]
    run_child(cmd, config_env(config["env"]), cwd=workdir, timeout=args.timeout)
    with open(os.path.join(out_dir, "metrics.csv")) as f:
        times = [float(r["epoch_time_s"]) for r in csv.DictReader(f)]
    return {"time_s": median_after(times), "times": times}


def run_deep(config: Dict, args, workdir: str) -> Dict:
    cmd = [
        sys.executable,
        "-m",
        __spec__.name,
        "--child",
        "--deep-layers",
        str(args.deep_layers),
        "--deep-steps",
        str(args.deep_steps),
        "--nodes",
        str(args.nodes),
        "--edges",
        str(args.edges),
    ]
    if config.get("threads"):
        cmd += ["--threads", str(config["threads"])]
    return run_child(cmd, config_env(config["env"]), cwd=workdir, timeout=args.timeout)[-1]


def measure(model: str, name: str, loaded: bool, args) -> Dict:
    config = CONFIGS[name]
    runner = run_small if model == "small" else run_deep
    with tempfile.TemporaryDirectory(prefix="bench_contention_") as workdir:
        start = time.perf_counter()
        try:
            if loaded:
                with Load(args.load_per_core, args.timeout + 60):
                    result = runner(config, args, workdir)
            else:
                result = runner(config, args, workdir)
        except subprocess.TimeoutExpired:
            result = {"time_s": float("nan"), "error": f"timeout after {args.timeout} s"}
        result["wall_s"] = time.perf_counter() - start
    return result


# ---- the deep child ------------------------------------------------------------------------------


def child(args) -> None:
    from revgnn.utils.allocator import use_tcmalloc

    use_tcmalloc()  # as every entry point: tcmalloc re-exec, OpenMP wait policy before torch

    from revgnn.utils.threads import configure_threads

    settings = configure_threads(args.threads, warn=False)  # as Backend.start with backend.num_threads

    import torch

    from revgnn.models import create_model
    from revgnn.utils.optimizer import ModelOptimizer

    torch.manual_seed(0)
    model = create_model("revgnn_deep", num_layers=args.deep_layers)
    x, edge_index, edge_attr, y = proteins_subgraph(args.nodes, args.edges, torch.device("cpu"))
    optimizer = ModelOptimizer(model, lambda ps: torch.optim.Adam(ps, lr=1e-3), flat=True, max_norm=1.0)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    model.train()

    def step() -> None:
        loss = loss_fn(model(x, edge_index, edge_attr), y)
        loss.backward()
        optimizer.step()

    times = time_calls(step, 1 + args.deep_steps)  # a warm-up, then the measured steps
    print(
        json.dumps(
            {
                "time_s": median_after(times),
                "times": times,
                "threads": torch.get_num_threads(),
                "openmp_env": settings.openmp_env,
                "kernels": os.environ.get("REVGNN_KERNELS", "1"),
            }
        )
    )


# ---- report --------------------------------------------------------------------------------------


def fmt(t: float) -> str:
    return "—" if t != t else (f"{t:.3f}" if t < 10 else f"{t:.1f}")


def table(results: Dict, models: List[str], configs: List[str]) -> str:
    rows = []
    for model in models:
        unit = "epoch (2 steps)" if model == "small" else "step"
        base = results.get((model, "before"), {}).get("idle", {}).get("time_s", float("nan"))
        for name in configs:
            r = results.get((model, name))
            if r is None:
                continue
            idle, loaded = r["idle"]["time_s"], r["loaded"]["time_s"]
            threads = r["idle"].get("threads", CONFIGS[name].get("threads", "default"))
            cells = [f"{model} ({unit})", f"`{name}`", threads, fmt(idle), fmt(loaded)]
            rows.append([*cells, f"**{loaded / idle:.2f}×**", f"{idle / base:.2f}"])
    header = ["model", "configuration", "threads", "idle s", "loaded s", "loaded / idle"]
    return "\n".join(markdown_table([*header, "idle / idle `before`"], rows))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="small,deep")
    parser.add_argument("--configs", default=",".join(MAIN_CONFIGS))
    parser.add_argument("--extra", action="store_true", help=f"also {', '.join(EXTRA_CONFIGS)}")
    parser.add_argument("--load-per-core", type=int, default=1, help="spinning processes per CPU")
    parser.add_argument(
        "--small-epochs", type=int, default=8, help="small: epochs (the first is not counted)"
    )
    parser.add_argument(
        "--small-nodes", type=int, default=None, help="small: data.num_nodes (default: the data config's)"
    )
    parser.add_argument("--deep-layers", type=int, default=20)
    parser.add_argument("--deep-steps", type=int, default=3, help="deep: measured steps after one warm-up")
    parser.add_argument("--nodes", type=int, default=13_200)
    parser.add_argument("--edges", type=int, default=790_000)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per measured run")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds over the configurations (interleaved); the best is reported",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes: checks the script, not the figures"
    )
    parser.add_argument("--out", default=None, help="also write the table (markdown) here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    if args.quick:
        args.small_epochs, args.deep_layers, args.deep_steps = 3, 3, 1
        args.nodes, args.edges = 2000, 60_000
        args.small_nodes = args.small_nodes or 2000
    models = args.models.split(",")
    configs = args.configs.split(",") + (EXTRA_CONFIGS if args.extra else [])
    unknown = [c for c in configs if c not in CONFIGS] + [m for m in models if m not in ("small", "deep")]
    if unknown:
        parser.error(f"unknown: {unknown}")
    signal.signal(signal.SIGTERM, _on_signal)

    ncpu = len(os.sched_getaffinity(0))
    print(
        f"# {ncpu} CPUs, load average at start {os.getloadavg()[0]:.1f}; loaded = "
        f"{args.load_per_core * ncpu} spinning processes",
        flush=True,
    )
    runs: Dict = {}
    for model in models:
        for _rep in range(args.repeat):  # round robin: a drifting background load hits every configuration
            for name in configs:
                for phase in ("idle", "loaded"):
                    r = measure(model, name, phase == "loaded", args)
                    runs.setdefault((model, name), {}).setdefault(phase, []).append(r)
                    print(
                        f"{model:5s} {name:12s} {phase:6s} {fmt(r['time_s']):>7s} s  "
                        f"(wall {r['wall_s']:.0f} s, load avg {os.getloadavg()[0]:.1f}) "
                        f"{json.dumps({k: v for k, v in r.items() if k not in ('time_s', 'wall_s')})}",
                        flush=True,
                    )
    # the best of the rounds: on a shared machine other jobs only ever add time
    results = {
        key: {phase: {**rs[0], "time_s": min(r["time_s"] for r in rs)} for phase, rs in r2.items()}
        for key, r2 in runs.items()
    }
    text = table(results, models, configs)
    print()
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
