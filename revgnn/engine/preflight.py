"""Everything a run refuses, checked before it starts, without loading data or building a model:
:class:`CheckBeforeStart` runs the checks as a Hydra callback before Hydra creates the run directory,
the training loop again for every job (and for a run started without Hydra). A refusal is a
:class:`~revgnn.errors.ConfigError`: one message, exit status 2, nothing left behind.

From the settings alone, in any process (:func:`check_config`; also every job of a sweep before the
first starts, :func:`check_sweep_jobs`):

* ``imports`` importable; no unknown key; every value in its range;
* the model: every key an argument of the variant's class, and the constraints between them;
* the data: its loader importable, every key one of its arguments, none missing;
* the backend: its name registered, and its own refusals
  (:meth:`~revgnn.engine.backends.Backend.check_config`: ``backend=sar`` refuses
  ``trainer.compile``, a missing ``backend.partition_dir`` and sub-graph trainer settings).

For this process, before its data loads (:func:`check_before_start`):

* the backend's start (:meth:`~revgnn.engine.backends.Backend.check_start`): the device is here,
  the process was started as the backend needs (``torchrun`` for ``ddp`` and ``sar``, not for
  ``local``), NCCL only on CUDA; and its task's trainer settings with the workers it will have
  (:meth:`~revgnn.engine.tasks.NodeTask.check_trainer`, :meth:`~revgnn.engine.tasks.GraphTask.check_trainer`,
  for the level the loader declares, :func:`~revgnn.engine.tasks.data_level`), or for ``sar`` the
  ``data`` group against the partition's ``meta.json``;
* the output directory and the checkpoint a run resumes.

Only what the loaded data shows is refused later, where it loads: the trainer settings of data whose
loader declares no level (:func:`revgnn.engine.tasks.make_task`: PyG objects, the same checks),
non-finite features (:func:`revgnn.data.checks.check_finite_inputs`), a data set's own validation,
an evaluator whose task count differs from the data's (:class:`~revgnn.engine.tasks.GraphTask`), a
SAR part file without its node tensors or evaluator (:class:`~revgnn.engine.sar_backend.SARTask`)."""

from __future__ import annotations

from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from revgnn.cli import refuse
from revgnn.cli.run_dirs import SWEPT_KEYS_ENV, swept_keys
from revgnn.config.schema import check_keys, check_ranges
from revgnn.config.store import import_modules
from revgnn.engine.checkpoint import check_resume, check_run_dir
from revgnn.errors import ConfigError

__all__ = [
    "check_config",
    "check_data_config",
    "check_model_constraints",
    "check_before_start",
    "sweep_jobs",
    "check_sweep_jobs",
    "task_config",
    "import_target",
    "CheckBeforeStart",
]


def check_config(cfg: DictConfig) -> None:
    """Checks the settings of a composed ``train.yaml`` on their own: the user's modules imported
    first (``imports``), then no unknown key (:func:`~revgnn.config.schema.check_keys`), every value in its
    range (:func:`~revgnn.config.schema.check_ranges`), every model key an argument of the variant's class
    (:func:`revgnn.models.check_model_config`) and the constraints between them
    (:func:`check_model_constraints`), the data loader importable and every data key one of its
    arguments (:func:`check_data_config`), the backend registered and what it refuses of the
    settings (:meth:`~revgnn.engine.backends.Backend.check_config`). Raises
    :class:`~revgnn.errors.ConfigError` naming the key."""
    from revgnn.engine.backends import backend_class
    from revgnn.models import check_model_config

    import_modules(cfg.get("imports"))  # what a user's modules register (models, convs, backends)
    check_keys(cfg)  # no key the schema lacks (Hydra's +key=value adds any)
    check_ranges(cfg)
    check_model_config(cfg.model)
    check_model_constraints(cfg.model)
    check_data_config(cfg.data)
    backend_class(cfg.backend.name).check_config(cfg)


