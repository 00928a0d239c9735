"""The training loop: every model of the zoo, every data set, every backend, read top to bottom.

Recipe (Li et al., ICML 2021, ogbn-proteins): every epoch draws a new random partition of the nodes into
``trainer.train_parts`` parts; a step takes ``trainer.parts_per_step`` of them (default one, or one per
worker under ``backend=ddp``), with the loss on their training nodes. Adam, gradient-norm clipping.
Evaluation is multi-view inference (:mod:`revgnn.engine.inference`) scored by OGB's evaluator, every
``trainer.eval_every`` epochs, on fresh or fixed views (``trainer.fixed_eval_views``); the best validation
score selects ``best.pt`` and its epoch's test score is ``final_test``. With ``trainer.test_views`` set,
the loop then loads ``best.pt`` and tests it on that many fresh views (``checkpoint_test``, the official
code's separate ``test.py``; docs/fidelity.md). Graph-level data go through the same loop with shuffled
mini-batches of graphs, SAR through it with one full-graph step per epoch: :mod:`revgnn.engine.tasks`
holds what differs between data, :mod:`revgnn.engine.backends` what differs between backends.

What a run holds (its model, optimiser, state and checkpoint files) is :mod:`revgnn.engine.run`'s
:class:`~revgnn.engine.run.Run`, handed to every part of the loop. Outputs in the run directory (rank 0
writes them; every write is atomic, :mod:`~revgnn.engine.checkpoint`):
``metrics.csv`` (one row per epoch, rewritten each epoch, and a last ``checkpoint_test`` row),
``summary.json`` (also after a divergence,
an interruption or a failure, with its ``status``), ``last.pt`` every epoch and ``best.pt``,
``learning_curve.png`` and optionally TensorBoard events. A checkpoint holds every worker's RNG state
and the position inside the epoch, so a resumed run continues exactly as an uninterrupted one would,
also after SIGINT / SIGTERM mid-epoch (:mod:`~revgnn.engine.interrupt`).
"""

from __future__ import annotations

import contextlib
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
from revgnn.engine.checkpoint import load_checkpoint
from revgnn.engine.divergence import NonFiniteError, diverged
from revgnn.engine.interrupt import TrainingInterrupted
from revgnn.engine.metrics import better
from revgnn.engine.reports import FIELDS, Summary, plot_learning_curve, write_metrics
from revgnn.engine.run import Checkpoints, Run
from revgnn.engine.seeds import Stream, evaluation_seed, seed_stream, seed_worker

__all__ = ["train", "train_step", "build_model", "resolve_output_dir"]

log = logging.getLogger("revgnn.train")


def train(cfg: DictConfig) -> Dict[str, Any]:
    """Runs one training job described by ``cfg`` (a composed ``train.yaml``) on its backend;
    returns the summary (:class:`~revgnn.engine.reports.Summary` as a dict: the content of
    ``summary.json``, the same on every worker)."""
    from revgnn.engine.preflight import check_before_start

    check_before_start(cfg, resolve_output_dir(cfg))  # settings, run directory, resume: before anything
    backend = make_backend(cfg)
    backend.start()
    try:
        summary = _train(cfg, backend)
    except BaseException:
        backend.close(ok=False)
        raise
    backend.close(ok=True)
    return summary.to_dict()


def _train(cfg: DictConfig, backend: Backend) -> Summary:
    # the checkpoint to resume from, read (and refused if it is none) before the data and the model
    ckpt = load_checkpoint(cfg.ckpt_path) if cfg.ckpt_path else None
    run = _setup(cfg, backend)
    if ckpt is not None:
        run.files.resume(run, ckpt)
        del ckpt  # its tensors are in the model and the optimiser now
    state = run.state
    try:
        _epochs(run)
    finally:
        if run.tb is not None:
            run.tb.close()
    if cfg.trainer.test_views is not None:
        try:
            state.checkpoint_test = checkpoint_test(run)
        except Exception as e:
            _summary(run, f"failed in the final test: {type(e).__name__}")
            raise
    summary = _summary(run, "completed", max(backend.gather(peak_memory_mb(backend.device))))
    if run.writer and cfg.logger.plot and state.history:
        plot_learning_curve(
            state.history,
            run.task.metric,
            os.path.join(run.out_dir, "learning_curve.png"),
            state.checkpoint_test,
        )
    log.info(
        "Highest Train: %.4f  Highest Valid: %.4f  Final Test: %.4f  (%s, epoch %d of %d, %s params, "
        "%.2f s/epoch, peak %.0f MB); outputs in %s",
        summary.highest_train,
        summary.highest_valid,
        summary.final_test,
        summary.metric,
        summary.best_epoch,
        summary.epochs,
        f"{summary.num_parameters:,}",
        summary.epoch_time_s,
        summary.peak_memory_mb,
        os.path.abspath(run.out_dir),
    )
    return summary


