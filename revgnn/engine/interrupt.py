"""SIGINT / SIGTERM during training: finish the step, save, say how to resume, exit non-zero.

A scheduler's SIGTERM (Slurm, Kubernetes, ``torchrun`` forwarding its own) or a Ctrl-C must not lose
the run, nor leave half a file. :class:`StopRequest` replaces the two handlers while the loop runs:
the first signal only sets a flag, which the loop reads after each optimiser step (all workers agree on
it in the step's one all-reduce, so they stop at the same step), then writes ``last.pt`` and
``summary.json`` and raises :class:`TrainingInterrupted`. A second SIGINT stops at once
(:class:`KeyboardInterrupt`), for a user who does not want to wait for the step.
"""

from __future__ import annotations

import signal
import threading
from typing import Optional

__all__ = ["StopRequest", "TrainingInterrupted"]


class TrainingInterrupted(Exception):
    """Training stopped on a signal after saving ``last.pt``; ``exit_code`` is ``128 + signum``."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class StopRequest:
    """Context manager that turns SIGINT and SIGTERM into a flag (:attr:`signum`) for the loop.

    Outside the main thread (where Python cannot install handlers) it does nothing.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum: Optional[int] = None
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()

    @property
    def requested(self) -> bool:
        return self.signum is not None
