"""Keyword arguments checked against the signature that takes them: names, types, choices and ranges.

A model forwards options it does not use itself to what does (a conv block's options, the
:class:`~revgnn.deq.DEQ`'s); the signature of that callable is the one definition of which options
exist, their types (annotations: ``int``, ``float``, ``bool``, ``str``, ``Optional[...]``,
``Literal[...]`` for a choice, mappings and sequences), their ranges
(``Annotated[int, Range(1)]``, :class:`~revgnn.utils.ranges.Range`) and defaults.
:func:`check_arguments` checks a mapping of arguments against it before anything is built, so that
``model.hidden_channels=abc``, ``model.aggr=maxx`` or ``model.jac_reg_weight=-1`` is one message
naming the key and what it must be, not an error from deep inside torch or PyG; a constructor checks
its own arguments against the same annotations with :func:`check_call`, so the range is written
once, on the parameter.

Example:
    >>> from typing import Literal
    >>> def block(channels: int, aggr: Literal["max", "mean"] = "max", t: float = 1.0): ...
    >>> check_arguments(block, {"aggr": "mean", "t": 2}, what="the block")
    >>> check_arguments(block, {"aggr": "maxx"}, what="the block", prefix="model.")
    Traceback (most recent call last):
    ...
    ValueError: model.aggr must be one of 'max', 'mean', got 'maxx'
    >>> def layer(channels: Annotated[int, Range(1)], p: Annotated[float, Range(0, 1, high_open=True)] = 0.0):
    ...     check_call(layer, locals())
    >>> layer(8, p=1.5)
    Traceback (most recent call last):
    ...
    ValueError: p must be >= 0 and < 1, got 1.5

This module imports nothing heavy (the config layer, :mod:`revgnn.config`, may use it).
"""

from __future__ import annotations

import collections.abc
import difflib
import inspect
import typing
from typing import (
    Annotated,
    Any,
    Callable,
    Dict,
    Iterable,
    Literal,
    Mapping,
    Optional,
    Union,
    get_args,
    get_origin,
)

from revgnn.utils.ranges import Range

__all__ = [
    "keyword_parameters",
    "takes_options",
    "with_defaults",
    "expected",
    "check_types",
    "check_arguments",
    "check_call",
]


def keyword_parameters(fn: Callable, skip: Iterable[str] = ()) -> Dict[str, inspect.Parameter]:
    """The parameters of ``fn`` (a class: its ``__init__``) that can be given by keyword, less
    ``skip`` and ``self``, with their annotations resolved (``from __future__ import annotations``
    leaves strings); an annotation that does not resolve is left unchecked."""
    target = fn.__init__ if isinstance(fn, type) else fn
    try:
        hints = typing.get_type_hints(target, include_extras=True)
    except Exception:  # a name only imported under TYPE_CHECKING (often the return type): each alone
        hints = _each_hint(target)
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {
        name: p.replace(annotation=hints.get(name, inspect.Parameter.empty))
        for name, p in inspect.signature(target).parameters.items()
        if p.kind in kinds and name != "self" and name not in set(skip)
    }


def _each_hint(fn: Callable) -> Dict[str, Any]:
    """The annotations of ``fn``'s parameters that resolve one by one (``from __future__ import
    annotations`` leaves strings), where :func:`typing.get_type_hints` fails for all of them at once
    because one name (e.g. the return type's) is imported only under ``TYPE_CHECKING``."""
    out = {}
    namespace = getattr(inspect.unwrap(fn), "__globals__", {})
    for name, p in inspect.signature(fn).parameters.items():
        annotation = p.annotation
        try:
            out[name] = eval(annotation, namespace) if isinstance(annotation, str) else annotation
        except Exception:  # this one alone stays unchecked
            continue
    return {k: v for k, v in out.items() if v is not inspect.Parameter.empty}


def takes_options(fn: Callable) -> bool:
    """``fn`` (a class: its ``__init__``) takes ``**kwargs``, which it forwards."""
    target = fn.__init__ if isinstance(fn, type) else fn
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(target).parameters.values())


