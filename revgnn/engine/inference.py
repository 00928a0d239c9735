"""Multi-view inference and OGB evaluation.

A model trained on random induced sub-graphs is evaluated the same way (Li et al., ICML 2021): draw ``V``
random partitions ("views") of ``K`` parts, run the model on every part, and average each node's logits
over the views. ``V = 1, K = 1`` is plain full-graph inference. Scores come from
:class:`ogb.nodeproppred.Evaluator`, so they are the leaderboard's (ROC-AUC for proteins, accuracy
for arxiv / products).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Dict, Iterable, List, Optional, Tuple

import torch
from torch import Tensor, nn

from revgnn.data.node_dataset import NodeDataset
from revgnn.data.random_parts import Partition, SubGraph, partition_graph

log = logging.getLogger("revgnn.train")

__all__ = ["as_edge_index", "draw_views", "predict", "predict_views", "Scorer"]


def as_edge_index(edge_index: Tensor, num_nodes: int):
    """Wraps destination-sorted edges as a ``torch_geometric.EdgeIndex`` so PyG takes its segment path,
    its CSC pointer filled now, once (a compiled model unpacks it eagerly: ``sort_edges``)."""
    from torch_geometric import EdgeIndex

    edge_index = EdgeIndex(edge_index, sparse_size=(num_nodes, num_nodes), sort_order="col")
    edge_index.get_csc()
    return edge_index


def _views(
    ds: NodeDataset, num_views: int, num_parts: int, generator: Optional[torch.Generator], mode: str
) -> Iterable[Partition]:
    """The ``num_views`` random partitions of ``ds``, drawn one at a time from ``generator``."""
    if num_views < 1 or num_parts < 1:
        raise ValueError(f"num_views and num_parts must be >= 1, got {num_views} and {num_parts}")
    for _ in range(num_views):
        yield partition_graph(ds.edge_index, ds.num_nodes, num_parts, generator, mode)


def draw_views(
    ds: NodeDataset,
    num_views: int,
    num_parts: int,
    generator: Optional[torch.Generator] = None,
    mode: str = "balanced",
) -> List[Partition]:
    """``num_views`` random partitions of ``ds`` into ``num_parts`` parts, drawn now and kept (for
    :func:`predict_views`: every evaluation on the same views). ``mode``: ``"balanced"`` or
    ``"uniform"`` (:func:`~revgnn.data.random_parts.random_partition`)."""
    return list(_views(ds, num_views, num_parts, generator, mode))


@torch.no_grad()
def predict(
    model: nn.Module,
    ds: NodeDataset,
    num_views: int = 1,
    num_parts: int = 1,
    generator: Optional[torch.Generator] = None,
    device: torch.device | str = "cpu",
    autocast: Optional[contextlib.AbstractContextManager] = None,
    shard: Tuple[int, int] = (0, 1),
    mode: str = "balanced",
) -> Tensor:
    """Per-node logits averaged over ``num_views`` random partitions into ``num_parts`` parts.

    Args:
        model (nn.Module): Called as ``model(x, edge_index, edge_attr)``; put in eval mode here.
        ds (NodeDataset): The graph.
        num_views (int): Views ``V`` (default: :obj:`1`).
        num_parts (int): Parts ``K`` per view; ``1`` runs the whole graph at once (default: :obj:`1`).
        generator (torch.Generator, optional): Randomness of the partitions.
        device: Where the model lives.
        autocast: Context manager entered around each forward (e.g. bf16 autocast), or :obj:`None`.
        shard (tuple): ``(rank, world_size)``: run only the forwards ``v * num_parts + k`` congruent to
            ``rank`` (every worker still draws every view); the workers' outputs sum to the full one
            (default: :obj:`(0, 1)`, all).
        mode (str): How the views are drawn, ``"balanced"`` or ``"uniform"``
            (:func:`~revgnn.data.random_parts.random_partition`). (default: :obj:`"balanced"`)

    Returns:
        ``[N, C]`` float32 logits on the CPU.
    """
    views = _views(ds, num_views, num_parts, generator, mode)
    return _predict(model, ds, views, num_views, device, autocast, shard)


@torch.no_grad()
def predict_views(
    model: nn.Module,
    ds: NodeDataset,
    views: List[Partition],
    device: torch.device | str = "cpu",
    autocast: Optional[contextlib.AbstractContextManager] = None,
    shard: Tuple[int, int] = (0, 1),
) -> Tensor:
    """:func:`predict` on given views (e.g. from :func:`draw_views`): per-node logits averaged over them."""
    if not views:
        raise ValueError("predict_views needs at least one view")
    return _predict(model, ds, views, len(views), device, autocast, shard)


def _predict(model, ds, views, num_views, device, autocast, shard) -> Tensor:
    was_training = model.training
    model.eval()
    rank, world_size = shard
    out = torch.zeros(ds.num_nodes, ds.num_classes)
    try:
        for v, partition in enumerate(views):
            num_parts = len(partition)
            for k in range(num_parts):
                if (v * num_parts + k) % world_size == rank:
                    sub = partition[k]  # its local edges are gathered now (Partition.__getitem__)
                    if sub.num_nodes:
                        out[sub.node_idx] += _forward(model, ds, sub, device, autocast)
                    del sub
            del partition  # a drawn view goes before the next is drawn: one view's edges at a time
    except FloatingPointError as e:  # e.g. a DEQ solve that diverged, on this worker alone
        if world_size == 1:
            raise
        # every worker sums the logits next: NaN ones stop them all alike there
        # (revgnn.engine.divergence.check_predictions), where raising would leave them waiting
        log.error("worker %d: %s: %s; its evaluation logits are NaN", rank, type(e).__name__, e)
        out.fill_(float("nan"))
    finally:
        model.train(was_training)
    return out / num_views


def _forward(model, ds, sub: SubGraph, device, autocast) -> Tensor:
    """``model``'s float32 logits of the part ``sub`` on the CPU."""
    x = sub.node_rows(ds.x).to(device)
    edge_index = as_edge_index(sub.edge_index.to(device), sub.num_nodes)
    edge_attr = None if ds.edge_attr is None else sub.edge_rows(ds.edge_attr).to(device)
    with autocast if autocast is not None else contextlib.nullcontext():
        return model(x, edge_index, edge_attr).float().cpu()


