"""The range a configurable value must lie in, declared once, where the value is declared.

* A **parameter** (a model's, a conv block's, the :class:`~revgnn.deq.DEQ`'s, a solver's, a data
  loader's) declares it in its annotation: ``num_layers: Annotated[int, Range(1)]``, ``dropout:
  Annotated[float, Range(0, 1, high_open=True)]``, ``Annotated[Optional[int], Range(1)]`` where
  :obj:`None` is allowed too. :mod:`revgnn.utils.signature` reads it, with the parameter's type and
  choices: :func:`~revgnn.utils.signature.check_arguments` and
  :func:`~revgnn.utils.signature.check_types` for options checked before anything is built (the
  model config before a run starts, :func:`revgnn.models.check_model_config`, with the conv options
  and DEQ options a model forwards and the solver options, :func:`revgnn.deq.check_solver_options`),
  and :func:`~revgnn.utils.signature.check_call`, with which constructors and solvers check their
  own arguments on entry. The error names the key: ``model.jac_reg_weight must be >= 0, got -1``.
* A data loader's config schema (:func:`revgnn.config.data_options.data_schema`) carries the ranges of the
  loader's parameters; a field of the hand-written schemas (``trainer``, ``optim``, ...), which is
  no callable's parameter, declares its own with :func:`revgnn.config.schema.ranged`.
  :func:`revgnn.config.schema.check_ranges` enforces both before a run starts.
* A command-line option of the other console scripts declares its own with :func:`revgnn.cli.ranged`
  (an argparse ``type``).

What spans several values (``hidden_channels`` divisible by ``num_groups``) is no range: the class's
``check_options`` classmethod checks it, called by its constructor and by the check before a run
starts. This module imports nothing, so loader modules can use it without slowing ``--help`` down.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

__all__ = ["Range"]


class Range(NamedTuple):
    """``low <= value <= high``; an open end (``low_open`` / ``high_open``) excludes its bound, and
    :obj:`None` leaves that side unbounded. :obj:`None` as a value (an ``Optional`` parameter left
    unset) is always inside."""

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False

    def contains(self, value) -> bool:
        if value is None:
            return True
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self) -> str:
        """``">= 0 and < 1"``: the condition in words, for error messages."""
        lo = "" if self.low is None else f"{'>' if self.low_open else '>='} {self.low}"
        hi = "" if self.high is None else f"{'<' if self.high_open else '<='} {self.high}"
        return " and ".join(b for b in (lo, hi) if b) or "any value"

    def __repr__(self) -> str:
        return f"Range({self.describe()})"
