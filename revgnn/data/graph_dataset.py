"""Graph-level data: batches of small graphs with one label vector per graph.

* :class:`GraphDataset`: the format the training loop consumes for graph property prediction (a
  sequence of PyG ``Data`` graphs, a split, the task and the OGB evaluator name); :meth:`~GraphDataset.loader`
  gives PyG ``DataLoader`` s over a split.
* :func:`load_ogbg`: ``ogbg-mol*`` through OGB's own ``PygGraphPropPredDataset``, with the node loaders'
  traps defused by the same helpers (:mod:`revgnn.data.ogbn`: no ``input()`` prompt, ``torch.load`` with
  exactly PyG's classes allowed, no silent download, clear errors for missing or corrupt files).
* :func:`mol_like`: a generated molecule-like data set with ogbg-molhiv's schema whose label needs
  multi-hop reasoning, for CPU smoke runs and demos.

Tests write raw OGB-layout copies with :mod:`revgnn.testing.fake_ogb`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Dict, List, Optional, Sequence

import numpy as np

from revgnn.utils.ranges import Range

if TYPE_CHECKING:  # torch is imported where it is used: the config schemas read the loaders' signatures
    import torch
    from torch import Tensor

__all__ = ["GraphDataset", "load_ogbg", "mol_like", "OGBG_DATASETS"]

TASKS = ("multilabel", "multiclass", "regression")
OGBG_DATASETS = ("ogbg-molhiv", "ogbg-molpcba", "ogbg-moltox21", "ogbg-molbace", "ogbg-molbbbp")


@dataclass
class GraphDataset:
    """Many small graphs, each with a label vector, and a train/valid/test split of graph ids.

    Attributes:
        name (str): e.g. ``"ogbg-molhiv"`` or ``"mol_like"``.
        graphs (Sequence[Data]): Indexable by a long tensor of graph ids (a PyG ``Dataset`` or a list).
            Each graph has ``x`` (``[n, in_channels]``), ``edge_index`` (both directions),
            ``edge_attr`` (or none) and ``y`` (``[1, T]``; NaN marks a missing label).
        split_idx (dict): ``{"train", "valid", "test"}`` -> long graph ids.
        task (str): ``"multilabel"`` (BCE over tasks, missing labels ignored) or ``"multiclass"``.
        num_classes (int): Output channels of the model (tasks, or classes).
        evaluator (str): Name passed to :class:`ogb.graphproppred.Evaluator`, or a metric of
            :mod:`revgnn.engine.metrics` (``accuracy``, ``rocauc``, ``f1``, ``rmse``, ``mae``).
        in_channels (int): Node feature columns (9 categorical atom features for OGB molecules).
        edge_channels (int, optional): Edge feature columns (3 bond features), :obj:`None` if none.
        batch_size (int): Graphs per training step (and per evaluation batch).
    """

    name: str
    graphs: Sequence
    split_idx: Dict[str, Tensor]
    task: str
    num_classes: int
    evaluator: str
    in_channels: int
    edge_channels: Optional[int]
    batch_size: int = 32
    species_channels: int = 0
    info: Dict[str, object] = field(default_factory=dict)

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if self.batch_size < 1:
            raise ValueError(f"{self.name}: batch_size must be >= 1, got {self.batch_size}")
        self.validate()

    def validate(self) -> None:
        """Raises one :class:`ValueError` listing every problem found: a split missing, not integer,
        or holding graph ids outside ``[0, G)`` (negative included); in the graphs, edge ids outside
        each graph's ``[0, n)``, node features other than ``in_channels`` wide, labels other than
        ``[1, num_classes]`` per graph, non-finite node or edge features. One vectorised pass over
        the collated storage of a PyG ``InMemoryDataset`` (OGB's), else one pass over the graphs."""
        import torch

        problems = []
        for key in ("train", "valid", "test"):
            if key not in self.split_idx:
                problems.append(f"split_idx lacks {key!r}")
                continue
            idx = self.split_idx[key]
            if idx.is_floating_point() or idx.dtype == torch.bool:
                problems.append(f"split {key!r} must hold integer graph ids, got {idx.dtype}")
            elif idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= len(self.graphs)):
                low, high = int(idx.min()), int(idx.max())
                problems.append(
                    f"split {key!r} refers to graph {low if low < 0 else high}, outside "
                    f"[0, {len(self.graphs)}) ({len(self.graphs)} graphs)"
                )
        width = self.num_classes if self.task == "multilabel" else 1
        problems += _graph_problems(self.graphs, self.in_channels, width)
        if problems:
            raise ValueError(f"{self.name}: the data set is not valid:\n  - " + "\n  - ".join(problems))

    @property
    def num_graphs(self) -> int:
        return len(self.graphs)

    def subset(self, split: str):
        idx = self.split_idx[split]
        if isinstance(self.graphs, list):
            return [self.graphs[i] for i in idx.tolist()]
        return self.graphs[idx]

    def loader(
        self,
        split: str,
        shuffle: bool = False,
        generator: Optional[torch.Generator] = None,
        batch_size: Optional[int] = None,
    ):
        """A PyG ``DataLoader`` over ``split``; ``generator`` makes a shuffled order reproducible."""
        from torch_geometric.loader import DataLoader

        return DataLoader(
            self.subset(split), batch_size=batch_size or self.batch_size, shuffle=shuffle, generator=generator
        )

    def labels(self, split: str) -> Tensor:
        """``[G, T]`` labels of ``split`` in split order (NaN = missing)."""
        import torch

        return torch.cat([g.y.view(1, -1) for g in self.subset(split)], dim=0)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.name}, graphs={self.num_graphs}, task={self.task}, "
            f"tasks={self.num_classes}, x={self.in_channels}, edge_attr={self.edge_channels}, "
            + ", ".join(f"{k}={v.numel()}" for k, v in self.split_idx.items())
            + ")"
        )


