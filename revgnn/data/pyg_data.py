"""Graphs of one's own: a PyG ``Data`` saved with ``torch.save`` (:func:`load_pyg_file`, ``data=pyg_file``),
any class of ``torch_geometric.datasets`` (:func:`load_pyg_dataset`, ``data=pyg``), and the conversion
both use, :func:`from_pyg`, which also takes what a user's own loader returns (``data._target_`` naming
a function that returns a ``Data``).

The conventions, for one ``Data`` (node-level: one graph, a label per node):

* ``x`` (``[N, F]``, required; integers are taken as numbers), ``edge_index`` (``[2, E]``, required;
  or PyG's transposed ``adj_t``), ``edge_attr`` (``[E, D]`` or ``[E]``, optional), ``y`` (``[N]`` or
  ``[N, T]``, required).
* The task follows from ``y`` unless named (``task``): integers are classes (``multiclass``, scored by
  accuracy), booleans or floats that are all 0 or 1 are binary tasks (``multilabel``, ROC-AUC), other
  floats are values (``regression``, RMSE). NaN in a float ``y`` marks an entry without a label, a
  negative class a node without one (no split may hold it; random parts are drawn from labelled ones).
  ``metric`` names another score (:mod:`revgnn.engine.metrics`: ``accuracy``, ``rocauc``, ``f1``,
  ``rmse``, ``mae``); no OGB name is involved.
* The split: PyG's boolean ``train_mask``, ``val_mask`` (or ``valid_mask``), ``test_mask`` (a 2-d mask,
  one column per split as in some PyG data sets, is read at column ``split``), or a ``split_idx`` dict
  ``{"train", "valid" (or "val"), "test"}`` of node ids. Parts that are missing are drawn at random from
  the nodes in no given part (``valid_fraction`` and ``test_fraction`` of all nodes, seeded by
  ``split_seed``; the rest trains): a ``Data`` without any split is split at random.

A sequence of ``Data`` (a list, or a file holding ``{"graphs": [...], "split_idx": {...}}``, or a PyG
data set of several graphs) is graph-level: one label vector per graph (``y`` ``[1, T]`` or a scalar),
split by ``split_idx`` of graph ids (or a data set's ``get_idx_split()``) or at random as above, trained
in batches of ``batch_size`` graphs with a graph-level model (e.g. ``model=revgnn_mol_small
model.encoder=linear``).

Everything is checked before training (:mod:`revgnn.data.checks`): a missing key, node ids out of range
(negative ones too), splits that overlap or leave the range, labels outside the classes, non-finite
features; each is one :class:`~revgnn.errors.ConfigError` naming the file and the field.

This module imports torch inside its functions: the config schemas read the loaders' signatures
without it (:func:`revgnn.config.data_options.data_schema`).
"""

from __future__ import annotations

import inspect
import os
from typing import TYPE_CHECKING, Annotated, Any, Dict, Optional, Union

from revgnn.data.ordering import NodeOrder
from revgnn.utils.ranges import Range

if TYPE_CHECKING:
    from torch import Tensor

    from revgnn.data.graph_dataset import GraphDataset
    from revgnn.data.node_dataset import NodeDataset

__all__ = ["load_pyg_file", "load_pyg_dataset", "from_pyg", "pyg_safe_globals", "infer_task"]

TASK_NAMES = ("multiclass", "multilabel", "regression")


def _error(message: str):
    from revgnn.errors import ConfigError

    return ConfigError(message)


def pyg_safe_globals():
    """Context manager allowing ``torch.load(..., weights_only=True)`` to read PyG ``Data`` objects
    (the data class and its storages), and nothing else that a pickle could name."""
    import torch
    from torch_geometric.data import Data
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import BaseStorage, EdgeStorage, GlobalStorage, NodeStorage

    classes = [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage, BaseStorage, NodeStorage, EdgeStorage]
    # only those not allowed yet: torch's context manager removes what it was given on exit, also a
    # class that PyG allowed for good at import (Data), which OGB's later loads then lack
    allowed = set(torch.serialization.get_safe_globals())
    return torch.serialization.safe_globals([c for c in classes if c not in allowed])