def _setup(cfg: DictConfig, backend: Backend) -> Run:
    """The run directory, the data, the model (the same initialisation on every worker, then each
    worker's dropout stream), the optimiser and the logger."""
    from hydra.utils import instantiate

    from revgnn.models import count_parameters
    from revgnn.utils.optimizer import ModelOptimizer

    device = backend.device
    out_dir = resolve_output_dir(cfg)
    if backend.is_writer:
        os.makedirs(out_dir, exist_ok=True)
    # Autocast covers the convolutions' matmuls; the reversible blocks' reconstruction and the loss
    # stay in float32 (logits are cast back before the loss).
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if _use_bf16(cfg, device) else None
    torch.manual_seed(cfg.seed)
    task = backend.make_task()
    if backend.is_writer:
        log.info("output directory: %s", os.path.abspath(out_dir))
    log.info("data: %s", task)
    model = backend.prepare_model(build_model(cfg.model, task.shapes).to(device))
    if cfg.trainer.compile:  # in place: the state dict, checkpoints and hooks stay the module's own
        model.compile()
    seed_worker(cfg.seed, backend.rank, backend.world_size)
    if cfg.trainer.fixed_eval_views:  # drawn from the seed alone: a resumed run scores on the same views
        task.fix_eval_views(torch.Generator().manual_seed(evaluation_seed(cfg.seed, 0, True)))
    num_params = count_parameters(model)
    log.info(
        "model: %s (%s parameters), backend %s x %d",
        cfg.model.name,
        f"{num_params:,}",
        backend.name,
        backend.world_size,
    )
    # One buffer for all parameters (and one for their gradients): the optimiser then updates a few
    # chunks of it instead of looping over ~10 tensors per layer (trainer.flat_params).
    optimizer = ModelOptimizer(model, instantiate(cfg.optim), cfg.trainer.flat_params, cfg.trainer.grad_clip)
    tb = None
    if backend.is_writer and cfg.logger.tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        tb = SummaryWriter(os.path.join(out_dir, "tensorboard"))
    return Run(
        model,
        task,
        optimizer,
        backend,
        autocast=autocast,
        cfg=cfg,
        files=Checkpoints(out_dir, backend.is_writer),
        num_params=num_params,
        tb=tb,
    )


def _use_bf16(cfg: DictConfig, device: torch.device) -> bool:
    precision = cfg.backend.precision.value
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")


def _epochs(run: Run) -> None:
    """Trains epochs ``run.state.epoch + 1`` to ``trainer.epochs``; on a divergence, an interruption or a
    failure writes the summary with that status and raises on."""
    from tqdm.auto import tqdm

    cfg, backend, device, state = run.cfg, run.backend, run.backend.device, run.state
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    bar = tqdm(
        range(state.epoch + 1, cfg.trainer.epochs + 1),
        desc=cfg.name,
        initial=state.epoch,
        total=cfg.trainer.epochs,
        disable=None if run.writer and cfg.logger.progress_bar else True,
        dynamic_ncols=True,
    )
    epoch = state.epoch
    try:
        with run.stop:
            for epoch in bar:
                # an epoch's warnings (e.g. a DEQ solve per step that did not converge) are counted and
                # logged once each at its end, instead of one line per step
                with warnings.catch_warnings(record=True) as epoch_warnings:
                    warnings.simplefilter("always")
                    row = _run_epoch(run, epoch)
                log_warnings(epoch_warnings, epoch, run.writer)
                bar.set_postfix(loss=f"{row['loss']:.4f}", valid=f"{state.best['valid']:.4f}")
                # a signal during evaluation or checkpointing: the epoch is saved, stop here
                flags = run.stop.flags(backend.rank, backend.world_size)
                if run.stop.agree(backend.all_reduce(flags, "all_reduce of the signals after an epoch")):
                    raise _interrupted(run, epoch + 1, None)
    except TrainingInterrupted:
        _summary(run, "interrupted")
        raise
    except FloatingPointError as e:  # a loss, gradient norm, prediction or DEQ solve (all workers alike)
        _summary(run, "diverged")
        raise diverged(e, epoch, run.files.last_good(state)) from None
    except Exception as e:
        if state.history:  # what finished stays reported (no collective here: a peer may be gone)
            _summary(run, f"failed at epoch {epoch}: {type(e).__name__}")
        raise
    finally:
        bar.close()


