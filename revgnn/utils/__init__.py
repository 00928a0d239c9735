"""Measurement and launch helpers.

``revgnn.utils.launch`` imports nothing heavy (entry points call it before torch is
loaded); the memory helpers are imported on first use.
"""
import importlib
from typing import Any

__all__ = ["SavedTensorBytes", "peak_rss_bytes"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("revgnn.utils.memory"), name)
    raise AttributeError(f"module 'revgnn.utils' has no attribute {name!r}")