def infer_task(y: "Tensor") -> str:
    """The task that ``y`` describes: integer classes -> ``multiclass``, booleans or floats all 0 or 1
    (NaN aside) -> ``multilabel``, other floats -> ``regression``."""
    import torch

    if y.dtype == torch.bool:
        return "multilabel"
    if not y.is_floating_point():
        return "multiclass"
    values = y[y == y]
    if values.numel() and bool(((values == 0) | (values == 1)).all()):
        return "multilabel"
    return "regression"


def _labels(name: str, y: Any, task: Optional[str], rows: int) -> tuple:
    """``(y in the loop's shape, task, output channels)``: ``[rows, 1]`` long classes, or ``[rows, T]``
    float targets."""
    import torch

    if not isinstance(y, torch.Tensor):
        raise _error(f"{name}: y must be a tensor of labels, got {type(y).__name__}")
    if y.size(0) != rows:
        raise _error(f"{name}: y has {y.size(0)} rows for {rows} nodes")
    task = task or infer_task(y)
    if task not in TASK_NAMES:
        raise _error(f"{name}: data.task={task}: choose one of {', '.join(TASK_NAMES)}")
    if task == "multiclass":
        if y.dim() > 2 or (y.dim() == 2 and y.size(1) != 1):
            raise _error(
                f"{name}: classes (integer y) must be [N] or [N, 1], got {list(y.shape)}; for several "
                f"binary tasks save y as float 0/1 [N, T]"
            )
        if y.is_floating_point():
            if bool((y != y.round()).any()):
                raise _error(f"{name}: data.task=multiclass needs integer classes in y, got fractions")
        y = y.long().view(-1, 1)  # a negative class marks a row without a label (_unlabelled)
        return y, task, int(y.max()) + 1 if y.numel() and int(y.max()) >= 0 else 0
    y = y.float()
    y = y.view(-1, 1) if y.dim() == 1 else y.reshape(rows, -1)
    if not bool((y == y).any()):
        raise _error(f"{name}: y has no label (all NaN)")
    if bool(y.isinf().any()):
        raise _error(f"{name}: y holds infinite values")
    if task == "multilabel":
        values = y[y == y]
        if not bool(((values == 0) | (values == 1)).all()):
            raise _error(f"{name}: data.task=multilabel needs 0/1 targets (NaN for none) in y")
    return y, task, y.size(1)


def _metric(name: str, metric: Optional[str], task: str) -> str:
    from revgnn.engine.metrics import DEFAULT_METRIC, check_metric

    metric = metric or DEFAULT_METRIC[task]
    try:
        check_metric(metric, task)
    except Exception as e:
        raise _error(f"{name}: {e}") from None
    return metric