def _run_epoch(run: Run, epoch: int) -> Dict[str, Any]:
    """Trains epoch ``epoch`` (from the saved position when resuming mid-epoch), evaluates it when due,
    saves ``last.pt`` (and ``best.pt``); returns its metrics row."""
    cfg, backend, model, state = run.cfg, run.backend, run.model, run.state
    model.train()
    if hasattr(model, "set_epoch"):  # models with an epoch schedule (DEQ-GNN's unrolled pretraining)
        model.set_epoch(epoch - 1)
    loss, epoch_time = _train_epoch(run, epoch)
    row = {
        "epoch": epoch,
        "evaluation": "",
        "loss": loss,
        "train": "",
        "valid": "",
        "test": "",
        "epoch_time_s": round(epoch_time, 4),
        "peak_memory_mb": round(
            max(backend.gather(peak_memory_mb(backend.device), "all_gather of peak memory")), 1
        ),
        "lr": run.optimizer.param_groups[0]["lr"],
        **model_epoch_stats(model, backend),
    }
    scheduled = epoch % cfg.trainer.eval_every == 0
    improved = False
    if scheduled or epoch == cfg.trainer.epochs:
        before = state.best
        improved = _evaluate(run, epoch, row, epoch_time)
        # an off-schedule evaluation of the last epoch: undone if a resume trains on (RunState.reopen)
        state.closing_best = None if scheduled else before
    else:
        state.closing_best = None
    state.history.append(row)
    state.epoch, state.step, state.partial = epoch, 0, None
    run.files.save(run, improved)  # last.pt, and best.pt as its byte copy
    if run.writer:
        write_metrics(state.history, os.path.join(run.out_dir, "metrics.csv"))
        if run.tb is not None:
            for key, value in row.items():
                if key not in ("epoch", "evaluation", "lr") and value != "":
                    run.tb.add_scalar(key, value, epoch)
    return row


def _train_epoch(run: Run, epoch: int) -> tuple:
    """The training steps of epoch ``epoch``: its batches (partition, order of graphs) are a function of
    (seed, epoch) alone, the same on every worker, and a run resumed mid-epoch skips the steps already
    taken. Returns the epoch's mean loss and time; a stop request saves the position and raises."""
    cfg, state = run.cfg, run.state
    first = state.step if epoch == state.epoch + 1 else 0
    partial = (state.partial if first else None) or {"loss_sum": 0.0, "count": 0, "time_s": 0.0}
    loss_sum, count = partial["loss_sum"], partial["count"]
    t0 = time.perf_counter() - partial["time_s"]
    generator = torch.Generator().manual_seed(seed_stream(cfg.seed, epoch, Stream.TRAIN_BATCHES))
    for step in run.task.train_steps(generator, run.backend.device, start=first):
        loss, stopping = train_step(run, step)
        loss_sum, count = loss_sum + loss * step.total, count + step.total
        if stopping:
            state.step = step.index + 1
            state.partial = {"loss_sum": loss_sum, "count": count, "time_s": time.perf_counter() - t0}
            run.files.save(run)  # state.epoch is still the last complete epoch
            raise _interrupted(run, epoch, step.index)
    return loss_sum / max(count, 1), time.perf_counter() - t0


def _evaluate(run: Run, epoch: int, row: Dict[str, Any], epoch_time: float) -> bool:
    """Scores the model on the epoch's views into ``row``; returns whether the validation score
    improved on the best (which it then becomes)."""
    cfg, state = run.cfg, run.state
    generator = torch.Generator().manual_seed(seed_stream(cfg.seed, epoch, Stream.EVALUATION))
    scores = run.task.evaluate(run.model, generator, run.backend.device, run.autocast)
    model_epoch_stats(run.model, run.backend, gather=False)  # the evaluation's solves are not training's
    row.update(scores, evaluation="selection")
    improved = better(run.task.metric, scores["valid"], state.best["valid"], state.best["epoch"] > 0)
    if improved:
        state.best = {"epoch": epoch, **scores}
    log.info(
        "epoch %d  loss %.4f  train %.4f  valid %.4f  test %.4f  (best valid %.4f @ %d)  %.1fs",
        epoch,
        row["loss"],
        scores["train"],
        scores["valid"],
        scores["test"],
        state.best["valid"],
        state.best["epoch"],
        epoch_time,
    )
    return improved


