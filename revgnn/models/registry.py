"""The model registry: ``register_model``, ``create_model``, ``list_models``.

Each model variant is a factory function decorated with :func:`register_model`;
its name is the function's name. ``create_model(name, **overrides)`` calls it;
overrides are checked against the model class so a typo is an error that lists
what exists, never silently ignored.
"""

from __future__ import annotations

import difflib
import fnmatch
import inspect
from typing import Any, Callable, Dict, List, Optional, Type

from torch import nn

_MODELS: Dict[str, Callable[..., nn.Module]] = {}


def register_model(fn: Optional[Callable[..., nn.Module]] = None, *, name: Optional[str] = None):
    """Registers a factory ``fn(**overrides) -> nn.Module`` under ``name`` (default: its name)."""

    def wrap(f: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        key = name or f.__name__
        if key in _MODELS and _MODELS[key] is not f:
            raise ValueError(f"a model named {key!r} is already registered")
        _MODELS[key] = f
        return f

    return wrap(fn) if fn is not None else wrap


def list_models(pattern: str = "*") -> List[str]:
    """Registered model names matching the shell-style ``pattern``, sorted."""
    return sorted(n for n in _MODELS if fnmatch.fnmatch(n, pattern))


def create_model(name: str, **overrides: Any) -> nn.Module:
    """Builds the registered model ``name`` with keyword ``overrides``.

    Raises:
        ValueError: ``name`` is not registered (the message lists the names).
        TypeError: an override is not an argument of the model.
    """
    if name not in _MODELS:
        close = difflib.get_close_matches(name, _MODELS, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"unknown model {name!r}.{hint} Available: {', '.join(list_models())}")
    return _MODELS[name](**overrides)


def model_arguments(cls: Type[nn.Module]) -> List[str]:
    """The keyword arguments of ``cls.__init__``."""
    params = inspect.signature(cls.__init__).parameters
    return [
        p
        for p in params
        if p != "self"
        and params[p].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]


def build(cls: Type[nn.Module], defaults: Dict[str, Any], overrides: Dict[str, Any]) -> nn.Module:
    """``cls(**{**defaults, **overrides})`` after checking every override name."""
    allowed = model_arguments(cls)
    unknown = sorted(set(overrides) - set(allowed))
    if unknown:
        raise TypeError(
            f"{cls.__name__} has no argument(s) {', '.join(map(repr, unknown))}; "
            f"valid overrides: {', '.join(allowed)}"
        )
    return cls(**{**defaults, **overrides})
