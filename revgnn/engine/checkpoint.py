"""The checkpoint format (written, read, resumed from) and run files that survive a crash.

A checkpoint (``last.pt`` every epoch, ``best.pt`` a byte copy of the best epoch's) holds the model, the
optimiser, every worker's RNG state, the loop's :class:`~revgnn.engine.run.RunState` (position, history,
best epoch), the run's config and what it was trained on. :func:`save_checkpoint` is its one writer;
:func:`load_checkpoint` its one reader, used by the resume (:func:`restore`, which refuses a checkpoint of
another layout or config), ``revgnn-evaluate`` and the benchmarks (:func:`load_trained`;
:func:`checkpoint_config` for the config alone). When the loop writes and copies them, sets the scheduled
``best.pt`` aside and resumes is :class:`revgnn.engine.run.Checkpoints`' business. A file that is not a
checkpoint of the training loop, or a truncated or corrupt one, is a :class:`CheckpointError` naming the
file (``revgnn-train``'s resume and ``revgnn-evaluate`` print it alone). The checks a run makes before it
starts of its directory
(:func:`check_run_dir`) and of the checkpoint it resumes (:func:`check_resume`) are here too.

Every file of a run is written to a temporary file in the same directory and renamed over its target
(:func:`os.replace` is atomic on POSIX): a crash, a ``kill -9`` or a full disk mid-write leaves the
previous version intact, never half a file.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import shutil
import types
import zipfile
from typing import Any, Dict, List, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from revgnn.cli.quoting import hydra_override
from revgnn.errors import ConfigError

__all__ = [
    "atomic_save",
    "atomic_copy",
    "atomic_write_text",
    "load_checkpoint",
    "checkpoint_config",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CHECKPOINT_KEYS",
    "RUN_FILES",
    "check_run_dir",
    "LAST",
    "BEST",
    "SCHEDULED_BEST",
    "save_checkpoint",
    "restore",
    "check_resume_config",
    "check_resume",
    "RESUME_COMPARED",
    "RESUME_FREE",
    "Trained",
    "load_trained",
]

log = logging.getLogger("revgnn.train")

#: The checkpoint of a run's last epoch (or position inside an epoch), written every epoch.
LAST = "last.pt"
#: The checkpoint of a run's best evaluation, a byte copy of that epoch's ``last.pt``.
BEST = "best.pt"
#: ``best.pt`` of the scheduled evaluations, set aside when an off-schedule evaluation of a run's last epoch
#: improved on it (:class:`~revgnn.engine.run.RunState`), so that resuming with more epochs continues as
#: one longer run would.
SCHEDULED_BEST = "scheduled_best.pt"

#: The files of a finished (or stopped) run that a new run in the same directory would replace.
RUN_FILES = (LAST, BEST, "metrics.csv", "summary.json")

#: The entries of every checkpoint the training loop writes (``last.pt``, ``best.pt``).
CHECKPOINT_KEYS = ("model", "optimizer", "epoch", "history", "best", "config", "rng")


class CheckpointError(ConfigError):
    """A file given as a checkpoint that is not one of the training loop's, or is truncated or
    corrupt; the message names the file."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint path that names no file."""


def atomic_save(obj: Any, path: str) -> None:
    """``torch.save`` to a temporary file in the same directory, then rename over ``path``.

    The pickler runs without a memo (:attr:`pickle.Pickler.fast`): a memo keeps every object it
    has written alive until the end, which for a checkpoint means the rebuild arguments of every
    tensor (storage wrappers, size and stride tuples, ...); for a 1001-layer RevGNN with its Adam
    state (100k tensors) that is a large transient on top of the training state
    (``docs/bench/cli_memory.md``). Without it the file is slightly larger (class references
    are repeated) and loads to the same
    values; tensors sharing storage stay shared (``torch.save`` tracks storages itself). A
    checkpoint holds no self-referential objects, which fast mode cannot write.

    Parameters (and any tensor that requires grad) are written as the plain detached tensors
    that ``state_dict()`` would have made, one at a time while pickling, so a checkpoint can hold
    ``state_dict(keep_vars=True)`` and save the same file without a detached alias of every
    parameter alive at once.
    """
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(obj, tmp, pickle_module=_memo_free_pickle())
    os.replace(tmp, path)


