"""The one in-memory graph format the training loop consumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
from torch import Tensor

from revgnn.data.checks import describe, finite_problem, graph_problems, split_problems
from revgnn.data.random_parts import destination_key, is_destination_sorted, sort_by_destination

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
        self.validate()

    def validate(self) -> None:
        """Raises one :class:`ValueError` listing every problem found (:mod:`revgnn.data.checks`):
        ``edge_index`` not ``[2, E]`` integer ids in ``[0, N)`` (negative ids included), ``edge_attr``
        rows other than ``E``, labels not ``[N, num_classes]`` (multilabel) or ``[N, 1]`` classes in
        ``[0, num_classes)`` (multiclass), a split missing, holding ids outside ``[0, N)`` or twice,
        splits that overlap, non-finite features. Run at construction (one :math:`O(N F + E D)` pass),
        so bad data stops at load rather than training on it (a negative id indexed from the end) or
        failing deep inside a kernel."""
        problems = validation_problems(self)
        if problems:
            raise ValueError(describe(self.name, problems))

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
        r"""Returns this data set with its edges sorted by (destination, source), copies of an edge in
        their order (a no-op if sorted already). The edge tensors are replaced one after the other, so
        the sort holds one extra copy of one of them at a time (where nothing else refers to them).

        Without edge features the edges are their keys :math:`k = j N + i`
        (:func:`~revgnn.data.random_parts.destination_key`): the keys are sorted in place and decoded,
        :math:`j = \lfloor k / N \rfloor`, :math:`i = k - j N`: no permutation exists and the old
        edges go before the new ones are written, so the sort holds one ``[E]`` array beside the
        graph (half the edges' bytes). Copies of an edge are equal columns, so their order is moot
        there."""
        key = destination_key(self.edge_index, self.num_nodes)
        if is_destination_sorted(key):
            return self
        if self.edge_attr is None:
            n = self.num_nodes
            self.edge_index = None  # the keys hold the edges: the old tensor goes (if only ours)
            if key.device.type == "cpu":
                key.numpy().sort()  # in place (numpy's sort of int64: no second [E] array)
            else:
                key = torch.sort(key).values
            self.edge_index = torch.empty(2, key.numel(), dtype=key.dtype, device=key.device)
            torch.div(key, n, rounding_mode="floor", out=self.edge_index[1])
            torch.remainder(key, n, out=self.edge_index[0])
            return self
        del key
        perm = sort_by_destination(self.edge_index, self.num_nodes)
        self.edge_index = self.edge_index[:, perm].contiguous()
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


def validation_problems(ds: NodeDataset) -> List[str]:
    """Every problem :meth:`NodeDataset.validate` reports, in order (an empty list: valid): the
    graph's (:func:`~revgnn.data.checks.graph_problems`), the labels' for the task, the split's
    (:func:`~revgnn.data.checks.split_problems`)."""
    n = ds.x.size(0)
    problems = graph_problems(n, ds.edge_index, ds.edge_attr, ds.x, ds.y)
    if ds.y.size(0) != n:  # reported with the graph's problems
        pass
    elif ds.task == "multilabel" and (ds.y.dim() != 2 or ds.y.size(1) != ds.num_classes):
        problems.append(
            f"y must be [N, num_classes] = [{n}, {ds.num_classes}] (multilabel), got {list(ds.y.shape)}"
        )
    elif ds.task == "multiclass" and (ds.y.dim() != 2 or ds.y.size(1) != 1 or ds.y.is_floating_point()):
        problems.append(f"y must be [N, 1] integer classes (multiclass), got {list(ds.y.shape)} {ds.y.dtype}")
    split = split_problems(ds.split_idx, n)
    problems += split
    if ds.task == "multiclass" and ds.y.size(0) == n and not split:
        for key in ("train", "valid", "test"):
            labels = ds.y.view(-1)[ds.split_idx[key]]
            if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= ds.num_classes):
                problems.append(
                    f"split {key!r} has labels outside [0, {ds.num_classes}) (num_classes): "
                    f"{int(labels.min())}..{int(labels.max())}"
                )
    problem = finite_problem("y", ds.y)
    return problems + ([problem] if problem else [])


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