def _split(
    name: str,
    data: Any,
    size: int,
    column: int,
    valid_fraction: float,
    test_fraction: float,
    seed: int,
    what: str = "node",
    labelled: Optional["Tensor"] = None,
) -> tuple:
    """``(split_idx, how it was made)`` from ``data``'s ``split_idx`` or masks (see the module
    docstring); missing parts are drawn at random from the ids in no given part (and ``labelled``)."""
    import torch

    given: Dict[str, "Tensor"] = {}
    get = (lambda k: data.get(k)) if isinstance(data, dict) else (lambda k: getattr(data, k, None))
    split_idx = get("split_idx")
    if split_idx is not None:
        if not isinstance(split_idx, dict):
            raise _error(f"{name}: split_idx must be a dict of train/valid/test ids, got {type(split_idx)}")
        aliases = {"train": ("train",), "valid": ("valid", "val"), "test": ("test",)}
        for key, names in aliases.items():
            for alias in names:
                if alias in split_idx:
                    idx = torch.as_tensor(split_idx[alias])
                    given[key] = idx.nonzero().view(-1) if idx.dtype == torch.bool else idx.view(-1)
        unknown = sorted(set(split_idx) - {"train", "valid", "val", "test"})
        if unknown:
            raise _error(f"{name}: split_idx has keys {unknown}; it takes train, valid (or val), test")
        how = "split_idx"
    else:
        how = "masks"
        for key, attrs in {
            "train": ("train_mask",),
            "valid": ("val_mask", "valid_mask"),
            "test": ("test_mask",),
        }.items():
            for attr in attrs:
                mask = get(attr)
                if mask is None:
                    continue
                mask = torch.as_tensor(mask)
                if mask.dim() == 2:
                    if not 0 <= column < mask.size(1):
                        raise _error(
                            f"{name}: {attr} has {mask.size(1)} split columns; data.split={column} is "
                            f"out of range"
                        )
                    mask = mask[:, column]
                if mask.dtype != torch.bool or mask.dim() != 1 or mask.numel() != size:
                    raise _error(
                        f"{name}: {attr} must be a boolean mask of {size} {what}s, got {mask.dtype} "
                        f"{list(mask.shape)}"
                    )
                given[key] = mask.nonzero().view(-1)
                break
    missing = [k for k in ("train", "valid", "test") if k not in given]
    if missing:
        used = torch.zeros(size, dtype=torch.bool)
        for key, idx in given.items():
            if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= size):
                raise _error(
                    f"{name}: split {key!r} holds {what} ids out of range [0, {size}) "
                    f"(min {int(idx.min())}, max {int(idx.max())})"
                )
            used[idx] = True
        free = (~used if labelled is None else ~used & labelled).nonzero().view(-1)
        free = free[torch.randperm(free.numel(), generator=torch.Generator().manual_seed(seed))]
        counts = {"valid": round(valid_fraction * size), "test": round(test_fraction * size)}
        start = 0
        for key in ("valid", "test"):
            if key in missing:
                given[key] = free[start : start + counts[key]].sort().values
                start += counts[key]
        if "train" in missing:
            given["train"] = free[start:].sort().values
        how = (f"{how} and " if len(missing) < 3 else "") + (
            f"random {', '.join(missing)} (seed {seed}, valid {valid_fraction}, test {test_fraction})"
        )
    from revgnn.data.checks import check_split

    check_split(name, given, size, what)
    return {k: given[k] for k in ("train", "valid", "test")}, how


def _labelled(y: "Tensor", task: str) -> "Tensor":
    """Rows of ``y`` with a label: a class >= 0, or any non-NaN target."""
    if task == "multiclass":
        return y.view(-1) >= 0
    return (y == y).any(1)


def _unlabelled(name: str, y: "Tensor", task: str, split_idx, what: str = "node") -> "Tensor":
    """``y`` with the rows no split holds that have no class (negative) set to class 0 (never scored
    or trained on); a split holding such a row is an error."""
    if task != "multiclass" or not bool((y < 0).any()):
        return y
    missing = y.view(-1) < 0
    for key, idx in split_idx.items():
        bad = idx[missing[idx]]
        if bad.numel():
            raise _error(
                f"{name}: {what} {int(bad[0])} is in split {key!r} but has no class (y = "
                f"{int(y[bad[0]])}; {bad.numel()} such {what}s there): classes are numbered 0..C-1, a "
                f"negative one marks a {what} without a label, which no split may hold"
            )
    return y.clamp(min=0)


def _check_classes(name: str, task: str, num_classes: int) -> None:
    """Classification needs two classes at least (class ids >= 0 are checked by :func:`_labels`)."""
    if task == "multiclass" and num_classes < 2:
        raise _error(f"{name}: y has {num_classes} class(es); classification needs at least 2")


def _float(t: Optional["Tensor"]) -> Optional["Tensor"]:
    if t is None:
        return None
    t = t if t.is_floating_point() else t.float()
    return t.view(-1, 1) if t.dim() == 1 else t


