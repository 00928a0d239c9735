"""One training step (forward, backward, Adam) of DEQ-GNN vs WT-RevGNN vs RevGNN at equal width: bytes
saved for backward (deterministic), peak-RSS growth during the step and median step time. Each model
runs in its own process (``--one MODEL``) so that peak RSS is its own.

Example::

    .venv/bin/python -m benchmarks.deq step --nodes 4000 --hidden 64 --steps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks.deq.common import build, load_graph, parser

MODELS = {
    # name -> (registered factory, overrides)
    "deq_gnn": ("deq_gnn", {}),
    "wt_revgnn": ("wt_revgnn", {}),
    "revgnn_small": ("revgnn_small", {}),
    "revgnn_112": ("revgnn_112", {}),
}


def bench_one(args) -> None:
    import warnings

    import torch

    from revgnn.deq import DEQConvergenceWarning
    from revgnn.models import count_parameters
    from revgnn.utils.memory import SavedTensorBytes, peak_rss_bytes

    warnings.simplefilter("ignore", DEQConvergenceWarning)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    data = load_graph(args.nodes)
    factory, extra = MODELS[args.one]
    model = build(factory, args.hidden, data, **extra)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    idx = data.split_idx["train"]

    def step(measure: bool):
        opt.zero_grad()
        with SavedTensorBytes() as saved:
            out = model(data.x, data.edge_index, data.edge_attr)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(out[idx], data.y[idx])
        loss.backward()
        opt.step()
        return saved.bytes

    rss0 = peak_rss_bytes()
    times, saved = [], 0
    for i in range(args.steps + 1):  # the first step warms up (allocations, Adam state)
        t0 = time.perf_counter()
        saved = step(True)
        if i:
            times.append(time.perf_counter() - t0)
    stats = getattr(model, "deq_stats", lambda: {})()
    print(
        json.dumps(
            {
                "model": args.one,
                "params": count_parameters(model),
                "saved_MB": saved / 2**20,
                "peak_rss_growth_MB": (peak_rss_bytes() - rss0) / 2**20,
                "step_s": statistics.median(times),
                "deq": {
                    k: stats[k]
                    for k in ("forward_steps", "forward_residual", "backward_steps", "backward_residual")
                    if k in stats
                },
            }
        )
    )


def bench_step(args) -> None:
    env = dict(os.environ)
    print(
        f"training step on proteins_like({args.nodes} nodes), width {args.hidden}, "
        f"{args.threads} threads, median of {args.steps} steps after 1 warm-up"
    )
    for name in args.models:
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.deq.step",
            "--one",
            name,
            "--nodes",
            str(args.nodes),
            "--hidden",
            str(args.hidden),
            "--steps",
            str(args.steps),
            "--threads",
            str(args.threads),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode:
            print(f"{name}: failed\n{proc.stderr[-2000:]}")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        print(
            f"{r['model']:14s} params {r['params']:>9,d}  saved-for-backward {r['saved_MB']:8.1f} MB  "
            f"peak-RSS growth {r['peak_rss_growth_MB']:8.1f} MB  step {r['step_s']:6.2f} s  {r['deq']}",
            flush=True,
        )


def main(argv=None, prog=None) -> None:
    p = parser(__doc__, prog, ["--nodes", "--hidden", "--threads"])
    p.add_argument("--steps", type=int, default=3, help="measured steps after one warm-up")
    p.add_argument(
        "--models", nargs="+", default=["deq_gnn", "wt_revgnn", "revgnn_small"], choices=sorted(MODELS)
    )
    p.add_argument("--one", choices=sorted(MODELS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    (bench_one if args.one else bench_step)(args)


if __name__ == "__main__":
    main()
