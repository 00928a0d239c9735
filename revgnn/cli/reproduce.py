"""``revgnn-reproduce``: runs an experiment over several seeds and writes a markdown table next to the
paper's numbers.

    revgnn-reproduce --experiment proteins_revgnn_deep --data-root data
    revgnn-reproduce --experiment proteins_wt_revgnn --seeds 10 model.hidden_channels=80
    revgnn-reproduce --smoke        # same pipeline, fake OGB graph, 1 epoch
    revgnn-reproduce --launcher slurm --data-root /data hydra.launcher.partition=gpu   # on SLURM

Without ``--launcher`` each seed is one ``python -m revgnn.train experiment=<name> seed=<s>`` process,
one after the other, writing into ``<out>/seed_<s>`` (a second call with the same ``--out`` is refused
by those runs, which never replace an earlier one: pass ``overwrite=true`` among the overrides to
run again there). With ``--launcher slurm|local`` the seeds are one Hydra sweep,
``revgnn.train -m hydra/launcher=slurm|local seed=0,...,n-1`` into ``<out>/sweep/<time>/``
(``revgnn/configs/hydra/launcher/``): ``slurm`` submits one SLURM job per seed (``hydra.launcher.*``
overrides set partition, GPUs, time limit...), ``local`` runs them as local processes (both are
Hydra's submitit launcher: ``pip install "revgnn[cluster]"``). Either way
each job's ``summary.json`` (best validation, the test score at that epoch and, for experiments with
``trainer.test_views``, the final multi-view test of ``best.pt``, the column the paper's number sits in)
feeds the table: mean ± unbiased standard deviation over seeds, parameters, peak memory and time per epoch.

A run that trained fewer epochs than the experiment's recipe (``trainer.epochs=...`` among the
overrides, or ``--smoke``), or whose overrides change the recipe (``model.num_layers=2``,
``optim.lr=...``: the model, data, optimiser or trainer), says so in the table's title and beside
each of its numbers: not the paper's configuration.
``--smoke`` writes a tiny raw ogbn-proteins directory, shrinks the model to 2 layers x 8 channels and
runs 1 epoch per seed, so the whole path (OGB loader, training, multi-view evaluation, table) is checked
in a minute.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from revgnn.cli import ranged

if TYPE_CHECKING:
    from revgnn.engine.reports import Summary
    from revgnn.models.registry import Reported

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
#: ``--launcher``'s choices: revgnn's ``hydra/launcher`` options (``configs/hydra/launcher/``).
LAUNCHERS = tuple(sorted(p.stem for p in (CONFIG_DIR / "hydra" / "launcher").glob("*.yaml")))


def reproducible_experiments() -> List[str]:
    """The experiments that reproduce a published score (the model registry's ``reported`` entries):
    ``--experiment``'s choices."""
    from revgnn.models import list_models, model_info

    return sorted(r.experiment for n in list_models() for r in model_info(n).reported if r.experiment)


def paper_score(experiment: str) -> Tuple[str, "Reported"]:
    """The published score ``experiment`` reproduces, from the model registry
    (:func:`revgnn.models.registry.paper_result`): its label for the table and the
    :class:`~revgnn.models.registry.Reported` score (``.score()`` is how it is written)."""
    from revgnn.models.registry import paper_result

    found = paper_result(experiment)
    if found is None:
        raise SystemExit(
            f"revgnn-reproduce: experiment {experiment!r} reproduces no published score; "
            f"those that do: {', '.join(reproducible_experiments())}"
        )
    info, result = found
    return f"{result.label}, {info.dataset} {result.metric}", result


def _mean_std(values):
    from revgnn.engine.reports import mean_std

    return mean_std(values)


def _compose(experiment: str, overrides: Sequence[str] = ()):
    from hydra import compose, initialize_config_dir

    from revgnn.config.store import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=[f"experiment={experiment}", *overrides])


def recipe_epochs(experiment: str) -> int:
    """``trainer.epochs`` of the experiment as shipped (no overrides): the recipe a table is held to."""
    return int(_compose(experiment).trainer.epochs)