def with_defaults(fn: Callable, arguments: Mapping[str, Any]) -> Dict[str, Any]:
    """``arguments`` over the defaults of ``fn``'s keyword parameters (a class: its ``__init__``):
    the values a call with ``arguments`` sees, for a check of several keys together (a
    ``check_options`` classmethod) made before anything is built. Keys ``fn`` does not take (the
    options it forwards) are kept."""
    defaults = {k: p.default for k, p in keyword_parameters(fn).items() if p.default is not p.empty}
    return {**defaults, **arguments}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def expected(value: Any, annotation: Any) -> Optional[str]:
    """What ``value`` must be for ``annotation`` when it is not (``"an int"``, ``"one of 'max',
    'mean'"``, ``">= 0 and < 1"``), else :obj:`None`. Types it cannot judge (a class of the
    caller's, ``Any``) pass. ``Annotated[T, Range(...)]`` (:class:`~revgnn.utils.ranges.Range`)
    bounds a value of type ``T``, e.g. ``dropout: Annotated[float, Range(0, 1, high_open=True)]``
    (``Annotated[Optional[int], Range(1)]``: :obj:`None` or at least 1); ``Annotated[str,
    REGISTRY]`` (a :class:`~revgnn.utils.registry.Registry`) takes the names registered in it when
    the value is checked, e.g. ``solver: Annotated[str, SOLVERS]``."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return None
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        want = expected(value, args[0])
        for extra in args[1:]:
            if want is None and isinstance(extra, Range) and not extra.contains(value):
                want = extra.describe()
            if want is None and hasattr(extra, "names") and value not in extra:
                close = difflib.get_close_matches(str(value), extra.names(), n=1)
                notes = [f"did you mean {close[0]!r}?"] if close else []
                notes += [extra.how_to_add] if getattr(extra, "how_to_add", "") else []
                hint = f" ({'; '.join(notes)})" if notes else ""
                want = f"one of the registered {extra.kind}s {', '.join(extra.names())}{hint}"
        return want
    if origin is Union:
        wants = [expected(value, a) for a in args]
        if None in wants:
            return None
        return " or ".join(dict.fromkeys(w for w in wants))
    if origin is Literal:
        return None if value in args else "one of " + ", ".join(map(repr, args))
    if annotation is type(None):
        return None if value is None else "null"
    if annotation is bool:
        return None if isinstance(value, bool) else "true or false"
    if annotation is int:
        return None if _is_int(value) else "an int"
    if annotation is float:
        return None if _is_int(value) or isinstance(value, float) else "a number"
    if annotation is str:
        return None if isinstance(value, str) else "a string"
    base = origin or annotation
    if not isinstance(base, type):
        return None
    if issubclass(base, collections.abc.Mapping):
        return None if isinstance(value, collections.abc.Mapping) else "a mapping ({key: value})"
    if issubclass(base, (list, tuple, collections.abc.Sequence)) and not issubclass(base, str):
        ok = isinstance(value, collections.abc.Sequence) and not isinstance(value, str)
        return None if ok else "a list ([a, b])"
    return None


def check_types(
    params: Mapping[str, inspect.Parameter], arguments: Mapping[str, Any], prefix: str = ""
) -> None:
    """Raises naming the first key of ``arguments`` whose value does not fit its parameter's
    annotation (:func:`expected`): :class:`ValueError` for a choice outside a ``Literal`` or a
    registry, or a value outside its :class:`~revgnn.utils.ranges.Range`; :class:`TypeError` else."""
    for key, value in arguments.items():
        param = params.get(key)
        want = None if param is None else expected(value, param.annotation)
        if want is not None:
            # a choice ("one of ...") or a range (">= 0 ...", "< 1"): the type was right, the value not
            error = ValueError if want.startswith(("one of", ">", "<")) else TypeError
            raise error(f"{prefix}{key} must be {want}, got {value!r}")


def check_arguments(
    fn: Callable, arguments: Mapping[str, Any], *, what: str, prefix: str = "", skip: Iterable[str] = ()
) -> None:
    """Checks ``arguments`` against the keyword parameters of ``fn`` less ``skip``: a key it does not
    take is a :class:`TypeError` naming it, the closest parameter and all of them (``what`` says whose
    they are); a value of the wrong type or outside its choices one naming the key (:func:`check_types`)."""
    params = keyword_parameters(fn, skip)
    unknown = [k for k in arguments if k not in params]
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), list(params), n=1)
        hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
        raise TypeError(
            f"{what} has no option(s) {', '.join(prefix + str(k) for k in unknown)}{hint}; "
            f"it takes {', '.join(params) or 'none'}"
        )
    check_types(params, arguments, prefix)


def check_call(fn: Callable, arguments: Mapping[str, Any], prefix: str = "") -> None:
    """Checks the arguments a call of ``fn`` received against ``fn``'s own annotations (types,
    choices, ranges: :func:`check_types`), for a constructor or function to call on entry with
    ``locals()``: ``check_call(DEQ, locals())`` at the top of ``DEQ.__init__``. Keys that are not
    keyword parameters of ``fn`` (``self``, ``__class__``, the ``**kwargs`` mapping, which the
    callee forwards and checks where it goes) are ignored; ``prefix`` goes before every key an
    error names (``"anderson: "``)."""
    params = keyword_parameters(fn)
    check_types(params, {k: v for k, v in arguments.items() if k in params}, prefix)
