"""What the training loop needs to know about a data set's level: node-level or graph-level.

A task turns a data set into training batches, computes the loss of a batch and scores a model on every
split with OGB's evaluator, so that :func:`revgnn.train.train` is one loop for both:

* :class:`NodeTask` (a :class:`~revgnn.data.graph.NodeDataset`, e.g. ogbn-proteins): every epoch a new
  random partition into ``trainer.train_parts`` parts, one step per part (its induced sub-graph, loss on
  its training nodes); multi-view inference (``trainer.eval_views`` x ``trainer.eval_parts``).
* :class:`GraphTask` (a :class:`~revgnn.data.graphs.GraphDataset`, e.g. ogbg-molhiv): every epoch the
  training graphs are shuffled into batches of ``data.batch_size``; the model is called as
  ``model(x, edge_index, edge_attr, batch, num_graphs)`` and returns one row per graph.

Both use BCE-with-logits over tasks for ``multilabel`` data (labels that are NaN are ignored, as OGB's
molecule sets have missing labels) and cross entropy for ``multiclass`` data.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["Batch", "NodeTask", "GraphTask", "make_task", "task_loss"]


class Batch(NamedTuple):
    """One training step: the model's positional inputs, which output rows the loss uses (a mask, or
    :obj:`None` for all), their targets and how many targets there are (to average epoch losses)."""
    inputs: Tuple[Any, ...]
    select: Optional[Tensor]
    y: Tensor
    count: int


def task_loss(logits: Tensor, y: Tensor, task: str) -> Tensor:
    """BCE-with-logits over labelled entries (``multilabel``; NaN = unlabelled) or cross entropy."""
    logits = logits.float()
    if task == "multilabel":
        y = y.float()
        labelled = y == y
        return F.binary_cross_entropy_with_logits(logits[labelled], y[labelled])
    return F.cross_entropy(logits, y.view(-1))


def _autocast(ctx):
    return ctx if ctx is not None else contextlib.nullcontext()


class NodeTask:
    """Node-level training on random-partition sub-graphs of one big graph (Li et al., ICML 2021)."""

    level = "node"

    def __init__(self, ds, trainer_cfg):
        from revgnn.evaluate import Scorer
        self.ds, self.tc = ds, trainer_cfg
        self.scorer = Scorer(ds)
        self.metric = self.scorer.metric
        self.train_mask = torch.zeros(ds.num_nodes, dtype=torch.bool)
        self.train_mask[ds.split_idx["train"]] = True

    def train_batches(self, generator: torch.Generator, device) -> Iterator[Batch]:
        from revgnn.data.partition import partition_graph
        from revgnn.evaluate import as_edge_index
        ds = self.ds
        for sub in partition_graph(ds.edge_index, ds.num_nodes, self.tc.train_parts, generator):
            mask = self.train_mask[sub.node_idx]
            if not mask.any():
                continue
            x = ds.x[sub.node_idx].to(device)
            edge_index = as_edge_index(sub.edge_index.to(device), sub.num_nodes)
            edge_attr = None if ds.edge_attr is None else ds.edge_attr[sub.edge_ids].to(device)
            y = ds.y[sub.node_idx[mask]].to(device)
            yield Batch((x, edge_index, edge_attr), mask.to(device), y, int(mask.sum()))

    def loss(self, logits: Tensor, batch: Batch) -> Tensor:
        return task_loss(logits[batch.select], batch.y, self.ds.task)

    def evaluate(self, model: nn.Module, generator: torch.Generator, device, autocast=None
                 ) -> Dict[str, float]:
        from revgnn.evaluate import predict
        logits = predict(model, self.ds, self.tc.eval_views, self.tc.eval_parts, generator, device, autocast)
        return self.scorer(logits)


class GraphTask:
    """Graph-level training on shuffled mini-batches of graphs, scored by OGB's graph evaluator."""

    level = "graph"

    def __init__(self, ds, trainer_cfg=None):
        from ogb.graphproppred import Evaluator
        self.ds = ds
        self.evaluator = Evaluator(ds.evaluator)
        self.metric = self.evaluator.eval_metric
        if self.evaluator.num_tasks != ds.num_classes:
            raise ValueError(f"{ds.name}: {ds.num_classes} tasks, but evaluator {ds.evaluator!r} expects "
                             f"{self.evaluator.num_tasks}")

    @staticmethod
    def _inputs(data, device) -> Tuple[Any, ...]:
        edge_attr = data.edge_attr.to(device) if data.edge_attr is not None else None
        return (data.x.to(device), data.edge_index.to(device), edge_attr, data.batch.to(device),
                data.num_graphs)

    def train_batches(self, generator: torch.Generator, device) -> Iterator[Batch]:
        for data in self.ds.loader("train", shuffle=True, generator=generator):
            y = data.y.view(data.num_graphs, -1).to(device)
            count = int((y == y).sum()) if y.is_floating_point() else y.numel()
            if count == 0:
                continue
            yield Batch(self._inputs(data, device), None, y, count)

    def loss(self, logits: Tensor, batch: Batch) -> Tensor:
        return task_loss(logits, batch.y, self.ds.task)

    @torch.no_grad()
    def predict(self, model: nn.Module, split: str, device, autocast=None) -> Tensor:
        """``[G, T]`` float32 logits of ``split``'s graphs, in split order, on the CPU."""
        was_training = model.training
        model.eval()
        out = []
        for data in self.ds.loader(split, shuffle=False):
            with _autocast(autocast):
                out.append(model(*self._inputs(data, device)).float().cpu())
        model.train(was_training)
        return torch.cat(out, dim=0) if out else torch.zeros(0, self.ds.num_classes)

    def evaluate(self, model: nn.Module, generator: Optional[torch.Generator], device, autocast=None
                 ) -> Dict[str, float]:
        scores = {}
        for split in ("train", "valid", "test"):
            logits = self.predict(model, split, device, autocast)
            y = self.ds.labels(split)
            pred = logits.argmax(-1, keepdim=True) if self.ds.task == "multiclass" else logits
            scores[split] = float(self.evaluator.eval({"y_true": y, "y_pred": pred})[self.metric])
        return scores


def make_task(ds, trainer_cfg):
    """:class:`NodeTask` for a ``NodeDataset``, :class:`GraphTask` for a ``GraphDataset``."""
    from revgnn.data.graph import NodeDataset
    from revgnn.data.graphs import GraphDataset
    if isinstance(ds, NodeDataset):
        return NodeTask(ds, trainer_cfg)
    if isinstance(ds, GraphDataset):
        return GraphTask(ds, trainer_cfg)
    raise TypeError(f"data._target_ must build a revgnn.data.NodeDataset or revgnn.data.graphs.GraphDataset, "
                    f"got {type(ds).__name__}")
