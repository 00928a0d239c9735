"""What a training run holds: :class:`Run` (what its epochs work with), its :class:`RunState` (what it
carries from epoch to epoch) and its :class:`Checkpoints` (the life cycle of its checkpoint files).

The loop (:mod:`revgnn.engine.loop`) builds one :class:`Run` per job and passes it to every part of
itself, down to :func:`~revgnn.engine.loop.train_step`; the run's files are written, copied, set aside
and resumed from only through :class:`Checkpoints`, whose format is :mod:`revgnn.engine.checkpoint`'s.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import torch
from omegaconf import DictConfig

from revgnn.engine.checkpoint import (
    BEST,
    LAST,
    SCHEDULED_BEST,
    Trained,
    atomic_copy,
    load_trained,
    restore,
    save_checkpoint,
)
from revgnn.engine.interrupt import StopRequest

if TYPE_CHECKING:
    from revgnn.utils.optimizer import ModelOptimizer

__all__ = ["Run", "RunState", "Checkpoints"]

log = logging.getLogger("revgnn.train")


@dataclasses.dataclass
class RunState:
    """What the loop carries from epoch to epoch, and a checkpoint holds besides the model, the
    optimiser and the RNG: ``epoch`` complete epochs and ``step`` steps of the next (``partial``: that
    epoch's loss sum, count and time so far), the metrics rows, the best evaluation
    (``{epoch, train, valid, test}``) and the final test of ``best.pt`` (not checkpointed).

    Evaluations run every ``trainer.eval_every`` epochs and at the run's last epoch. An evaluation of
    the last epoch that is off that schedule is a *closing* one: ``closing_best`` keeps the best
    before it, and :meth:`reopen` undoes it when a resumed run trains past that epoch — so ``N``
    epochs and ``k`` + ``N - k`` epochs give the same history and ``best.pt`` for every ``k``."""

    epoch: int = 0
    step: int = 0
    partial: Optional[Dict[str, float]] = None
    history: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    best: Dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"epoch": 0, "train": math.nan, "valid": -math.inf, "test": math.nan}
    )
    closing_best: Optional[Dict[str, Any]] = None
    checkpoint_test: Optional[Dict[str, Any]] = None

    def reopen(self) -> bool:
        """Undoes a closing evaluation of the last epoch before training past it: its row loses its
        scores and the best is the scheduled one again. Returns whether the closing evaluation was the
        best (``best.pt`` is then its epoch's: :meth:`Checkpoints.resume` puts the scheduled one back)."""
        if self.closing_best is None:
            return False
        row = self.history[-1]
        improved = self.best["epoch"] == row["epoch"]
        row.update(evaluation="", train="", valid="", test="")
        self.best, self.closing_best = self.closing_best, None
        return improved


class Checkpoints:
    """The checkpoint files of the run directory ``directory`` and their life cycle: ``last.pt`` after
    every epoch (and at a stop inside one), ``best.pt`` a byte copy of it when the evaluation improved,
    the scheduled ``best.pt`` set aside by a closing evaluation (:class:`RunState`) and put back when a
    resume trains past it, and the resume itself. Every worker calls the same methods (saving gathers
    every worker's RNG state); only the ``writer`` rank touches the files, each write atomic
    (:mod:`revgnn.engine.checkpoint`)."""

    def __init__(self, directory: str, writer: bool):
        self.directory = directory
        self.writer = writer
        self.last = os.path.join(directory, LAST)
        self.best = os.path.join(directory, BEST)
        self.scheduled_best = os.path.join(directory, SCHEDULED_BEST)

    def save(self, run: "Run", improved: bool = False) -> None:
        """Writes ``last.pt`` of ``run.state`` (pickled once); with ``improved``, ``best.pt`` becomes a
        byte copy of it (after setting the scheduled ``best.pt`` aside when this evaluation is a
        closing one). All workers take part: each one's RNG state is gathered."""
        device = run.backend.device
        rng = run.backend.gather(
            {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            },
            "all_gather of the RNG states for last.pt",
        )
        if not self.writer:
            return
        save_checkpoint(self.last, run, rng)
        if improved:
            if run.state.closing_best is not None and os.path.exists(self.best):
                os.replace(self.best, self.scheduled_best)
            atomic_copy(self.last, self.best)

    def resume(self, run: "Run", ckpt: Dict[str, Any]) -> None:
        """Restores ``ckpt`` (read from ``run.cfg.ckpt_path``) into ``run`` (its model, optimiser, RNG
        and :attr:`Run.state`; :func:`~revgnn.engine.checkpoint.restore`'s checks) and, when the run
        trains on past the checkpoint's epoch, undoes a closing evaluation (:meth:`RunState.reopen`)
        and its ``best.pt``."""
        run.state = state = RunState(**restore(ckpt, run))
        epochs = run.cfg.trainer.epochs
        if state.epoch >= epochs:
            log.warning(
                "checkpoint is at epoch %d >= trainer.epochs=%d: nothing to train", state.epoch, epochs
            )
            return
        if not state.reopen() or not self.writer:
            return
        if os.path.exists(self.scheduled_best):
            os.replace(self.scheduled_best, self.best)
        elif state.best["epoch"] == 0 and os.path.exists(self.best):  # no scheduled evaluation before it
            os.remove(self.best)

    def load_best(self, epoch: int) -> Optional[Trained]:
        """``best.pt`` of the best evaluation, at ``epoch`` (``0``: none); :obj:`None` with a warning
        when no evaluation saved one here. Raises when ``best.pt`` holds another epoch (another run
        wrote into the directory)."""
        if not epoch or not os.path.exists(self.best):
            log.warning(
                "no %s from this run (no evaluation improved on -inf, or the best epoch was written to "
                "another output_dir before a resume): the final test is skipped",
                self.best,
            )
            return None
        best = load_trained(self.best)
        if best.epoch != epoch:
            raise RuntimeError(
                f"{self.best} holds epoch {best.epoch}, but the best validation score was at epoch "
                f"{epoch}: another run wrote into this directory. Give each run its own output_dir"
            )
        return best

    def last_good(self, state: RunState) -> str:
        """``last.pt`` and its epoch, for the message of a divergence."""
        if os.path.exists(self.last) and state.history:
            return f"{self.last} (epoch {state.history[-1]['epoch']})"
        return "none (no epoch finished)"

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.directory!r}, writer={self.writer})"


