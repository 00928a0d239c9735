r"""Distributed full-graph training with SAR, one process per worker.

Launch (one host, 4 workers; multi-host: add ``--nnodes``, ``--node_rank``,
``--rdzv_endpoint`` as usual)::

    python scripts/partition.py --data proteins_like --num-parts 4 --out parts/pl4
    torchrun --nproc_per_node=4 -m revgnn.distributed.run \
        --partition-dir parts/pl4 --model revgnn_small --epochs 50

Each worker loads only its part. Parameters are broadcast from rank 0 at the
start; every step the loss on worker :math:`p` is normalised by the *global*
number of labelled entries,

.. math::
    L_p = \frac{1}{|\mathcal{L}|\,T} \sum_{i \in \mathcal{L}_p} \ell(
    \hat{\mathbf{y}}_i, \mathbf{y}_i),

so that the all-reduced sum of the per-worker gradients equals the
single-process full-graph gradient of the mean loss (``T`` tasks for
multilabel BCE, 1 for cross entropy). Evaluation gathers the split nodes'
predictions and runs the OGB Evaluator on every worker (same numbers
everywhere).

The building blocks (:func:`setup_sar`, :func:`prepare_model`,
:func:`train_step`, :func:`evaluate`) are what ``revgnn.train`` calls for
``backend=sar``; :func:`main` is a self-contained loop.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, field
from typing import Dict, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from revgnn.utils.flat import FlatParameters, build_optimizer

from .comm import (all_gather_object_checked, all_reduce_gradients,
                   all_reduce_sum, broadcast_parameters, init_distributed)
from .partition import load_partition

__all__ = ['SARJob', 'setup_sar', 'prepare_model', 'train_step', 'evaluate',
           'predict', 'fit', 'train_sar', 'main']


@dataclass
class SARJob:
    """One worker's data: its :class:`~revgnn.distributed.sar.SARGraph`,
    local node features/labels/split masks and the dataset metadata
    written by ``scripts/partition.py``."""
    graph: object
    x: Tensor
    y: Tensor
    edge_attr: Optional[Tensor]
    masks: Dict[str, Tensor]
    task: str = 'multilabel'
    evaluator: Optional[str] = None
    meta: dict = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return self.graph.rank


def setup_sar(partition_dir: str, timeout_s: float = 300.0,
              backend: Optional[str] = None,
              device: Optional[torch.device] = None) -> SARJob:
    """Joins the process group (``torchrun`` environment), loads this
    worker's part from ``partition_dir`` and builds the SAR graph.

    Raises :class:`~revgnn.distributed.partition.PartitionMismatchError`
    before any training if the files do not fit the job, and
    :class:`~revgnn.distributed.comm.SARCommError` if a peer never joins
    within ``timeout_s``.
    """
    from .sar import SARGraph
    init_distributed(backend=backend, timeout_s=timeout_s)
    if dist.get_backend() == 'nccl':
        torch.cuda.set_device(int(os.environ.get('LOCAL_RANK', 0)))
    part = load_partition(partition_dir, dist.get_rank(),
                          dist.get_world_size())
    graph = SARGraph(part, timeout_s=timeout_s)
    dev = device or (torch.device('cuda', torch.cuda.current_device())
                     if dist.get_backend() == 'nccl' else torch.device('cpu'))
    graph.to(dev)
    with open(os.path.join(partition_dir, 'meta.json')) as f:
        meta = json.load(f)
    nd = part['node_data']
    for key in ('x', 'y'):
        if key not in nd:
            raise ValueError(f'{partition_dir} has no node tensor {key!r}; '
                             'partition with scripts/partition.py')
    masks = {k[:-5]: v for k, v in nd.items() if k.endswith('_mask')}
    info = meta.get('dataset', {})
    ea = graph.edge_attr
    return SARJob(graph=graph, x=nd['x'].to(dev), y=nd['y'].to(dev),
                  edge_attr=None if ea is None else ea.to(dev),
                  masks={k: v.to(dev) for k, v in masks.items()},
                  task=info.get('task', 'multilabel'),
                  evaluator=info.get('evaluator'), meta=meta)


def prepare_model(model: torch.nn.Module) -> torch.nn.Module:
    """Switches the model's convs to SAR (in place) and broadcasts rank 0's
    parameters and buffers so all workers start identical."""
    from .convs import convert_to_sar
    convert_to_sar(model)
    if dist.is_initialized() and dist.get_world_size() > 1:
        broadcast_parameters(model)
    return model


def _loss_sum(out: Tensor, y: Tensor, task: str) -> Tensor:
    if task == 'multilabel':
        return F.binary_cross_entropy_with_logits(out, y.to(out.dtype),
                                                  reduction='sum')
    return F.cross_entropy(out, y.view(-1).long(), reduction='sum')


def _global_count(job: SARJob, split: str) -> float:
    key = f'_count_{split}'
    if key not in job.meta:
        n = job.masks[split].sum().to(torch.float64).view(1)
        if dist.is_initialized():
            all_reduce_sum(n, 'global label count')
        per = job.y.size(1) if job.task == 'multilabel' else 1
        job.meta[key] = float(n.item()) * per
    return job.meta[key]


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               job: SARJob, clip_norm: Optional[float] = None,
               flat: Optional[FlatParameters] = None) -> float:
    """One full-graph step on every worker; returns the global mean loss.

    With ``flat`` (the model's :class:`~revgnn.utils.flat.FlatParameters`,
    whose ``params`` the optimiser holds) the gradient is all-reduced as one
    buffer, and clipping and the update run on its few chunks."""
    model.train()
    if flat is not None:
        flat.zero_grad()
    else:
        optimizer.zero_grad(set_to_none=True)
    out = model(job.x, job.graph, job.edge_attr)
    mask = job.masks['train']
    loss = _loss_sum(out[mask], job.y[mask], job.task) / _global_count(
        job, 'train')
    loss.backward()
    multi = dist.is_initialized() and dist.get_world_size() > 1
    if flat is not None:
        flat.sync()
        params = flat.params
        if multi:  # the flat gradient is already one buffer
            all_reduce_sum(flat.grad, 'all_reduce_gradients')
    else:
        params = [p for p in model.parameters() if p.requires_grad]
        if multi:
            all_reduce_gradients(params)
    if clip_norm:
        torch.nn.utils.clip_grad_norm_(params, clip_norm)
    optimizer.step()
    total = loss.detach().to(torch.float64).view(1)
    if dist.is_initialized():
        all_reduce_sum(total, 'loss')
    return float(total.item())


@torch.no_grad()
def predict(model: torch.nn.Module, job: SARJob) -> Tensor:
    """Local logits (no autograd state: the rings only move features)."""
    model.eval()
    return model(job.x, job.graph, job.edge_attr)


def evaluate(model: torch.nn.Module, job: SARJob,
             splits=('train', 'valid', 'test')) -> Dict[str, float]:
    """Distributed evaluation with the OGB Evaluator named in the partition
    metadata (ROC-AUC for proteins, accuracy for arxiv/products); falls
    back to accuracy / mean ROC-AUC-free loss when there is none."""
    out = predict(model, job)
    pieces = {}
    for s in splits:
        m = job.masks.get(s)
        if m is None:
            continue
        pieces[s] = (out[m].float().cpu(), job.y[m].cpu())
    gathered = (all_gather_object_checked(pieces, 'evaluate')
                if dist.is_initialized() else [pieces])
    result = {}
    for s in pieces:
        pred = torch.cat([g[s][0] for g in gathered])
        y = torch.cat([g[s][1] for g in gathered])
        result[s] = _metric(job, pred, y)
    return result


def _metric(job: SARJob, pred: Tensor, y: Tensor) -> float:
    if job.evaluator:
        from ogb.nodeproppred import Evaluator
        ev = Evaluator(job.evaluator)
        if job.task == 'multilabel':
            res = ev.eval({'y_true': y, 'y_pred': pred})
        else:
            res = ev.eval({'y_true': y.view(-1, 1),
                           'y_pred': pred.argmax(-1, keepdim=True)})
        return float(next(iter(res.values())))
    if job.task == 'multilabel':
        return float(((pred > 0) == (y > 0.5)).float().mean())
    return float((pred.argmax(-1) == y.view(-1)).float().mean())


def _shapes(job: SARJob) -> Dict[str, object]:
    """The model's data-dependent arguments, from the partition metadata."""
    info = job.meta.get('dataset', {})
    return dict(in_channels=job.x.size(1),
                out_channels=info.get('num_classes', job.y.size(1)),
                edge_channels=(None if job.edge_attr is None else job.edge_attr.size(1)),
                species_channels=info.get('species_channels', 0))