def _smoke_overrides(experiment: str, data_root: str) -> List[str]:
    """Shrinks whichever size keys the experiment's model config has."""
    cfg = _compose(experiment)
    out = [
        f"data.root={data_root}",
        "trainer.epochs=1",
        "trainer.train_parts=2",
        "trainer.eval_views=2",
        "trainer.eval_parts=2",
        "trainer.eval_every=1",
        "logger.progress_bar=false",
    ]
    if cfg.trainer.test_views is not None:  # the final test of best.pt, shrunk like the evaluation
        out += ["trainer.test_views=2", "trainer.test_parts=2"]
    from revgnn.models import model_arguments

    arguments = model_arguments(cfg.model.name)
    for key, value in (("num_layers", 2), ("hidden_channels", 8), ("max_iter", 3), ("pretrain_depth", 2)):
        if key in arguments:
            out.append(f"model.{key}={value}")
    return out


def recipe_changes(overrides: Sequence[str]) -> List[str]:
    """The ``overrides`` that change the experiment's recipe: those of the model, data, optimiser and
    trainer (their groups or keys), except the keys a resume may change as well because they leave
    the run as it is (``revgnn.engine.checkpoint.RESUME_FREE``: where the data is, the final test's
    views) and ``trainer.epochs``, which a table reports as a short run."""
    from revgnn.engine.checkpoint import RESUME_FREE

    out = []
    for o in overrides:
        key = o.lstrip("+~").split("=", 1)[0]
        if (
            key.split(".")[0].split("/")[0] in ("model", "data", "optim", "trainer")
            and key not in RESUME_FREE
        ):
            out.append(o)
    return out


def _epochs_label(epochs: Sequence[int], recipe: int) -> str:
    lo, hi = min(epochs), max(epochs)
    return f"{lo} of {recipe} epochs" if lo == hi else f"{lo}-{hi} of {recipe} epochs"