def _summary(run: Run, status: str, peak_mb: Optional[float] = None) -> Summary:
    """The run's summary with ``status``; the writer rank writes it and ``metrics.csv``."""
    cfg, backend, state = run.cfg, run.backend, run.state
    peak_mb = peak_memory_mb(backend.device) if peak_mb is None else peak_mb
    history, best = state.history, state.best
    times = [r["epoch_time_s"] for r in history]
    summary = Summary(
        name=cfg.name,
        seed=cfg.seed,
        model=cfg.model.name,
        data=run.task.name,
        metric=run.task.metric,
        num_parameters=run.num_params,
        epochs=len(history),
        best_epoch=best["epoch"],
        highest_train=best["train"],
        highest_valid=best["valid"],
        final_test=best["test"],
        checkpoint_test=state.checkpoint_test,
        epoch_time_s=sum(times) / max(len(times), 1),
        # the rows' figures are taken before each epoch's evaluation and checkpoint, and a resumed
        # run's history holds the earlier process's peaks
        peak_memory_mb=round(max([peak_mb] + [r["peak_memory_mb"] for r in history]), 1),
        device=backend.device.type,
        bf16=run.autocast is not None,
        backend=backend.name,
        world_size=backend.world_size,
        status=status,
        output_dir=run.out_dir,
        model_stats={k: v for k, v in (history[-1] if history else {}).items() if k not in FIELDS},
    )
    if run.writer:
        summary.write(os.path.join(run.out_dir, "summary.json"))
        write_metrics(history, os.path.join(run.out_dir, "metrics.csv"), state.checkpoint_test)
    return summary


def train_step(run: Run, step) -> tuple:
    """One optimiser step of ``run`` over this worker's batches of ``step``: forward (under
    ``run.autocast``), loss share, backward for each (gradients accumulate), then one all-reduce of
    ``[step loss, signal of each worker]`` over the workers
    (:meth:`~revgnn.engine.interrupt.StopRequest.flags`: what ``run.stop`` received by then). The update
    (:meth:`ModelOptimizer.step <revgnn.utils.optimizer.ModelOptimizer.step>`: gradients reduced over the
    workers, clipped) is applied only when the step loss and the gradient norm are finite, else
    :class:`~revgnn.engine.divergence.NonFiniteError` is raised on every worker; returns
    ``(step loss, whether any worker asked to stop)``."""
    model, task, backend, autocast = run.model, run.task, run.backend, run.autocast
    loss_sum = torch.zeros((), dtype=torch.float64)
    failure: Optional[FloatingPointError] = None
    for batch in step.batches:
        try:
            with autocast if autocast is not None else contextlib.nullcontext():
                logits = model(*batch.inputs)
            loss = task.loss(logits, batch, step.total)
            aux = model_auxiliary_loss(model, lambda out: task.loss(out, batch, max(batch.count, 1)))
            if aux is not None:  # modules' own loss terms (e.g. DEQ Jacobian regularisation), batch's share
                loss = loss + aux * (batch.count / step.total)
            loss.backward()
        except FloatingPointError as e:  # e.g. a DEQ solve that diverged: on this worker alone, so it
            failure = e  # is agreed through the all-reduce below, not raised past the peers
            break
        loss_sum += loss.detach().to(loss_sum)
    stop, ws = run.stop, backend.world_size
    failed = torch.zeros(ws, dtype=torch.float64)
    failed[backend.rank] = float(failure is not None)
    status = backend.all_reduce(
        torch.cat([loss_sum.view(1), stop.flags(backend.rank, ws), failed]),
        f"all_reduce of step {step.index}'s loss",
    )
    loss_value, stopping = float(status[0]), stop.agree(status[1 : ws + 1])
    any_failed = bool(status[ws + 1 :].any())  # this worker's own failure among them
    if any_failed or not math.isfinite(loss_value):
        run.optimizer.zero_grad()
        if any_failed:
            raise NonFiniteError(_failures(backend, failure, step.index), step.index)
        raise NonFiniteError(f"loss is {loss_value}", step.index)
    # clears the gradients after the update: freed (or zeroed in the flat buffer) here rather than
    # before the next backward, they stay out of evaluation and checkpointing
    norm = run.optimizer.step(backend.reduce_gradients)
    if not math.isfinite(norm):  # the summed gradients' norm: the same on every worker
        raise NonFiniteError(f"gradient norm is {norm}", step.index)
    return loss_value, stopping


