"""What a run reports: ``metrics.csv`` (a row per epoch), ``summary.json`` (:class:`Summary`) and the
learning-curve plot; the one writer and the one reader of each.

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

__all__ = ["FIELDS", "Summary", "write_metrics", "plot_learning_curve"]

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
