"""One registry helper for everything chosen by name: models, conv blocks, DEQ solvers, backends.

A :class:`Registry` maps names to entries. :meth:`Registry.register` is the only way in: it refuses a
taken name and lets the registry's ``entry`` function check the object and say what to store (the
conv registry stores a :class:`~revgnn.nn.ConvSpec` read off the class, the solver registry checks the
signature). :meth:`Registry.get` returns an entry or raises :class:`UnknownName`, whose message lists
the registered names with the closest matches first (:mod:`difflib`), and :meth:`Registry.names`
lists them. The mapping is read-only otherwise, so no entry skips the checks;
:meth:`Registry.unregister` takes one out again (tests, notebooks).

Example:
    >>> ACTS = Registry("activation", how_to_add="see ACTS.register")
    >>> @ACTS.register("relu")
    ... def relu(x):
    ...     return max(x, 0.0)
    >>> ACTS.get("relu")(-2.0), ACTS.names()
    (0.0, ['relu'])
    >>> print(ACTS.unknown("rleu"))  # what ACTS.get("rleu") raises
    unknown activation 'rleu' (did you mean 'relu'?); choose one of relu (see ACTS.register)

This module imports nothing heavy: the config layer, which must not import torch, uses it too.
"""

from __future__ import annotations

import difflib
import fnmatch
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

__all__ = ["Registry", "UnknownName"]


class UnknownName(KeyError, ValueError):
    """A name no entry of the registry has. A :class:`KeyError` (it is a failed lookup) and a
    :class:`ValueError` (it is a bad value given by the user, e.g. ``model.conv=sag``)."""

    def __str__(self) -> str:  # KeyError's own would quote the message
        return str(self.args[0])


def _origin(obj: Any) -> str:
    """``module.qualname`` of a class or function (what a clash names), else its type."""
    qualname = getattr(obj, "__qualname__", None)
    return f"{obj.__module__}.{qualname}" if qualname else type(obj).__name__


class Registry:
    """Names to entries, each added by :meth:`register` and found by :meth:`get`.

    Args:
        kind (str): What an entry is, for messages (``"conv"``, ``"model"``).
        entry (callable, optional): ``entry(name, obj, **details) -> stored``, called by
            :meth:`register`; it raises if ``obj`` does not fit and returns what the registry
            stores for ``name`` (default: ``obj`` itself).
        how_to_add (str, optional): How a user adds an entry, appended to the message of an
            unknown name, e.g. ``"add your own with register_solver"``. (default: :obj:`""`)
    """

    def __init__(self, kind: str, entry: Optional[Callable[..., Any]] = None, how_to_add: str = ""):
        self.kind = kind
        self.how_to_add = how_to_add
        self._entry = entry
        self._entries: Dict[str, Any] = {}
        self._sources: Dict[str, Any] = {}  # what was registered, to tell a re-import from a clash

    def register(self, name: Optional[str] = None, obj: Any = None, **details: Any) -> Any:
        """Adds ``obj`` under ``name`` and returns ``obj``; without ``obj`` it is a decorator
        (``@REGISTRY.register("name")``; ``@REGISTRY.register()`` takes the object's ``__name__``).
        ``details`` go to the registry's ``entry`` function (e.g. a conv's ``factored_edges``).

        Registering the same class or function again (its module re-imported) replaces the entry;
        another object under a taken name is a :class:`ValueError` naming both.
        """
        if obj is None:
            return lambda target: self.register(name, target, **details)
        key = obj.__name__ if name is None else name
        if not isinstance(key, str) or not key:
            raise ValueError(f"a {self.kind} needs a non-empty string as its name, got {key!r}")
        old = self._sources.get(key)
        if old is not None and old is not obj and _origin(old) != _origin(obj):
            raise ValueError(
                f"a {self.kind} named {key!r} is already registered ({_origin(old)}); "
                f"register {_origin(obj)} under another name"
            )
        if details and self._entry is None:
            raise TypeError(f"the {self.kind} registry takes no details, got {', '.join(details)}")
        stored = obj if self._entry is None else self._entry(key, obj, **details)
        self._entries[key], self._sources[key] = stored, obj
        return obj

    def unregister(self, name: str) -> Any:
        """Removes ``name`` and returns its entry."""
        entry = self.get(name)
        del self._entries[name], self._sources[name]
        return entry

    def get(self, name: str) -> Any:
        """The entry of ``name``; :class:`UnknownName` (listing the names) if there is none."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):  # TypeError: an unhashable value given as a name
            raise self.unknown(name) from None

    __getitem__ = get

    def unknown(self, name: Any, prefix: str = "") -> UnknownName:
        """The error for ``name``: ``prefix`` (e.g. the config key), the closest names, all names."""
        close = difflib.get_close_matches(str(name), list(self._entries), n=3)
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        how = f" ({self.how_to_add})" if self.how_to_add else ""
        names = ", ".join(self.names()) or "none is registered"
        return UnknownName(f"{prefix}unknown {self.kind} {name!r}{hint}; choose one of {names}{how}")

    def names(self, pattern: str = "*") -> List[str]:
        """The registered names matching the shell-style ``pattern``, sorted."""
        return sorted(n for n in self._entries if fnmatch.fnmatchcase(n, pattern))

    def items(self) -> List[Tuple[str, Any]]:
        """``(name, entry)`` pairs, sorted by name."""
        return [(n, self._entries[n]) for n in self.names()]

    def values(self) -> List[Any]:
        """The entries, sorted by name."""
        return [self._entries[n] for n in self.names()]

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._entries
        except TypeError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"