def _failures(backend: Backend, failure: Optional[FloatingPointError], step: int) -> str:
    """What raised in the forward or backward of ``step``: this worker's error alone, or, of several
    workers, every failed worker's, gathered (a collective every worker makes, since each saw the same
    summed flags)."""
    mine = None if failure is None else f"{type(failure).__name__}: {failure}"
    if backend.world_size == 1:
        return str(mine)
    messages = backend.gather(mine, f"all_gather of step {step}'s failures")
    return "; ".join(f"worker {r}: {m}" for r, m in enumerate(messages) if m is not None)


def _interrupted(run: Run, epoch: int, step: Optional[int]) -> TrainingInterrupted:
    signum, name = run.stop.reported(run.backend.rank)  # its own signal, else the peer's that stopped it
    where = f"in epoch {epoch} after {step + 1} step(s)" if step is not None else f"before epoch {epoch}"
    return TrainingInterrupted(
        f"{name}: stopped {where}; saved {run.files.last}. "
        f"Resume with:\n  {resume_command(run.cfg, run.backend, run.files.last)}",
        signum,
    )


def resume_command(cfg: DictConfig, backend: Backend, last_path: str) -> str:
    """The command line that continues this run from ``last_path``: the launcher, the job's own
    overrides (without any earlier ``ckpt_path``) and ``ckpt_path=<last_path>``."""
    from hydra.core.hydra_config import HydraConfig

    from revgnn.cli.quoting import hydra_override

    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    overrides = [o for o in overrides if not o.lstrip("+~").startswith(("ckpt_path=", "output_dir="))]
    words = [shlex.quote(o) for o in overrides]
    if HydraConfig.initialized():  # a --config-dir of the user's own: its options are needed again
        for source in HydraConfig.get().runtime.config_sources:
            if source.provider == "command-line" and source.schema == "file":
                words.insert(0, f"--config-dir {shlex.quote(source.path)}")
    # continue in the same directory; paths quoted for Hydra (a sweep job's directory holds = and ,)
    words.append(hydra_override("output_dir", os.path.dirname(os.path.abspath(last_path))))
    words.append(hydra_override("ckpt_path", os.path.abspath(last_path)))
    return " ".join([backend.launch_prefix()] + words)


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
    every = backend.gather(stats, "all_gather of the model's epoch statistics")
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


def checkpoint_test(run: Run) -> Optional[Dict[str, Any]]:
    """The final test: every worker loads ``best.pt`` (:meth:`Checkpoints.load_best
    <revgnn.engine.run.Checkpoints.load_best>`) into the model (set to the best epoch's schedule, e.g.
    DEQ-GNN's pretraining phase) and scores it with ``task.final_test`` on ``trainer.test_views`` x
    ``trainer.test_parts`` fresh views drawn from the seed alone; returns
    ``{epoch, views, parts, train, valid, test}``, or :obj:`None` (with a warning) when no
    evaluation ever saved a ``best.pt``."""
    tc, model, best_epoch = run.cfg.trainer, run.model, run.state.best["epoch"]
    best = run.files.load_best(best_epoch)
    if best is None:
        return None
    model.load_state_dict(best.model_state)
    if hasattr(model, "set_epoch"):
        model.set_epoch(best_epoch - 1)
    generator = torch.Generator().manual_seed(seed_stream(run.cfg.seed, 0, Stream.CHECKPOINT_TEST))
    scores = run.task.final_test(model, generator, run.backend.device, run.autocast)
    model_epoch_stats(model, run.backend, gather=False)  # the test's solves are not training's
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


def build_model(model_cfg: DictConfig, shapes: Dict[str, Any]) -> "torch.nn.Module":
    """Instantiates ``model_cfg`` with the data's shapes (``in_channels``, ``out_channels``,
    ``edge_channels``, ``species_channels``) where the config does not set them; every key is passed
    on, ``null`` as :obj:`None`."""
    from hydra.utils import instantiate

    cfg = OmegaConf.to_container(model_cfg, resolve=True)
    return instantiate(cfg, **{k: v for k, v in shapes.items() if cfg.get(k) is None})


def resolve_output_dir(cfg: DictConfig) -> str:
    """Hydra's run (or sweep job) directory, which is ``output_dir`` when set
    (``configs/hydra/default.yaml``); outside Hydra ``cfg.output_dir`` or ``outputs/<name>``."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return HydraConfig.get().runtime.output_dir
    return str(cfg.output_dir) if cfg.output_dir else f"outputs/{cfg.name}"


def peak_memory_mb(device) -> float:
    """Peak memory so far: ``max_memory_allocated`` on CUDA, the process's peak RSS on CPU."""
    from revgnn.utils.memory import peak_rss_bytes

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_rss_bytes() / 2**20
