"""``revgnn-train``'s command line, checked before Hydra runs it: every mistake in it is one message and
exit status 2 (:func:`~revgnn.cli.refuse`), with the closest names, before any data loads.

:func:`prepare` is what :func:`revgnn.cli.train.cli` calls first:

* ``data.kwargs.<key>=value`` adds the key to that dict (as Hydra's ``++``);
* path values holding ``=`` or ``,`` (a sweep job's directory, ``multirun/.../1_seed=1/last.pt``) are
  quoted for Hydra (:func:`~revgnn.cli.quoting.quote_path_overrides`), so a resume command pastes as printed;
* a ``--config-dir``'s data options get their schemas (:func:`~revgnn.config.store.register_data_dir`);
* the configuration is composed as Hydra will compose it (each value of a swept key once), and what
  Hydra would report through its own wrapper (an unknown option of a group, ``model=revgnn_dep``; an
  unknown key, ``trainer.epoch=5``; a value outside an enum, ``backend.device=gpu``; an override that
  does not parse) becomes one :class:`~revgnn.errors.ConfigError`; the composed settings then go
  through :func:`revgnn.engine.preflight.check_config` (keys, ranges, the model's arguments and their
  constraints, the data loader and its arguments).

Nothing here imports torch unless the config names a user's module that does.
"""

from __future__ import annotations

import difflib
import os
from typing import Any, List, Optional, Sequence

from revgnn.errors import ConfigError

__all__ = ["prepare", "check_command_line", "explain"]

#: Config nodes that are dicts of keyword arguments: ``data.kwargs.name=Cora`` adds the key.
OPEN_DICTS = ("data.kwargs.",)
#: Hydra flags after which the command does not train (help, config printing, completion).
_NO_RUN = ("help", "hydra_help", "cfg", "info", "shell_completion")


def prepare(argv: Sequence[str]) -> List[str]:
    """The command line ``argv`` (without the program) with path values quoted for Hydra; raises
    :class:`ConfigError` for the first mistake in it (:func:`check_command_line`)."""
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_known_args(list(argv))[0]
    overrides = [str(o) for o in args.overrides]
    quoted = _quoted(list(argv), overrides, bool(args.multirun))
    if args.config_dir is not None:
        config_dir = os.path.abspath(args.config_dir)
        if not os.path.isdir(config_dir):
            raise ConfigError(f"--config-dir {args.config_dir}: no such directory ({config_dir})")
        from pathlib import Path

        from revgnn.config.store import register_data_dir

        register_data_dir(Path(config_dir) / "data")
    if not any(getattr(args, flag, None) for flag in _NO_RUN):
        args = get_args_parser().parse_known_args(quoted)[0]
        check_command_line([str(o) for o in args.overrides], args.config_dir, args.config_name, args.multirun)
    return quoted


def _quoted(argv: List[str], overrides: List[str], multirun: bool) -> List[str]:
    from revgnn.cli.quoting import quote_path_overrides

    fixed = dict(zip(overrides, quote_path_overrides(overrides, multirun)))
    for o, new in fixed.items():
        # the keys of a dict of keyword arguments (data=pyg's data.kwargs) are the user's to choose:
        # added or replaced (Hydra's ++), where Hydra would refuse a key the dict does not hold yet
        if new.startswith(OPEN_DICTS):
            fixed[o] = "++" + new
    return [fixed.get(a, a) for a in argv]


