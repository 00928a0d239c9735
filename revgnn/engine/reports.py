"""What a run reports: ``metrics.csv`` (a row per epoch), ``summary.json`` (:class:`Summary`) and the
learning-curve plot; the one writer and the one reader of each. A sweep's table (:func:`sweep_table`:
mean ± std over the jobs that differ only in ``seed``) is written to the sweep directory as
``results.md`` and printed when the sweep ends (:class:`SweepTable`, a Hydra callback);
:func:`mean_std` is the one place that computes a mean ± std (``revgnn-reproduce`` uses it too).

Every file is written whole and atomically (:func:`~revgnn.engine.checkpoint.atomic_write_text`), so a
crash leaves the previous version. ``revgnn-reproduce`` and the benchmarks read summaries through
:meth:`Summary.read`, never by key strings of their own.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
from typing import Any, Dict, List, Optional

from revgnn.engine.checkpoint import atomic_write_text

__all__ = [
    "FIELDS",
    "Summary",
    "write_metrics",
    "plot_learning_curve",
    "mean_std",
    "sweep_table",
    "SweepTable",
]

#: metrics.csv's columns (model statistics follow). ``evaluation`` says what scored a row's train / valid /
#: test: ``selection`` (the in-training evaluation), ``checkpoint_test`` (the last row: the final test of
#: ``best.pt``, whose epoch the row's ``epoch`` is), empty when the epoch was not evaluated.
FIELDS = ["epoch", "evaluation", "loss", "train", "valid", "test", "epoch_time_s", "peak_memory_mb", "lr"]


@dataclasses.dataclass
class Summary:
    """A run's ``summary.json``: written at its end, and also after a divergence, an interruption or a
    failure (``status``). Scores are the data set's ``metric`` at ``best_epoch``, the epoch of the best
    validation score; ``model_stats`` are the last epoch's model statistics (e.g. DEQ convergence),
    stored at the top level of the file as in ``metrics.csv``."""

    name: str
    seed: int
    model: str
    data: str
    metric: str
    num_parameters: int
    epochs: int  #: epochs in the history (a resumed run's included)
    best_epoch: int
    highest_train: float
    highest_valid: float
    final_test: float  #: the test score at ``best_epoch``
    #: the separate test of ``best.pt`` (``{epoch, views, parts, train, valid, test}``), or None
    checkpoint_test: Optional[Dict[str, Any]]
    epoch_time_s: float  #: mean over the history's epochs
    peak_memory_mb: float  #: the whole run's peak (a resumed run's earlier processes included)
    device: str
    bf16: bool
    backend: str
    world_size: int
    status: str  #: completed, diverged, interrupted, or failed ... (with the epoch and the error's type)
    output_dir: str
    model_stats: Dict[str, float] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        """The JSON object of ``summary.json``: the fields, ``model_stats`` spread at the top level."""
        d = dataclasses.asdict(self)
        return {**d, **d.pop("model_stats")}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Summary":
        """The inverse of :meth:`to_dict`; a key the class lacks is a model statistic."""
        names = {f.name for f in dataclasses.fields(cls)} - {"model_stats"}
        missing = sorted(names - set(d))
        if missing:
            raise ValueError(f"not a revgnn run summary: no {', '.join(missing)}")
        return cls(**{k: d[k] for k in names}, model_stats={k: v for k, v in d.items() if k not in names})

    def write(self, path: str) -> None:
        atomic_write_text(json.dumps(self.to_dict(), indent=2), path)

    @classmethod
    def read(cls, path: str) -> "Summary":
        """Reads a run's ``summary.json``; a file that is not one is a :class:`ValueError` naming it."""
        with open(path) as f:
            try:
                return cls.from_dict(json.load(f))
            except (ValueError, TypeError) as e:
                raise ValueError(f"{path}: {e}") from e


def write_metrics(history: List[Dict[str, Any]], path: str, final: Optional[Dict[str, Any]] = None) -> None:
    """``metrics.csv``: one row per epoch (the loop's fields, then any model statistics), rewritten
    whole (atomically) from the history; then, when given, the ``checkpoint_test`` row of the final
    test (``final``: its epoch and scores)."""
    rows = list(history)
    if final is not None:
        rows.append(
            {
                "epoch": final["epoch"],
                "evaluation": "checkpoint_test",
                **{k: final[k] for k in ("train", "valid", "test")},
            }
        )
    extra = sorted({k for row in rows for k in row if k not in FIELDS})
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS + extra, lineterminator="\n", restval="")
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(buf.getvalue(), path)


