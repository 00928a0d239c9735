"""Measurement and launch helpers."""
from revgnn.utils.memory import SavedTensorBytes, peak_rss_bytes

__all__ = ["SavedTensorBytes", "peak_rss_bytes"]