def fit(job: SARJob, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
        epochs: int, clip_norm: float, eval_every: int,
        out_dir: Optional[str] = None,
        flat: Optional[FlatParameters] = None) -> Dict[str, object]:
    """The SAR training loop: one full-graph step per epoch on every worker,
    distributed evaluation, selection by the best validation score. Rank 0
    prints progress and, with ``out_dir``, writes ``metrics.csv`` and
    ``summary.json``. Returns the summary (same on every worker)."""
    rank = job.rank
    history, best = [], {'epoch': 0, 'valid': -float('inf')}
    for epoch in range(1, epochs + 1):
        t = time.perf_counter()
        loss = train_step(model, optimizer, job, clip_norm, flat)
        row = {'epoch': epoch, 'loss': loss, 'epoch_time_s': time.perf_counter() - t}
        if eval_every and (epoch % eval_every == 0 or epoch == epochs):
            row.update(evaluate(model, job))
            if row.get('valid', -float('inf')) > best['valid']:
                best = dict(row)
        history.append(row)
        if rank == 0:
            print(' '.join(f'{k} {v:.4f}' if isinstance(v, float) else f'{k} {v}'
                           for k, v in row.items()), flush=True)
    summary = {'backend': 'sar', 'world_size': dist.get_world_size() if dist.is_initialized() else 1,
               'epochs': epochs, 'best_epoch': best['epoch'],
               'highest_train': best.get('train', float('nan')),
               'highest_valid': best['valid'], 'final_test': best.get('test', float('nan')),
               'epoch_time_s': sum(r['epoch_time_s'] for r in history) / max(len(history), 1)}
    if rank == 0 and out_dir:
        import csv
        os.makedirs(out_dir, exist_ok=True)
        keys = sorted({k for r in history for k in r}, key=lambda k: (k != 'epoch', k))
        with open(os.path.join(out_dir, 'metrics.csv'), 'w', newline='') as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(history)
        with open(os.path.join(out_dir, 'summary.json'), 'w') as f:
            json.dump(summary, f, indent=2)
    return summary


