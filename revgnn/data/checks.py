"""Checks of a loaded graph: node ids in range, splits that are node (or graph) ids, disjoint and in
range, and finite inputs — written once, for both places that check data.

Each ``*_problems`` function returns every problem it finds, one sentence each naming the field, what
is wrong and the first offending entry (an empty list: valid); :func:`describe` makes them one
message. :class:`~revgnn.data.node_dataset.NodeDataset` raises them as a :class:`ValueError` at
construction; the ``check_*`` functions, which the loaders of one's own data and the loop call, as a
:class:`~revgnn.errors.ConfigError`, so ``revgnn-train`` prints one message and exits with 2 instead of
training on the data (an id out of range corrupts memory in the fused kernels; a NaN feature makes the
loss NaN, which would read as a divergence blamed on the learning rate).

:func:`check_node_graph` checks one graph's tensors (a PyG ``Data``'s or a
:class:`~revgnn.data.node_dataset.NodeDataset`'s), :func:`check_split` a split, and
:func:`check_finite_inputs` the features of any data set the loop trains on
(:func:`revgnn.engine.tasks.make_task` calls it for every data set).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Mapping, Optional

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "check_node_graph",
    "check_split",
    "check_finite",
    "check_finite_inputs",
    "nonfinite_entries",
    "finite_problem",
    "graph_problems",
    "split_problems",
    "describe",
]


def describe(name: str, problems: List[str]) -> str:
    """One message for the ``problems`` of data set ``name``: ``"name: problem"``, or a list."""
    if len(problems) == 1:
        return f"{name}: {problems[0]}"
    return f"{name}: the data set is not valid:\n  - " + "\n  - ".join(problems)


def _raise(name: str, problems: List[str]) -> None:
    if problems:
        from revgnn.errors import ConfigError

        raise ConfigError(describe(name, problems))


#: entries a finiteness check reads at a time: its temporaries (``isfinite`` makes a float copy) stay a
#: few MB at any data set size instead of one copy of the whole tensor
_FINITE_CHUNK = 1 << 20


def nonfinite_entries(t: "Tensor") -> tuple:
    """``(count, first row, kinds)`` of the NaN or infinite entries of the float tensor ``t``:
    ``(0, None, [])`` when every entry is finite; ``kinds`` lists ``"NaN"`` and/or ``"infinite"``.
    Read in chunks of rows, so the check needs no tensor of ``t``'s size."""
    import torch

    rows = t.reshape(t.size(0), -1) if t.dim() else t.reshape(1, 1)
    step = max(1, _FINITE_CHUNK // max(rows.size(1), 1))
    count, first, kinds = 0, None, set()
    for start in range(0, rows.size(0), step):
        chunk = rows[start : start + step]
        bad = ~torch.isfinite(chunk)
        found = int(bad.sum())
        if not found:
            continue
        count += found
        if first is None:
            first = start + int(bad.any(1).nonzero()[0, 0])
        kinds.update(k for k, m in (("NaN", chunk.isnan()), ("infinite", chunk.isinf())) if bool(m.any()))
    return count, first, [k for k in ("NaN", "infinite") if k in kinds]


def finite_problem(what: str, t: Optional["Tensor"], row: str = "node") -> Optional[str]:
    """The problem of a float tensor ``t`` holding NaN or infinite entries (how many, of which kind,
    the first ``row`` holding one), or :obj:`None`."""
    if t is None or not t.is_floating_point() or t.numel() == 0:
        return None
    count, first, kinds = nonfinite_entries(t)
    if not count:
        return None
    return (
        f"{what} holds {count} non-finite ({', '.join(kinds)}) value(s) of {t.numel()}, the first at "
        f"{row} {first}: the input data are not finite, so training on them would diverge whatever the "
        f"learning rate; fix or impute them before training"
    )


def check_finite(name: str, what: str, t: Optional["Tensor"], row: str = "node") -> None:
    """Raises :class:`~revgnn.errors.ConfigError` when the float tensor ``t`` holds NaN or infinite
    entries (:func:`finite_problem`)."""
    problem = finite_problem(what, t, row)
    _raise(name, [problem] if problem else [])


def _ids_problem(what: str, ids: "Tensor", size: int, kind: str) -> Optional[str]:
    """Integer ids in ``[0, size)``: the problem of ``ids`` (a tensor of any shape), or :obj:`None`."""
    import torch

    if ids.is_floating_point() or ids.dtype == torch.bool:
        return f"{what} must hold integer {kind} ids, got {ids.dtype}"
    if not ids.numel():
        return None
    low, high = int(ids.min()), int(ids.max())
    if 0 <= low and high < size:
        return None
    where = ""
    if ids.dim() == 2:  # an edge_index: the first edge with an id out of range
        bad = int(((ids < 0) | (ids >= size)).any(0).nonzero()[0, 0])
        where = f"; the first at edge {bad}: {ids[:, bad].tolist()}"
    return (
        f"{what} holds {kind} ids out of range [0, {size}) (min {low}, max {high}{where}); the "
        f"{size} {kind}s are numbered 0..{size - 1}"
    )


def graph_problems(
    num_nodes: int,
    edge_index: "Tensor",
    edge_attr: Optional["Tensor"] = None,
    x: Optional["Tensor"] = None,
    y: Optional["Tensor"] = None,
) -> List[str]:
    """Every problem of one graph: ``edge_index`` not ``[2, E]`` integer node ids in
    ``[0, num_nodes)``, ``edge_attr`` rows other than ``E``, ``x`` or ``y`` rows other than
    ``num_nodes``, non-finite ``x`` or ``edge_attr``."""
    import torch

    problems = []
    if not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2 or edge_index.size(0) != 2:
        shape = list(edge_index.shape) if isinstance(edge_index, torch.Tensor) else type(edge_index).__name__
        problems.append(f"edge_index must be a [2, E] tensor of node ids, got {shape}")
    else:
        problems.append(_ids_problem("edge_index", edge_index, num_nodes, "node"))
        if edge_attr is not None and edge_attr.size(0) != edge_index.size(1):
            problems.append(f"edge_attr has {edge_attr.size(0)} rows for {edge_index.size(1)} edges")
    for what, t in (("x", x), ("y", y)):
        if t is not None and t.size(0) != num_nodes:
            problems.append(f"{what} has {t.size(0)} rows for {num_nodes} nodes")
    problems += [finite_problem("x", x), finite_problem("edge_attr", edge_attr, "edge")]
    return [p for p in problems if p is not None]


def check_node_graph(
    name: str,
    num_nodes: int,
    edge_index: "Tensor",
    edge_attr: Optional["Tensor"] = None,
    x: Optional["Tensor"] = None,
    y: Optional["Tensor"] = None,
) -> None:
    """Raises :class:`~revgnn.errors.ConfigError` listing every problem of one graph
    (:func:`graph_problems`)."""
    _raise(name, graph_problems(num_nodes, edge_index, edge_attr, x, y))


def split_problems(split_idx: Mapping[str, Any], size: int, what: str = "node") -> List[str]:
    """Every problem of ``split_idx`` (``{"train", "valid", "test"}`` -> integer ids): a split
    missing or not a 1-d tensor of integer ids, ids outside ``[0, size)``, an id twice in a split or in
    two splits, an empty training split."""
    import torch

    problems, seen, owner = [], torch.zeros(size, dtype=torch.long), {}
    for i, key in enumerate(("train", "valid", "test")):
        if key not in split_idx:
            problems.append(f"the split has no {key!r} part (it has {', '.join(map(str, split_idx))})")
            continue
        idx = split_idx[key]
        if not isinstance(idx, torch.Tensor) or idx.dim() != 1:
            problems.append(f"split {key!r} must be a 1-d tensor of {what} ids, got {idx!r:.80}")
            continue
        bad = _ids_problem(f"split {key!r}", idx, size, what)
        if bad:
            problems.append(bad)
            continue
        if idx.numel():
            counts = torch.bincount(idx, minlength=size)
            if int(counts.max()) > 1:
                problems.append(f"split {key!r} holds {what} {int(counts.argmax())} more than once")
            both = (seen > 0) & (counts > 0)
            if bool(both.any()):
                first = int(both.nonzero()[0, 0])
                problems.append(
                    f"splits overlap: {what} {first} is in {owner[int(seen[first])]!r} and in "
                    f"{key!r} ({int(both.sum())} {what}s are in both)"
                )
            seen[idx] = i + 1
        owner[i + 1] = key
    train = split_idx.get("train")
    if isinstance(train, torch.Tensor) and train.numel() == 0:
        problems.append("the 'train' split is empty")
    return problems


def check_split(name: str, split_idx: Mapping[str, Any], size: int, what: str = "node") -> None:
    """Raises :class:`~revgnn.errors.ConfigError` listing every problem of ``split_idx``
    (:func:`split_problems`)."""
    _raise(name, split_problems(split_idx, size, what))


def check_finite_inputs(ds) -> None:
    """Checks that the features a model reads (``x``, ``edge_attr``) of a node-level data set, or of
    every graph of a graph-level one, are finite. Raises :class:`~revgnn.errors.ConfigError`."""
    if hasattr(ds, "x"):
        check_finite(ds.name, "x", ds.x)
        check_finite(ds.name, "edge_attr", getattr(ds, "edge_attr", None), "edge")
        return
    graphs = getattr(ds, "graphs", ())
    stored = getattr(graphs, "_data", None)  # a PyG InMemoryDataset: its graphs' tensors, collated
    if stored is not None and getattr(stored, "x", None) is not None:
        check_finite(ds.name, "x (all graphs' nodes)", stored.x)
        check_finite(ds.name, "edge_attr (all graphs' edges)", getattr(stored, "edge_attr", None), "edge")
        return
    for i, g in enumerate(graphs):
        check_finite(ds.name, f"graph {i}'s x", getattr(g, "x", None))
        check_finite(ds.name, f"graph {i}'s edge_attr", getattr(g, "edge_attr", None), "edge")