def _graph_problems(graphs: Sequence, in_channels: int, num_classes: int) -> List[str]:
    """The problems of :meth:`GraphDataset.validate` in the graphs themselves (``num_classes``: the
    label width, the tasks of a multilabel set, 1 for a class index)."""
    import torch

    storage = getattr(graphs, "_data", None)
    slices = getattr(graphs, "slices", None)
    if storage is not None and slices and "edge_index" in slices and "x" in slices:
        # an InMemoryDataset: every graph's edges and nodes collated, edge ids local to their graph
        nodes = slices["x"].diff()
        xs, edge_index = [storage.x], storage.edge_index
        per_edge = torch.repeat_interleave(nodes, slices["edge_index"].diff())
        edge_attrs, ys = [getattr(storage, "edge_attr", None)], [storage.y]
        y_rows = slices["y"].diff() if "y" in slices else None
    else:
        if not len(graphs):
            return []
        nodes = torch.tensor([g.num_nodes for g in graphs])
        xs, edge_attrs = [g.x for g in graphs], [getattr(g, "edge_attr", None) for g in graphs]
        edge_index = torch.cat([g.edge_index for g in graphs], dim=1)
        per_edge = torch.repeat_interleave(nodes, torch.tensor([g.edge_index.size(1) for g in graphs]))
        ys, y_rows = [g.y.view(1, -1) for g in graphs], None
    problems = []
    if edge_index.numel():
        bad = (edge_index < 0) | (edge_index >= per_edge)
        if bool(bad.any()):
            problems.append(
                f"{int(bad.any(0).sum())} edge(s) hold node ids outside their graph's [0, n) "
                f"(e.g. {int(edge_index[bad][0])}); edge ids are local to each graph"
            )
    widths = {x.size(-1) for x in xs if x is not None}
    if widths - {in_channels}:
        problems.append(f"node features are {sorted(widths)} wide, in_channels is {in_channels}")
    for what, ts in (("x", xs), ("edge_attr", edge_attrs)):
        count = sum(int((~torch.isfinite(t)).sum()) for t in ts if t is not None and t.is_floating_point())
        if count:
            problems.append(f"{what} has {count} non-finite value(s) (NaN or inf)")
    y = torch.cat([t.reshape(-1, t.size(-1)) for t in ys]) if ys and ys[0] is not None else None
    if y is not None and (y.size(-1) != num_classes or (y_rows is not None and bool((y_rows != 1).any()))):
        problems.append(f"labels must be [1, {num_classes}] per graph, got {y.size(-1)} wide")
    return problems


# ------------------------------------------------------------------------------------------- OGB


