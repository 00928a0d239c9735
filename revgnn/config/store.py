"""Hydra's config nodes, built from the schemas and the registries (the library itself imports no
Hydra): :func:`register_configs` stores them in Hydra's ConfigStore, with the run-directory resolvers
(:mod:`revgnn.cli.run_dirs`); every command that composes ``train.yaml`` calls it first (it is
idempotent), nothing is stored at import.

* A ``model`` option (``model=<name>``) is the name of a registered variant, and every variant is one:
  the options are stored (:func:`store_model_config`), not written as files, for the variants of this
  package (their names read from the ``@register_model`` decorators in ``revgnn/models/*.py``,
  :func:`builtin_model_names`, so that torch is not imported) and for any other a module named in
  ``imports`` registers (:func:`import_modules`). :class:`~revgnn.config.schema.ModelConfig` types only
  ``_target_`` and ``name`` and leaves the node open, so every argument of the variant's model class can
  be set (``model.learn_t=true``); :func:`revgnn.models.check_model_config` checks the keys when a run
  starts, before any data is loaded.
* A ``data`` option's schema (:mod:`revgnn.config.data_options`) is stored under the loader's function
  name, for the package's data group and a ``--config-dir``'s (:func:`register_data_dir`).
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from revgnn.cli.run_dirs import job_dir, run_dir, stamp
from revgnn.config.data_options import DATA_CONFIGS, data_schema
from revgnn.config.schema import AdamConfig, ModelConfig, TrainConfig
from revgnn.errors import ConfigError

__all__ = [
    "register_configs",
    "store_model_config",
    "builtin_model_names",
    "register_data_dir",
    "store_data_schema",
    "import_modules",
]


def import_modules(names: Any, key: str = "imports") -> None:
    """Imports the modules ``names`` (the config's ``imports``, e.g. ``[my_pkg.my_models]``), so that
    what they register (:func:`~revgnn.models.register_model`, :func:`~revgnn.nn.register_conv`,
    :func:`~revgnn.deq.register_solver`, :func:`~revgnn.engine.backends.register_backend`) can be
    named by the config (``model.name=my_model``, ``model.conv=my_conv``, ...). A module is looked up
    on ``sys.path`` and then in the working directory (as ``python -m`` does); one that is not found
    is a :class:`ConfigError` naming it (an error inside the module is its own traceback)."""
    import os

    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    for i, name in enumerate(names or ()):
        try:
            importlib.import_module(str(name))
        except ModuleNotFoundError as e:
            if e.name is None or not (name == e.name or str(name).startswith(e.name + ".")):
                raise  # the module was found and failed importing something else
            raise ConfigError(
                f"{key}[{i}]={name}: no module named {e.name!r} on the Python path or in the working "
                f"directory {os.getcwd()}; add its directory to PYTHONPATH"
            ) from None
    registry = sys.modules.get("revgnn.models.registry")
    for model in registry.list_models() if registry is not None else ():
        store_model_config(model)  # model=<name> for what they registered (the library stores none)


def store_model_config(name: str) -> None:
    """Stores the Hydra option ``model=<name>`` for the registered variant ``name``: the open model
    schema (:class:`ModelConfig`) with the name, which is all a model option holds (the variant's
    arguments are the registry's, :func:`revgnn.models.model_info`)."""
    node = {"defaults": [{"/schema/model@_here_": "model"}, "_self_"], "name": name}
    ConfigStore.instance().store(group="model", name=name, node=node)


def builtin_model_names(models_dir: Optional[Path] = None) -> List[str]:
    """The names the ``@register_model`` decorators in ``models_dir`` (default: ``revgnn/models``)
    register, read from the source so that the ``model`` options exist without importing torch (the
    decorator's ``name=`` when given, else the function's name); ``tests/models/test_zoo.py`` checks them
    against the registry."""
    names = []
    for path in sorted((models_dir or Path(__file__).parent.parent / "models").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            for dec in getattr(node, "decorator_list", ()):
                func = dec.func if isinstance(dec, ast.Call) else dec
                if getattr(func, "id", getattr(func, "attr", None)) != "register_model":
                    continue
                given = [k.value for k in getattr(dec, "keywords", ()) if k.arg == "name"]
                names.append(ast.literal_eval(given[0]) if given else node.name)
    return sorted(names)


def register_data_dir(config_dir: Path) -> None:
    """Stores the schemas of the data options in ``config_dir`` (a user's ``--config-dir``'s ``data/``
    group) that select one in their ``defaults`` (``- /schema/data@_here_: <loader name>``), so such
    a file composes from the user's directory as from the package's. A loader that cannot be imported
    gets an open schema: the run then refuses it in one message when it checks the data config
    (:func:`revgnn.engine.preflight.check_data_config`). The working directory is put on the module
    path, as for ``imports``."""
    import os

    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    cs = ConfigStore.instance()
    for path in sorted(Path(config_dir).glob("*.yaml")):
        try:
            target = OmegaConf.load(path).get("_target_")
        except Exception:  # Hydra names a file it cannot read
            continue
        if not isinstance(target, str):
            continue
        store_data_schema(cs, target)


def store_data_schema(cs: ConfigStore, target: str) -> None:
    """Stores the schema of the loader ``target`` under its function's name; an open node when the
    loader cannot be imported or typed (the run's data check says why, in one message)."""
    name = target.rpartition(".")[2]
    try:
        node: Any = data_schema(target)
    except Exception:
        node = OmegaConf.create({"_target_": target}, flags={"struct": False})
    cs.store(group="schema/data", name=name, node=node)


def register_configs() -> None:
    """Stores the schemas in Hydra's ConfigStore and the run-directory resolvers (idempotent)."""
    for name, fn in (("revgnn.run_dir", run_dir), ("revgnn.job_dir", job_dir), ("revgnn.stamp", stamp)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    # open: the keys a variant accepts are its model class's arguments (checked at the start of a run)
    cs.store(
        group="schema/model", name="model", node=OmegaConf.structured(ModelConfig, flags={"struct": False})
    )
    # the package's variants, read from its source (no torch import), and any registered already (a
    # user's module imported before this one); a user's registered later are stored by import_modules
    registry = sys.modules.get("revgnn.models.registry")
    for name in {*builtin_model_names(), *(registry.list_models() if registry is not None else ())}:
        store_model_config(name)
    for path in sorted(DATA_CONFIGS.glob("*.yaml")):
        # a loader that cannot be imported spoils only the runs that choose it (an open schema; the
        # run's data check names the import error), not every run
        target = OmegaConf.load(path).get("_target_")
        if isinstance(target, str):
            store_data_schema(cs, target)
    cs.store(group="schema/optim", name="adam", node=AdamConfig)
