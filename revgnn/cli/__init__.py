"""The console scripts: ``revgnn-train`` (:mod:`revgnn.cli.train`, its command line checked by
:mod:`revgnn.cli.overrides`), ``revgnn-evaluate`` (:mod:`revgnn.cli.evaluate`), ``revgnn-reproduce``
(:mod:`revgnn.cli.reproduce`) and ``revgnn-partition`` (:mod:`revgnn.cli.partition`). They ship in the
wheel, so every command of the README works from ``pip install .``. What they share at the Hydra
boundary: run and sweep directories (:mod:`revgnn.cli.run_dirs`), launchers (:mod:`revgnn.cli.launcher`),
override quoting (:mod:`revgnn.cli.quoting`), and here an option's range (:func:`ranged`) and the exit
of a refused run (:func:`refuse`)."""

from __future__ import annotations

import argparse
from typing import Any, Callable, Optional

from revgnn.errors import ConfigError

__all__ = ["ranged", "refuse"]


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


def refuse(error: ConfigError) -> None:
    """Ends ``revgnn-train`` with the message alone (logging is not set up yet; :func:`revgnn.cli.train.main`
    logs it the same way later) and status 2."""
    import sys

    print(f"revgnn-train: {error}", file=sys.stderr)
    sys.exit(2)