def load_ogbg(
    name: str = "ogbg-molhiv",
    root: str = "data",
    allow_download: bool = False,
    batch_size: Annotated[int, Range(1)] = 32,
) -> GraphDataset:
    """Loads an OGB graph-property data set through ``ogb.graphproppred.PygGraphPropPredDataset``.

    Args:
        name (str): An ``ogbg-mol*`` data set (categorical atom/bond features), e.g. ``"ogbg-molhiv"``.
        root (str): Directory holding ``ogbg_molhiv/`` (raw/ and split/scaffold/). (default: ``"data"``)
        allow_download (bool): Let OGB download a missing data set. (default: :obj:`False`)
        batch_size (int): Graphs per step. (default: :obj:`32`)
    """
    from revgnn.data.ogbn import check_layout, load_ogb_dataset

    if name not in OGBG_DATASETS:
        raise ValueError(f"unknown OGB graph data set {name!r}; expected one of {OGBG_DATASETS}")
    check_layout(name, root, allow_download)
    dataset, split_idx = load_ogb_dataset(name, root)
    if "classification" not in dataset.task_type or dataset.task_type.startswith("multiclass"):
        raise ValueError(f"{name}: task type {dataset.task_type!r} is not supported (binary tasks only)")
    data = dataset._data
    return GraphDataset(
        name=name,
        graphs=dataset,
        split_idx={k: v.view(-1).long() for k, v in split_idx.items()},
        task="multilabel",
        num_classes=dataset.num_tasks,
        evaluator=name,
        in_channels=int(data.x.size(1)),
        edge_channels=None if data.edge_attr is None else int(data.edge_attr.size(1)),
        batch_size=batch_size,
    )


# -------------------------------------------------------------------------------- generated data

# indices into OGB's allowable-feature lists (ogb.utils.features)
_C, _N, _O = 5, 6, 7  # atomic number - 1
_SINGLE, _DOUBLE, _AROMATIC = 0, 1, 3  # bond types