class Scorer:
    """Scores logits with OGB's node evaluator (the leaderboard's metric).

    Args:
        evaluator (str): Name for :class:`ogb.nodeproppred.Evaluator`, e.g. ``"ogbn-proteins"``, or
            a metric of :mod:`revgnn.engine.metrics` (``"accuracy"``, ``"rmse"``, ...).
        task (str): ``"multilabel"`` (logits scored as they are) or ``"multiclass"`` (their argmax).
        ds (NodeDataset, optional): Labels and splits for :meth:`__call__`.
    """

    def __init__(self, evaluator: str, task: str, ds: Optional[NodeDataset] = None):
        from revgnn.engine.metrics import METRICS

        self.ds, self.task = ds, task
        if evaluator in METRICS:  # a metric by name (a data set of one's own)
            self.evaluator, self.metric = None, evaluator
            return
        from ogb.nodeproppred import Evaluator

        self.evaluator = Evaluator(evaluator)
        self.metric = self.evaluator.eval_metric

    @classmethod
    def for_dataset(cls, ds: NodeDataset) -> "Scorer":
        return cls(ds.evaluator, ds.task, ds)

    def score(self, y_true: Tensor, logits: Tensor) -> float:
        """The metric of ``logits`` (``[n, C]``) against ``y_true`` (OGB's ``[n, T]`` / ``[n, 1]``)."""
        if self.evaluator is None:
            from revgnn.engine.metrics import score

            return score(self.metric, y_true, logits, self.task)
        pred = logits.argmax(dim=-1, keepdim=True) if self.task == "multiclass" else logits
        return float(self.evaluator.eval({"y_true": y_true, "y_pred": pred})[self.metric])

    def __call__(self, logits: Tensor) -> Dict[str, float]:
        """Returns ``{split: score}`` for ``train``, ``valid`` and ``test`` of the data set; NaN or
        infinite logits are a :class:`~revgnn.engine.divergence.NonFiniteError`, not a score."""
        from revgnn.engine.divergence import check_predictions

        if logits.shape[0] != self.ds.num_nodes:
            raise ValueError(f"logits have {logits.shape[0]} rows for {self.ds.num_nodes} nodes")
        check_predictions({split: logits[idx] for split, idx in self.ds.split_idx.items()})
        return {split: self.score(self.ds.y[idx], logits[idx]) for split, idx in self.ds.split_idx.items()}
