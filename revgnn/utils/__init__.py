"""Measurement, memory and launch helpers.

``revgnn.utils.launch`` imports nothing heavy (entry points call it before torch is
loaded); the memory helpers and ``FlatParameters`` are imported on first use.
"""

import importlib
from typing import Any

_HOME = {
    "SavedTensorBytes": "memory",
    "peak_rss_bytes": "memory",
    "release_free_memory": "memory",
    "FlatParameters": "flat",
}
__all__ = list(_HOME)


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"revgnn.utils.{_HOME[name]}"), name)
    raise AttributeError(f"module 'revgnn.utils' has no attribute {name!r}")