def _node_dataset(
    data: Any,
    name: str,
    task: Optional[str],
    metric: Optional[str],
    split: int,
    valid_fraction: float,
    test_fraction: float,
    split_seed: int,
) -> "NodeDataset":
    import torch

    from revgnn.data.checks import check_node_graph
    from revgnn.data.node_dataset import NodeDataset

    if getattr(data, "edge_index", None) is None and getattr(data, "adj_t", None) is not None:
        data = data.clone()
        data.edge_index = _edges_of_adj_t(name, data.adj_t)
    for key in ("x", "edge_index", "y"):
        if getattr(data, key, None) is None:
            keys = ", ".join(sorted(k for k in data.keys()))
            raise _error(
                f"{name}: the graph has no {key!r} (it has {keys or 'nothing'}); a node-level Data needs "
                f"x [N, F], edge_index [2, E] and y, and optionally edge_attr and a split"
            )
    x, edge_index, edge_attr = data.x, data.edge_index, getattr(data, "edge_attr", None)
    if not isinstance(x, torch.Tensor) or x.dim() not in (1, 2):
        raise _error(f"{name}: x must be an [N, F] tensor, got {getattr(x, 'shape', type(x).__name__)}")
    x = _float(x)
    if x.size(1) == 0:
        raise _error(f"{name}: x has no feature columns ([{x.size(0)}, 0]); give each node at least one")
    edge_attr = _float(edge_attr) if isinstance(edge_attr, torch.Tensor) else edge_attr
    num_nodes = x.size(0)
    check_node_graph(name, num_nodes, edge_index, edge_attr, x, None)
    y, task, num_classes = _labels(name, data.y, task, num_nodes)
    labelled = _labelled(y, task)
    split_idx, how = _split(
        name, data, num_nodes, split, valid_fraction, test_fraction, split_seed, labelled=labelled
    )
    y = _unlabelled(name, y, task, split_idx)
    _check_classes(name, task, num_classes)
    metric = _metric(name, metric, task)
    ds = NodeDataset(
        name=name,
        x=x.contiguous(),
        edge_index=edge_index.long().contiguous(),
        edge_attr=None if edge_attr is None else edge_attr.contiguous(),
        y=y,
        split_idx=split_idx,
        task=task,
        num_classes=num_classes,
        evaluator=metric,
        info={"split": how},
    )
    return ds.sorted_by_destination()


def _edges_of_adj_t(name: str, adj_t: Any) -> "Tensor":
    """``edge_index`` (source, destination) of a transposed adjacency ``adj_t`` (PyG's
    ``ToSparseTensor``: a ``torch_sparse.SparseTensor`` or a ``torch.sparse`` tensor, row = destination)."""
    import torch

    if hasattr(adj_t, "coo") and not isinstance(adj_t, torch.Tensor):  # torch_sparse.SparseTensor
        row, col, _ = adj_t.coo()
    elif isinstance(adj_t, torch.Tensor) and adj_t.is_sparse:
        row, col = adj_t.coalesce().indices()
    elif isinstance(adj_t, torch.Tensor) and adj_t.layout in (torch.sparse_csr, torch.sparse_csc):
        row, col = adj_t.to_sparse_coo().coalesce().indices()
    else:
        raise _error(f"{name}: adj_t is a {type(adj_t).__name__}; give edge_index [2, E] instead")
    return torch.stack([col, row])


