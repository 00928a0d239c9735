"""The schema of a ``data`` option, derived from the signature of the loader its ``_target_`` names.

One typed field per parameter, with the parameter's default and the
:class:`~revgnn.utils.ranges.Range` its annotation declares (read by
:func:`revgnn.config.schema.check_ranges`). It is stored under the loader's function name
(:func:`revgnn.config.store.register_configs`), and the option selects it in its own ``defaults`` list,
e.g. ``data/proteins_like.yaml`` starts with ``defaults: [/schema/data@_here_: proteins_like, _self_]``.
A new data set is therefore its loader plus one YAML file.

This module imports OmegaConf but neither Hydra nor torch (nor do the loader modules it reads signatures
from).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Dict, Literal, Optional, get_args, get_origin

from omegaconf import MISSING, OmegaConf

from revgnn.utils.ranges import Range

__all__ = ["DATA_CONFIGS", "data_schema", "data_schemas"]

#: The package's ``data`` group.
DATA_CONFIGS = Path(__file__).parent.parent / "configs" / "data"
#: one schema class per loader function, so that every composition (and every pickled config sent to
#: a worker) refers to the same class object
_DATA_SCHEMAS: Dict[Any, type] = {}


def data_schema(target: str) -> type:
    """The structured schema of a ``data`` option whose ``_target_`` is ``target`` (a loader function's
    dotted path), derived from the loader's signature: one field per parameter, typed by its annotation,
    defaulting to its default (``???``, i.e. required, where it has none) and carrying the
    :class:`~revgnn.utils.ranges.Range` of an ``Annotated[T, Range(...)]`` annotation for
    :func:`check_ranges`; a ``Literal`` choice (``node_order: NodeOrder``) is a field of its values' type,
    its choices checked before anything loads (:func:`revgnn.engine.preflight.check_data_config` reads
    the signature). Misspelt keys and values of the wrong type then fail at composition, naming the
    key. The loader's module must import without torch (import it inside the function). The schema of a
    loader is built once and reused.
    """
    module, _, name = target.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ImportError(f"data loader {target!r} cannot be imported ({e}); fix the _target_") from e
    if fn in _DATA_SCHEMAS:
        return _DATA_SCHEMAS[fn]
    fields: list = [("_target_", str, field(default=target))]
    for p in inspect.signature(fn).parameters.values():
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            raise TypeError(
                f"{target}: parameter {p.name!r} is {p.kind.description}; a loader takes named ones"
            )
        if p.annotation is p.empty:
            raise TypeError(f"{target}: parameter {p.name!r} has no type annotation, which its config needs")
        hint = eval(p.annotation, fn.__globals__) if isinstance(p.annotation, str) else p.annotation
        metadata = {}
        if get_origin(hint) is Annotated:
            hint, *extras = get_args(hint)
            ranges = [r for r in extras if isinstance(r, Range)]
            metadata = {"range": ranges[0]} if ranges else {}
        if get_origin(hint) is Literal:  # a choice: the type of its values (OmegaConf holds no Literal)
            hint = type(get_args(hint)[0])
        default = MISSING if p.default is p.empty else p.default
        fields.append((p.name, hint, field(default=default, metadata=metadata)))
    schema = dataclasses.make_dataclass(f"{name}_config", fields)
    try:
        OmegaConf.structured(schema)
    except Exception as e:  # omegaconf.ValidationError: a type a config cannot hold
        raise TypeError(f"{target}: its signature cannot be a config schema ({e})") from e
    # importable by a name unique to the loader, so a composed config pickles (torch.multiprocessing
    # workers, run_workers): importing this module in a worker builds the package's schemas again
    schema.__module__ = __name__
    schema.__qualname__ = "_data_schema_" + target.replace(".", "_")
    globals()[schema.__qualname__] = schema
    _DATA_SCHEMAS[fn] = schema
    return schema


def data_schemas(config_dir: Optional[Path] = None) -> Dict[str, type]:
    """``{loader function name: schema}`` for every ``_target_`` named in ``config_dir``'s YAML files
    (default: the package's ``data`` group); the name is what an option's ``defaults`` list selects."""
    schemas: Dict[str, type] = {}
    targets: Dict[str, str] = {}
    for path in sorted(Path(config_dir or DATA_CONFIGS).glob("*.yaml")):
        target = OmegaConf.load(path).get("_target_")
        if not isinstance(target, str):
            raise ValueError(f"{path} names no _target_: a data option says which loader builds it")
        name = target.rpartition(".")[2]
        if targets.setdefault(name, target) != target:
            raise ValueError(f"two data loaders are named {name!r} ({targets[name]}, {target}): rename one")
        if name not in schemas:
            schemas[name] = data_schema(target)
    return schemas


def __getattr__(name: str) -> type:
    """A pickled config refers to its data schema by the name :func:`data_schema` gives it; a worker
    process that unpickles one builds the package's schemas first (nothing is built at import)."""
    if name.startswith("_data_schema_"):
        data_schemas()
        if name in globals():
            return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
