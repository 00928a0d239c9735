"""revgnn: a model zoo for very deep graph neural networks.

Submodules are imported lazily so that command-line entry points (``--help``)
do not pay for importing PyTorch Geometric.
"""

import importlib
from typing import Any

__version__ = "0.1.0"

_SUBMODULES = ("nn", "models", "deq", "data", "distributed", "utils")

#: Names of the public API reachable as ``revgnn.<name>``, by the submodule that defines them.
_EXPORTS = {
    "InvertibleModule": "nn",
    "GroupAddRev": "nn",
    "register_conv": "nn",
    "create_model": "models",
    "register_model": "models",
}

__all__ = ["__version__", *_SUBMODULES, *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"revgnn.{name}")
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"revgnn.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'revgnn' has no attribute {name!r}")