def _graph_dataset(
    graphs: Any,
    split_source: Any,
    name: str,
    task: Optional[str],
    metric: Optional[str],
    valid_fraction: float,
    test_fraction: float,
    split_seed: int,
    batch_size: int,
) -> "GraphDataset":
    import torch
    from torch_geometric.data import Data

    from revgnn.data.checks import check_node_graph
    from revgnn.data.graph_dataset import GraphDataset

    if len(graphs) == 0:
        raise _error(f"{name}: no graphs")
    out, ys = [], []
    for i, g in enumerate(graphs):
        where = f"{name}: graph {i}"
        if not isinstance(g, Data):
            raise _error(f"{where} is a {type(g).__name__}, not a torch_geometric.data.Data")
        for key in ("x", "edge_index", "y"):
            if getattr(g, key, None) is None:
                raise _error(f"{where} has no {key!r}; every graph needs x, edge_index and y")
        x = _float(g.x)
        if x.dim() != 2 or x.size(1) == 0:
            raise _error(
                f"{where}: x must be [n, F] with F >= 1, got {list(x.shape)} (a TUDataset keeps continuous "
                f"node attributes with data.kwargs.use_node_attr=true)"
            )
        edge_attr = _float(getattr(g, "edge_attr", None))
        check_node_graph(where, x.size(0), g.edge_index, edge_attr, x, None)
        ys.append(torch.as_tensor(g.y).reshape(1, -1))
        out.append(Data(x=x, edge_index=g.edge_index.long(), edge_attr=edge_attr, num_nodes=x.size(0)))
    widths = {y.size(1) for y in ys}
    if len(widths) > 1:
        raise _error(f"{name}: the graphs' y have different widths {sorted(widths)}")
    y, task, num_classes = _labels(name, torch.cat(ys), task, len(out))
    widths = {(g.x.size(1), None if g.edge_attr is None else g.edge_attr.size(1)) for g in out}
    if len(widths) > 1:
        raise _error(f"{name}: the graphs' (x, edge_attr) widths differ: {sorted(widths, key=str)}")
    ((in_channels, edge_channels),) = widths
    split_idx, how = _split(
        name,
        split_source,
        len(out),
        0,
        valid_fraction,
        test_fraction,
        split_seed,
        "graph",
        _labelled(y, task),
    )
    y = _unlabelled(name, y, task, split_idx, "graph")
    for g, label in zip(out, y):
        g.y = label.view(1, -1)
    _check_classes(name, task, num_classes)
    return GraphDataset(
        name=name,
        graphs=out,
        split_idx=split_idx,
        task=task,
        num_classes=num_classes,
        evaluator=_metric(name, metric, task),
        in_channels=in_channels,
        edge_channels=edge_channels,
        batch_size=batch_size,
        info={"split": how},
    )


def from_pyg(
    data: Any,
    name: str = "graph",
    task: Optional[str] = None,
    metric: Optional[str] = None,
    split: Annotated[int, Range(0)] = 0,
    valid_fraction: Annotated[float, Range(0, 1, high_open=True)] = 0.2,
    test_fraction: Annotated[float, Range(0, 1, high_open=True)] = 0.2,
    split_seed: int = 0,
    batch_size: Annotated[int, Range(1)] = 32,
    node_order: NodeOrder = "none",
) -> Union["NodeDataset", "GraphDataset"]:
    """The data set the training loop takes, from PyG objects (conventions: the module docstring).

    Args:
        data: A ``Data`` (node-level); a list of ``Data`` or a dict ``{"graphs": [...],
            "split_idx": {...}}`` (graph-level); a PyG data set (one graph: node-level, several:
            graph-level with its ``get_idx_split()`` when it has one); or a ``NodeDataset`` /
            ``GraphDataset``, returned as it is.
        name (str): The data set's name in logs and ``summary.json``. (default: :obj:`"graph"`)
        task (str, optional): ``multiclass``, ``multilabel`` or ``regression``; :obj:`None` reads it
            off ``y`` (:func:`infer_task`). (default: :obj:`None`)
        metric (str, optional): ``accuracy``, ``rocauc``, ``f1``, ``rmse`` or ``mae``; :obj:`None`:
            the task's default (accuracy, ROC-AUC, RMSE). (default: :obj:`None`)
        split (int): Column of 2-d split masks. (default: :obj:`0`)
        valid_fraction (float): Share of all nodes (graphs) drawn for a missing validation part.
            (default: :obj:`0.2`)
        test_fraction (float): Same for a missing test part. (default: :obj:`0.2`)
        split_seed (int): Seed of a random split. (default: :obj:`0`)
        batch_size (int): Graphs per step of graph-level data. (default: :obj:`32`)
        node_order (str): ``"none"``, ``"rcm"`` or ``"degree"``: relabel the nodes of node-level
            data so that neighbours lie close in memory (:func:`~revgnn.data.ordering.reorder`),
            once, after the split is made; graph-level data refuse any other than ``"none"``.
            (default: :obj:`"none"`)
    """
    from revgnn.data.graph_dataset import GraphDataset
    from revgnn.data.ordering import reorder

    dataset = _from_pyg(
        data, name, task, metric, split, valid_fraction, test_fraction, split_seed, batch_size
    )
    if node_order == "none":
        return dataset
    if isinstance(dataset, GraphDataset):
        raise _error(
            f"{name} is graph-level (many small graphs): data.node_order={node_order} relabels the nodes "
            f"of one big graph; leave it at none"
        )
    return reorder(dataset, node_order)