def train_sar(cfg) -> Dict[str, object]:
    """``revgnn-train backend=sar``: the composed Hydra config run on the
    partitioned graph (``backend.partition_dir``), one process per worker
    started by ``torchrun``. ``model``, ``optim``, ``trainer.epochs``,
    ``trainer.grad_clip``, ``trainer.eval_every``, ``trainer.flat_params`` and ``seed`` apply; the
    ``data`` group does not (the partition files hold the graph)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from revgnn.models import create_model
    from revgnn.train import resolve_output_dir

    b = cfg.backend
    if not b.partition_dir:
        raise ValueError('backend=sar needs backend.partition_dir=DIR, a directory written by '
                         '`revgnn-partition --data ... --num-parts P --out DIR`')
    if b.num_threads:
        torch.set_num_threads(b.num_threads)
    job = setup_sar(b.partition_dir, b.timeout_s, b.dist_backend)
    kwargs = {k: v for k, v in OmegaConf.to_container(cfg.model, resolve=True).items()
              if v is not None and k != '_target_'}
    name = kwargs.pop('name')
    torch.manual_seed(cfg.seed)
    model = prepare_model(create_model(name, **_shapes(job), **kwargs))
    torch.manual_seed(cfg.seed + job.rank)  # independent dropout per worker
    optimizer, flat = build_optimizer(model, instantiate(cfg.optim), cfg.trainer.flat_params)
    try:
        return fit(job, model, optimizer, cfg.trainer.epochs, cfg.trainer.grad_clip,
                   cfg.trainer.eval_every, resolve_output_dir(cfg), flat)
    finally:
        dist.barrier()
        dist.destroy_process_group()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        description='SAR distributed full-graph training (launch with '
        'torchrun --nproc_per_node=P -m revgnn.distributed.run ...)')
    p.add_argument('--partition-dir', required=True)
    p.add_argument('--model', default='revgnn_small',
                   help='a name from revgnn.models.list_models()')
    p.add_argument('--model-args', default='{}',
                   help='JSON dict of model overrides, e.g. '
                   '\'{"num_layers": 64, "hidden_channels": 64}\'')
    p.add_argument('--epochs', type=int, default=10)
    p.add_argument('--lr', type=float, default=1e-3)
    p.add_argument('--clip-norm', type=float, default=1.0)
    p.add_argument('--eval-every', type=int, default=5)
    p.add_argument('--timeout', type=float, default=300.0,
                   help='seconds before a silent or dead peer aborts the job')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--backend', default=None, choices=['gloo', 'nccl'])
    p.add_argument('--out', default=None, help='directory for metrics.csv and summary.json')
    args = p.parse_args(argv)

    job = setup_sar(args.partition_dir, args.timeout, args.backend)
    from revgnn.models import create_model
    torch.manual_seed(args.seed)
    model = prepare_model(create_model(args.model, **{**_shapes(job),
                                                      **json.loads(args.model_args)}))
    torch.manual_seed(args.seed + job.rank)  # independent dropout per worker
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    fit(job, model, opt, args.epochs, args.clip_norm, args.eval_every, args.out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