def format_table(
    experiment: str,
    summaries: List["Summary"],
    overrides: Sequence[str],
    recipe: int,
    smoke: bool = False,
    runs: Optional[str] = None,
) -> str:
    """The markdown table of ``summaries`` (one per seed). When ``smoke`` or any seed trained fewer than
    ``recipe`` epochs, or ``overrides`` change the recipe (:func:`recipe_changes`: the model, data,
    optimiser or trainer), the title says so and every number of this run carries the label."""
    label, reported = paper_score(experiment)
    epochs = [s.epochs for s in summaries]
    short = smoke or min(epochs) < recipe
    changed = [] if smoke else recipe_changes(overrides)  # a smoke run changes everything: it says so
    notes = (["smoke"] if smoke else []) + ([_epochs_label(epochs, recipe)] if short else [])
    notes += [f"changed: {' '.join(changed)}"] if changed else []
    tag = f" ({', '.join(notes)})" if notes else ""
    if smoke:
        title = (
            f"# {experiment} (smoke: fake data, tiny model, {_epochs_label(epochs, recipe)} — not a result)"
        )
    elif changed:
        title = (
            f"# {experiment} (not the paper's configuration: {' '.join(changed)}"
            f"{', ' + _epochs_label(epochs, recipe) if short else ''} — not comparable to the paper)"
        )
    elif short:
        title = f"# {experiment} (short run: {_epochs_label(epochs, recipe)} — not comparable to the paper)"
    else:
        title = f"# {experiment}"
    valid = _mean_std([100 * s.highest_valid for s in summaries])
    test = _mean_std([100 * s.final_test for s in summaries])
    # the final test of best.pt (trainer.test_views), a column of its own when the runs have it
    tested = [s.checkpoint_test for s in summaries]
    if any(t is None for t in tested) and not all(t is None for t in tested):
        raise ValueError(
            "some seeds ran the final test of best.pt and others did not: one table needs one protocol"
        )
    final = tested[0] is not None
    if final:
        protocols = {(t["views"], t["parts"]) for t in tested}
        if len(protocols) > 1:
            raise ValueError(f"the seeds' final tests used different views x parts: {sorted(protocols)}")
        ((views, parts),) = protocols
        checkpoint = _mean_std([100 * t["test"] for t in tested])
    params = summaries[0].num_parameters
    memory = max(s.peak_memory_mb for s in summaries)
    epoch_time = statistics.mean(s.epoch_time_s for s in summaries)
    device = summaries[0].device
    paper = reported.score()

    def seed_entry(s: "Summary") -> str:
        entry = f"{s.seed}: {100 * s.highest_valid:.2f} / {100 * s.final_test:.2f} / {s.best_epoch}"
        if final:
            entry += f" / {100 * s.checkpoint_test['test']:.2f}"
        if short:
            entry += f" ({'smoke, ' if smoke else ''}{s.epochs} of {recipe} epochs)"
        return entry + (" (changed)" if changed else "")

    lines = [
        title,
        "",
        f"{len(summaries)} seeds; metric: {summaries[0].metric} × 100; mean ± unbiased std. "
        f"Epochs per seed: {_epochs_label(epochs, recipe)} (the recipe's trainer.epochs: {recipe}). "
        f"Extra overrides: `{' '.join(overrides) or 'none'}`.",
    ]
    if runs:
        lines.append(f"Runs: `{runs}`.")
    # valid and test: the selection evaluation at the best epoch; with a final test, the paper's number
    # (the official test.py's multi-view test of the saved best model) sits in its column
    head = ["valid", "test"] + ([f"test of best.pt ({views} × {parts} views)"] if final else [])
    ours = [f"{valid[0]:.2f} ± {valid[1]:.2f}{tag}", f"{test[0]:.2f} ± {test[1]:.2f}{tag}"]
    ours += [f"{checkpoint[0]:.2f} ± {checkpoint[1]:.2f}{tag}"] if final else []
    theirs = ["", "", paper] if final else ["", paper]
    rest = ["#params", "peak memory (MB, " + device + ")", "time / epoch (s)"]
    lines += [
        "",
        "| | " + " | ".join(head + rest) + " |",
        "|---" * (1 + len(head) + len(rest)) + "|",
        "| this run | "
        + " | ".join(ours + [f"{params:,}{tag}", f"{memory:.0f}{tag}", f"{epoch_time:.2f}{tag}"])
        + " |",
        f"| paper ({label}) | " + " | ".join(theirs + ["", "", ""]) + " |",
        "",
        f"Per seed (valid / test / best epoch{' / test of best.pt' if final else ''}): "
        + ", ".join(seed_entry(s) for s in summaries),
        "",
    ]
    return "\n".join(lines)


def _run_sequential(args, out: Path, seeds: int, overrides: List[str]) -> List["Summary"]:
    summaries = []
    for seed in range(seeds):
        run_dir = out / f"seed_{seed}"
        cmd = [
            sys.executable,
            "-m",
            "revgnn.train",
            f"experiment={args.experiment}",
            f"seed={seed}",
            f"output_dir={run_dir}",
            f"hydra.run.dir={run_dir}",
            *overrides,
        ]
        print("$", " ".join(cmd), flush=True)
        code = subprocess.run(cmd).returncode
        if code:  # the run has said why, above
            raise SystemExit(f"revgnn-reproduce: the run of seed {seed} failed (exit status {code})")
        summaries.append(_read_summary(run_dir / "summary.json"))
    return summaries


def _read_summary(path: Path) -> "Summary":
    from revgnn.engine.reports import Summary

    return Summary.read(str(path))