@dataclasses.dataclass
class Run:
    """What a run's epochs work with, set up once by the loop (:mod:`revgnn.engine.loop`), and the
    :class:`RunState` they carry on. :func:`~revgnn.engine.loop.train_step` reads the first six fields
    alone, so a step can be taken with a :class:`Run` of just those (tests, benchmarks)."""

    model: torch.nn.Module
    task: Any  #: batches, loss and evaluation of this worker's data (:mod:`revgnn.engine.tasks`)
    optimizer: "ModelOptimizer"  #: the optimiser with its flat buffer and gradient clipping
    backend: Any  #: the :class:`~revgnn.engine.backends.Backend` (a task's ``Workers``)
    autocast: Any = None  #: the bf16 autocast context, or None
    stop: StopRequest = dataclasses.field(default_factory=StopRequest)  #: signals received
    cfg: Optional[DictConfig] = None  #: the composed ``train.yaml``
    files: Optional[Checkpoints] = None  #: the run directory's checkpoints
    state: RunState = dataclasses.field(default_factory=RunState)
    num_params: int = 0
    tb: Any = None  #: the TensorBoard writer (the writer rank, ``logger.tensorboard``), or None

    @property
    def out_dir(self) -> str:
        return self.files.directory

    @property
    def writer(self) -> bool:
        return self.backend.is_writer