def _molecule(rng: np.random.Generator, num_nodes: int, ring_prob: float):
    """A random valence-bounded tree (max degree 4) plus ring closures between atoms 4-5 bonds apart."""
    src, dst = [], []
    degree = np.zeros(num_nodes, dtype=np.int64)
    for i in range(1, num_nodes):
        candidates = np.nonzero(degree[:i] < 3)[0]
        j = int(rng.choice(candidates))
        src.append(j), dst.append(i)
        degree[i] += 1
        degree[j] += 1
    adj = np.zeros((num_nodes, num_nodes), dtype=bool)
    adj[src, dst] = adj[dst, src] = True
    dist = _distances(adj)
    ring = np.zeros(num_nodes, dtype=bool)
    for _ in range(num_nodes // 6):
        if rng.random() >= ring_prob:
            continue
        a, b = np.nonzero(((dist == 4) | (dist == 5)) & (degree[:, None] < 3) & (degree[None] < 3))
        if a.size == 0:
            break
        k = int(rng.integers(a.size))
        i, j = int(a[k]), int(b[k])
        src.append(i), dst.append(j)
        degree[i] += 1
        degree[j] += 1
        adj[i, j] = adj[j, i] = True
        ring[i] = ring[j] = True
        dist = _distances(adj)
    return np.array(src), np.array(dst), degree, adj, dist, ring


def _distances(adj: np.ndarray) -> np.ndarray:
    """All-pairs shortest-path lengths (hops) of a small graph; unreachable = a large number."""
    n = adj.shape[0]
    dist = np.full((n, n), 10**6, dtype=np.int64)
    np.fill_diagonal(dist, 0)
    reach = np.eye(n, dtype=bool)
    frontier = reach
    for hop in range(1, n):
        frontier = (frontier.astype(np.int64) @ adj.astype(np.int64) > 0) & ~reach
        if not frontier.any():
            break
        dist[frontier] = hop
        reach |= frontier
    return dist


def mol_like(
    num_graphs: Annotated[int, Range(1)] = 2000,
    min_nodes: Annotated[int, Range(1)] = 12,
    max_nodes: Annotated[int, Range(1)] = 28,
    distance: Annotated[int, Range(1)] = 5,
    hetero_atoms: Annotated[int, Range(0)] = 2,
    ring_prob: Annotated[float, Range(0, 1)] = 0.5,
    valid_fraction: Annotated[float, Range(0, 1, high_open=True)] = 0.1,
    test_fraction: Annotated[float, Range(0, 1, high_open=True)] = 0.1,
    batch_size: Annotated[int, Range(1)] = 32,
    seed: int = 0,
) -> GraphDataset:
    """Generates ``mol_like``: molecule-shaped graphs with ogbg-molhiv's schema and a multi-hop label.

    Each graph is a carbon skeleton (a random tree of maximum degree 4 with ring closures) in which
    exactly ``hetero_atoms`` atoms are nitrogen and ``hetero_atoms`` are oxygen, placed at random. The
    label is 1 iff some nitrogen and some oxygen are exactly ``distance`` bonds apart (shortest path).
    Atom counts carry no signal (every graph has the same number of N and O), and the remaining atom and
    bond features (degree, hydrogens, ring membership, random double/aromatic bonds) are what RDKit
    would report for such a skeleton, so the label can only be read off ``distance``-hop structure: a
    GNN needs about ``distance / 2`` rounds of message passing before the readout can see it.

    Features follow OGB's ``smiles2graph``: ``x`` is ``[n, 9]`` long (atomic number - 1, chirality,
    degree, formal charge, hydrogens, radicals, hybridisation, aromatic, in ring), ``edge_attr`` is
    ``[2m, 3]`` long (bond type, stereo, conjugated) with both edge directions; ``y`` is ``[1, 1]`` long.
    The split is random; the evaluator is ogbg-molhiv's (ROC-AUC).

    Args:
        num_graphs (int): Graphs. (default: :obj:`2000`)
        min_nodes (int): Smallest graph. (default: :obj:`12`)
        max_nodes (int): Largest graph. (default: :obj:`28`)
        distance (int): N-O shortest-path length that makes a graph positive. (default: :obj:`5`)
        hetero_atoms (int): Nitrogens (and oxygens) per graph. (default: :obj:`2`)
        ring_prob (float): Chance of each of the ``n / 6`` ring closure attempts. (default: :obj:`0.5`)
        valid_fraction (float): Share of graphs in the validation split. (default: :obj:`0.1`)
        test_fraction (float): Share of graphs in the test split. (default: :obj:`0.1`)
        batch_size (int): Graphs per training step. (default: :obj:`32`)
        seed (int): Generator seed. (default: :obj:`0`)
    """
    import torch
    from torch_geometric.data import Data

    if not 2 * hetero_atoms <= min_nodes <= max_nodes:
        raise ValueError(
            f"need 2 * hetero_atoms <= min_nodes <= max_nodes, got {hetero_atoms}, {min_nodes}, {max_nodes}"
        )
    if distance < 1:
        raise ValueError(f"distance must be >= 1, got {distance}")
    rng = np.random.default_rng(seed)
    graphs: List[Data] = []
    for _ in range(num_graphs):
        n = int(rng.integers(min_nodes, max_nodes + 1))
        src, dst, degree, adj, dist, ring = _molecule(rng, n, ring_prob)
        atoms = np.full(n, _C)
        hetero = rng.permutation(n)[: 2 * hetero_atoms]
        nitrogen, oxygen = hetero[:hetero_atoms], hetero[hetero_atoms:]
        atoms[nitrogen], atoms[oxygen] = _N, _O
        label = int((dist[np.ix_(nitrogen, oxygen)] == distance).any())
        bond = np.where(rng.random(src.size) < 0.15, _DOUBLE, _SINGLE)
        in_ring = ring[src] & ring[dst]
        bond[in_ring & (rng.random(src.size) < 0.5)] = _AROMATIC
        aromatic = np.zeros(n, dtype=np.int64)
        aromatic[src[bond == _AROMATIC]] = aromatic[dst[bond == _AROMATIC]] = 1
        valence = {_C: 4, _N: 3, _O: 2}
        hydrogens = np.clip(np.array([valence[a] for a in atoms]) - degree, 0, 8)
        x = np.stack(
            [
                atoms,
                np.zeros(n, np.int64),
                np.minimum(degree, 10),
                np.full(n, 5),
                hydrogens,
                np.zeros(n, np.int64),
                np.where(aromatic == 1, 1, 2),
                aromatic,
                ring.astype(np.int64),
            ],
            axis=1,
        )
        ea = np.stack([bond, np.zeros_like(bond), (bond != _SINGLE).astype(np.int64)], axis=1)
        edge_index = np.stack([np.concatenate([src, dst]), np.concatenate([dst, src])])
        graphs.append(
            Data(
                x=torch.from_numpy(x),
                edge_index=torch.from_numpy(edge_index),
                edge_attr=torch.from_numpy(np.concatenate([ea, ea])),
                y=torch.tensor([[label]]),
                num_nodes=n,
            )
        )
    perm = torch.from_numpy(rng.permutation(num_graphs))
    n_valid, n_test = int(valid_fraction * num_graphs), int(test_fraction * num_graphs)
    split_idx = {
        "train": perm[n_valid + n_test :].sort().values,
        "valid": perm[:n_valid].sort().values,
        "test": perm[n_valid : n_valid + n_test].sort().values,
    }
    positive = float(np.mean([int(g.y) for g in graphs])) if graphs else 0.0
    return GraphDataset(
        name="mol_like",
        graphs=graphs,
        split_idx=split_idx,
        task="multilabel",
        num_classes=1,
        evaluator="ogbg-molhiv",
        in_channels=9,
        edge_channels=3,
        batch_size=batch_size,
        info={"positive_fraction": positive},
    )
