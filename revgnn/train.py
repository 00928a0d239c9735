"""The training loop: every model of the zoo, every data set, one file, read top to bottom.

    revgnn-train                                          # small RevGNN on generated proteins_like
    revgnn-train experiment=proteins_revgnn_deep          # the paper's 1001-layer RevGNN
    revgnn-train -m experiment=proteins_revgnn_deep seed=0,1,2,3,4,5,6,7,8,9
    revgnn-train experiment=molhiv_revgnn_graphnorm       # graph-level: RevGNN + GraphNorm on ogbg-molhiv
    python -m revgnn.train trainer.epochs=5 ckpt_path=outputs/.../last.pt   # resume

Recipe (Li et al., ICML 2021, ogbn-proteins): every epoch draws a new random partition of the nodes into
``trainer.train_parts`` parts and takes one optimiser step per part, on its induced sub-graph, with the
loss on that part's training nodes (BCE over tasks for multi-label data, cross entropy for classes).
Adam, gradient-norm clipping. Evaluation is multi-view inference (:mod:`revgnn.evaluate`) scored by OGB's
evaluator; the reported test score is the one at the best validation score. Graph-level data (a
:class:`~revgnn.data.graphs.GraphDataset`) goes through the same loop with shuffled mini-batches of graphs
instead of partitions; :mod:`revgnn.tasks` holds what differs between the two levels.

Outputs in the run directory: ``metrics.csv`` (one row per epoch), ``summary.json``, ``last.pt`` and
``best.pt`` (written atomically: a crash mid-write leaves the previous file intact), ``learning_curve.png``
and optionally TensorBoard events. A checkpoint holds the RNG states, so a resumed run continues exactly
as an uninterrupted one would.

This module's top level imports only Hydra and the config schemas: ``--help`` and ``--cfg job`` do not
import torch or PyG.
"""
from __future__ import annotations

import logging
from typing import Any, Dict

import hydra
from omegaconf import DictConfig, OmegaConf

import revgnn.config  # noqa: F401  (registers the structured schemas)

log = logging.getLogger("revgnn.train")


