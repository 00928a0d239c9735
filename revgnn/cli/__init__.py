"""Console scripts besides ``revgnn-train``: ``revgnn-evaluate`` (:mod:`revgnn.cli.evaluate`),
``revgnn-reproduce`` (:mod:`revgnn.cli.reproduce`) and ``revgnn-partition``
(:mod:`revgnn.cli.partition`). They ship in the wheel, so every command of the
README works from ``pip install .``."""

from __future__ import annotations

import argparse
from typing import Any, Callable, Optional

__all__ = ["ranged"]


def ranged(kind: Callable[[str], Any], low: Optional[float] = None, high: Optional[float] = None) -> Callable:
    """An argparse ``type``: the option's text converted by ``kind`` (``int``, ``float``) and
    required in ``[low, high]`` (:class:`~revgnn.utils.ranges.Range`, as the config schemas'
    ranges), so ``--views 0`` is an error saying ``argument --views: must be >= 1, got 0``."""
    from revgnn.utils.ranges import Range

    bounds = Range(low, high)

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
        if not bounds.contains(value):
            raise argparse.ArgumentTypeError(f"must be {bounds.describe()}, got {value}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its own messages
    return parse