def import_target(target: str, key: str) -> Any:
    """The callable ``target`` names (a user's module found on the path or in the working directory);
    an import that fails, for whatever reason inside the module, is one :class:`ConfigError`."""
    import importlib
    import os
    import sys

    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    module, _, name = str(target).rpartition(".")
    if not module:
        raise ConfigError(f"{key}={target}: name a function as module.function (e.g. my_graph.load)")
    try:
        fn = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as e:
        if e.name is not None and (module == e.name or module.startswith(e.name + ".")):
            raise ConfigError(
                f"{key}={target}: no module named {e.name!r} on the Python path or in the working "
                f"directory {os.getcwd()}; run from the directory that holds it, or add that directory "
                f"to PYTHONPATH"
            ) from None
        raise ConfigError(f"{key}={target}: importing {module} failed: {type(e).__name__}: {e}") from None
    except AttributeError:
        raise ConfigError(f"{key}={target}: module {module} has no {name!r}") from None
    except Exception as e:  # a user's module that fails on import: this run only, one message
        where = ""
        tb = e.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename.endswith(module.replace(".", os.sep) + ".py"):
                where = f" (line {tb.tb_lineno})"
            tb = tb.tb_next
        if isinstance(e, SyntaxError):
            where = f" ({e.filename}, line {e.lineno})"
        raise ConfigError(
            f"{key}={target}: importing {module} failed{where}: {type(e).__name__}: {e}"
        ) from None
    if not callable(fn):
        raise ConfigError(f"{key}={target} is a {type(fn).__name__}, not a function or class")
    return fn


def check_data_config(data: Any) -> None:
    """Checks the ``data`` config before anything is loaded: its ``_target_`` imports (a user's
    module from the working directory), every key is an argument of that loader (the closest one
    named), no required argument is missing, and values fit the annotations. Raises
    :class:`~revgnn.errors.ConfigError`."""
    import inspect

    from omegaconf import OmegaConf

    from revgnn.utils.signature import check_arguments

    if not isinstance(data, DictConfig) or "_target_" not in data:
        raise ConfigError("data has no _target_: a data option names the function that loads it")
    target = data._target_
    fn = import_target(target, "data._target_")
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    for name, p in params.items():
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            if name not in data or OmegaConf.is_missing(data, name):
                raise ConfigError(f"data.{name} is required by {target}: set it, e.g. data.{name}=...")
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    try:
        given = OmegaConf.to_container(data, resolve=True)
    except Exception:  # an interpolation only Hydra's run resolves (${hydra:...}): the keys suffice
        given = OmegaConf.to_container(data, resolve=False)
    given = {k: v for k, v in given.items() if not str(k).startswith("_")}
    try:
        check_arguments(fn, given, what=f"the data loader {target}", prefix="data.")
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None


def check_model_constraints(model: Any) -> None:
    """Constraints between a model's arguments that its constructor would otherwise refuse only
    after the data has loaded: ``hidden_channels`` divisible by ``num_groups`` (each reversible
    group has ``hidden_channels / num_groups`` channels). The values are the config's, else the
    variant's defaults. Raises :class:`~revgnn.errors.ConfigError`."""
    from revgnn.models.registry import CONFIG_TARGET, MODELS, model_info

    if not isinstance(model, DictConfig) or model.get("_target_") != CONFIG_TARGET:
        return
    name = model.get("name")
    if name not in MODELS:
        return
    info = model_info(name)

    def value(key: str) -> Any:
        return model[key] if model.get(key) is not None else info.defaults.get(key)

    hidden, groups = value("hidden_channels"), value("num_groups")
    if isinstance(hidden, int) and isinstance(groups, int) and groups > 0 and hidden % groups:
        low = hidden - hidden % groups
        close = [c for c in (low, low + groups) if c > 0]
        raise ConfigError(
            f"model.hidden_channels={hidden} must be divisible by model.num_groups={groups} (each "
            f"reversible group gets hidden_channels / num_groups channels); e.g. "
            + " or ".join(f"model.hidden_channels={c}" for c in close)
        )


