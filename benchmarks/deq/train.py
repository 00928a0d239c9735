"""DEQ-GNN trained on ``proteins_like`` through the training loop, arms (``--arms``, model overrides
such as ``jac_reg_weight=0.5`` or ``spectral_reg_weight=10,spectral_reg_target=0.5``; ``none``
unregularised) x seeds, optionally after unrolled pretraining (``--pretrain-epochs``, every arm): per
run the epochs whose every training solve reached the tolerance within 30 evaluations, the max
evaluations and residual, the best validation score and the test score at it; per arm their mean ±
std over the seeds, and the per-seed difference of each arm to the unregularised one; ``--record
FILE`` keeps each run's per-epoch max evaluations as JSON.

Examples::

    .venv/bin/python -m benchmarks.deq train --nodes 2000 --epochs 50 --seeds-list 0 1 \
        --arms none jac_reg_weight=0.1
    .venv/bin/python -m benchmarks.deq train --nodes 2000 --epochs 300 --max-iter 100 --seeds-list 0 1 \
        --arms none spectral_reg_weight=10,spectral_reg_target=0.5 --pretrain-epochs 5 \
        --spectral-radius-every 0
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import sys

from benchmarks.common import markdown_table
from benchmarks.deq.common import Arm, parser

#: The issue's budget: every training solve of an epoch within this many evaluations.
EVAL_BUDGET = 30
#: Evaluations at the end of a run whose validation scores ``train`` averages.
TAIL = 10


def _mean_std(values, signed: bool = False) -> str:
    """``mean ± std`` over the seeds (sample std; the value alone for one seed)."""
    values = list(values)
    fmt = "+.4f" if signed else ".4f"
    if len(values) < 2:
        return format(values[0], fmt) if values else "n/a"
    return f"{format(statistics.mean(values), fmt)} ± {statistics.stdev(values):.4f}"


def train_run(args, seed: int, arm: Arm, out_dir: str):
    """One run of the training loop; returns its metrics.csv rows and summary, and whether it was
    reused (``--reuse``: ``out_dir`` holds a completed run of the same length whose checkpoint has the
    same configuration, compared as a resume compares it; the runs are deterministic per seed; an
    interrupted run there is trained again from the start)."""
    import csv

    from hydra import compose, initialize_config_module

    from revgnn.config.store import register_configs
    from revgnn.engine.checkpoint import check_resume_config, checkpoint_config
    from revgnn.engine.loop import train
    from revgnn.engine.reports import Summary

    register_configs()

    overrides = [
        "logger.plot=false",
        "logger.progress_bar=false",
        "data=proteins_like",
        f"data.num_nodes={args.nodes}",
        "model=deq_gnn",
        f"model.hidden_channels={args.hidden}",
        f"model.max_iter={args.max_iter}",
        f"model.tol={args.tol:g}",
        f"model.pretrain_epochs={args.pretrain_epochs}",
        *arm.overrides(args.jac_every),
        f"model.spectral_radius_every={args.spectral_radius_every}",
        *([] if "spectral_radius_iters" in arm.model else ["model.spectral_radius_iters=10"]),
        f"trainer.epochs={args.epochs}",
        f"trainer.eval_every={args.eval_every}",
        f"seed={seed}",
        f"name=deq_{arm.folder}_seed{seed}",
    ]
    with initialize_config_module(config_module="revgnn.configs", version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    cfg.output_dir = out_dir
    cfg.overwrite = True  # a run that is not reused is trained again from the start, over the old one
    summary_path = os.path.join(out_dir, "summary.json")
    previous = Summary.read(summary_path) if args.reuse and os.path.exists(summary_path) else None
    if (
        previous is not None and previous.status == "completed"
    ):  # an interrupted or failed run is trained again
        if previous.epochs != args.epochs:
            raise SystemExit(f"--reuse: {out_dir} holds a run of {previous.epochs} epochs")
        try:
            check_resume_config(checkpoint_config(os.path.join(out_dir, "last.pt")), cfg, out_dir)
        except ValueError as e:
            raise SystemExit(f"--reuse: {e}\ngive --out-dir another folder") from None
        summary, reused = previous.to_dict(), True
    else:
        summary, reused = train(cfg), False
    rows = list(csv.DictReader(open(os.path.join(out_dir, "metrics.csv"))))
    return rows, summary, overrides, reused


def epoch_report(rows, pretrain_epochs: int) -> dict:
    """Per run: which epochs kept every training solve within :data:`EVAL_BUDGET` evaluations and at
    the tolerance (a pretraining epoch counts as its unrolled applications: it solves nothing), the
    max evaluations over all epochs, the max final residual over the solving (DEQ) epochs, and the
    validation score at the last evaluation and averaged over the last :data:`TAIL` evaluations (less
    noisy than the best, a max over every evaluation)."""
    steps = [float(r["deq_forward_steps_max"]) for r in rows]
    pre = [int(r["epoch"]) <= pretrain_epochs for r in rows]
    ok = [
        s <= EVAL_BUDGET if p else s <= EVAL_BUDGET and float(r["deq_forward_converged"]) == 1.0
        for r, s, p in zip(rows, steps, pre)
    ]
    residuals = [float(r["deq_forward_residual_max"]) for r, p in zip(rows, pre) if not p]
    valid = [float(r["valid"]) for r in rows if r.get("valid")]
    return {
        "valid_final": valid[-1] if valid else float("nan"),
        "valid_tail": statistics.mean(valid[-TAIL:]) if valid else float("nan"),
        "valid_tail_sd": statistics.stdev(valid[-TAIL:]) if len(valid) > 1 else float("nan"),
        "steps": steps,
        "ok": sum(ok),
        "failed": [(int(r["epoch"]), int(s)) for r, s, o in zip(rows, steps, ok) if not o],
        "unconverged": sum(float(r["deq_forward_converged"]) < 1.0 for r, p in zip(rows, pre) if not p),
        "unconverged_epochs": [
            int(r["epoch"]) for r, p in zip(rows, pre) if not p and float(r["deq_forward_converged"]) < 1.0
        ],
        "max_steps": max(steps),
        "max_residual": max(residuals) if residuals else float("nan"),
        "spectral_last": rows[-1].get("deq_spectral_radius_mean", ""),
    }


def write_record(args, results, argv) -> None:
    """``--record``: per arm and seed the max forward evaluations of each epoch's training solves and
    the solving epochs whose solve did not converge, as JSON with the command that made them (the
    published figures are checked against this file by ``tests/benchmarks/test_deq_figures.py``); ``argv`` is
    the command line after ``train``, written as ``python -m benchmarks.deq train ...``."""
    runs = {}
    for (label, seed), (_, _, rep) in results.items():
        runs.setdefault(label, {})[str(seed)] = {
            "max_evaluations": [int(s) for s in rep["steps"]],
            "unconverged_epochs": rep["unconverged_epochs"],
        }
    record = {
        "command": " ".join(["python -m benchmarks.deq", "train", *argv]),
        "epochs": args.epochs,
        "tol": args.tol,
        "max_iter": args.max_iter,
        "pretrain_epochs": args.pretrain_epochs,
        "threads": args.threads,
        "runs": runs,
    }
    text = json.dumps(record, indent=1)
    # one line per list of numbers, so that a run is one line of the file and of its diffs
    text = re.sub(r"\[[\d\s,]*\]", lambda m: json.dumps(json.loads(m.group(0))), text)
    with open(args.record, "w") as fh:
        fh.write(text + "\n")
    print(f"record written to {args.record}:\n")
    print("\n".join(record_table(record)))
    print(f"\n{record_statement(record)}")


#: The bound published for seeds 0-9 (docs/bench/deq.md); ``record_table`` counts the epochs above it.
PUBLISHED_BOUND = 16


def record_table(record) -> list:
    """A ``--record`` file as a markdown table, one row per run: the most evaluations any training solve
    took and its first epoch (the unrolled pretraining epochs count as their applications), the
    solving epochs above :data:`PUBLISHED_BOUND` and above :data:`EVAL_BUDGET` evaluations, and
    those whose solve did not reach the tolerance."""
    rows = []
    for label, seeds in record["runs"].items():
        for seed, run in seeds.items():
            steps = run["max_evaluations"]
            deq = steps[record["pretrain_epochs"] :]
            worst = max(steps)
            rows.append(
                [
                    label,
                    seed,
                    len(steps),
                    f"{worst} ({steps.index(worst) + 1})",
                    sum(s > PUBLISHED_BOUND for s in deq),
                    sum(s > EVAL_BUDGET for s in deq),
                    len(run["unconverged_epochs"]),
                ]
            )
    header = [
        "arm",
        "seed",
        "epochs",
        "max evaluations (epoch)",
        f"epochs over {PUBLISHED_BOUND}",
        f"epochs over {EVAL_BUDGET}",
        "epochs unconverged",
    ]
    return markdown_table(header, rows, "llrrrrr")


def _tol_text(x: float) -> str:
    """``1e-4`` rather than ``0.0001`` (as the pages write tolerances), where that is exact."""
    mantissa, exponent = f"{x:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}" if float(f"{mantissa}e{exponent}") == x else f"{x:g}"


def record_statement(record) -> str:
    """The sentence the docs publish for a ``--record`` file (tests/benchmarks/test_deq_figures.py
    looks for it)."""
    runs = [run for seeds in record["runs"].values() for run in seeds.values()]
    seeds = sorted(int(s) for arm in record["runs"].values() for s in arm)
    worst = max(max(run["max_evaluations"]) for run in runs)
    missed = sum(len(run["unconverged_epochs"]) for run in runs)
    seeds_text = (
        f"{seeds[0]}-{seeds[-1]}"
        if seeds == list(range(seeds[0], seeds[-1] + 1))
        else ", ".join(map(str, seeds))
    )
    if missed:
        return (
            f"in {missed} epochs of {len(runs) * record['epochs']} a training solve missed "
            f"{_tol_text(record['tol'])} (budget {record['max_iter']}); held-out seeds {seeds_text}"
        )
    return (
        f"every training solve met {_tol_text(record['tol'])} within {worst} evaluations in all "
        f"{record['epochs']} epochs of held-out seeds {seeds_text}"
    )


def bench_train(args, argv) -> None:
    import tempfile
    import warnings

    import torch

    from revgnn.deq import DEQConvergenceWarning

    warnings.simplefilter("ignore", DEQConvergenceWarning)
    torch.set_num_threads(args.threads)
    root = args.out_dir or tempfile.mkdtemp(prefix="bench_deq_train_")
    results = {}
    arms = args.arms
    for seed in args.seeds_list:
        for arm in arms:
            rows, summary, overrides, reused = train_run(
                args, seed, arm, os.path.join(root, f"{arm.folder}_s{seed}")
            )
            results[(arm.label, seed)] = (rows, summary, epoch_report(rows, args.pretrain_epochs))
            print(
                f"{arm.label} seed {seed}{' (reused)' if reused else ''}: "
                "forward evaluations per solve, max over each epoch: "
                f"{[int(s) for s in results[(arm.label, seed)][2]['steps']]}",
                flush=True,
            )
    if args.record:
        write_record(args, results, argv)
    own = {o for arm in arms for o in arm.overrides(args.jac_every)}
    shown = [o for o in overrides if o not in own and not o.startswith(("seed=", "name="))]
    print(
        f"\nruns in {root}\noverrides (besides the arm's and the seed): {' '.join(shown)}"
        f"; regularised arms: model.jac_reg_every={args.jac_every}"
    )
    metric = summary.get("metric", "score")
    epochs = len(rows)
    pre = args.pretrain_epochs
    note = f"; epochs 1-{pre} are unrolled pretraining, counted as their unrolled applications" if pre else ""
    print(
        f"\nEpochs whose every training forward solve reached rel. residual {args.tol:g} within "
        f"{EVAL_BUDGET} evaluations (budget {args.max_iter}){note}; residual over the solving epochs:\n"
    )
    spectral = args.spectral_radius_every > 0
    header = [
        "arm",
        "seed",
        f"epochs ≤ {EVAL_BUDGET} evaluations",
        "epochs over (their max evaluations)",
        "max evaluations, all epochs",
        "max rel. residual, DEQ epochs",
        *(["spectral radius, last epoch"] if spectral else []),
        f"best valid {metric} (epoch)",
        "test at best valid",
        "final valid",
        f"valid, last {TAIL} evaluations: mean (sd)",
    ]
    table = []
    for (label, seed), (_, summary, rep) in results.items():
        failed = ", ".join(f"{e} ({s})" for e, s in rep["failed"][:8])
        failed += f", ... ({len(rep['failed'])} in all)" if len(rep["failed"]) > 8 else ""
        table.append(
            [
                label,
                seed,
                f"{rep['ok']} / {epochs}",
                failed or "none",
                f"{rep['max_steps']:.0f}",
                f"{rep['max_residual']:.1e}",
                *([f"{float(rep['spectral_last']):.3f}"] if spectral else []),
                f"{summary['highest_valid']:.4f} ({summary['best_epoch']})",
                f"{summary['final_test']:.4f}",
                f"{rep['valid_final']:.4f}",
                f"{rep['valid_tail']:.4f} ({rep['valid_tail_sd']:.4f})",
            ]
        )
    print("\n".join(markdown_table(header, table, align="llrlrrrrrrr")), flush=True)

    seeds = args.seeds_list
    print(f"\nPer arm over seeds {', '.join(map(str, seeds))} (mean ± sample std):\n")
    summary_rows = []
    for arm in arms:
        reps = [results[(arm.label, s)][2] for s in seeds]
        sums = [results[(arm.label, s)][1] for s in seeds]
        first = sorted(r["failed"][0][0] for r in reps if r["failed"])
        summary_rows.append(
            [
                arm.label,
                f"{sum(r['ok'] == epochs for r in reps)} / {len(seeds)}",
                f"{sum(r['ok'] for r in reps)} / {epochs * len(seeds)}",
                f"{sum(r['unconverged'] for r in reps)}",
                f"{first[0]}-{first[-1]}" if first else "none",
                f"{max(r['max_steps'] for r in reps):.0f}",
                _mean_std(s["highest_valid"] for s in sums),
                _mean_std(s["final_test"] for s in sums),
                _mean_std(r["valid_final"] for r in reps),
                _mean_std(r["valid_tail"] for r in reps),
                f"{statistics.mean(r['valid_tail_sd'] for r in reps):.4f}",
            ]
        )
    print(
        "\n".join(
            markdown_table(
                [
                    "arm",
                    f"runs with every epoch ≤ {EVAL_BUDGET}",
                    f"epochs ≤ {EVAL_BUDGET}",
                    f"epochs with a solve stopped at {args.max_iter}",
                    "first epoch over, earliest-latest seed",
                    "max evaluations",
                    f"best valid {metric}",
                    "test at best valid",
                    "final valid",
                    f"valid, mean of last {TAIL} evaluations",
                    f"sd of a run's last {TAIL} evaluations, mean",
                ],
                summary_rows,
                align="lrrrrrrrrrr",
            )
        )
    )
    block = max(10, math.ceil(epochs / 60) * 10)
    starts = range(1, epochs + 1, block)
    print(
        f"\nEpochs over {EVAL_BUDGET} evaluations or unconverged, per {block} epochs, sum over the seeds:\n"
    )
    print(
        "\n".join(
            markdown_table(
                ["arm"] + [f"{a}-{min(a + block - 1, epochs)}" for a in starts],
                [
                    [arm.label]
                    + [
                        sum(
                            a <= e < a + block for s in seeds for e, _ in results[(arm.label, s)][2]["failed"]
                        )
                        for a in starts
                    ]
                    for arm in arms
                ],
                align="l" + "r" * len(starts),
            )
        )
    )

    ref = next((a.label for a in arms if not a.regularised), arms[0].label)
    others = [a.label for a in arms if a.label != ref]
    if not others:
        return
    print(
        f"\nPaired by seed, arm − {ref} (best valid / test at best valid / final valid / valid, mean of "
        f"the last {TAIL} evaluations):\n"
    )
    diffs = {w: [] for w in others}
    paired = []
    for s in seeds:
        cells = [s]
        for w in others:
            (a, ra), (b, rb) = (results[(w, s)][1:], results[(ref, s)][1:])
            d = (
                a["highest_valid"] - b["highest_valid"],
                a["final_test"] - b["final_test"],
                ra["valid_final"] - rb["valid_final"],
                ra["valid_tail"] - rb["valid_tail"],
            )
            diffs[w].append(d)
            cells.append(" / ".join(f"{x:+.4f}" for x in d))
        paired.append(cells)
    paired.append(
        ["mean ± std"]
        + [" / ".join(_mean_std((d[i] for d in diffs[w]), True) for i in range(4)) for w in others]
    )
    paired.append(
        ["seeds ≥ 0"] + [" / ".join(f"{sum(d[i] >= 0 for d in diffs[w])}" for i in range(4)) for w in others]
    )
    header = ["seed"] + [f"{w} − {ref}" for w in others]
    print("\n".join(markdown_table(header, paired, align="l" + "r" * len(others))), flush=True)


def main(argv=None, prog=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = parser(
        __doc__, prog, ["--nodes", "--hidden", "--threads", "--tol", "--max-iter", "--arms", "--seeds-list"]
    )
    p.add_argument("--epochs", type=int, default=30, help="epochs per run")
    p.add_argument("--eval-every", type=int, default=5, help="evaluate every this many epochs")
    p.add_argument(
        "--pretrain-epochs",
        type=int,
        default=0,
        help="epochs of unrolled weight-tied pretraining first (model.pretrain_epochs), every arm",
    )
    p.add_argument("--jac-every", type=int, default=1, help="model.jac_reg_every of the regularised arms")
    p.add_argument(
        "--spectral-radius-every",
        type=int,
        default=1,
        help="model.spectral_radius_every (0: off; the estimate draws from the global RNG, so it "
        "changes the run's dropout masks)",
    )
    p.add_argument("--out-dir", help="keep each run's output under this folder (default: a temp dir)")
    p.add_argument(
        "--record", help="write each run's per-epoch max evaluations to this JSON file (with the command)"
    )
    p.add_argument(
        "--reuse",
        action="store_true",
        help="take a run --out-dir already holds, completed with the same configuration, instead "
        "of training it again (same --threads assumed)",
    )
    bench_train(p.parse_args(argv), argv)


if __name__ == "__main__":
    main()