def plot_learning_curve(history, metric: str, path: str, final: Optional[Dict[str, Any]] = None) -> None:
    """Training loss and train/valid/test scores against epochs, as a PNG (written atomically); the
    final test of ``best.pt`` (``final``), when given, as a star at its epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_score) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot([r["epoch"] for r in history], [r["loss"] for r in history])
    ax_loss.set(xlabel="epoch", ylabel="training loss", title="loss")
    evaluated = [r for r in history if r["valid"] != ""]
    for split in ("train", "valid", "test"):
        ax_score.plot([r["epoch"] for r in evaluated], [r[split] for r in evaluated], marker="o", label=split)
    if final is not None:
        label = f"test of best.pt ({final['views']} x {final['parts']})"
        ax_score.plot([final["epoch"]], [final["test"]], marker="*", markersize=12, ls="", label=label)
    ax_score.set(xlabel="epoch", ylabel=metric, title=metric)
    ax_score.legend()
    fig.tight_layout()
    tmp = f"{path}.tmp{os.getpid()}.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)


def mean_std(values) -> tuple:
    """``(mean, unbiased standard deviation)`` of ``values`` (``nan`` for the std of one value)."""
    import statistics

    values = list(values)
    mean = statistics.mean(values)
    std = statistics.stdev(values) if len(values) > 1 else float("nan")  # unbiased (n - 1)
    return mean, std


def _job_overrides(run_dir: str) -> List[str]:
    """The overrides of the job in ``run_dir`` (Hydra's ``.hydra/overrides.yaml``), or ``[]``."""
    path = os.path.join(run_dir, ".hydra", "overrides.yaml")
    if not os.path.exists(path):
        return []
    from omegaconf import OmegaConf

    return [str(o) for o in OmegaConf.load(path)]


def sweep_table(sweep_dir: str) -> Optional[str]:
    """A markdown table of the runs under ``sweep_dir`` (every ``summary.json``): one row per group of
    jobs whose overrides are equal but for ``seed``, with the number of seeds and the mean ± unbiased
    std of each reported score (best validation, the test score at that epoch, the final test of
    ``best.pt`` when run), and the jobs that did not complete. :obj:`None` when there is no summary."""
    import glob

    groups: Dict[tuple, List[Summary]] = {}
    for path in sorted(glob.glob(os.path.join(glob.escape(sweep_dir), "**", "summary.json"), recursive=True)):
        try:
            s = Summary.read(path)
        except ValueError:
            continue
        run_dir = os.path.dirname(path)
        key = tuple(o for o in _job_overrides(run_dir) if o.split("=", 1)[0].lstrip("+~") != "seed")
        groups.setdefault(key, []).append(s)
    if not groups:
        return None
    tested = any(s.checkpoint_test for ss in groups.values() for s in ss)
    common = [o for o in next(iter(groups)) if all(o in key for key in groups)]
    head = ["runs (overrides but seed)" if len(groups) > 1 else "runs", "metric", "seeds", "valid", "test"]
    head += ["test of best.pt"] if tested else []
    head += ["not completed"]
    lines = [
        f"# Sweep {sweep_dir}",
        "",
        "Mean ± unbiased std over the jobs that differ only in seed; valid is the best validation score,",
        "test the test score at that epoch. Jobs that did not complete are listed, not averaged.",
        "",
        f"Overrides of every job: `{' '.join(common) or 'none'}`.",
        "",
        "| " + " | ".join(head) + " |",
        "|---" * len(head) + "|",
    ]

    def cell(values) -> str:
        if not values:
            return ""
        mean, std = mean_std(values)
        return f"{mean:.4f} ± {std:.4f}" if len(values) > 1 else f"{mean:.4f}"

    for key, runs in groups.items():
        done = [s for s in runs if s.status == "completed"]
        row = [
            " ".join(o for o in key if o not in common) or "all",
            ", ".join(sorted({s.metric for s in runs})),
            ", ".join(str(s.seed) for s in sorted(done, key=lambda s: s.seed)),
            cell([s.highest_valid for s in done]),
            cell([s.final_test for s in done]),
        ]
        if tested:
            row.append(cell([s.checkpoint_test["test"] for s in done if s.checkpoint_test]))
        row.append(", ".join(f"seed {s.seed}: {s.status}" for s in runs if s.status != "completed"))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


try:  # a Hydra callback: only where Hydra is installed (it always is with revgnn-train)
    from hydra.experimental.callback import Callback as _Callback
except ImportError:  # pragma: no cover
    _Callback = object  # type: ignore[misc,assignment]


class SweepTable(_Callback):
    """Hydra callback (``hydra/default.yaml``): when a multirun ends, writes :func:`sweep_table` of its
    sweep directory to ``<sweep dir>/results.md`` and prints it with the directory."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        import sys

        sweep_dir = str(config.hydra.sweep.dir)
        table = sweep_table(sweep_dir)
        if table is None:
            print(
                f"revgnn-train: the sweep in {os.path.abspath(sweep_dir)} left no summary.json",
                file=sys.stderr,
            )
            return
        path = os.path.join(sweep_dir, "results.md")
        atomic_write_text(table, path)
        print(f"\n{table}\nwritten to {os.path.abspath(path)}", flush=True)
