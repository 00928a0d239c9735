"""Hydra override syntax: values quoted so that Hydra's grammar reads them back unchanged
(:func:`hydra_quote`), ``key=value`` as a command line prints it (:func:`hydra_override`), and the path
values of a command line quoted where Hydra would refuse them (:func:`quote_path_overrides`)."""

from __future__ import annotations

from typing import List

__all__ = ["PATH_KEYS", "hydra_quote", "hydra_override", "quote_path_overrides"]


#: Keys whose values are paths: a value holding ``=``, ``,``, a space, quotes or brackets is quoted
#: for Hydra when given unquoted (:func:`quote_path_overrides`), as a sweep job's directory
#: (``1_seed=1``) is.
PATH_KEYS = (
    "ckpt_path",
    "output_dir",
    "data.path",
    "data.root",
    "backend.partition_dir",
    "hydra.run.dir",
    "hydra.sweep.dir",
)
_HYDRA_SPECIAL = set("=,[]{}()'\"\\ \t")


def hydra_quote(value: str) -> str:
    """``value`` as a Hydra override value: as it is when Hydra's grammar reads it back unchanged,
    else quoted (``'multirun/x/1_seed=1/last.pt'``)."""
    text = str(value)
    if text and not (set(text) & _HYDRA_SPECIAL):
        return text
    if "'" not in text:
        return f"'{text}'"
    if '"' not in text:
        return f'"{text}"'
    return "'" + text.replace("'", "\\'") + "'"


def hydra_override(key: str, value: str) -> str:
    """``key=value`` for a command line: quoted for Hydra (:func:`hydra_quote`) and for the shell,
    so it can be pasted as printed."""
    import shlex

    return shlex.quote(f"{key}={hydra_quote(value)}")


def quote_path_overrides(overrides: List[str], multirun: bool = False) -> List[str]:
    """The command line's overrides with the values of :data:`PATH_KEYS` quoted for Hydra where they
    hold a character its grammar reads otherwise (``ckpt_path=multirun/x/1_seed=1/last.pt``, which
    Hydra would refuse with ``mismatched input '='``). Under ``-m`` a value with a comma stays a
    sweep unless it is an existing path; an interpolation (``${...}``) is left alone."""
    import os

    out = []
    for arg in overrides:
        key, sep, value = arg.partition("=")
        if (
            sep
            and key.lstrip("+~") in PATH_KEYS
            and value
            and value[0] not in "'\""
            and "${" not in value
            and set(value) & _HYDRA_SPECIAL
            and not (multirun and "," in value and not os.path.exists(value))
        ):
            arg = f"{key}={hydra_quote(value)}"
        out.append(arg)
    return out
