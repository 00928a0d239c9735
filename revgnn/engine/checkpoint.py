"""Run files that survive a crash: checkpoints and text written atomically, checkpoint loading,
and the checks a run makes of its directory and of the checkpoint it resumes before it starts.

Every file of a run is written to a temporary file in the same directory and renamed over its target
(:func:`os.replace` is atomic on POSIX): a crash, a ``kill -9`` or a full disk mid-write leaves the
previous version intact, never half a file. :func:`load_checkpoint` is the one reader of the format:
a file that is not a checkpoint of the training loop, or a truncated or corrupt one, is a
:class:`CheckpointError` naming the file (``revgnn-train``'s resume and ``revgnn-evaluate`` print
it alone).
"""

from __future__ import annotations

import os
import pickle
import shutil
import types
import zipfile
from typing import Any, Dict, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from revgnn.config import ConfigError

__all__ = [
    "atomic_save",
    "atomic_copy",
    "atomic_write_text",
    "load_checkpoint",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CHECKPOINT_KEYS",
    "RUN_FILES",
    "check_run_dir",
    "RESUME_COMPARED",
    "RESUME_FREE",
    "check_resume_config",
    "check_resume",
]

#: The files of a finished (or stopped) run that a new run in the same directory would replace.
RUN_FILES = ("last.pt", "best.pt", "metrics.csv", "summary.json")

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


def check_run_dir(out_dir: str, ckpt_path: Optional[str] = None, overwrite: bool = False) -> None:
    """Refuses to start a run in ``out_dir`` that would replace an earlier run's files
    (:data:`RUN_FILES`): a :class:`~revgnn.config.ConfigError` naming the directory, unless the run
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
        f"to replace it, resume it with ckpt_path={os.path.join(out_dir, 'last.pt')}, or choose "
        f"another output_dir"
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
        saved = load_checkpoint(cfg.ckpt_path, mmap=True)["config"] or {}
        check_resume_config(saved, cfg, cfg.ckpt_path)


def atomic_write_text(text: str, path: str) -> None:
    """Writes ``text`` to a temporary file next to ``path``, then renames it over ``path``."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