def _memo_free_pickle():
    """A ``pickle_module`` for :func:`torch.save` whose ``Pickler`` keeps no memo."""

    class Pickler(pickle.Pickler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.fast = True

        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, torch.Tensor) and (obj.requires_grad or isinstance(obj, torch.nn.Parameter)):
                return obj.detach().__reduce_ex__(2)
            return NotImplemented

    return types.SimpleNamespace(
        __name__="pickle", Pickler=Pickler, Unpickler=pickle.Unpickler, load=pickle.load, dump=pickle.dump
    )


def atomic_copy(src: str, dst: str) -> None:
    """Copies the file ``src`` to a temporary file next to ``dst``, then renames it over ``dst``."""
    tmp = f"{dst}.tmp{os.getpid()}"
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def load_checkpoint(path: str, mmap: bool = False) -> Dict[str, Any]:
    """Loads a checkpoint written by the training loop (tensors and plain Python values only);
    ``mmap=True`` maps the tensors' bytes instead of reading them (``torch.load(mmap=True)``), for
    a look at its small entries (``config``, ``epoch``) that does not read a large file.

    Raises :class:`CheckpointNotFoundError` (a :class:`FileNotFoundError`) when ``path`` is no
    file, and :class:`CheckpointError` with
    ``not a revgnn checkpoint: <path>`` for a file that is not one (not written by ``torch.save``,
    objects other than tensors and plain values, or entries missing from :data:`CHECKPOINT_KEYS`)
    and ``truncated or corrupt checkpoint: <path>`` for a ``torch.save`` archive that cannot be read.
    """
    if not os.path.isfile(path):
        raise CheckpointNotFoundError(f"checkpoint {path!r} does not exist: ckpt_path names no file")
    what = "pass the last.pt or best.pt of a revgnn-train run"
    with open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":  # torch.save writes a zip archive
            raise CheckpointError(f"not a revgnn checkpoint: {path} (not written by torch.save); {what}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:
        cause = (str(e).strip().splitlines() or [""])[0]
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                torch_file = any(n.endswith("/data.pkl") for n in z.namelist())
            if not torch_file or "Weights only load failed" in str(e):
                kind = "a zip archive but no torch.save file" if not torch_file else "objects besides tensors"
                raise CheckpointError(f"not a revgnn checkpoint: {path} ({kind}); {what}") from e
        raise CheckpointError(
            f"truncated or corrupt checkpoint: {path} ({type(e).__name__}: {cause[:200]}); use another "
            f"checkpoint of the run (last.pt / best.pt) or train again"
        ) from e
    missing = [k for k in CHECKPOINT_KEYS if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise CheckpointError(f"not a revgnn checkpoint: {path} (no {', '.join(missing)} entries); {what}")
    return ckpt


def checkpoint_config(path: str) -> Dict[str, Any]:
    """The configuration of the run that wrote the checkpoint at ``path``, as the plain dict it is stored
    as (the form :func:`check_resume_config` compares). Reads the checkpoint memory-mapped: its tensors
    are not read. :func:`load_checkpoint`'s checks and errors."""
    return load_checkpoint(path, mmap=True)["config"] or {}


def check_run_dir(out_dir: str, ckpt_path: Optional[str] = None, overwrite: bool = False) -> None:
    """Refuses to start a run in ``out_dir`` that would replace an earlier run's files
    (:data:`RUN_FILES`): a :class:`~revgnn.errors.ConfigError` naming the directory, unless the run
    resumes from a checkpoint in that directory (``ckpt_path``) or ``overwrite`` is set."""
    found = [f for f in RUN_FILES if os.path.exists(os.path.join(out_dir, f))]
    if not found or overwrite:
        return
    if ckpt_path and os.path.realpath(os.path.dirname(os.path.abspath(ckpt_path))) == os.path.realpath(
        out_dir
    ):
        return  # resuming the run that is there: it continues its files
    raise ConfigError(
        f"output directory {out_dir} holds an earlier run ({', '.join(found)}): pass overwrite=true "
        f"to replace it, resume it with {hydra_override('ckpt_path', os.path.join(out_dir, LAST))}, "
        f"or choose another output_dir"
    )


#: The sections (and ``seed``) a resume compares with the checkpoint's config.
RESUME_COMPARED = ("model", "data", "optim", "trainer", "backend", "seed")
#: Keys a resume may change freely: the schedule's length, where things are, how they are logged
#: and run. Everything else under :data:`RESUME_COMPARED` changes the run.
RESUME_FREE = (
    "trainer.epochs",
    "trainer.test_views",
    "trainer.test_parts",
    "data.root",
    "data.allow_download",
    "backend.num_threads",
    "backend.timeout_s",
    "backend.dist_backend",
    "backend.partition_dir",
)


def check_resume_config(saved: Dict[str, Any], cfg: DictConfig, path: str) -> Dict[str, tuple]:
    """Compares the checkpoint's config with this run's; returns the changed keys that
    ``cfg.resume_allow`` names (``{key: (old, new)}``) and raises :class:`ConfigError` listing
    every other change."""
    now = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)

    def flat(d, prefix=""):
        out = {}
        for k, v in d.items():
            if isinstance(v, dict) and v:
                out.update(flat(v, f"{prefix}{k}."))
            else:
                out[f"{prefix}{k}"] = v
        return out

    old, new = (
        flat({k: saved[k] for k in RESUME_COMPARED if k in saved}),
        flat({k: now[k] for k in RESUME_COMPARED}),
    )
    keys = set(old) | set(new)
    unknown = [k for k in cfg.resume_allow if k not in keys]
    if unknown:
        raise ConfigError(f"resume_allow names {', '.join(unknown)}, which the configuration has no key for")
    changed = {
        k: (old.get(k), new.get(k))
        for k in sorted(keys)
        if k in old and old.get(k) != new.get(k) and k not in RESUME_FREE
    }
    refused = {k: v for k, v in changed.items() if k not in cfg.resume_allow}
    if refused:
        lines = "\n".join(f"  {k}: {a!r} (checkpoint) -> {b!r} (now)" for k, (a, b) in refused.items())
        raise ConfigError(
            f"checkpoint {path} was trained with other settings:\n{lines}\nResume with the "
            f"checkpoint's values, or name the keys you mean to change in resume_allow "
            f"(e.g. resume_allow=[{next(iter(refused))}]); trainer.epochs may always grow."
        )
    return {k: v for k, v in changed.items() if k in cfg.resume_allow}


def check_resume(cfg: DictConfig) -> None:
    """Refuses, before anything is built, a resume (``cfg.ckpt_path``) from a file that is no
    checkpoint of the loop (:func:`load_checkpoint`) or whose run had other settings
    (:func:`check_resume_config`). Reads the checkpoint memory-mapped: its tensors are not read."""
    if cfg.ckpt_path:
        check_resume_config(checkpoint_config(cfg.ckpt_path), cfg, cfg.ckpt_path)


def atomic_write_text(text: str, path: str) -> None:
    """Writes ``text`` to a temporary file next to ``path``, then renames it over ``path``."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def save_checkpoint(path: str, run: Any, rng: List[Dict[str, Any]]) -> None:
    """Writes the checkpoint of ``run`` (a :class:`~revgnn.engine.run.Run`) to ``path`` atomically: the
    model and optimiser state (with the flat buffer's parameter layout, or None), every worker's RNG
    state (``rng``, by rank), the loop state (``run.state``), the backend's identity and the resolved
    config."""
    state = run.state
    # keep_vars: the parameters themselves rather than a detached alias of each (20k tensor objects at
    # 1001 layers); atomic_save writes them detached, so the file is the same.
    atomic_save(
        {
            "model": run.model.state_dict(keep_vars=True),
            "optimizer": run.optimizer.state_dict(),
            "epoch": state.epoch,
            "step": state.step,
            "partial": state.partial,
            "history": state.history,
            "best": state.best,
            "closing_best": state.closing_best,
            "num_parameters": run.num_params,
            "flat_params": run.optimizer.layout,
            "backend": run.backend.identity(),
            "config": OmegaConf.to_container(run.cfg, resolve=True, enum_to_str=True),
            "rng": rng,
        },
        path,
    )


def restore(ckpt: Dict[str, Any], run: Any) -> Dict[str, Any]:
    """Loads ``ckpt`` (read from ``run.cfg.ckpt_path`` by :func:`load_checkpoint`) into the run's model,
    optimiser and this worker's RNG; returns the loop state's fields (``epoch``, ``step``, ``partial``,
    ``history``, ``best``, ``closing_best``: :class:`~revgnn.engine.run.RunState`'s). Refuses a
    checkpoint of another backend, world size or partitioning, model or parameter layout, or config
    (:func:`check_resume_config`)."""
    from revgnn.utils.optimizer import LayoutMismatch  # imports FlatParameters' registration hooks

    cfg, backend = run.cfg, run.backend
    path = cfg.ckpt_path
    saved = ckpt.get("backend") or {"backend": "local", "world_size": 1}
    now = backend.identity()
    if saved != now:
        diff = ", ".join(
            f"{k} {saved.get(k)!r} -> {now.get(k)!r}"
            for k in sorted(set(saved) | set(now))
            if saved.get(k) != now.get(k)
        )
        raise RuntimeError(
            f"checkpoint {path} was written by another run layout ({diff}): its workers' RNG streams and "
            f"data do not continue in this one. Resume with the checkpoint's backend, world size and "
            f"partition directory"
        )
    allowed = check_resume_config(ckpt.get("config") or {}, cfg, path)
    try:
        run.model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise RuntimeError(
            f"checkpoint {path} does not fit model {cfg.model.name!r} as configured (was it trained with "
            f"other model settings?): {e}"
        ) from e
    try:  # flat_params: FlatParameters.layout, or None for per-tensor state
        run.optimizer.load_state_dict(ckpt["optimizer"], ckpt.get("flat_params"))
    except LayoutMismatch as e:
        hint = "" if e.flat is None else f"; resume with trainer.flat_params={str(e.flat).lower()}"
        raise RuntimeError(f"checkpoint {path} holds {e}{hint}") from None
    for key, (old, new) in allowed.items():  # an allowed optimiser change takes effect on the restored state
        name = key[len("optim.") :]
        if key.startswith("optim.") and all(name in g for g in run.optimizer.param_groups):
            for group in run.optimizer.param_groups:
                group[name] = new
        log.info("resume: %s changed from %r to %r (resume_allow)", key, old, new)
    rng = ckpt["rng"]
    rng = rng[backend.rank] if isinstance(rng, list) else rng  # a list by rank since the one loop
    torch.set_rng_state(rng["torch"])
    if backend.device.type == "cuda" and rng.get("cuda") is not None:
        torch.cuda.set_rng_state(rng["cuda"], backend.device)
    step = ckpt.get("step", 0)
    log.info("resumed from %s at epoch %d%s", path, ckpt["epoch"], f", step {step}" if step else "")
    return dict(
        epoch=ckpt["epoch"],
        step=step,
        partial=ckpt.get("partial"),
        history=ckpt["history"],
        best=ckpt["best"],
        closing_best=ckpt.get("closing_best"),
    )


@dataclasses.dataclass
class Trained:
    """A trained model as a checkpoint holds it, for inference: its run's config, the model's state
    dict and the number of epochs it was trained."""

    config: DictConfig
    model_state: Dict[str, torch.Tensor]
    epoch: int


def load_trained(path: str) -> Trained:
    """The model of the checkpoint at ``path`` (:func:`load_checkpoint`'s checks and errors)."""
    ckpt = load_checkpoint(path)
    return Trained(OmegaConf.create(ckpt["config"]), ckpt["model"], ckpt["epoch"])
