"""The run directory of ``revgnn-train`` and of each job of a sweep, named through the resolvers
``${revgnn.run_dir:...}``, ``${revgnn.job_dir:...}`` and ``${revgnn.stamp:...}`` of
``configs/hydra/default.yaml`` (registered by :func:`revgnn.config.store.register_configs`)."""

from __future__ import annotations

from typing import Any, List, Optional

__all__ = ["run_dir", "stamp", "SWEPT_KEYS_ENV", "swept_keys", "job_swept_keys", "job_dir"]


def run_dir(output_dir: Optional[str], default: str) -> str:
    """``hydra.run.dir`` / ``hydra.sweep.dir``: ``output_dir`` when set, so a run keeps all its files
    (checkpoints, ``.hydra/``, ``train.log``) in one directory."""
    return default if output_dir in (None, "") else str(output_dir)


def stamp(default: str) -> str:
    """The run directory's time stamp: rank 0's start time under ``torchrun`` (shared as
    ``REVGNN_RUN_STAMP`` by :mod:`revgnn.distributed.torchrun`), else ``default`` (Hydra's ``now``)."""
    import os

    return os.environ.get("REVGNN_RUN_STAMP") or default


#: The keys the command line of a multirun sweeps, as JSON, set by
#: :class:`~revgnn.engine.preflight.CheckBeforeStart` in the process that launches the sweep: a job
#: that a launcher runs in another process (submitit's, locally or on SLURM, which pass the environment
#: on) has another command line.
SWEPT_KEYS_ENV = "REVGNN_SWEPT_KEYS"


def swept_keys(overrides: List[str]) -> List[str]:
    """Keys that ``overrides`` sweep (``k=a,b``, ``k=range(...)``, ``choice``, ``glob``,
    ``interval``), as Hydra's override parser reads them; ``[]`` when they do not parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    given = [o for o in overrides if "=" in o and not o.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(given)
    except Exception:  # Hydra reports a bad override itself
        return []
    return [o.key_or_group for o in parsed if o.is_sweep_override()]


def job_swept_keys() -> List[str]:
    """The keys this job's sweep sweeps: from :data:`SWEPT_KEYS_ENV`, else this process's command
    line (a sweep started without the callback)."""
    import json
    import os
    import sys

    if SWEPT_KEYS_ENV in os.environ:
        return list(json.loads(os.environ[SWEPT_KEYS_ENV]))
    return swept_keys(sys.argv[1:])


def job_dir(num: Any, overrides: Any) -> str:
    """``hydra.sweep.subdir``: the job number and the values of the swept keys
    (``1_optim.lr=0.01``; all of the job's overrides when no sweep syntax is on the command line, e.g.
    a sweeper plugin), path separators replaced, so every job of a sweep over any key gets its own,
    readable directory (the job's full overrides are in its ``.hydra/overrides.yaml``)."""
    items = [str(o) for o in overrides]
    swept = job_swept_keys()
    chosen = [o for o in items if o.split("=", 1)[0].lstrip("+~") in swept] or items
    name = "_".join([str(num)] + ([",".join(chosen)] if chosen else [])).replace("/", "_")
    if len(name) > 120:  # file systems cap names at 255 bytes; keep it readable and unique
        import hashlib

        name = f"{name[:100]}..{hashlib.sha1(name.encode()).hexdigest()[:10]}"
    return name
