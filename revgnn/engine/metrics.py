"""Scores by name, independent of OGB's data set names: what a data set of one's own is scored with
(``data.metric=accuracy|rocauc|f1|rmse|mae``, or the default of its task, :data:`DEFAULT_METRIC`).

Every function takes the targets in the training loop's shapes (``[n, 1]`` long classes for
``multiclass``; ``[n, T]`` float for ``multilabel`` 0/1 targets and ``regression`` values, NaN marking
an entry without a label) and the model's ``[n, C]`` logits, and returns a float:

* ``accuracy``: share of correct argmax classes (``multiclass``), or of labelled entries whose sign of
  the logit matches the 0/1 target (``multilabel``);
* ``rocauc``: ROC-AUC averaged over the tasks that have both classes among their labelled entries
  (OGB's rule for ogbn-proteins and ogbg-mol*); for ``multiclass``, one class against the rest on the
  softmax, averaged over the classes present;
* ``f1``: macro F1 over classes (``multiclass``) or F1 over all labelled entries, logit > 0 as
  positive (``multilabel``);
* ``rmse`` / ``mae``: root mean squared / mean absolute error over labelled entries (``regression``);
  lower is better (:data:`LOWER_IS_BETTER`): the loop selects the epoch with the lowest validation
  score, and ``highest_valid`` in ``summary.json`` is that best score.
"""

from __future__ import annotations

from typing import Callable, Dict

import torch
from torch import Tensor

__all__ = ["METRICS", "METRIC_TASKS", "DEFAULT_METRIC", "LOWER_IS_BETTER", "score", "better", "check_metric"]


def _accuracy(y: Tensor, logits: Tensor, task: str) -> float:
    if task == "multiclass":
        return float((logits.argmax(-1) == y.view(-1)).float().mean()) if y.numel() else float("nan")
    labelled = y == y
    return float(((logits > 0).float() == y)[labelled].float().mean())


def _rocauc(y: Tensor, logits: Tensor, task: str) -> float:
    from sklearn.metrics import roc_auc_score

    if task == "multiclass":
        prob = logits.float().softmax(-1)
        y = torch.nn.functional.one_hot(y.view(-1), logits.size(-1)).float()
        logits = prob
    scores = []
    for t in range(y.size(1)):
        labelled = y[:, t] == y[:, t]
        col = y[labelled, t]
        if col.numel() and 0 < float(col.sum()) < col.numel():
            scores.append(roc_auc_score(col.numpy(), logits[labelled, t].float().numpy()))
    if not scores:
        raise ValueError("rocauc: no task has both positive and negative labels in this split")
    return float(sum(scores) / len(scores))


def _f1(y: Tensor, logits: Tensor, task: str) -> float:
    from sklearn.metrics import f1_score

    if task == "multiclass":
        return float(
            f1_score(y.view(-1).numpy(), logits.argmax(-1).numpy(), average="macro", zero_division=0)
        )
    labelled = y == y
    return float(f1_score(y[labelled].numpy(), (logits[labelled] > 0).float().numpy(), zero_division=0))


def _errors(y: Tensor, logits: Tensor) -> Tensor:
    labelled = y == y
    return logits.float()[labelled] - y.float()[labelled]


def _rmse(y: Tensor, logits: Tensor, task: str) -> float:
    return float(_errors(y, logits).pow(2).mean().sqrt())


def _mae(y: Tensor, logits: Tensor, task: str) -> float:
    return float(_errors(y, logits).abs().mean())


#: name -> ``fn(y_true, logits, task)``
METRICS: Dict[str, Callable[[Tensor, Tensor, str], float]] = {
    "accuracy": _accuracy,
    "rocauc": _rocauc,
    "f1": _f1,
    "rmse": _rmse,
    "mae": _mae,
}
#: the tasks each metric scores
METRIC_TASKS = {
    "accuracy": ("multiclass", "multilabel"),
    "rocauc": ("multiclass", "multilabel"),
    "f1": ("multiclass", "multilabel"),
    "rmse": ("regression",),
    "mae": ("regression",),
}
#: the metric of a task when none is named
DEFAULT_METRIC = {"multiclass": "accuracy", "multilabel": "rocauc", "regression": "rmse"}
#: metrics where a lower score is better (the loop selects the lowest validation score)
LOWER_IS_BETTER = frozenset({"rmse", "mae"})


def check_metric(metric: str, task: str, where: str = "data.metric") -> None:
    """Raises :class:`~revgnn.errors.ConfigError` when ``metric`` is unknown or cannot score ``task``."""
    from revgnn.errors import ConfigError

    if metric not in METRICS:
        raise ConfigError(f"{where}={metric}: no such metric; choose one of {', '.join(METRICS)}")
    if task not in METRIC_TASKS[metric]:
        fits = [m for m, tasks in METRIC_TASKS.items() if task in tasks]
        raise ConfigError(f"{where}={metric} cannot score a {task} task; choose one of {', '.join(fits)}")


def score(metric: str, y_true: Tensor, logits: Tensor, task: str) -> float:
    """``metric`` of ``logits`` (``[n, C]``) against ``y_true`` for ``task``."""
    return METRICS[metric](y_true.cpu(), logits.detach().float().cpu(), task)


def better(metric: str, new: float, best: float, any_best: bool) -> bool:
    """Whether ``new`` improves on ``best`` under ``metric`` (``any_best``: whether there is one)."""
    if metric in LOWER_IS_BETTER:
        return not any_best or new < best
    return new > best
