"""The range a configurable value must lie in, declared where the value is a parameter.

A data loader declares it in its signature, ``num_nodes: Annotated[int, Range(1)] = 6000``; the config
schema derived from that signature (:func:`revgnn.config.data_schema`) carries it, and
:func:`revgnn.config.check_ranges` enforces it, naming the key, before a run starts. Schema fields
declare theirs with :func:`revgnn.config.ranged`. This module imports nothing, so loader modules can use
it without slowing ``--help`` down.
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
