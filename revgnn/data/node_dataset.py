"""The one in-memory graph format the training loop consumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

import torch
from torch import Tensor

from revgnn.data.random_parts import sort_by_destination

__all__ = ["NodeDataset"]

TASKS = ("multilabel", "multiclass", "regression")


@dataclass
class NodeDataset:
    """A single graph with node labels and a train/valid/test split.

    Edges are stored sorted by destination (then source) so that every induced sub-graph is sorted as
    well (see :mod:`revgnn.data.random_parts`).

    Attributes:
        name (str): Data set name, e.g. ``"ogbn-proteins"`` or ``"proteins_like"``.
        x (Tensor): ``[N, F]`` float node features. For proteins-style data the last
            :attr:`species_channels` columns are a species one-hot.
        edge_index (Tensor): ``[2, E]`` long, (source, destination), sorted by destination.
        edge_attr (Tensor, optional): ``[E, D]`` float edge features, aligned with :attr:`edge_index`.
        y (Tensor): ``[N, T]`` float 0/1 targets (``multilabel``), ``[N, 1]`` long classes
            (``multiclass``), OGB's shapes, or ``[N, T]`` float values (``regression``).
        split_idx (dict): ``{"train", "valid", "test"}`` -> long node ids.
        task (str): ``"multilabel"`` (BCE over tasks), ``"multiclass"`` (cross entropy) or
            ``"regression"`` (mean squared error).
        num_classes (int): Output channels of the model (tasks, or classes).
        evaluator (str): Name passed to :class:`ogb.nodeproppred.Evaluator`, or a metric of
            :mod:`revgnn.engine.metrics` (``accuracy``, ``rocauc``, ``f1``, ``rmse``, ``mae``).
        species_channels (int): Width of the species one-hot at the end of :attr:`x` (0 if none).
    """

    name: str
    x: Tensor
    edge_index: Tensor
    edge_attr: Optional[Tensor]
    y: Tensor
    split_idx: Dict[str, Tensor]
    task: str
    num_classes: int
    evaluator: str
    species_channels: int = 0
    info: Dict[str, object] = field(default_factory=dict)

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        n = self.x.size(0)
        if self.edge_index.dim() != 2 or self.edge_index.size(0) != 2:
            raise ValueError(f"{self.name}: edge_index must be [2, E], got {list(self.edge_index.shape)}")
        if self.edge_attr is not None and self.edge_attr.size(0) != self.edge_index.size(1):
            raise ValueError(
                f"{self.name}: edge_attr has {self.edge_attr.size(0)} rows for "
                f"{self.edge_index.size(1)} edges"
            )
        if self.y.size(0) != n:
            raise ValueError(f"{self.name}: y has {self.y.size(0)} rows for {n} nodes")
        if self.edge_index.numel() and int(self.edge_index.max()) >= n:
            raise ValueError(
                f"{self.name}: edge_index refers to node {int(self.edge_index.max())} but there are {n} nodes"
            )
        for key in ("train", "valid", "test"):
            if key not in self.split_idx:
                raise ValueError(f"{self.name}: split_idx lacks {key!r}")

    @property
    def num_nodes(self) -> int:
        return self.x.size(0)

    @property
    def num_edges(self) -> int:
        return self.edge_index.size(1)

    @property
    def in_channels(self) -> int:
        return self.x.size(1)

    @property
    def edge_channels(self) -> Optional[int]:
        return None if self.edge_attr is None else self.edge_attr.size(1)

    def sorted_by_destination(self) -> "NodeDataset":
        """Returns this data set with its edges sorted by (destination, source) (a no-op if already)."""
        ei = self.edge_index
        if ei.size(1) < 2:
            return self
        key = ei[1] * self.num_nodes + ei[0]
        if bool((key[1:] >= key[:-1]).all()):
            return self
        perm = sort_by_destination(ei, self.num_nodes)
        self.edge_index = ei[:, perm].contiguous()
        if self.edge_attr is not None:
            self.edge_attr = self.edge_attr[perm].contiguous()
        return self

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.name}, nodes={self.num_nodes}, edges={self.num_edges}, "
            f"x={list(self.x.shape)}, "
            f"edge_attr={None if self.edge_attr is None else list(self.edge_attr.shape)}, "
            f"task={self.task}, classes={self.num_classes}, "
            + ", ".join(f"{k}={v.numel()}" for k, v in self.split_idx.items())
            + ")"
        )


def species_one_hot(species: Tensor) -> tuple[Tensor, Tensor]:
    """Maps arbitrary species ids (e.g. NCBI taxonomy ids) to a one-hot; returns (one_hot, unique_ids)."""
    uniq, inverse = torch.unique(species.view(-1), return_inverse=True)
    one_hot = torch.zeros(species.numel(), uniq.numel())
    one_hot[torch.arange(species.numel()), inverse] = 1.0
    return one_hot, uniq


def sum_edge_features(edge_index: Tensor, edge_attr: Tensor, num_nodes: int) -> Tensor:
    """Per-node sum of the features of its incoming edges (proteins' node feature, Li et al.)."""
    out = torch.zeros(num_nodes, edge_attr.size(1), dtype=edge_attr.dtype)
    return out.index_add_(0, edge_index[1], edge_attr)
