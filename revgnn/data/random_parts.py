"""Random node partitions and their induced sub-graphs, by index arithmetic.

The ogbn-proteins recipe of Li et al. (ICML 2021) draws a fresh random partition of the nodes into ``K``
parts every epoch and trains on one part's induced sub-graph per step. The official code builds each
sub-graph with Python dictionaries and per-edge loops, which costs minutes per epoch on the 79M edges of
ogbn-proteins. Here a whole partition is a handful of vectorised tensor operations:

1. ``part[v]`` for every node: ``uniform`` draws each node's part on its own (the official code's
   ``np.random.randint(K, size=N)``: part sizes are multinomial), ``balanced`` cuts a random
   permutation into ``K`` chunks (sizes differ by at most one);
2. an edge survives iff both endpoints share a part: ``part[src] == part[dst]``;
3. one boolean mask per part groups the surviving edge ids into ``K`` contiguous ranges;
4. a node's local id is its rank inside its part, so ``local[edge_index[:, ids]]`` is the sub-graph.

Because every step is stable and monotone in the global ids, a graph whose edges are sorted by
destination yields sub-graphs whose edges are sorted by destination as well, which lets PyG use its
segment (CSR) aggregation path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

import torch
from torch import Tensor

__all__ = [
    "PARTITION_MODES",
    "random_partition",
    "Partition",
    "SubGraph",
    "partition_graph",
    "sort_by_destination",
    "destination_key",
    "is_destination_sorted",
]

#: How :func:`random_partition` assigns nodes to parts.
PARTITION_MODES = ("balanced", "uniform")


def random_partition(
    num_nodes: int, num_parts: int, generator: Optional[torch.Generator] = None, mode: str = "balanced"
) -> Tensor:
    r"""Assigns every node to one of ``num_parts`` parts at random.

    ``balanced``: a random permutation cut into :math:`K` chunks, so part sizes differ by at most one.
    ``uniform``: every node's part is drawn on its own, :math:`p_v \sim \mathcal{U}\{0, \ldots, K-1\}`
    (the official RevGNN code's ``np.random.randint(K, size=N)``), so the sizes are
    :math:`\mathrm{Multinomial}(N; 1/K, \ldots, 1/K)` and a part may even be empty.

    Args:
        num_nodes (int): Number of nodes ``N``.
        num_parts (int): Number of parts ``K`` (``1 <= K <= N``).
        generator (torch.Generator, optional): Source of randomness (default: the global generator).
        mode (str, optional): ``"balanced"`` or ``"uniform"``. (default: :obj:`"balanced"`)

    Returns:
        A ``[N]`` long tensor of part ids.
    """
    if mode not in PARTITION_MODES:
        raise ValueError(f"partition mode must be one of {', '.join(PARTITION_MODES)}, got {mode!r}")
    if not 1 <= num_parts <= max(num_nodes, 1):
        raise ValueError(f"num_parts must be in [1, num_nodes={num_nodes}], got {num_parts}")
    if mode == "uniform":
        return torch.randint(num_parts, (num_nodes,), generator=generator)
    perm = torch.randperm(num_nodes, generator=generator)
    part = torch.empty(num_nodes, dtype=torch.long)
    part[perm] = torch.arange(num_nodes) * num_parts // num_nodes
    return part


@dataclass
class SubGraph:
    """The sub-graph induced by one part.

    Attributes:
        node_idx (Tensor): ``[n]`` global ids of the part's nodes, ascending.
        edge_index (Tensor): ``[2, e]`` edges in local ids (rows of ``node_idx``).
        edge_ids (Tensor, optional): ``[e]`` global ids of those edges, to gather edge attributes;
            :obj:`None` where the part is the whole graph (``node_idx`` is ``0, ..., N-1`` and
            ``edge_index`` the graph's own edges), whose rows :meth:`node_rows` and
            :meth:`edge_rows` return without a gather.
    """

    node_idx: Tensor
    edge_index: Tensor
    edge_ids: Optional[Tensor]

    @property
    def num_nodes(self) -> int:
        return self.node_idx.numel()

    def node_rows(self, t: Tensor) -> Tensor:
        """The rows of the per-node tensor ``t`` for this part's nodes: ``t[node_idx]``, or ``t``
        itself (no copy: at ogbn-products' size the features are 1 GB) for the whole graph."""
        return t if self.edge_ids is None else t[self.node_idx]

    def edge_rows(self, t: Tensor) -> Tensor:
        """The rows of the per-edge tensor ``t`` for this part's edges: ``t[edge_ids]``, or ``t``
        itself for the whole graph."""
        return t if self.edge_ids is None else t[self.edge_ids]


class Partition:
    """All ``K`` induced sub-graphs of a node partition, built at once and sliced lazily.

    Args:
        edge_index (Tensor): ``[2, E]`` global edges (source, destination).
        part (Tensor): ``[N]`` part id of every node, from :func:`random_partition`.
        num_parts (int): ``K``.
    """

    def __init__(self, edge_index: Tensor, part: Tensor, num_parts: int):
        num_nodes = part.numel()
        self.num_parts = num_parts
        self._edge_index = edge_index
        if num_parts == 1:  # the whole graph (full-graph inference): its own ids, no copy of its edges
            self.node_perm, self.edge_ids, self._local = torch.arange(num_nodes), None, None
            self.node_ptr = torch.tensor([0, num_nodes])
            self.edge_ptr = torch.tensor([0, edge_index.size(1)])
            return
        # Grouping by part uses one boolean mask per part rather than a sort: K passes over a vector are
        # much cheaper than a stable sort of it on CPU, and keep ascending global order inside a part.
        node_groups = [torch.nonzero(part == k).view(-1) for k in range(num_parts)]
        self.node_perm = torch.cat(node_groups)
        self.node_ptr = torch.zeros(num_parts + 1, dtype=torch.long)
        torch.cumsum(torch.tensor([len(n) for n in node_groups]), 0, out=self.node_ptr[1:])
        local = torch.empty(num_nodes, dtype=torch.long)
        for nodes in node_groups:
            local[nodes] = torch.arange(nodes.numel())

        # part ids as int32 (num_parts <= num_nodes < 2^31): the two [E] gathers take half the memory
        part = part.int() if num_nodes < 2**31 else part
        src_part = part[edge_index[0]]
        kept = torch.nonzero(src_part == part[edge_index[1]]).view(-1)
        kept_part = src_part[kept]
        del src_part
        edge_groups = [kept[kept_part == k] for k in range(num_parts)]
        self.edge_ids = torch.cat(edge_groups)
        self.edge_ptr = torch.zeros(num_parts + 1, dtype=torch.long)
        torch.cumsum(torch.tensor([len(e) for e in edge_groups]), 0, out=self.edge_ptr[1:])
        # a part's edges in local ids are gathered when it is taken (__getitem__): a partition holds
        # E / K edge ids, not also 2 E / K local ids (and the gathers' temporaries) for every part at once
        self._local = local

    def __len__(self) -> int:
        return self.num_parts

    def __getitem__(self, k: int) -> SubGraph:
        if not 0 <= k < self.num_parts:
            raise IndexError(f"part {k} out of range [0, {self.num_parts})")
        n0, n1 = self.node_ptr[k].item(), self.node_ptr[k + 1].item()
        e0, e1 = self.edge_ptr[k].item(), self.edge_ptr[k + 1].item()
        if self._local is None:  # one part: the whole graph, nothing gathered
            return SubGraph(self.node_perm, self._edge_index, None)
        ids = self.edge_ids[e0:e1]
        return SubGraph(self.node_perm[n0:n1], self._local[self._edge_index[:, ids]], ids)

    def __iter__(self) -> Iterator[SubGraph]:
        return (self[k] for k in range(self.num_parts))

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(num_parts={self.num_parts}, kept_edges={int(self.edge_ptr[-1])})"


def partition_graph(
    edge_index: Tensor,
    num_nodes: int,
    num_parts: int,
    generator: Optional[torch.Generator] = None,
    mode: str = "balanced",
) -> Partition:
    """Draws a random partition (:func:`random_partition`, ``mode`` ``"balanced"`` or ``"uniform"``)
    and returns its induced sub-graphs (see :class:`Partition`)."""
    return Partition(edge_index, random_partition(num_nodes, num_parts, generator, mode), num_parts)


def sort_by_destination(edge_index: Tensor, num_nodes: int) -> Tensor:
    """Returns the permutation that sorts edges by (destination, source); copies of an edge keep
    their order (a stable sort)."""
    return torch.sort(destination_key(edge_index, num_nodes), stable=True).indices


def destination_key(edge_index: Tensor, num_nodes: int) -> Tensor:
    r"""``[E]`` sort key of every edge by (destination, source): :math:`j N + i` for the edge
    :math:`i \to j`, so equal keys are copies of one edge."""
    return (edge_index[1] * num_nodes).add_(edge_index[0])  # in place: one [E] temporary, not two


def is_destination_sorted(key: Tensor) -> bool:
    """Whether the keys of :func:`destination_key` are in order already."""
    return key.numel() < 2 or bool((key[1:] >= key[:-1]).all())