def _hydra(config_dir: Optional[str]):
    """Hydra as ``revgnn-train`` runs it (the package's configs and schemas, ``config_dir`` first)."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery

    from revgnn.config.store import register_configs

    register_configs()
    search_path = create_config_search_path("pkg://revgnn.configs")
    if config_dir is not None:
        search_path.prepend(
            provider="command-line",
            path=f"file://{os.path.abspath(config_dir)}",
            anchor=SearchPathQuery(provider="schema"),
        )
    return Hydra.create_main_hydra2(task_name="revgnn-train", config_search_path=search_path)


def check_command_line(
    overrides: List[str],
    config_dir: Optional[str] = None,
    config_name: Optional[str] = None,
    multirun: bool = False,
) -> None:
    """Composes ``train.yaml`` (or ``config_name``) with ``overrides`` as Hydra will and checks the
    result (:func:`revgnn.engine.preflight.check_config`); under ``multirun`` every value of every
    swept key is composed once (with the other keys' first values), and the settings of each job are
    left to :class:`~revgnn.engine.preflight.CheckBeforeStart`, which names the job; raises
    :class:`ConfigError`."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    from revgnn.engine.preflight import check_config, task_config

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as e:
        raise explain(e, overrides) from None
    jobs = [overrides]
    if multirun:
        fixed, swept = [], []
        for o, text in zip(parsed, overrides):
            if o.is_sweep_override() and o.is_discrete_sweep():
                key = o.get_key_element()
                swept.append([f"{key}={v}" for v in o.sweep_string_iterator()])
            elif o.is_sweep_override():
                return  # a range or interval sweep is another sweeper's: the jobs check themselves
            else:
                fixed.append(text)
        firsts = [values[0] for values in swept]
        jobs = [fixed + firsts]
        for i, values in enumerate(swept):
            jobs += [fixed + firsts[:i] + [v] + firsts[i + 1 :] for v in values[1:]]
    hydra = _hydra(config_dir)
    try:
        for job in jobs:
            try:
                cfg = hydra.compose_config(config_name or "train", job, run_mode=RunMode.RUN)
            except Exception as e:
                raise explain(e, job) from None
            if not multirun:  # a sweep's jobs are checked, named by number, by CheckBeforeStart
                check_config(task_config(cfg))
    finally:
        GlobalHydra.instance().clear()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def explain(e: BaseException, overrides: Sequence[str]) -> ConfigError:
    """One message for an error Hydra raised composing ``overrides``."""
    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

    if isinstance(e, ConfigError):
        return e
    if isinstance(e, OverrideParseException):
        bad = _unparsable(overrides)
        return ConfigError(
            f"cannot read the override {bad!r}: {_first_line(e)}; quote a value that holds = , or "
            f"spaces as key='value' (in the shell: \"key='value'\")"
            if bad
            else f"cannot read the command line: {_first_line(e)}"
        )
    if isinstance(e, MissingConfigException):
        return _missing_option(e, overrides)
    cause = e.__cause__ or e.__context__
    while cause is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
        return _unknown_key(cause, overrides)
    if isinstance(cause, ValidationError):
        key = getattr(cause, "full_key", None) or "?"
        value = _given(key, overrides)
        message = getattr(cause, "msg", None) or _first_line(cause)
        message = message.splitlines()[0].replace("Invalid value", "invalid value")
        return ConfigError(f"{key}={value}: {message}")
    return ConfigError(_first_line(e))


def _given(key: str, overrides: Sequence[str]) -> str:
    for o in overrides:
        k, _, v = o.partition("=")
        if k.lstrip("+~") == key:
            return v
    return "?"


def _unparsable(overrides: Sequence[str]) -> Optional[str]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for o in overrides:
        try:
            parser.parse_overrides([o])
        except Exception:
            return o
    return None


def _missing_option(e: Any, overrides: Sequence[str]) -> ConfigError:
    missing = str(getattr(e, "missing_cfg_file", "") or "")
    options = [str(o) for o in (getattr(e, "options", None) or [])]
    group, _, choice = missing.rpartition("/")
    if group.startswith("schema/data"):
        return ConfigError(
            f"a data option selects the schema /{missing}, which does not exist: delete the line "
            f"'- /schema/data@_here_: {choice}' from its defaults list (the loader's signature is "
            f"checked without it)"
        )
    if not group:
        return ConfigError(_first_line(e))
    close = difflib.get_close_matches(choice, options, 3, 0.6)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    shown = ", ".join(options) if len(options) <= 40 else ", ".join(options[:40]) + ", ..."
    return ConfigError(
        f"{group}={choice}: no such {group} option{hint}; the options are {shown or 'none'}"
        + (
            f" (an option of your own is <dir>/{group}/<name>.yaml with --config-dir <dir>)"
            if group in ("data", "experiment")
            else ""
        )
    )


def _unknown_key(cause: Any, overrides: Sequence[str]) -> ConfigError:
    import dataclasses

    full_key = str(getattr(cause, "full_key", "") or "")
    key = str(getattr(cause, "key", "") or full_key.rpartition(".")[2])
    parent = full_key[: -len(key)].rstrip(".") if full_key.endswith(key) else full_key.rpartition(".")[0]
    kind = getattr(cause, "object_type", None)
    names = [f.name for f in dataclasses.fields(kind)] if dataclasses.is_dataclass(kind) else []
    node = getattr(cause, "parent_node", None)
    if not names and node is not None and "_target_" in node:  # an open node: its target's arguments
        try:
            from revgnn.engine.preflight import import_target
            from revgnn.utils.signature import keyword_parameters

            names = ["_target_", *keyword_parameters(import_target(node["_target_"], f"{parent}._target_"))]
        except Exception:
            names = []
    close = difflib.get_close_matches(key, names, 1)
    prefix = f"{parent}." if parent else ""
    hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
    takes = f"; {parent or 'the top level'} takes {', '.join(names)}" if names else ""
    return ConfigError(f"unknown key {full_key or key}: revgnn-train has no such setting{hint}{takes}")