def train(cfg: DictConfig) -> Dict[str, Any]:
    """Runs one training job described by ``cfg`` (a composed ``train.yaml``); returns the summary."""
    import contextlib
    import csv
    import json
    import math
    import os
    import time

    import torch
    from hydra.utils import instantiate
    from tqdm.auto import tqdm

    from revgnn.models import count_parameters
    from revgnn.tasks import make_task
    from revgnn.utils.flat import build_optimizer, optimizer_step

    # ---- setup ------------------------------------------------------------------------------
    out_dir = resolve_output_dir(cfg)
    os.makedirs(out_dir, exist_ok=True)
    device_name = cfg.backend.device.value
    if device_name == "auto":
        device_name = "cuda" if torch.cuda.is_available() else "cpu"
    if device_name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("backend.device=cuda but CUDA is not available; use backend.device=auto or cpu")
    device = torch.device(device_name)
    precision = cfg.backend.precision.value
    use_bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda")
    # Autocast covers the convolutions' matmuls; the reversible blocks' reconstruction and the loss
    # stay in float32 (logits are cast back before the loss).
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if use_bf16 else None
    if cfg.backend.num_threads:
        torch.set_num_threads(cfg.backend.num_threads)
    torch.manual_seed(cfg.seed)
    tc = cfg.trainer
    for key in ("epochs", "train_parts", "eval_every", "eval_views", "eval_parts"):
        if tc[key] < 1:
            raise ValueError(f"trainer.{key} must be >= 1, got {tc[key]}")

    # ---- data, model, optimiser ----------------------------------------------------------------
    ds = instantiate(cfg.data)
    task = make_task(ds, tc)  # node- or graph-level batches, loss and evaluator
    log.info("data: %s", ds)
    model = build_model(cfg.model, ds).to(device)
    num_params = count_parameters(model)
    log.info("model: %s (%s parameters)", cfg.model.name, f"{num_params:,}")
    # One buffer for all parameters (and one for their gradients): the optimiser then updates a
    # few chunks of it instead of looping over ~10 tensors per layer (trainer.flat_params).
    optimizer, flat = build_optimizer(model, instantiate(cfg.optim), tc.flat_params)

    start_epoch, history = 0, []
    best = {"epoch": 0, "train": float("nan"), "valid": -math.inf, "test": float("nan")}
    last_path, best_path = os.path.join(out_dir, "last.pt"), os.path.join(out_dir, "best.pt")
    if cfg.ckpt_path:
        ckpt = load_checkpoint(cfg.ckpt_path)
        try:
            model.load_state_dict(ckpt["model"])
        except RuntimeError as e:
            raise RuntimeError(f"checkpoint {cfg.ckpt_path} does not fit model {cfg.model.name!r} as "
                               f"configured (was it trained with other model settings?): {e}") from e
        saved_layout = ckpt.get("flat_params")  # FlatParameters.layout, or None for per-tensor state
        if bool(saved_layout) != (flat is not None):
            raise RuntimeError(f"checkpoint {cfg.ckpt_path} holds optimiser state for "
                               f"{'flat' if saved_layout else 'per-tensor'} parameters; resume "
                               f"with trainer.flat_params={str(bool(saved_layout)).lower()}")
        if flat is not None and saved_layout != flat.layout:
            raise RuntimeError(f"checkpoint {cfg.ckpt_path} holds flat optimiser state for another "
                               f"parameter layout (parameters, their order or the chunking differ); "
                               f"its moments cannot be matched to this model's parameters")
        optimizer.load_state_dict(ckpt["optimizer"])
        start_epoch, history, best = ckpt["epoch"], ckpt["history"], ckpt["best"]
        torch.set_rng_state(ckpt["rng"]["torch"])
        if device.type == "cuda" and ckpt["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state(ckpt["rng"]["cuda"], device)
        log.info("resumed from %s at epoch %d", cfg.ckpt_path, start_epoch)
    if start_epoch >= tc.epochs:
        log.warning("checkpoint is at epoch %d >= trainer.epochs=%d: nothing to train", start_epoch, tc.epochs)

    csv_path = os.path.join(out_dir, "metrics.csv")
    fields = ["epoch", "loss", "train", "valid", "test", "epoch_time_s", "peak_memory_mb", "lr"]
    with open(csv_path, "w", newline="") as f:  # rewritten from history, so a resume continues it
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(history)
    tb = None
    if cfg.logger.tensorboard:
        from torch.utils.tensorboard import SummaryWriter
        tb = SummaryWriter(os.path.join(out_dir, "tensorboard"))

    def checkpoint(epoch: int) -> Dict[str, Any]:
        # keep_vars: the parameters themselves rather than a detached alias of each (20k tensor
        # objects at 1001 layers); atomic_save writes them detached, so the file is the same.
        return {"model": model.state_dict(keep_vars=True), "optimizer": optimizer.state_dict(), "epoch": epoch,
                "history": history, "best": best, "num_parameters": num_params,
                "flat_params": flat.layout if flat is not None else None,
                "config": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
                "rng": {"torch": torch.get_rng_state(),
                        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}}

    # ---- the loop -----------------------------------------------------------------------------
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    bar = tqdm(range(start_epoch + 1, tc.epochs + 1), desc=cfg.name, disable=None if cfg.logger.progress_bar
               else True, initial=start_epoch, total=tc.epochs, dynamic_ncols=True)
    for epoch in bar:
        model.train()
        if hasattr(model, "set_epoch"):  # models with an epoch schedule (DEQ-GNN's unrolled pretraining)
            model.set_epoch(epoch - 1)
        t0 = time.perf_counter()
        # The batches' randomness (partition, or order of graphs) is a function of (seed, epoch) alone:
        # no state to resume.
        batches = task.train_batches(torch.Generator().manual_seed(_stream(cfg.seed, epoch, 0)), device)
        total_loss, total_nodes = 0.0, 0
        for step, batch in enumerate(batches):
            with autocast if autocast is not None else contextlib.nullcontext():
                logits = model(*batch.inputs)
            loss = task.loss(logits, batch)
            if not torch.isfinite(loss):
                good = f"{last_path} (epoch {start_epoch if not history else history[-1]['epoch']})" \
                    if os.path.exists(last_path) else "none (no epoch finished)"
                raise FloatingPointError(
                    f"loss is {loss.item()} at epoch {epoch}, step {step}: training diverged. "
                    f"Last good checkpoint: {good}. Try a lower optim.lr or trainer.grad_clip.")
            loss.backward()
            # clears the gradients after the update: freed (or zeroed in the flat buffer) here
            # rather than before the next backward, they stay out of evaluation and checkpointing
            optimizer_step(optimizer, flat, tc.grad_clip)
            total_loss += loss.item() * batch.count
            total_nodes += batch.count
        epoch_time = time.perf_counter() - t0

        row = {"epoch": epoch, "loss": total_loss / max(total_nodes, 1), "train": "", "valid": "",
               "test": "", "epoch_time_s": round(epoch_time, 4), "peak_memory_mb": round(peak_memory_mb(device), 1),
               "lr": optimizer.param_groups[0]["lr"]}
        improved = False
        if epoch % tc.eval_every == 0 or epoch == tc.epochs:
            scores = task.evaluate(model, torch.Generator().manual_seed(_stream(cfg.seed, epoch, 1)),
                                   device, autocast)
            row.update(scores)
            improved = scores["valid"] > best["valid"]
            if improved:
                best = {"epoch": epoch, **scores}
            log.info("epoch %d  loss %.4f  train %.4f  valid %.4f  test %.4f  (best valid %.4f @ %d)  %.1fs",
                     epoch, row["loss"], scores["train"], scores["valid"], scores["test"], best["valid"],
                     best["epoch"], epoch_time)
        history.append(row)
        atomic_save(checkpoint(epoch), last_path)  # pickled once; best.pt is a byte copy
        if improved:
            atomic_copy(last_path, best_path)
        with open(csv_path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=fields).writerow(row)
        if tb is not None:
            for key in ("loss", "train", "valid", "test", "epoch_time_s", "peak_memory_mb"):
                if row[key] != "":
                    tb.add_scalar(key, row[key], epoch)
        bar.set_postfix(loss=f"{row['loss']:.4f}", valid=f"{best['valid']:.4f}")
    bar.close()
    if tb is not None:
        tb.close()

    # ---- summary ------------------------------------------------------------------------------
    times = [r["epoch_time_s"] for r in history]
    summary = {"name": cfg.name, "seed": cfg.seed, "model": cfg.model.name, "data": ds.name,
               "metric": task.metric, "num_parameters": num_params, "epochs": len(history),
               "best_epoch": best["epoch"], "highest_train": best["train"], "highest_valid": best["valid"],
               "final_test": best["test"], "epoch_time_s": sum(times) / max(len(times), 1),
               # the whole run's peak: the rows' figures are taken before each epoch's evaluation
               # and checkpoint, and a resumed run's history holds the earlier process's peaks
               "peak_memory_mb": round(max([peak_memory_mb(device)] + [r["peak_memory_mb"] for r in history]), 1),
               "device": device.type, "bf16": use_bf16, "output_dir": out_dir}
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if cfg.logger.plot and history:
        plot_learning_curve(history, task.metric, os.path.join(out_dir, "learning_curve.png"))
    log.info("Highest Train: %.4f  Highest Valid: %.4f  Final Test: %.4f  (%s, epoch %d of %d, %s params, "
             "%.2f s/epoch, peak %.0f MB)", best["train"], best["valid"], best["test"], task.metric,
             best["epoch"], len(history), f"{num_params:,}", summary["epoch_time_s"], summary["peak_memory_mb"])
    return summary


def build_model(model_cfg: DictConfig, ds) -> "torch.nn.Module":  # noqa: F821
    """Instantiates ``model_cfg`` with the data set's shapes; ``null`` entries keep the variant's default."""
    from hydra.utils import instantiate
    kwargs = {k: v for k, v in OmegaConf.to_container(model_cfg, resolve=True).items() if v is not None}
    return instantiate(kwargs, in_channels=ds.in_channels, out_channels=ds.num_classes,
                       edge_channels=ds.edge_channels, species_channels=ds.species_channels)


def resolve_output_dir(cfg: DictConfig) -> str:
    """``cfg.output_dir`` if set, else Hydra's run directory (or ``outputs/<name>`` outside Hydra)."""
    if cfg.output_dir:
        return str(cfg.output_dir)
    from hydra.core.hydra_config import HydraConfig
    if HydraConfig.initialized():
        return HydraConfig.get().runtime.output_dir
    return f"outputs/{cfg.name}"


def _stream(seed: int, epoch: int, purpose: int) -> int:
    """A distinct generator seed for each (run seed, epoch, purpose)."""
    return (seed * 1_000_003 + epoch) * 4 + purpose


def peak_memory_mb(device) -> float:
    """Peak memory so far: ``max_memory_allocated`` on CUDA, the process's peak RSS on CPU."""
    import torch

    from revgnn.utils.memory import peak_rss_bytes
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_rss_bytes() / 2**20


def atomic_save(obj: Any, path: str) -> None:
    """``torch.save`` to a temporary file in the same directory, then rename over ``path``.

    The pickler runs without a memo (:attr:`pickle.Pickler.fast`): a memo keeps every object it
    has written alive until the end, which for a checkpoint means the rebuild arguments of every
    tensor (storage wrappers, size and stride tuples, ...); for a 1001-layer RevGNN with its Adam
    state (100k tensors) that held ~50 MB at once on top of the training state. Without it
    the file is ~7% larger (class references are repeated) and loads to the same
    values; tensors sharing storage stay shared (``torch.save`` tracks storages itself). A
    checkpoint holds no self-referential objects, which fast mode cannot write.

    Parameters (and any tensor that requires grad) are written as the plain detached tensors
    that ``state_dict()`` would have made, one at a time while pickling, so a checkpoint can hold
    ``state_dict(keep_vars=True)`` and save the same file without a detached alias of every
    parameter alive at once.
    """
    import os
    import torch
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(obj, tmp, pickle_module=_memo_free_pickle())
    os.replace(tmp, path)


def _memo_free_pickle():
    """A ``pickle_module`` for :func:`torch.save` whose ``Pickler`` keeps no memo."""
    import pickle
    import types

    import torch

    class Pickler(pickle.Pickler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.fast = True

        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, torch.Tensor) and (obj.requires_grad or isinstance(obj, torch.nn.Parameter)):
                return obj.detach().__reduce_ex__(2)
            return NotImplemented

    return types.SimpleNamespace(__name__="pickle", Pickler=Pickler, Unpickler=pickle.Unpickler,
                                 load=pickle.load, dump=pickle.dump)


def atomic_copy(src: str, dst: str) -> None:
    """Copies the file ``src`` to a temporary file next to ``dst``, then renames it over ``dst``."""
    import os
    import shutil
    tmp = f"{dst}.tmp{os.getpid()}"
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def load_checkpoint(path: str) -> Dict[str, Any]:
    """Loads a checkpoint written by :func:`train` (tensors and plain Python values only)."""
    import os
    import torch
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {path!r} does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise RuntimeError(f"checkpoint {path!r} could not be read ({type(e).__name__}: {e})") from e


def plot_learning_curve(history, metric: str, path: str) -> None:
    """Training loss and train/valid/test scores against epochs, as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_loss, ax_score) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot([r["epoch"] for r in history], [r["loss"] for r in history])
    ax_loss.set(xlabel="epoch", ylabel="training loss", title="loss")
    evaluated = [r for r in history if r["valid"] != ""]
    for split in ("train", "valid", "test"):
        ax_score.plot([r["epoch"] for r in evaluated], [r[split] for r in evaluated], marker="o", label=split)
    ax_score.set(xlabel="epoch", ylabel=metric, title=metric)
    ax_score.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns the best validation score for sweepers. ``backend=sar`` trains
    full-graph across the ``torchrun`` workers (:func:`revgnn.distributed.run.train_sar`)."""
    if cfg.backend.name.value == "sar":
        from revgnn.distributed.run import train_sar
        return train_sar(cfg)["highest_valid"]
    return train(cfg)["highest_valid"]


def cli() -> None:
    """``revgnn-train``: re-executes once with tcmalloc preloaded when it is installed (flat peak
    RSS in depth, faster steps; ``REVGNN_ALLOCATOR=system`` opts out), then runs :func:`main`."""
    from revgnn.utils.launch import use_tcmalloc
    use_tcmalloc()
    main()


if __name__ == "__main__":
    cli()
