"""SIGINT / SIGTERM during training: finish the step, save, say how to resume, exit non-zero.

A scheduler's SIGTERM (Slurm, Kubernetes, ``torchrun`` forwarding its own) or a Ctrl-C must not lose
the run, nor leave half a file. :class:`StopRequest` replaces the two handlers while the loop runs:
the first signal only sets a flag, which the loop reads after each optimiser step (all workers agree on
it in the step's one all-reduce, so they stop at the same step), then writes ``last.pt`` and
``summary.json`` and raises :class:`TrainingInterrupted`. A second SIGINT stops at once
(:class:`KeyboardInterrupt`), for a user who does not want to wait for the step.

The flag every worker contributes is its signal's number at its own rank (:meth:`StopRequest.flags`),
so the sum over the workers says which worker got which signal: a worker that got none reports its
peer's (``SIGINT (sent to rank 1)``) and exits with that signal's code, not a guessed SIGTERM.
"""

from __future__ import annotations

import signal
import threading
from typing import Dict, Optional, Tuple

import torch

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
        self.signum: Optional[int] = None  # this worker's own signal
        self.signals: Dict[int, int] = {}  # {rank: signal} of every worker, as last agreed (agree)
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

    def flags(self, rank: int = 0, world_size: int = 1) -> torch.Tensor:
        """``[world_size]`` float64: this worker's signal number at ``rank`` (0 for none), zeros
        elsewhere; summed over the workers (exact: small integers) it holds every worker's signal."""
        flags = torch.zeros(world_size, dtype=torch.float64)
        flags[rank] = float(self.signum or 0)
        return flags

    def agree(self, summed: torch.Tensor) -> bool:
        """Records the workers' summed :meth:`flags`; returns whether any worker asked to stop (the
        same answer on every worker: a signal that arrives after :meth:`flags` counts next time)."""
        self.signals = {r: int(s) for r, s in enumerate(summed.tolist()) if s > 0}
        return bool(self.signals)

    def reported(self, rank: int = 0) -> Tuple[int, str]:
        """The signal this worker stops on and how to name it: its own, else the lowest-ranked
        peer's (``"SIGINT (sent to rank 1)"``)."""
        if rank in self.signals or not self.signals:
            signum = self.signals.get(rank) or self.signum or signal.SIGTERM
            return signum, signal.Signals(signum).name
        peer = min(self.signals)
        signum = self.signals[peer]
        return signum, f"{signal.Signals(signum).name} (sent to rank {peer})"
