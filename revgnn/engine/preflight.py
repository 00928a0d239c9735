"""The checks a run makes before it starts, without loading data or building a model: its settings
(:func:`check_config`), its output directory and the checkpoint it resumes (:func:`check_before_start`);
:class:`CheckBeforeStart` runs them as a Hydra callback before Hydra creates the run directory, the
training loop again for every job (and for a run started without Hydra). A refusal is a
:class:`~revgnn.config.ConfigError`: one message, exit status 2, nothing left behind."""

from __future__ import annotations

from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from revgnn.config import (
    SWEPT_KEYS_ENV,
    ConfigError,
    _swept_keys,
    check_keys,
    check_ranges,
    import_modules,
    refuse,
)
from revgnn.engine.checkpoint import check_resume, check_run_dir

__all__ = ["check_config", "check_before_start", "sweep_jobs", "check_sweep_jobs", "CheckBeforeStart"]


def check_config(cfg: DictConfig) -> None:
    """Checks the settings of a composed ``train.yaml`` on their own: the user's modules imported
    first (``imports``), then no unknown key (:func:`~revgnn.config.check_keys`), every value in its
    range (:func:`~revgnn.config.check_ranges`), every model key an argument of the variant's class
    (:func:`revgnn.models.check_model_config`). Raises :class:`~revgnn.config.ConfigError` naming
    the key."""
    from revgnn.models import check_model_config

    import_modules(cfg.get("imports"))  # what a user's modules register (models, convs, backends)
    check_keys(cfg)  # no key the schema lacks (Hydra's +key=value adds any)
    check_ranges(cfg)
    check_model_config(cfg.model)


def check_before_start(cfg: DictConfig, out_dir: str) -> None:
    """Everything a run refuses without loading data or building a model, in one place:
    :func:`check_config`, an output directory holding an earlier run
    (:func:`revgnn.engine.checkpoint.check_run_dir`) and a resume whose checkpoint was trained with
    other settings (:func:`revgnn.engine.checkpoint.check_resume`). Raises
    :class:`~revgnn.config.ConfigError`."""
    check_config(cfg)
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
            check_config(_task_config(loader.load_sweep_config(config, list(job))))
        except ConfigError as e:
            values = " ".join(o for o in job if o.split("=", 1)[0].lstrip("+~") in swept)
            raise ConfigError(f"sweep job {number} ({values}): {e}") from e


def _task_config(config: DictConfig) -> DictConfig:
    """The job's config as the task function gets it (Hydra's ``run_job``): Hydra's node removed."""
    import copy

    from omegaconf import open_dict, read_write

    task = copy.deepcopy(config)
    with read_write(task), open_dict(task):
        del task["hydra"]
    return task


class CheckBeforeStart(Callback):
    """Hydra callback (``hydra/default.yaml``): a bad configuration (:func:`check_before_start`) is
    refused in one message (:func:`~revgnn.config.refuse`) before Hydra creates the run directory or
    writes its ``.hydra/`` files and ``train.log``, so a refused run leaves nothing behind and an
    earlier run in its directory stays whole. A sweep's settings shared by every job, and every job
    with its swept values (:func:`check_sweep_jobs`), are checked before any job starts (or is
    submitted to a cluster); each job is checked again by the training loop, as is a run started
    without Hydra."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            check_before_start(_task_config(config), str(config.hydra.run.dir))
        except ConfigError as e:
            refuse(e)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        import json
        import os

        swept = _swept_keys([str(o) for o in config.hydra.overrides.task])
        try:  # the run directory and the resume are the jobs' own
            check_config(_task_config(config))
            check_sweep_jobs(config, swept)
        except ConfigError as e:
            refuse(e)
        # every job's directory is named by its swept values (hydra.sweep.subdir), also in a job
        # that a launcher starts in another process
        os.environ[SWEPT_KEYS_ENV] = json.dumps(swept)