def _from_pyg(
    data, name, task, metric, split, valid_fraction, test_fraction, split_seed, batch_size
) -> Union["NodeDataset", "GraphDataset"]:
    from torch_geometric.data import Data, Dataset

    from revgnn.data.graph_dataset import GraphDataset
    from revgnn.data.node_dataset import NodeDataset

    if isinstance(data, (NodeDataset, GraphDataset)):
        return data
    options = dict(task=task, metric=metric, valid_fraction=valid_fraction, test_fraction=test_fraction)
    options["split_seed"] = split_seed
    if isinstance(data, Dataset):
        if len(data) == 1:
            return _node_dataset(data[0], name, split=split, **options)
        split_source = {"split_idx": data.get_idx_split()} if hasattr(data, "get_idx_split") else {}
        return _graph_dataset(list(data), split_source, name, batch_size=batch_size, **options)
    if isinstance(data, Data):
        return _node_dataset(data, name, split=split, **options)
    if isinstance(data, dict) and "graphs" in data:
        unknown = sorted(set(data) - {"graphs", "split_idx"})
        if unknown:
            raise _error(f"{name}: a dict of graphs takes the keys graphs and split_idx, not {unknown}")
        return _graph_dataset(data["graphs"], data, name, batch_size=batch_size, **options)
    if isinstance(data, (list, tuple)):
        return _graph_dataset(list(data), {}, name, batch_size=batch_size, **options)
    raise _error(
        f"{name}: got a {type(data).__name__}; expected a torch_geometric.data.Data (one graph), a list "
        f"of Data (graph-level), a dict {{'graphs': [...], 'split_idx': {{...}}}}, a PyG data set, or a "
        f"revgnn NodeDataset / GraphDataset"
    )


