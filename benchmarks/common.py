"""What the benchmarks share: generated graphs, median timing, one child process per measured row,
and markdown tables (``from benchmarks.common import median_after, time_calls``). torch and PyG are
imported inside the functions, so a benchmark's ``--help`` stays fast.

* Graphs: :func:`destination_sorted_graph` (random edges sorted by destination, with 8-d edge features:
  the conv and reversible-stack benchmarks) and :func:`proteins_subgraph` (one step's sub-graph of the
  ogbn-proteins recipe, node features and labels included: the training-step benchmarks);
  :func:`graph_size` reads a benchmark's ``--graph`` choice, a named size or ``NODES:EDGES``.
* Timing: :func:`time_calls` times each call (synchronising the device where asked);
  :func:`median_after` takes the median after the warm-up.
* Child processes: every measured row can run in a fresh interpreter, so that peak RSS, allocator and
  OpenMP settings belong to that row alone. :func:`child_env` prepares its environment,
  :func:`run_child` runs it and returns the JSON lines it printed (the last one is the row).
* Memory: :func:`alive_at_peak` lists what is allocated at the peak of a call, by the operator
  and the revgnn functions that allocated it.
* Tables: :func:`markdown_table`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = [
    "alive_at_peak",
    "destination_sorted_graph",
    "proteins_subgraph",
    "graph_size",
    "time_calls",
    "median_after",
    "child_env",
    "run_child",
    "write_report",
    "ChildFailed",
    "markdown_table",
    "with_pyg_group_add_rev",
]


def destination_sorted_graph(nodes: int, edges: int, seed: int = 0, edge_channels: int = 8):
    """``edges`` uniformly random directed edges over ``nodes`` nodes (self loops and parallel edges
    allowed), sorted by destination then source and returned as a PyG ``EdgeIndex`` (``sort_order="col"``,
    the fast aggregation path), with ``[edges, edge_channels]`` uniform edge features in the same order.
    """
    import torch
    from torch_geometric import EdgeIndex

    g = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, nodes, (2, edges), generator=g)
    edge_attr = torch.rand(edges, edge_channels, generator=g)
    perm = (edge_index[1] * nodes + edge_index[0]).argsort()
    edge_index, edge_attr = edge_index[:, perm], edge_attr[perm]
    edge_index = EdgeIndex(edge_index, sparse_size=(nodes, nodes), sort_order="col")
    return edge_index, edge_attr


def proteins_subgraph(nodes: int, edges: int, device, seed: int = 0):
    """A random undirected graph shaped like one step of the ogbn-proteins recipe (a tenth of the graph:
    about 13.2k nodes and 790k directed edges): ``edges / 2`` random pairs stored in both directions
    with shared 8-d edge features, node input = per-node sum of the incoming edge features ‖ an 8-way
    species one-hot, 112 binary labels (20 % positive). Returns ``[x, edge_index, edge_attr, y]`` on
    ``device``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, nodes, (edges // 2,), generator=g)
    dst = torch.randint(0, nodes, (edges // 2,), generator=g)
    edge_index = torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
    edge_attr = torch.rand(edges // 2, 8, generator=g).repeat(2, 1)
    species = torch.nn.functional.one_hot(torch.randint(0, 8, (nodes,), generator=g), 8).float()
    edge_sum = torch.zeros(nodes, 8).index_add_(0, edge_index[1], edge_attr)
    x = torch.cat([edge_sum, species], dim=-1)
    y = (torch.rand(nodes, 112, generator=g) < 0.2).float()
    return [t.to(device) for t in (x, edge_index, edge_attr, y)]


def graph_size(spec: str, named: Dict[str, Sequence[int]]) -> Tuple[int, int]:
    """``(nodes, edges)`` of a benchmark's graph given by name (a key of ``named``) or as
    ``NODES:EDGES`` (``300:3000``: a graph of any size, e.g. the tiny ones the tests run). Raises
    :class:`ValueError` naming the choices for anything else."""
    if spec in named:
        nodes, edges = named[spec]
        return int(nodes), int(edges)
    nodes, sep, edges = spec.partition(":")
    if sep and nodes.isdigit() and edges.isdigit() and int(nodes) > 0:
        return int(nodes), int(edges)
    raise ValueError(f"graph {spec!r}: give one of {', '.join(named)} or NODES:EDGES (e.g. 300:3000)")


def with_pyg_group_add_rev(model):
    """Replaces every :class:`revgnn.nn.GroupAddRev` of ``model`` (in place) by PyG's
    ``torch_geometric.nn.GroupAddRev`` around the same group modules, so a zoo model can be timed with
    PyG's reversible wrapper instead of ours (same parameters, same blocks). PyG's wrapper knows no
    :class:`~revgnn.nn.Shared` marker: an adapter hands the marked tensors over unwrapped (PyG shares
    every argument whose width is not the node features'). Returns the number of blocks replaced."""
    from torch import nn
    from torch_geometric.nn import GroupAddRev as PyGGroupAddRev

    from revgnn.nn import GroupAddRev, Shared

    class PyGBlock(nn.Module):
        def __init__(self, convs):
            super().__init__()
            self.rev = PyGGroupAddRev(convs, num_groups=len(convs))

        def forward(self, x, *args):
            return self.rev(x, *[a.value if isinstance(a, Shared) else a for a in args])

    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, GroupAddRev):
                setattr(parent, name, PyGBlock(child.convs))
                replaced += 1
    return replaced


def time_calls(
    fn: Callable[[], object], calls: int, sync: Optional[Callable[[], None]] = None
) -> List[float]:
    """Wall-clock seconds of each of ``calls`` calls of ``fn``; ``sync`` (e.g.
    ``torch.cuda.synchronize``) runs before the clock starts and before it stops, so that queued
    device work is counted in the call that queued it."""
    times = []
    for _ in range(calls):
        if sync is not None:
            sync()
        start = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        times.append(time.perf_counter() - start)
    return times


def median_after(times: Sequence[float], warmup: int = 1) -> float:
    """The median of ``times`` without the first ``warmup`` (kernel builds, allocator and cache
    warm-up), or of all of them when nothing would be left (a run too slow for more than one call)."""
    return statistics.median(list(times[warmup:]) or list(times))


def child_env(allocator: Optional[str] = None, strip: Iterable[str] = (), **extra: str) -> Dict[str, str]:
    """The environment for a measured child process: this process's, without the keys in ``strip`` and
    without the launcher's re-execution marker (so that the child's entry point picks its allocator and
    OpenMP settings itself, as a user's run does), then ``extra``.

    Args:
        allocator (str, optional): ``"system"``: glibc malloc (``REVGNN_ALLOCATOR=system``, no
            ``LD_PRELOAD``); any other value: the entry points' default (tcmalloc when installed;
            ``REVGNN_ALLOCATOR`` unset); :obj:`None`: as inherited. (default: :obj:`None`)
        strip (Iterable[str]): Variables not to hand down. (default: none)
        **extra (str): Variables to set.
    """
    env = {k: v for k, v in os.environ.items() if k not in set(strip) | {"_REVGNN_REEXEC"}}
    if allocator == "system":
        env["REVGNN_ALLOCATOR"] = "system"
        env.pop("LD_PRELOAD", None)
    elif allocator is not None:
        env.pop("REVGNN_ALLOCATOR", None)
    env.update(extra)
    return env


class ChildFailed(RuntimeError):
    """A measured child process exited with an error; ``returncode`` and ``stderr`` say how."""

    def __init__(self, cmd: Sequence[str], returncode: int, stderr: str):
        self.returncode, self.stderr = returncode, stderr
        super().__init__(f"{' '.join(map(str, cmd[:3]))} ... failed ({returncode}): {stderr[-2000:]}")


def run_child(
    cmd: Sequence[str],
    env: Optional[Dict[str, str]] = None,
    cwd: Optional[str] = None,
    timeout: Optional[float] = None,
) -> list:
    """Runs ``cmd`` (e.g. ``[sys.executable, "-m", __spec__.name, "--child", ...]``) to completion and
    returns the
    JSON values it printed: every stdout line that parses as a JSON object or array (log lines do
    not); a row's child prints its row last. Raises :class:`ChildFailed` on a non-zero exit and
    ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
    proc = subprocess.run(
        [str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise ChildFailed(cmd, proc.returncode, proc.stderr)
    values = []
    for line in proc.stdout.splitlines():
        if line.startswith(("{", "[")):
            try:
                values.append(json.loads(line))
            except json.JSONDecodeError:  # e.g. a "[time][logger][INFO] ..." log line
                continue
    return values


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> List[str]:
    """The lines of a markdown table: ``| a | b |`` for ``header`` and each row (cells already
    formatted, or ``str()`` of them; an empty cell is ``| |``), under a rule of ``---`` per column, or
    ``---:`` for a column whose letter in ``align`` is ``r`` (``align="lrr"``: left, right, right;
    missing letters are left)."""
    rule = ["---:" if align[i : i + 1] == "r" else "---" for i in range(len(header))]

    def line(cells):
        return "|" + "|".join(f" {c} " if str(c) else " " for c in cells) + "|"

    return [line(header), "|" + "|".join(rule) + "|", *(line(row) for row in rows)]


def write_report(report: str, out: str) -> None:
    """Prints a benchmark's report and writes it to ``out`` (its folder made as needed)."""
    from pathlib import Path

    print()
    print(report)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report)
    print(f"written to {path}")


def alive_at_peak(fn: Callable[[], object], min_bytes: int = 0) -> Tuple[int, List[Tuple[int, int, str]]]:
    """Runs ``fn()`` under :mod:`torch.profiler` (allocation events, Python stacks) and returns the
    peak of the bytes allocated above the start and what was alive then: ``(bytes, count,
    where)`` per place of allocation, largest first, ``where`` being the operator and the three
    innermost revgnn functions (or autograd's entry) above it; allocations under ``min_bytes``
    are summed as ``"smaller allocations"``. Deterministic for a given computation, as
    :class:`revgnn.utils.memory.LargestAllocation` is (which reads the same events), and slow:
    for a scaled-down graph."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True) as prof:
        fn()
    allocations = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.typed[0] == _EventType.Allocation:
            allocations.append(event)
        stack.extend(event.children)
    allocations.sort(key=lambda e: e.start_time_ns)
    live: Dict[int, object] = {}
    current = peak = 0
    at_peak: Dict[int, object] = {}
    for event in allocations:
        fields = event.extra_fields
        if fields.alloc_size > 0:
            live[fields.ptr] = event
        else:
            live.pop(fields.ptr, None)
        current += fields.alloc_size
        if current > peak:
            peak, at_peak = current, dict(live)
    groups: Dict[str, List[int]] = {}
    for event in at_peak.values():
        size = event.extra_fields.alloc_size
        where = _allocated_where(event, _EventType) if size >= min_bytes else "smaller allocations"
        entry = groups.setdefault(where, [0, 0])
        entry[0] += size
        entry[1] += 1
    rows = sorted(((b, c, w) for w, (b, c) in groups.items()), reverse=True)
    return peak, rows


def _allocated_where(event, event_type) -> str:
    op, frames, parent = None, [], event.parent
    while parent is not None and len(frames) < 3:
        name = parent.name
        if op is None and parent.typed[0] == event_type.TorchOp:
            op = name
        if parent.typed[0] == event_type.PyCall and ("revgnn/" in name or "torch/autograd/__init__" in name):
            frames.append(name.split("revgnn/")[-1])
        parent = parent.parent
    return f"{op} @ {' < '.join(frames)}"
