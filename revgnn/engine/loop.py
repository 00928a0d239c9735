"""The training loop: every model of the zoo, every data set, every backend, read top to bottom.

Recipe (Li et al., ICML 2021, ogbn-proteins): every epoch draws a new random partition of the nodes into
``trainer.train_parts`` parts; a step takes ``trainer.parts_per_step`` of them (default one, or one per
worker under ``backend=ddp``), with the loss on their training nodes. Adam, gradient-norm clipping.
Evaluation is multi-view inference (:mod:`revgnn.evaluate`) scored by OGB's evaluator, every
``trainer.eval_every`` epochs, on fresh or fixed views (``trainer.fixed_eval_views``); the best validation
score selects ``best.pt`` and its epoch's test score is ``final_test``. With ``trainer.test_views`` set,
the loop then loads ``best.pt`` and tests it on that many fresh views (``checkpoint_test``, the official
code's separate ``test.py``; docs/fidelity.md). Graph-level data go through the same loop with shuffled
mini-batches of graphs, SAR through it with one full-graph step per epoch: :mod:`revgnn.engine.tasks`
holds what differs between data, :mod:`revgnn.engine.backends` what differs between backends.

Outputs in the run directory (rank 0 writes them; every write is atomic, :mod:`~revgnn.engine.checkpoint`):
``metrics.csv`` (one row per epoch, rewritten each epoch, and a last ``checkpoint_test`` row),
``summary.json`` (also after a divergence,
an interruption or a failure, with its ``status``), ``last.pt`` every epoch and ``best.pt``,
``learning_curve.png`` and optionally TensorBoard events. A checkpoint holds every worker's RNG state
and the position inside the epoch, so a resumed run continues exactly as an uninterrupted one would,
also after SIGINT / SIGTERM mid-epoch (:mod:`~revgnn.engine.interrupt`).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import math
import os
import shlex
import time
import warnings
from typing import Any, Dict, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from revgnn.engine.backends import Backend, make_backend
from revgnn.engine.checkpoint import (
    atomic_copy,
    atomic_save,
    atomic_write_text,
    check_run_dir,
    load_checkpoint,
)
from revgnn.engine.interrupt import StopRequest, TrainingInterrupted

__all__ = ["train", "train_step", "build_model", "resolve_output_dir", "seed_stream"]

log = logging.getLogger("revgnn.train")

#: metrics.csv's columns (model statistics follow). ``evaluation`` says what scored a row's train / valid /
#: test: ``selection`` (the in-training evaluation), ``checkpoint_test`` (the last row: the final test of
#: ``best.pt``, whose epoch the row's ``epoch`` is), empty when the epoch was not evaluated.
FIELDS = ["epoch", "evaluation", "loss", "train", "valid", "test", "epoch_time_s", "peak_memory_mb", "lr"]


def train(cfg: DictConfig) -> Dict[str, Any]:
    """Runs one training job described by ``cfg`` (a composed ``train.yaml``) on its backend;
    returns the summary (the same on every worker)."""
    from revgnn.config import check_keys, check_ranges, import_modules
    from revgnn.models import check_model_config

    import_modules(cfg.get("imports"))  # what a user's modules register (models, convs, backends)
    check_keys(cfg)  # no key the schema lacks (Hydra's +key=value adds any)
    check_ranges(cfg)  # every value in the range its schema declares, before anything starts
    check_model_config(cfg.model)  # every model key an argument of the variant's class, in range
    check_run_dir(resolve_output_dir(cfg), cfg.ckpt_path, cfg.overwrite)  # no earlier run replaced
    backend = make_backend(cfg)
    backend.start()
    try:
        summary = _train(cfg, backend)
    except BaseException:
        backend.close(ok=False)
        raise
    backend.close(ok=True)
    return summary


def _train(cfg: DictConfig, backend: Backend) -> Dict[str, Any]:
    from hydra.utils import instantiate
    from tqdm.auto import tqdm

    from revgnn.models import count_parameters
    from revgnn.utils.flat import build_optimizer

    # ---- setup ------------------------------------------------------------------------------
    device, writer = backend.device, backend.is_writer
    out_dir = resolve_output_dir(cfg)
    if writer:
        os.makedirs(out_dir, exist_ok=True)
    precision = cfg.backend.precision.value
    use_bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda")
    # Autocast covers the convolutions' matmuls; the reversible blocks' reconstruction and the loss
    # stay in float32 (logits are cast back before the loss).
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if use_bf16 else None
    tc = cfg.trainer
    torch.manual_seed(cfg.seed)

    # the checkpoint to resume from, read (and refused if it is none) before the data and the model
    ckpt = load_checkpoint(cfg.ckpt_path) if cfg.ckpt_path else None

    # ---- data, model, optimiser ----------------------------------------------------------------
    task = backend.make_task()  # batches, loss and evaluator of this worker's data
    log.info("data: %s", task)
    model = backend.prepare_model(build_model(cfg.model, task.shapes).to(device))
    if tc.compile:  # in place: the state dict, checkpoints and hooks stay the module's own
        model.compile()
    backend.seed_workers(cfg.seed)
    if tc.fixed_eval_views:  # drawn from the seed alone: a resumed run scores on the same views
        task.fix_eval_views(torch.Generator().manual_seed(seed_stream(cfg.seed, 0, 1)))
    num_params = count_parameters(model)
    log.info(
        "model: %s (%s parameters), backend %s x %d",
        cfg.model.name,
        f"{num_params:,}",
        backend.name,
        backend.world_size,
    )
    # One buffer for all parameters (and one for their gradients): the optimiser then updates a
    # few chunks of it instead of looping over ~10 tensors per layer (trainer.flat_params).
    optimizer, flat = build_optimizer(model, instantiate(cfg.optim), tc.flat_params)

    state = {
        "epoch": 0,
        "step": 0,
        "partial": None,
        "history": [],
        "best": {"epoch": 0, "train": float("nan"), "valid": -math.inf, "test": float("nan")},
        "checkpoint_test": None,  # the final test of best.pt, after the last epoch
    }
    last_path, best_path = os.path.join(out_dir, "last.pt"), os.path.join(out_dir, "best.pt")
    if ckpt is not None:
        state = {**resume(cfg, backend, model, optimizer, flat, ckpt), "checkpoint_test": None}
        del ckpt  # its tensors are in the model and the optimiser now
    start_epoch, history = state["epoch"], state["history"]
    if start_epoch >= tc.epochs:
        log.warning(
            "checkpoint is at epoch %d >= trainer.epochs=%d: nothing to train", start_epoch, tc.epochs
        )

    tb = None
    if writer and cfg.logger.tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        tb = SummaryWriter(os.path.join(out_dir, "tensorboard"))

    def save_last(epoch: int, step: int = 0, partial: Optional[Dict[str, float]] = None) -> None:
        """``last.pt`` after ``epoch`` complete epochs and ``step`` steps of the next (all workers
        take part: each one's RNG state is gathered; rank 0 writes)."""
        rng = backend.gather(
            {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            }
        )
        if writer:
            # keep_vars: the parameters themselves rather than a detached alias of each (20k tensor
            # objects at 1001 layers); atomic_save writes them detached, so the file is the same.
            atomic_save(
                {
                    "model": model.state_dict(keep_vars=True),
                    "optimizer": optimizer.state_dict(),
                    "epoch": epoch,
                    "step": step,
                    "partial": partial,
                    "history": history,
                    "best": state["best"],
                    "num_parameters": num_params,
                    "flat_params": flat.layout if flat is not None else None,
                    "backend": backend.identity(),
                    "config": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
                    "rng": rng,
                },
                last_path,
            )

    def write_summary(status: str, peak_mb: float) -> Dict[str, Any]:
        best = state["best"]
        times = [r["epoch_time_s"] for r in history]
        summary = {
            "name": cfg.name,
            "seed": cfg.seed,
            "model": cfg.model.name,
            "data": task.name,
            "metric": task.metric,
            "num_parameters": num_params,
            "epochs": len(history),
            "best_epoch": best["epoch"],
            "highest_train": best["train"],
            "highest_valid": best["valid"],
            "final_test": best["test"],
            # the separate test of best.pt (trainer.test_views x test_parts), or null
            "checkpoint_test": state["checkpoint_test"],
            "epoch_time_s": sum(times) / max(len(times), 1),
            # the whole run's peak: the rows' figures are taken before each epoch's evaluation
            # and checkpoint, and a resumed run's history holds the earlier process's peaks
            "peak_memory_mb": round(max([peak_mb] + [r["peak_memory_mb"] for r in history]), 1),
            "device": device.type,
            "bf16": use_bf16,
            "backend": backend.name,
            "world_size": backend.world_size,
            "status": status,
            "output_dir": out_dir,
            # the last epoch's model statistics (e.g. DEQ convergence), as in metrics.csv
            **{k: v for k, v in (history[-1] if history else {}).items() if k not in FIELDS},
        }
        if writer:
            atomic_write_text(json.dumps(summary, indent=2), os.path.join(out_dir, "summary.json"))
            write_metrics(history, os.path.join(out_dir, "metrics.csv"), state["checkpoint_test"])
        return summary

    # ---- the loop -----------------------------------------------------------------------------
    def run_epoch(epoch: int) -> Dict[str, Any]:
        """Trains one epoch (from the saved position when resuming mid-epoch), evaluates when due,
        saves; returns its metrics row."""
        model.train()
        if hasattr(model, "set_epoch"):  # models with an epoch schedule (DEQ-GNN's unrolled pretraining)
            model.set_epoch(epoch - 1)
        # the epoch's batches (partition, order of graphs) are a function of (seed, epoch) alone, the
        # same on every worker; a run resumed mid-epoch skips the steps already taken
        first = state["step"] if epoch == start_epoch + 1 else 0
        partial = (state["partial"] if first else None) or {"loss_sum": 0.0, "count": 0, "time_s": 0.0}
        loss_sum, count = partial["loss_sum"], partial["count"]
        t0 = time.perf_counter() - partial["time_s"]
        generator = torch.Generator().manual_seed(seed_stream(cfg.seed, epoch, 0))
        for step in task.train_steps(generator, device, start=first):
            loss, stopping = train_step(
                model, task, step, optimizer, flat, backend, autocast, tc.grad_clip, stop
            )
            if not math.isfinite(loss):
                raise FloatingPointError(
                    f"loss is {loss} at epoch {epoch}, step {step.index}: training diverged (no update was "
                    f"applied). Last good checkpoint: {_last_good(last_path, history)}. Try a lower optim.lr "
                    f"or trainer.grad_clip."
                )
            loss_sum, count = loss_sum + loss * step.total, count + step.total
            if stopping:
                save_last(
                    epoch - 1,
                    step.index + 1,
                    {"loss_sum": loss_sum, "count": count, "time_s": time.perf_counter() - t0},
                )
                raise _interrupted(cfg, backend, stop, last_path, epoch, step.index)
        epoch_time = time.perf_counter() - t0

        row = {
            "epoch": epoch,
            "evaluation": "",
            "loss": loss_sum / max(count, 1),
            "train": "",
            "valid": "",
            "test": "",
            "epoch_time_s": round(epoch_time, 4),
            "peak_memory_mb": round(max(backend.gather(peak_memory_mb(device))), 1),
            "lr": optimizer.param_groups[0]["lr"],
            **model_epoch_stats(model, backend),
        }
        improved = False
        if epoch % tc.eval_every == 0 or epoch == tc.epochs:
            scores = task.evaluate(
                model,
                torch.Generator().manual_seed(seed_stream(cfg.seed, epoch, 1)),
                device,
                autocast,
                backend.all_reduce,
            )
            model_epoch_stats(model, backend, gather=False)  # the evaluation's solves are not training's
            row.update(scores, evaluation="selection")
            improved = scores["valid"] > state["best"]["valid"]
            if improved:
                state["best"] = {"epoch": epoch, **scores}
            best = state["best"]
            log.info(
                "epoch %d  loss %.4f  train %.4f  valid %.4f  test %.4f  (best valid %.4f @ %d)  %.1fs",
                epoch,
                row["loss"],
                scores["train"],
                scores["valid"],
                scores["test"],
                best["valid"],
                best["epoch"],
                epoch_time,
            )
        history.append(row)
        save_last(epoch)  # pickled once; best.pt is a byte copy
        if writer:
            if improved:
                atomic_copy(last_path, best_path)
            write_metrics(history, os.path.join(out_dir, "metrics.csv"))
            if tb is not None:
                for key, value in row.items():
                    if key not in ("epoch", "evaluation", "lr") and value != "":
                        tb.add_scalar(key, value, epoch)
        return row

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    bar = tqdm(
        range(start_epoch + 1, tc.epochs + 1),
        desc=cfg.name,
        initial=start_epoch,
        total=tc.epochs,
        disable=None if writer and cfg.logger.progress_bar else True,
        dynamic_ncols=True,
    )
    epoch, stop = start_epoch, StopRequest()
    try:
        with stop:
            for epoch in bar:
                # an epoch's warnings (e.g. a DEQ solve per step that did not converge) are counted and
                # logged once each at its end, instead of one line per step
                with warnings.catch_warnings(record=True) as epoch_warnings:
                    warnings.simplefilter("always")
                    row = run_epoch(epoch)
                log_warnings(epoch_warnings, epoch, writer)
                bar.set_postfix(loss=f"{row['loss']:.4f}", valid=f"{state['best']['valid']:.4f}")
                # a signal during evaluation or checkpointing: the epoch is saved, stop here
                if float(backend.all_reduce(torch.tensor([float(stop.requested)], dtype=torch.float64))) > 0:
                    raise _interrupted(cfg, backend, stop, last_path, epoch + 1, None)
    except TrainingInterrupted:
        write_summary("interrupted", peak_memory_mb(device))
        raise
    except FloatingPointError:
        write_summary("diverged", peak_memory_mb(device))
        raise
    except Exception as e:
        if history:  # what finished stays reported (no collective here: a peer may be gone)
            write_summary(f"failed at epoch {epoch}: {type(e).__name__}", peak_memory_mb(device))
        raise
    finally:
        bar.close()
        if tb is not None:
            tb.close()

    # ---- the final test of best.pt ----------------------------------------------------------------
    if tc.test_views is not None:
        try:
            state["checkpoint_test"] = checkpoint_test(
                cfg, task, model, best_path, state["best"]["epoch"], device, autocast, backend
            )
        except Exception as e:
            write_summary(f"failed in the final test: {type(e).__name__}", peak_memory_mb(device))
            raise

    # ---- summary ------------------------------------------------------------------------------
    summary = write_summary("completed", max(backend.gather(peak_memory_mb(device))))
    if writer and cfg.logger.plot and history:
        plot_learning_curve(
            history, task.metric, os.path.join(out_dir, "learning_curve.png"), state["checkpoint_test"]
        )
    best = state["best"]
    log.info(
        "Highest Train: %.4f  Highest Valid: %.4f  Final Test: %.4f  (%s, epoch %d of %d, %s params, "
        "%.2f s/epoch, peak %.0f MB)",
        best["train"],
        best["valid"],
        best["test"],
        task.metric,
        best["epoch"],
        len(history),
        f"{num_params:,}",
        summary["epoch_time_s"],
        summary["peak_memory_mb"],
    )
    return summary


def train_step(
    model,
    task,
    step,
    optimizer,
    flat,
    backend: Backend,
    autocast=None,
    grad_clip: float = 0.0,
    stop: Optional[StopRequest] = None,
):
    """One optimiser step over this worker's batches of ``step``: forward, loss share, backward for each
    (gradients accumulate), then one all-reduce of ``[step loss, stop flag]`` over the workers (the flag:
    ``stop`` received a signal by then). The
    update is applied only when the step loss is finite (gradients reduced over the workers, clipped);
    returns ``(step loss, whether any worker asked to stop)``."""
    from revgnn.utils.flat import optimizer_step

    loss_sum = torch.zeros((), dtype=torch.float64)
    for batch in step.batches:
        with autocast if autocast is not None else contextlib.nullcontext():
            logits = model(*batch.inputs)
        loss = task.loss(logits, batch, step.total)
        aux = model_auxiliary_loss(model, lambda out: task.loss(out, batch, max(batch.count, 1)))
        if aux is not None:  # modules' own loss terms (e.g. DEQ Jacobian regularisation), batch's share
            loss = loss + aux * (batch.count / step.total)
        loss.backward()
        loss_sum += loss.detach().to(loss_sum)
    stop_flag = torch.tensor(float(stop is not None and stop.requested), dtype=torch.float64)
    status = backend.all_reduce(torch.stack([loss_sum, stop_flag]))
    loss_value = float(status[0])
    if not math.isfinite(loss_value):
        if flat is not None:
            flat.zero_grad()
        else:
            optimizer.zero_grad(set_to_none=True)
        return loss_value, bool(status[1] > 0)
    # clears the gradients after the update: freed (or zeroed in the flat buffer) here rather than
    # before the next backward, they stay out of evaluation and checkpointing
    optimizer_step(optimizer, flat, grad_clip, backend.reduce_gradients)
    return loss_value, bool(status[1] > 0)


def resume(cfg: DictConfig, backend: Backend, model, optimizer, flat, ckpt: Dict[str, Any]) -> Dict[str, Any]:
    """Loads ``ckpt`` (read from ``cfg.ckpt_path`` by :func:`~revgnn.engine.checkpoint.load_checkpoint`)
    into the model, the optimiser and this worker's RNG; returns the loop state. Refuses a checkpoint
    of another backend, world size or partitioning, model or parameter layout."""
    saved = ckpt.get("backend") or {"backend": "local", "world_size": 1}
    now = backend.identity()
    if saved != now:
        diff = ", ".join(
            f"{k} {saved.get(k)!r} -> {now.get(k)!r}"
            for k in sorted(set(saved) | set(now))
            if saved.get(k) != now.get(k)
        )
        raise RuntimeError(
            f"checkpoint {cfg.ckpt_path} was written by another run layout ({diff}): its "
            f"workers' RNG streams and data do not continue in this one. Resume with the "
            f"checkpoint's backend, world size and partition directory"
        )
    allowed = check_resume_config(ckpt.get("config") or {}, cfg, cfg.ckpt_path)
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise RuntimeError(
            f"checkpoint {cfg.ckpt_path} does not fit model {cfg.model.name!r} as "
            f"configured (was it trained with other model settings?): {e}"
        ) from e
    saved_layout = ckpt.get("flat_params")  # FlatParameters.layout, or None for per-tensor state
    if bool(saved_layout) != (flat is not None):
        raise RuntimeError(
            f"checkpoint {cfg.ckpt_path} holds optimiser state for "
            f"{'flat' if saved_layout else 'per-tensor'} parameters; resume "
            f"with trainer.flat_params={str(bool(saved_layout)).lower()}"
        )
    if flat is not None and saved_layout != flat.layout:
        raise RuntimeError(
            f"checkpoint {cfg.ckpt_path} holds flat optimiser state for another "
            f"parameter layout (parameters, their order or the chunking differ); "
            f"its moments cannot be matched to this model's parameters"
        )
    optimizer.load_state_dict(ckpt["optimizer"])
    for key, (old, new) in allowed.items():  # an allowed optimiser change takes effect on the restored state
        name = key[len("optim.") :]
        if key.startswith("optim.") and all(name in g for g in optimizer.param_groups):
            for group in optimizer.param_groups:
                group[name] = new
        log.info("resume: %s changed from %r to %r (resume_allow)", key, old, new)
    rng = ckpt["rng"]
    rng = rng[backend.rank] if isinstance(rng, list) else rng  # a list by rank since the one loop
    torch.set_rng_state(rng["torch"])
    if backend.device.type == "cuda" and rng.get("cuda") is not None:
        torch.cuda.set_rng_state(rng["cuda"], backend.device)
    step = ckpt.get("step", 0)
    log.info("resumed from %s at epoch %d%s", cfg.ckpt_path, ckpt["epoch"], f", step {step}" if step else "")
    return {
        "epoch": ckpt["epoch"],
        "step": step,
        "partial": ckpt.get("partial"),
        "history": ckpt["history"],
        "best": ckpt["best"],
    }


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
    ``cfg.resume_allow`` names (``{key: (old, new)}``) and raises listing every other change."""
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
        raise ValueError(f"resume_allow names {', '.join(unknown)}, which the configuration has no key for")
    changed = {
        k: (old.get(k), new.get(k))
        for k in sorted(keys)
        if k in old and old.get(k) != new.get(k) and k not in RESUME_FREE
    }
    refused = {k: v for k, v in changed.items() if k not in cfg.resume_allow}
    if refused:
        lines = "\n".join(f"  {k}: {a!r} (checkpoint) -> {b!r} (now)" for k, (a, b) in refused.items())
        raise ValueError(
            f"checkpoint {path} was trained with other settings:\n{lines}\nResume with the "
            f"checkpoint's values, or name the keys you mean to change in resume_allow "
            f"(e.g. resume_allow=[{next(iter(refused))}]); trainer.epochs may always grow."
        )
    return {k: v for k, v in changed.items() if k in cfg.resume_allow}


def _last_good(last_path: str, history) -> str:
    if os.path.exists(last_path) and history:
        return f"{last_path} (epoch {history[-1]['epoch']})"
    return "none (no epoch finished)"


def _interrupted(
    cfg, backend: Backend, stop: StopRequest, last_path: str, epoch: int, step: Optional[int]
) -> TrainingInterrupted:
    import signal

    signum = stop.signum or signal.SIGTERM  # a peer's signal: this worker got none itself
    where = f"in epoch {epoch} after {step + 1} step(s)" if step is not None else f"before epoch {epoch}"
    return TrainingInterrupted(
        f"{signal.Signals(signum).name}: stopped {where}; saved {last_path}. "
        f"Resume with:\n  {resume_command(cfg, backend, last_path)}",
        signum,
    )


def resume_command(cfg: DictConfig, backend: Backend, last_path: str) -> str:
    """The command line that continues this run from ``last_path``: the launcher, the job's own
    overrides (without any earlier ``ckpt_path``) and ``ckpt_path=<last_path>``."""
    from hydra.core.hydra_config import HydraConfig

    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    overrides = [o for o in overrides if not o.lstrip("+~").startswith(("ckpt_path=", "output_dir="))]
    overrides.append(
        f"output_dir={os.path.dirname(os.path.abspath(last_path))}"
    )  # continue in the same directory
    overrides.append(f"ckpt_path={os.path.abspath(last_path)}")
    return " ".join([backend.launch_prefix()] + [shlex.quote(o) for o in overrides])


def model_epoch_stats(model, backend: Backend, gather: bool = True) -> Dict[str, float]:
    """What the model's modules report per epoch (``epoch_stats()``, e.g. :class:`revgnn.nn.DEQ`'s
    convergence), prefixed by the module's class name; over workers, ``*_max`` keys take the max and
    the others the mean. With ``gather=False`` the statistics are only reset (no collective)."""
    stats: Dict[str, float] = {}
    for name, m in model.named_modules():
        fn = getattr(m, "epoch_stats", None)
        if callable(fn) and m is not model:
            prefix = type(m).__name__.lower() + ("_" + name.replace(".", "_") if stats else "")
            stats.update({f"{prefix}_{k}": v for k, v in fn().items()})
    if not gather:
        return {}
    every = backend.gather(stats)
    keys = sorted({k for s in every for k in s})
    return {
        k: (max if k.endswith("_max") else lambda v: sum(v) / len(v))([s[k] for s in every if k in s])
        for k in keys
    }


def model_auxiliary_loss(model, output_loss) -> Optional[torch.Tensor]:
    """The sum of the loss terms the model's modules add to the training loss (``auxiliary_loss
    (output_loss)``, e.g. :class:`revgnn.deq.DEQ`'s Jacobian regularisation), or ``None``. Each module
    returns its terms since its last call, on the scale of a mean over the batch (``output_loss`` maps a
    model output to the batch's mean loss, for terms that supervise extra outputs); the loop adds the sum,
    weighted with the batch's share of the step, to the batch's loss."""
    terms = []
    for m in model.modules():
        fn = getattr(m, "auxiliary_loss", None)
        if callable(fn):
            term = fn(output_loss)
            if term is not None:
                terms.append(term)
    return torch.stack(terms).sum() if terms else None


def log_warnings(caught, epoch: int, writer: bool) -> None:
    """Logs each distinct warning (category and place) of an epoch once, with its count."""
    groups: Dict[tuple, list] = {}
    for w in caught:
        groups.setdefault((w.category, w.filename, w.lineno), []).append(w)
    for (category, _, _), ws in groups.items():
        if writer:
            log.warning(
                "%s%s in epoch %d: %s",
                category.__name__,
                f" x{len(ws)}" if len(ws) > 1 else "",
                epoch,
                ws[0].message,
            )


def checkpoint_test(
    cfg: DictConfig, task, model, best_path: str, best_epoch: int, device, autocast, backend: Backend
) -> Optional[Dict[str, Any]]:
    """The final test: every worker loads ``best.pt`` into ``model`` (set to the best epoch's
    schedule, e.g. DEQ-GNN's pretraining phase) and scores it with ``task.final_test`` on
    ``trainer.test_views`` x ``trainer.test_parts`` fresh views drawn from the seed alone; returns
    ``{epoch, views, parts, train, valid, test}``, or :obj:`None` (with a warning) when no
    evaluation ever saved a ``best.pt``."""
    tc = cfg.trainer
    if not best_epoch or not os.path.exists(best_path):
        log.warning(
            "no %s from this run (no evaluation improved on -inf, or the best epoch was written to "
            "another output_dir before a resume): the final test is skipped",
            best_path,
        )
        return None
    ckpt = load_checkpoint(best_path)
    if ckpt["epoch"] != best_epoch:
        raise RuntimeError(
            f"{best_path} holds epoch {ckpt['epoch']}, but the best validation score was at epoch "
            f"{best_epoch}: another run wrote into this directory. Give each run its own output_dir"
        )
    model.load_state_dict(ckpt["model"])
    if hasattr(model, "set_epoch"):
        model.set_epoch(best_epoch - 1)
    generator = torch.Generator().manual_seed(seed_stream(cfg.seed, 0, 2))
    scores = task.final_test(model, generator, device, autocast, backend.all_reduce)
    model_epoch_stats(model, backend, gather=False)  # the test's solves are not training's
    result = {"epoch": best_epoch, "views": tc.test_views, "parts": tc.test_parts, **scores}
    log.info(
        "Checkpoint test of best.pt (epoch %d, %d view(s) x %d part(s)): train %.4f  valid %.4f  test %.4f",
        best_epoch,
        tc.test_views,
        tc.test_parts,
        scores["train"],
        scores["valid"],
        scores["test"],
    )
    return result


def write_metrics(history, path: str, final: Optional[Dict[str, Any]] = None) -> None:
    """``metrics.csv``: one row per epoch (the loop's fields, then any model statistics), rewritten
    whole (atomically) from the history; then, when given, the ``checkpoint_test`` row of the final
    test (``final``: its epoch and scores)."""
    rows = list(history)
    if final is not None:
        rows.append(
            {
                "epoch": final["epoch"],
                "evaluation": "checkpoint_test",
                **{k: final[k] for k in ("train", "valid", "test")},
            }
        )
    extra = sorted({k for row in rows for k in row if k not in FIELDS})
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS + extra, lineterminator="\n", restval="")
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(buf.getvalue(), path)


def build_model(model_cfg: DictConfig, shapes: Dict[str, Any]) -> "torch.nn.Module":
    """Instantiates ``model_cfg`` with the data's shapes (``in_channels``, ``out_channels``,
    ``edge_channels``, ``species_channels``); every key is passed on, ``null`` as :obj:`None`."""
    from hydra.utils import instantiate

    return instantiate(OmegaConf.to_container(model_cfg, resolve=True), **shapes)


def resolve_output_dir(cfg: DictConfig) -> str:
    """Hydra's run (or sweep job) directory, which is ``output_dir`` when set
    (``configs/hydra/default.yaml``); outside Hydra ``cfg.output_dir`` or ``outputs/<name>``."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return HydraConfig.get().runtime.output_dir
    return str(cfg.output_dir) if cfg.output_dir else f"outputs/{cfg.name}"


def seed_stream(seed: int, epoch: int, purpose: int) -> int:
    """A distinct generator seed for each (run seed, epoch, purpose): 0 training batches, 1 evaluation."""
    return (seed * 1_000_003 + epoch) * 4 + purpose


def peak_memory_mb(device) -> float:
    """Peak memory so far: ``max_memory_allocated`` on CUDA, the process's peak RSS on CPU."""
    from revgnn.utils.memory import peak_rss_bytes

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_rss_bytes() / 2**20


def plot_learning_curve(history, metric: str, path: str, final: Optional[Dict[str, Any]] = None) -> None:
    """Training loss and train/valid/test scores against epochs, as a PNG (written atomically); the
    final test of ``best.pt`` (``final``), when given, as a star at its epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_score) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot([r["epoch"] for r in history], [r["loss"] for r in history])
    ax_loss.set(xlabel="epoch", ylabel="training loss", title="loss")
    evaluated = [r for r in history if r["valid"] != ""]
    for split in ("train", "valid", "test"):
        ax_score.plot([r["epoch"] for r in evaluated], [r[split] for r in evaluated], marker="o", label=split)
    if final is not None:
        label = f"test of best.pt ({final['views']} x {final['parts']})"
        ax_score.plot([final["epoch"]], [final["test"]], marker="*", markersize=12, ls="", label=label)
    ax_score.set(xlabel="epoch", ylabel=metric, title=metric)
    ax_score.legend()
    fig.tight_layout()
    tmp = f"{path}.tmp{os.getpid()}.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)