def load_pyg_file(
    path: str,
    task: Optional[str] = None,
    metric: Optional[str] = None,
    split: Annotated[int, Range(0)] = 0,
    valid_fraction: Annotated[float, Range(0, 1, high_open=True)] = 0.2,
    test_fraction: Annotated[float, Range(0, 1, high_open=True)] = 0.2,
    split_seed: int = 0,
    batch_size: Annotated[int, Range(1)] = 32,
    node_order: NodeOrder = "none",
) -> Union["NodeDataset", "GraphDataset"]:
    """A graph saved with ``torch.save``: a ``Data`` (node-level), a list of ``Data`` or a dict
    ``{"graphs": [...], "split_idx": {...}}`` (graph-level); read with ``weights_only=True`` and
    PyG's data classes allowed (:func:`pyg_safe_globals`), so loading runs no code from the file.
    The other arguments are :func:`from_pyg`'s; a relative ``path`` is taken from the working
    directory."""
    import pickle

    import torch

    if not path:
        raise _error("data.path is not set: give the file, e.g. data.path=graph.pt")
    if not os.path.isfile(path):
        where = os.path.abspath(path)
        raise _error(f"data.path={path}: no such file ({where}); save a graph with torch.save(data, path)")
    try:
        with pyg_safe_globals():
            data = torch.load(path, weights_only=True, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise _error(
            f"data.path={path}: cannot read it as a graph saved with torch.save ({first[:300]}); it must "
            f"hold a torch_geometric.data.Data, a list of them, or {{'graphs': [...], 'split_idx': {{...}}}}"
        ) from None
    name = os.path.splitext(os.path.basename(path))[0]
    return from_pyg(
        data,
        name,
        task=task,
        metric=metric,
        split=split,
        valid_fraction=valid_fraction,
        test_fraction=test_fraction,
        split_seed=split_seed,
        batch_size=batch_size,
        node_order=node_order,
    )


def _dataset_class(name: str):
    import torch_geometric.datasets as datasets

    cls = getattr(datasets, name, None)
    if not inspect.isclass(cls):
        import difflib

        names = [
            n for n in getattr(datasets, "__all__", dir(datasets)) if inspect.isclass(getattr(datasets, n))
        ]
        close = difflib.get_close_matches(name, names, 3)
        raise _error(
            f"data.name={name}: torch_geometric.datasets has no such class"
            + (f" (did you mean {', '.join(close)}?)" if close else "")
        )
    return cls


def load_pyg_dataset(
    name: str,
    root: Optional[str] = None,
    kwargs: Optional[Dict[str, Any]] = None,
    allow_download: bool = False,
    task: Optional[str] = None,
    metric: Optional[str] = None,
    split: Annotated[int, Range(0)] = 0,
    valid_fraction: Annotated[float, Range(0, 1, high_open=True)] = 0.2,
    test_fraction: Annotated[float, Range(0, 1, high_open=True)] = 0.2,
    split_seed: int = 0,
    batch_size: Annotated[int, Range(1)] = 32,
    node_order: NodeOrder = "none",
) -> Union["NodeDataset", "GraphDataset"]:
    """A data set of ``torch_geometric.datasets`` by its class ``name`` (``KarateClub``,
    ``Planetoid`` with ``kwargs={"name": "Cora"}``, ``TUDataset``, ...), built with ``root``
    (default: ``data/<name>``; classes without one, like ``KarateClub``, take none) and ``kwargs``.
    Downloads are off unless ``allow_download``: a class whose raw files are missing under its
    ``raw_dir`` is then an error naming the directory and the files to put there. One graph is
    node-level, several graph-level (:func:`from_pyg`, which the other arguments go to)."""
    from omegaconf import DictConfig, OmegaConf

    cls = _dataset_class(name)
    kwargs = (
        OmegaConf.to_container(kwargs, resolve=True) if isinstance(kwargs, DictConfig) else dict(kwargs or {})
    )
    params = inspect.signature(cls.__init__).parameters
    if "root" in params and "root" not in kwargs:
        kwargs["root"] = root if root is not None else os.path.join("data", name)
    described = f"{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
    if not allow_download and "download" in cls.__dict__:
        cls = type(name, (cls,), {"download": _refuse_download, "__module__": cls.__module__})
        if "process" in cls.__mro__[1].__dict__:  # PyG processes only if the class defines process
            cls.process = cls.__mro__[1].__dict__["process"]
    try:
        with pyg_safe_globals():  # PyG's own torch.load of the processed file, without its fallback
            dataset = cls(**kwargs)
    except TypeError as e:
        raise _error(f"data: {described}: {e}") from None
    except _DownloadRefused as e:
        raise _error(
            f"data: {described}: its files are missing and downloads are off: put {e.files} into "
            f"{e.raw_dir}, or set data.allow_download=true on a machine with internet access"
        ) from None
    label = name if "name" not in kwargs else f"{name}-{kwargs['name']}"
    return from_pyg(
        dataset,
        label,
        task=task,
        metric=metric,
        split=split,
        valid_fraction=valid_fraction,
        test_fraction=test_fraction,
        split_seed=split_seed,
        batch_size=batch_size,
        node_order=node_order,
    )


class _DownloadRefused(Exception):
    def __init__(self, raw_dir: str, files: str):
        super().__init__(raw_dir)
        self.raw_dir, self.files = raw_dir, files


def _refuse_download(self) -> None:
    names = self.raw_file_names
    names = [names] if isinstance(names, str) else list(names)
    files = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    raise _DownloadRefused(os.path.abspath(self.raw_dir), files or "its raw files")
