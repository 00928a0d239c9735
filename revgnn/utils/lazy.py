"""Package attributes imported on first use (PEP 562), so that importing a package stays cheap.

A package lists where each public name lives and hands the lookup to :func:`lazy_exports`::

    _HOME = {"NodeDataset": "node_dataset", "load_ogbn": "ogbn"}
    __all__ = list(_HOME)
    __getattr__ = lazy_exports(__name__, _HOME)

``revgnn.data.NodeDataset`` then imports ``revgnn.data.node_dataset`` the first time it is read, and
``import revgnn.data.synthetic`` runs no other submodule: command-line ``--help`` and the config
schemas, which read the data loaders' signatures, do not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict

__all__ = ["lazy_exports"]


def lazy_exports(package: str, homes: Dict[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``package``: ``name`` is ``package.<homes[name]>.<name>``,
    imported when first read; any other name is an ``AttributeError``, as for a plain module."""

    def __getattr__(name: str) -> Any:
        if name in homes:
            return getattr(importlib.import_module(f"{package}.{homes[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