def check_before_start(cfg: DictConfig, out_dir: str) -> None:
    """Everything a run refuses without loading data or building a model, in one place (the module
    docstring lists it): :func:`check_config`, what the backend refuses of this process and of its
    task's settings (:meth:`~revgnn.engine.backends.Backend.check_start`), an output directory
    holding an earlier run (:func:`revgnn.engine.checkpoint.check_run_dir`) and a resume whose
    checkpoint was trained with other settings (:func:`revgnn.engine.checkpoint.check_resume`).
    Raises :class:`~revgnn.errors.ConfigError`."""
    from revgnn.engine.backends import backend_class
    from revgnn.engine.tasks import data_level

    check_config(cfg)
    level = data_level(import_target(cfg.data._target_, "data._target_"))
    backend_class(cfg.backend.name).check_start(cfg, level)
    check_run_dir(out_dir, cfg.ckpt_path, cfg.overwrite)
    check_resume(cfg)


#: The sweeper whose jobs :func:`check_sweep_jobs` expands (Hydra's default, ``k=a,b`` lists).
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def sweep_jobs(config: DictConfig) -> list[list[str]] | None:
    """The overrides of every job of a multirun, in launch order, as Hydra's basic sweeper deals
    them out (``hydra.sweeper.params``, then the command line's); ``None`` under another sweeper,
    whose jobs are not known before it runs (e.g. Optuna's)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if config.hydra.sweeper.get("_target_") != BASIC_SWEEPER:
        return None
    params = config.hydra.sweeper.get("params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()] + [str(o) for o in config.hydra.overrides.task]
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    batches = BasicSweeper.split_arguments(parser.parse_overrides(arguments), None)
    return [list(job) for batch in batches for job in batch]


def check_sweep_jobs(config: DictConfig, swept: list[str]) -> None:
    """Checks every job of a multirun with its swept values (:func:`check_config`) before the first
    starts or is submitted, composing each as Hydra will (its config loader's
    ``load_sweep_config``): a bad value in the 40th job of a cluster sweep is refused before any job
    queues, naming the job and its values of the keys the command line sweeps (``swept``) and of
    ``hydra.sweeper.params``. A sweeper other than the basic one is left to the jobs themselves (the
    training loop checks each)."""
    from hydra.core.global_hydra import GlobalHydra

    jobs = sweep_jobs(config)
    if not jobs:
        return
    loader = GlobalHydra.instance().config_loader()
    swept = set(swept) | set((config.hydra.sweeper.get("params") or {}).keys())
    for number, job in enumerate(jobs):
        try:
            check_config(task_config(loader.load_sweep_config(config, list(job))))
        except ConfigError as e:
            values = " ".join(o for o in job if o.split("=", 1)[0].lstrip("+~") in swept)
            raise ConfigError(f"sweep job {number} ({values}): {e}") from e


def task_config(config: DictConfig) -> DictConfig:
    """The job's config as the task function gets it (Hydra's ``run_job``): Hydra's node removed."""
    import copy

    from omegaconf import open_dict, read_write

    task = copy.deepcopy(config)
    with read_write(task), open_dict(task):
        del task["hydra"]
    return task


class CheckBeforeStart(Callback):
    """Hydra callback (``hydra/default.yaml``): a bad configuration (:func:`check_before_start`) is
    refused in one message (:func:`~revgnn.cli.refuse`) before Hydra creates the run directory or
    writes its ``.hydra/`` files and ``train.log``, so a refused run leaves nothing behind and an
    earlier run in its directory stays whole. A sweep's settings shared by every job, and every job
    with its swept values (:func:`check_sweep_jobs`), are checked before any job starts (or is
    submitted to a cluster); each job is checked again by the training loop, as is a run started
    without Hydra."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            check_before_start(task_config(config), str(config.hydra.run.dir))
        except ConfigError as e:
            refuse(e)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        import json
        import os

        swept = swept_keys([str(o) for o in config.hydra.overrides.task])
        try:  # the run directory and the resume are the jobs' own
            check_config(task_config(config))
            check_sweep_jobs(config, swept)
        except ConfigError as e:
            refuse(e)
        # every job's directory is named by its swept values (hydra.sweep.subdir), also in a job
        # that a launcher starts in another process
        os.environ[SWEPT_KEYS_ENV] = json.dumps(swept)