def _run_sweep(args, out: Path, seeds: int, overrides: List[str]) -> tuple:
    """All seeds as one Hydra multirun through ``--launcher``; the jobs' summaries, found by globbing
    the sweep directory (whatever ``hydra.sweep.subdir`` names the job directories)."""
    from revgnn.cli.launcher import check_launcher
    from revgnn.errors import ConfigError

    try:
        check_launcher([f"hydra/launcher={args.launcher}"])
    except ConfigError as e:
        raise SystemExit(f"revgnn-reproduce: --launcher {args.launcher}: {e}") from None
    sweep_dir = (out / "sweep" / time.strftime("%Y-%m-%d_%H-%M-%S")).resolve()
    cmd = [
        sys.executable,
        "-m",
        "revgnn.train",
        "-m",
        f"hydra/launcher={args.launcher}",
        f"experiment={args.experiment}",
        "seed=" + ",".join(str(s) for s in range(seeds)),
        f"hydra.sweep.dir={sweep_dir}",
        *overrides,
    ]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    by_seed: Dict[int, List["Summary"]] = {}
    for path in sorted(sweep_dir.rglob("summary.json")):
        s = _read_summary(path)
        by_seed.setdefault(s.seed, []).append(s)
    missing = [s for s in range(seeds) if s not in by_seed]
    if missing:
        raise SystemExit(f"revgnn-reproduce: no summary.json for seed(s) {missing} under {sweep_dir}")
    several = {s: len(v) for s, v in by_seed.items() if len(v) > 1}
    if several:
        raise SystemExit(
            f"revgnn-reproduce: several runs per seed under {sweep_dir} ({several}); an override "
            "with a comma sweeps it as well: pass one value per key"
        )
    return [by_seed[s][0] for s in range(seeds)], sweep_dir


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="revgnn-reproduce", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--experiment",
        default="proteins_revgnn_deep",
        choices=reproducible_experiments(),
        help="an experiment that reproduces a published score (default: proteins_revgnn_deep)",
    )
    parser.add_argument("--seeds", type=ranged(int, 1), default=10, help="seeds 0 .. n-1 (default: 10)")
    parser.add_argument("--data-root", default=None, help="directory holding ogbn_proteins/ (data.root)")
    parser.add_argument("--out", default=None, help="output directory (default: reproduce/<experiment>)")
    parser.add_argument("--smoke", action="store_true", help="1 epoch, 2 seeds, tiny model, fake OGB data")
    parser.add_argument(
        "--launcher",
        default=None,
        choices=LAUNCHERS,
        help="run the seeds as one Hydra sweep through hydra/launcher=slurm (one SLURM job per seed) "
        "or local (the same jobs as local processes); both need the cluster extra, "
        'pip install "revgnn[cluster]" (default: one process per seed, in turn)',
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        help="extra Hydra overrides passed to every run (hydra.launcher.* ones configure the launcher)",
    )
    return parser


def main(argv: Optional[Sequence[str]] = None) -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    args = build_parser().parse_args(argv)
    launcher_keys = [o for o in args.overrides if o.lstrip("+~").startswith("hydra.launcher.")]
    if launcher_keys and not args.launcher:
        raise SystemExit(f"revgnn-reproduce: {' '.join(launcher_keys)} given without --launcher")

    out = Path(args.out or f"reproduce/{args.experiment}{'_smoke' if args.smoke else ''}")
    out.mkdir(parents=True, exist_ok=True)
    overrides = list(args.overrides)
    seeds = args.seeds
    if args.smoke:
        from revgnn.data.graph_dataset import OGBG_DATASETS
        from revgnn.testing.fake_ogb import write_fake_ogbg, write_fake_ogbn

        root = (out / "fake_ogb").resolve()
        name = _compose(args.experiment).data.get("name")  # the experiment's OGB data set, faked
        if name is not None and not (root / name.replace("-", "_")).exists():
            if name in OGBG_DATASETS:
                write_fake_ogbg(str(root), name, num_graphs=60)
            else:
                write_fake_ogbn(str(root), name, num_nodes=96, avg_degree=6)
        overrides = _smoke_overrides(args.experiment, str(root)) + overrides
        seeds = min(seeds, 2)
    elif args.data_root:
        overrides.append(f"data.root={args.data_root}")

    if args.launcher:
        summaries, runs = _run_sweep(args, out, seeds, overrides)
    else:
        summaries, runs = _run_sequential(args, out, seeds, overrides), out
    table = format_table(
        args.experiment,
        summaries,
        overrides,
        recipe_epochs(args.experiment),
        smoke=args.smoke,
        runs=str(runs),
    )
    (out / "results.md").write_text(table)
    print(table)
    print(f"written to {out / 'results.md'}")


if __name__ == "__main__":
    main()
