"""Checks of a loaded graph that a run makes before it trains: node ids in range, splits that are
node (or graph) ids, disjoint and in range, and finite inputs. Each failure is a
:class:`~revgnn.errors.ConfigError` naming the data set, the field and the first offending entry, so
``revgnn-train`` prints one message and exits with 2 instead of training on it (an id out of range
corrupts memory in the fused kernels; a NaN feature makes the loss NaN, which would read as a
divergence blamed on the learning rate).

:func:`check_node_graph` checks one graph's tensors (a PyG ``Data``'s or a
:class:`~revgnn.data.node_dataset.NodeDataset`'s), :func:`check_split` a split, and
:func:`check_finite_inputs` the features of any data set the loop trains on
(:func:`revgnn.engine.tasks.make_task` calls it for every data set).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["check_node_graph", "check_split", "check_finite", "check_finite_inputs", "nonfinite_entries"]


def _error(message: str):
    from revgnn.errors import ConfigError

    return ConfigError(message)


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


def check_finite(name: str, what: str, t: Optional["Tensor"], row: str = "node") -> None:
    """Raises :class:`~revgnn.errors.ConfigError` when the float tensor ``t`` holds NaN or infinite
    entries, saying how many and the first ``row`` holding one."""
    if t is None or not t.is_floating_point() or t.numel() == 0:
        return
    count, first, kinds = nonfinite_entries(t)
    if count:
        raise _error(
            f"{name}: {what} holds {count} non-finite ({', '.join(kinds)}) value(s) of {t.numel()}, the "
            f"first at {row} {first}: the input data are not finite, so training on them would diverge "
            f"whatever the learning rate; fix or impute them before training"
        )


def check_node_graph(
    name: str,
    num_nodes: int,
    edge_index: "Tensor",
    edge_attr: Optional["Tensor"] = None,
    x: Optional["Tensor"] = None,
    y: Optional["Tensor"] = None,
) -> None:
    """Checks one graph: ``edge_index`` is ``[2, E]`` of integer node ids in ``[0, num_nodes)``,
    ``edge_attr`` has one row per edge, ``x`` and ``y`` one row per node, and ``x`` and
    ``edge_attr`` are finite. Raises :class:`~revgnn.errors.ConfigError`."""
    import torch

    if not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2 or edge_index.size(0) != 2:
        shape = list(edge_index.shape) if isinstance(edge_index, torch.Tensor) else type(edge_index).__name__
        raise _error(f"{name}: edge_index must be a [2, E] tensor of node ids, got {shape}")
    if edge_index.is_floating_point() or edge_index.dtype == torch.bool:
        raise _error(f"{name}: edge_index must hold integer node ids, got {edge_index.dtype}")
    if edge_index.numel():
        low, high = int(edge_index.min()), int(edge_index.max())
        if low < 0 or high >= num_nodes:
            bad = int(((edge_index < 0) | (edge_index >= num_nodes)).any(0).nonzero()[0, 0])
            raise _error(
                f"{name}: edge_index holds node ids out of range [0, {num_nodes}) (min {low}, max {high}; "
                f"the first at edge {bad}: {edge_index[:, bad].tolist()}); a graph of {num_nodes} nodes "
                f"numbers them 0..{num_nodes - 1}"
            )
    if edge_attr is not None and edge_attr.size(0) != edge_index.size(1):
        raise _error(f"{name}: edge_attr has {edge_attr.size(0)} rows for {edge_index.size(1)} edges")
    for what, t in (("x", x), ("y", y)):
        if t is not None and t.size(0) != num_nodes:
            raise _error(f"{name}: {what} has {t.size(0)} rows for {num_nodes} nodes")
    check_finite(name, "x", x)
    check_finite(name, "edge_attr", edge_attr, "edge")


def check_split(name: str, split_idx: Mapping[str, Any], size: int, what: str = "node") -> None:
    """Checks ``split_idx`` (``{"train", "valid", "test"}`` -> integer ids): every split present,
    ids in ``[0, size)``, no id twice in a split and no id in two splits; the training split not
    empty. Raises :class:`~revgnn.errors.ConfigError`."""
    import torch

    seen = torch.zeros(size, dtype=torch.long)
    owner = {}
    for i, key in enumerate(("train", "valid", "test")):
        if key not in split_idx:
            raise _error(f"{name}: the split has no {key!r} part (it has {', '.join(map(str, split_idx))})")
        idx = split_idx[key]
        if not isinstance(idx, torch.Tensor) or idx.is_floating_point() or idx.dim() != 1:
            raise _error(f"{name}: split {key!r} must be a 1-d tensor of {what} ids, got {idx!r:.80}")
        if idx.numel():
            low, high = int(idx.min()), int(idx.max())
            if low < 0 or high >= size:
                raise _error(
                    f"{name}: split {key!r} holds {what} ids out of range [0, {size}) (min {low}, max {high})"
                )
            counts = torch.bincount(idx, minlength=size)
            if int(counts.max()) > 1:
                raise _error(f"{name}: split {key!r} holds {what} {int(counts.argmax())} more than once")
            both = (seen > 0) & (counts > 0)
            if bool(both.any()):
                first = int(both.nonzero()[0, 0])
                raise _error(
                    f"{name}: splits overlap: {what} {first} is in {owner[int(seen[first])]!r} and in "
                    f"{key!r} ({int(both.sum())} {what}s are in both)"
                )
            seen[idx] = i + 1
        owner[i + 1] = key
    if split_idx["train"].numel() == 0:
        raise _error(f"{name}: the 'train' split is empty")


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
