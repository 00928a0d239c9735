"""Measurement, memory and launch helpers.

``revgnn.utils.allocator`` imports nothing heavy (entry points call it before torch is
loaded); the memory helpers, ``FlatParameters`` and ``ModelOptimizer`` are imported on first use.
"""

from revgnn.utils.lazy import lazy_exports

_HOME = {
    "SavedTensorBytes": "memory",
    "peak_rss_bytes": "memory",
    "release_free_memory": "memory",
    "FlatParameters": "flat",
    "ModelOptimizer": "optimizer",
}
__all__ = list(_HOME)
__getattr__ = lazy_exports(__name__, _HOME)
