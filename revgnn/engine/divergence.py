r"""Divergence: a NaN or infinite loss, gradient norm, model output or solve ends training on every worker
at the same point, with ``status: diverged`` in ``summary.json`` and the last good checkpoint named.

Four places can first show it, and each is seen alike by every worker without a collective of its
own, because each is checked on values that a collective already made the same everywhere:

* the step's loss: the loop's one all-reduce of ``[loss, signals]`` per step
  (:func:`revgnn.engine.loop.train_step`);
* the gradients' global norm :math:`\lVert g \rVert_2` after they are summed over the workers
  (:meth:`revgnn.utils.optimizer.ModelOptimizer.step`): an all-reduce hands every worker the same
  bits, so every worker computes the same norm (a NaN or infinity in any worker's gradient reaches every
  sum). A finite loss can have a non-finite gradient (an overflow in the backward);
* the evaluation's predictions, checked by :func:`check_predictions` before they are scored (OGB's
  evaluator, through scikit-learn, would fail on them with ``Input contains NaN``): node tasks score
  logits summed over the workers, SAR the predictions gathered from all of them;
* a ``FloatingPointError`` raised in one worker's forward or backward (a DEQ solver's
  :class:`~revgnn.deq.SolverDivergenceError`): the worker sets its flag in the same step's all-reduce
  instead of raising past its peers, and only then, every worker having seen the flag, are the failed
  workers' messages gathered. (Under ``backend=sar`` a forward exchanges halos layer by layer, so a
  worker that raises mid-forward leaves its peers waiting there; they end with the peer named, as
  for any failed worker.)

A non-finite loss or gradient norm applies no update, so the weights stay those of the last step. The
loop turns the :class:`NonFiniteError` into :class:`TrainingDiverged` (:func:`diverged`), which adds the
epoch and the last good checkpoint; ``revgnn-train`` prints it as one message and exits with 1.
"""

from __future__ import annotations

from typing import Mapping, Optional

from torch import Tensor

__all__ = ["NonFiniteError", "TrainingDiverged", "check_predictions", "diverged"]


class NonFiniteError(FloatingPointError):
    """A loss, gradient norm or prediction is NaN or infinite: ``what`` says which, ``step`` is the
    step of the epoch (:obj:`None` for an evaluation) and ``updated`` whether that step's update was
    applied."""

    def __init__(self, what: str, step: Optional[int] = None, updated: bool = False):
        super().__init__(what)
        self.what, self.step, self.updated = what, step, updated


class TrainingDiverged(FloatingPointError):
    """Training stopped at a non-finite loss, gradient norm or prediction (see the module docstring)."""


def check_predictions(predictions: Mapping[str, Tensor], what: str = "the evaluation's") -> None:
    """Raises :class:`NonFiniteError` naming each split whose ``predictions`` hold a NaN or an
    infinity, with how many of how many entries."""
    bad = {}
    for split, pred in predictions.items():
        if pred.is_floating_point():
            count = int(pred.numel() - pred.isfinite().sum())
            if count:
                bad[split] = f"{split} {count} of {pred.numel()}"
    if bad:
        raise NonFiniteError(f"{what} predictions are NaN or infinite ({', '.join(bad.values())} entries)")


def diverged(e: FloatingPointError, epoch: int, last_good: str) -> TrainingDiverged:
    """The message a run stops with: what was not finite (a :class:`NonFiniteError`, or another
    ``FloatingPointError`` such as a DEQ solver's divergence), where, the last good checkpoint and
    what to try."""
    what, step = getattr(e, "what", f"{type(e).__name__}: {e}"), getattr(e, "step", None)
    where = f"epoch {epoch}" + (f", step {step}" if step is not None else "")
    update = " (no update was applied)" if step is not None and not getattr(e, "updated", True) else ""
    return TrainingDiverged(
        f"{what} at {where}: training diverged{update}. Last good checkpoint: {last_good}. "
        f"Try a lower optim.lr or trainer.grad_clip."
    )
