"""Full-graph training steps and inference at the real data sets' sizes: peak RSS, seconds, ns per
edge × channel × layer, for each conv recipe of the zoo.

Each row is one fresh child process (so that its peak RSS is its own), run one after the other:

1. it generates a random graph of the named size (``proteins``: 132,534 nodes, 79,122,504 directed
   edges, 8-d edge features, 16-d node input, 112 binary tasks; ``products``: 2,449,029 nodes,
   123,718,280 directed edges, 100-d node input, 47 classes, no edge features; or ``NODES:EDGES``),
   sorts it by destination once (a PyG ``EdgeIndex`` with its CSC pointer, as the zoo's models do)
   and records the process's RSS: the **graph** column, what the data alone costs;
2. it builds a :class:`revgnn.models.RevGNN` of the recipe (2 groups, dropout 0.1; ``--hidden``
   channels, default 80 on proteins as RevGNN-Deep, 160 on products as the PyG products example) with
   ``--layers`` reversible blocks;
3. ``train``: one full-graph training step (forward, loss over every node, backward, Adam step);
   ``infer``: one forward under ``torch.no_grad``. Timed once (the median of ``--repeat`` calls)
   after ``--warmup`` untimed calls
   (default 1: the first call loads kernels and fills caches). **step peak** is the peak RSS from
   the built graph on (Linux's ``VmHWM``, reset then: the graph resident, plus the model, optimiser
   and every call); the JSON's ``peak_rss_gb`` is ``ru_maxrss`` at the end, which that reset clears
   too (where it cannot be reset: the whole process's, graph generation included);
   **ns/(E·C·L)** is the timed seconds over edges × hidden channels × layers.

The recipes are the conv blocks of the zoo: ``gen_max`` (GENConv max, RevGNN-Deep's), ``gen_mean``,
``gen_softmax`` (learnable temperature), ``sage``, ``gcn``, ``gin``, ``gat`` (2 heads; edge
features where the graph has them). ``--pyg`` adds, per recipe, one layer of PyG's own conv on the
same graph (forward + backward, its messages formed as PyG forms them): the side-by-side figure where
it fits in memory, ``out of memory`` where it does not.

**Cost per edge against graph size** (``--sweep``): one graph per edge count, of ``EDGES /
--degree`` nodes (default degree 50, products' is about 50), each with every ``--node-order``
(``none``, ``rcm``, ``degree``: applied as ``data.node_order`` applies it,
:func:`revgnn.data.ordering.reorder`, its seconds reported apart). The table gives ns per edge and
its ratio to the smallest graph's in the same series. ``--generator random`` draws uniform edges,
which no order can make local; ``--generator geometric`` a 2-d lattice graph whose locality is
hidden by random ids (:func:`geometric_edges`), which RCM recovers.

    python -m benchmarks.scale --graph proteins --recipes gen_max,sage --modes train,infer
    python -m benchmarks.scale --graph products --recipes sage --layers 2,8
    python -m benchmarks.scale --graph 20000:2000000 --pyg          # a small graph, every recipe
    python -m benchmarks.scale --sweep 0.1M,0.4M,1.6M,6.4M,25.6M,124M --generator geometric \
        --node-order none,rcm --recipes gen_max --modes train --layers 8 --hidden 64

``--composition`` profiles the timed call (:func:`benchmarks.common.alive_at_peak`) and lists, per row,
what is alive at its peak in node states, by the operator and revgnn functions that allocated it:
where a step's memory goes, on a scaled-down graph (``--graph products/40``).

The table goes to ``bench_out/scale.md`` (``--out``) and each row to stdout as JSON.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

from benchmarks.common import ChildFailed, alive_at_peak, child_env, graph_size, markdown_table, run_child

#: name -> (nodes, edges, node input, edge features, outputs, multi-label, default hidden channels)
SIZES: Dict[str, tuple] = {
    "proteins": (132_534, 79_122_504, 16, 8, 112, True, 80),
    "products": (2_449_029, 123_718_280, 100, 0, 47, False, 160),
}
#: recipe -> (conv, conv options)
RECIPES: Dict[str, tuple] = {
    "gen_max": ("gen", {"aggr": "max"}),
    "gen_mean": ("gen", {"aggr": "mean"}),
    "gen_softmax": ("gen", {"aggr": "softmax", "learn_t": True}),
    "sage": ("sage", {"aggr": "mean"}),
    "gcn": ("gcn", {}),
    "gin": ("gin", {}),
    "gat": ("gat", {"heads": 2}),
}


def _rss_bytes() -> int:
    """The process's current resident set size (``/proc/self/statm``)."""
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _reset_high_water_mark() -> bool:
    """Resets the process's peak RSS (``VmHWM``; Linux: ``5`` into ``/proc/self/clear_refs``), so that
    :func:`_high_water_mark` then measures what follows alone; False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _high_water_mark() -> int:
    """``VmHWM`` of ``/proc/self/status``: the peak RSS since the last reset, in bytes."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def shape_of(graph: str):
    """``(nodes, edges, in, edge_dim, out, multilabel, hidden)`` of a named size, a named size scaled
    down (``products/40``: its features and channels, 1/40 of its nodes and edges) or
    ``NODES:EDGES`` (a small proteins-like graph)."""
    if graph in SIZES:
        return SIZES[graph]
    name, _, divisor = graph.partition("/")
    if name in SIZES and divisor:  # products/40: the named graph's features, 1/40 of its nodes and edges
        if not divisor.isdigit() or int(divisor) < 1:
            raise ValueError(f"{graph!r}: a named size over a positive integer, e.g. {name}/40")
        nodes, edges, *rest = SIZES[name]
        return (max(1, nodes // int(divisor)), max(1, edges // int(divisor)), *rest)
    nodes, edges = graph_size(graph, {k: v[:2] for k, v in SIZES.items()})
    return (nodes, edges, 16, 8, 112, True, 32)


def random_edges(nodes: int, edges: int, generator):
    """``[2, edges]`` uniformly random directed edges (self loops and parallel edges allowed): no order
    of the nodes brings neighbours close, whatever it is."""
    import torch

    return torch.randint(0, nodes, (2, edges), generator=generator)


def geometric_edges(nodes: int, edges: int, generator):
    """``[2, edges]`` directed edges of a 2-d lattice graph with its locality hidden: node ``i`` sits
    at cell ``(i // side, i % side)`` of a ``side x side`` torus (``side = ceil(sqrt(N))``) and each
    edge joins a uniformly random source to a uniformly random cell within ``r`` of it in both
    directions (``(2r + 1)^2`` about twice the mean degree, so few edges repeat); then every node
    gets a random new id. An order by breadth-first levels (RCM) finds a bandwidth of about
    ``side * r`` again, where the shuffled ids read sources from the whole ``[N, C]`` matrix."""
    import math

    import torch

    side = math.isqrt(nodes - 1) + 1 if nodes > 1 else 1
    r = max(1, math.ceil((math.sqrt(2 * edges / nodes) - 1) / 2))
    src = torch.randint(0, nodes, (edges,), generator=generator)
    row = src // side + torch.randint(-r, r + 1, (edges,), generator=generator)
    col = src % side + torch.randint(-r, r + 1, (edges,), generator=generator)
    dst = (row.remainder_(side) * side + col.remainder_(side)).remainder_(nodes)  # a partial last row wraps
    del row, col
    relabel = torch.randperm(nodes, generator=generator)
    return torch.stack([relabel[src], relabel[dst]])


#: ``--generator``: how a graph's edges are drawn.
GENERATORS = {"random": random_edges, "geometric": geometric_edges}


def make_graph(
    nodes: int,
    edges: int,
    in_channels: int,
    edge_dim: int,
    out: int,
    multilabel: bool,
    generator: str = "random",
    node_order: str = "none",
):
    """A graph of ``GENERATORS[generator]``, relabelled by ``node_order`` the way a data set's loader
    does (:func:`revgnn.data.ordering.reorder`), sorted by destination as an ``EdgeIndex`` with its
    CSC pointer filled; features and labels. Returns ``(x, edge_index, edge_attr, y, seconds the
    order took)``."""
    import torch

    from revgnn.nn.graph_input import sort_edges

    g = torch.Generator().manual_seed(0)
    edge_index = GENERATORS[generator](nodes, edges, g)
    edge_attr = torch.rand(edges, edge_dim, generator=g) if edge_dim else None
    x = torch.randn(nodes, in_channels, generator=g)
    if multilabel:
        y = (torch.rand(nodes, out, generator=g) < 0.2).float()
    else:
        y = torch.randint(0, out, (nodes,), generator=g)
    order_seconds = 0.0
    if node_order != "none":
        start = time.perf_counter()
        x, edge_index, edge_attr, y = _reordered(x, edge_index, edge_attr, y, out, node_order)
        order_seconds = time.perf_counter() - start
    edge_index, edge_attr = sort_edges(edge_index, edge_attr, nodes)
    return x, edge_index, edge_attr, y, order_seconds


def _reordered(x, edge_index, edge_attr, y, out: int, method: str):
    """The tensors relabelled by :func:`revgnn.data.ordering.reorder`, through a
    :class:`~revgnn.data.NodeDataset` as a loader's ``node_order`` does it."""
    import torch

    from revgnn.data.node_dataset import NodeDataset
    from revgnn.data.ordering import reorder

    multilabel = y.is_floating_point()
    ds = NodeDataset(
        name="scale",
        x=x,
        edge_index=edge_index,
        edge_attr=edge_attr,
        y=y if multilabel else y.view(-1, 1),
        split_idx={  # every node in train (a data set has a train split); the order maps it
            "train": torch.arange(x.size(0)),
            **{k: torch.zeros(0, dtype=torch.long) for k in ("valid", "test")},
        },
        task="multilabel" if multilabel else "multiclass",
        num_classes=out,
        evaluator="rocauc" if multilabel else "accuracy",
    )
    ds = reorder(ds, method)
    return ds.x, ds.edge_index, ds.edge_attr, ds.y if multilabel else ds.y.view(-1)


def child(args) -> dict:
    """One row: the graph, the model, one timed call; the row's figures."""
    if args.memory_limit_gb:  # fail with "can't allocate memory" rather than wake the OOM killer
        limit = int(args.memory_limit_gb * 1e9)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import torch

    torch.set_num_threads(args.threads)
    nodes, edges, fin, edge_dim, out, multilabel, hidden = shape_of(args.graph)
    hidden = args.hidden or hidden
    x, edge_index, edge_attr, y, order_seconds = make_graph(
        nodes, edges, fin, edge_dim, out, multilabel, args.generator, args.node_order
    )
    conv, options = RECIPES[args.recipe]
    uses_edges = conv in ("gen", "gat") and edge_attr is not None
    if not uses_edges:
        edge_attr = None
    import gc

    gc.collect()
    graph_rss = _rss_bytes()
    resettable = _reset_high_water_mark()  # from here on, the peak is the model's and the step's
    if args.mode == "pyg":
        hidden //= 2  # one group's width: the conv a block of 2 groups runs twice per layer
        seconds = _pyg_layer(conv, options, hidden, x, edge_index, edge_attr)
        layers = 1
    else:
        from revgnn.models import RevGNN

        torch.manual_seed(0)
        model = RevGNN(
            fin,
            hidden,
            out,
            args.layers,
            conv=conv,
            edge_channels=edge_dim if uses_edges else None,
            dropout=0.1,
            **options,
        )
        loss_fn = torch.nn.BCEWithLogitsLoss() if multilabel else torch.nn.CrossEntropyLoss()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

        def call():
            if args.mode == "infer":
                model.eval()
                with torch.no_grad():
                    model(x, edge_index, edge_attr)
                return
            model.train()
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x, edge_index, edge_attr), y).backward()
            optimizer.step()

        for _ in range(args.warmup):  # caches, kernel loads, the allocator's first pages
            call()
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            if args.composition:
                peak, at_peak = alive_at_peak(call, min_bytes=nodes * hidden)  # >= 1/4 node state
            else:
                call()
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        layers = args.layers
    composition = {}
    if args.composition and args.mode != "pyg":
        state = nodes * hidden * 4  # one [N, hidden] float32 node state
        composition = {
            "peak_above_start_node_states": peak / state,
            "at_peak_node_states": [[b / state, c, where] for b, c, where in at_peak],
        }
    return {
        "graph": args.graph,
        "generator": args.generator,
        "node_order": args.node_order,
        "order_seconds": order_seconds,
        "recipe": args.recipe,
        "mode": args.mode,
        "layers": layers,
        "hidden": hidden,
        "nodes": nodes,
        "edges": edges,
        "seconds": seconds,
        "ns_per_edge": seconds * 1e9 / edges,
        "ns_per_edge_channel_layer": seconds * 1e9 / (edges * hidden * layers),
        "graph_rss_gb": graph_rss / 1e9,
        "step_peak_rss_gb": _high_water_mark() / 1e9 if resettable else None,
        "peak_rss_gb": _peak_bytes() / 1e9,
        **composition,
    }


def _pyg_layer(conv: str, options: dict, channels: int, x, edge_index, edge_attr) -> float:
    """Seconds of one forward + backward of PyG's own conv of the recipe on one group's width."""
    import torch
    from torch_geometric.nn import GATConv, GCNConv, GENConv, GINConv, SAGEConv

    h = torch.randn(x.size(0), channels, requires_grad=True)
    e = torch.randn(edge_index.size(1), channels) if edge_attr is not None and conv == "gen" else None
    layer = {
        "gen": lambda: GENConv(
            channels, channels, aggr=options["aggr"], learn_t=options.get("learn_t", False)
        ),
        "sage": lambda: SAGEConv(channels, channels, aggr=options["aggr"]),
        "gcn": lambda: GCNConv(channels, channels),
        "gin": lambda: GINConv(torch.nn.Linear(channels, channels), train_eps=True),
        "gat": lambda: GATConv(
            channels,
            channels // options["heads"],
            heads=options["heads"],
            edge_dim=edge_attr.size(1) if edge_attr is not None else None,
        ),
    }[conv]()
    args = (h, edge_index) + (
        (e,) if e is not None else ((edge_attr,) if conv == "gat" and edge_attr is not None else ())
    )
    start = time.perf_counter()
    layer(*args).sum().backward()
    return time.perf_counter() - start


def rows_of(args) -> List[dict]:
    """One dict per child process: graph (the sweep's sizes, or ``--graph``), recipe, mode, depth and
    node order."""
    rows = []
    for graph in args.graphs:
        for recipe in args.recipes:
            runs = [(mode, layers) for mode in args.modes for layers in args.layers]
            for mode, layers in runs + ([("pyg", 1)] if args.pyg else []):
                for order in args.node_orders:
                    rows.append(dict(graph=graph, recipe=recipe, mode=mode, layers=layers, node_order=order))
    return rows


def _recipe_label(r: dict) -> str:
    order = r.get("node_order", "none")
    return r["recipe"] if order == "none" else f"{r['recipe']}, {order} order"


def table(results: List[dict]) -> List[str]:
    header = ["recipe", "mode", "layers", "hidden", "graph RSS GB", "step peak RSS GB", "s", "ns/(E·C·L)"]
    lines = []
    for r in results:
        if "error" in r:
            lines.append([_recipe_label(r), r["mode"], r["layers"], "", "", "", r["error"], ""])
            continue
        lines.append(
            [
                _recipe_label(r),
                "PyG conv, 1 layer" if r["mode"] == "pyg" else r["mode"],
                r["layers"],
                r["hidden"],
                f"{r['graph_rss_gb']:.2f}",
                f"{r['step_peak_rss_gb']:.2f}" if r.get("step_peak_rss_gb") else "",
                f"{r['seconds']:.2f}",
                f"{r['ns_per_edge_channel_layer']:.2f}",
            ]
        )
    return markdown_table(header, lines, align="lllrrrrr")


def sweep_table(results: List[dict]) -> List[str]:
    """The sweep: ns per edge of each graph size, and its ratio to the smallest graph's of the same
    recipe, mode, depth and node order (the goal: <= 1.2 at the largest); then one line per series,
    smallest -> largest."""
    header = [
        "edges",
        "nodes",
        "recipe",
        "mode",
        "order",
        "order s",
        "step s",
        "ns/edge",
        "ns/(E·C·L)",
        "× smallest",
    ]
    first: Dict[tuple, float] = {}
    last: Dict[tuple, tuple] = {}
    lines = []
    for r in results:
        key = (r["recipe"], r["mode"], r["layers"], r["node_order"])
        if "error" in r:
            lines.append(
                ["", r["graph"], r["recipe"], r["mode"], r["node_order"], "", r["error"], "", "", ""]
            )
            continue
        base = first.setdefault(key, r["ns_per_edge"])
        last[key] = (r["edges"], r["ns_per_edge"])
        lines.append(
            [
                f"{r['edges']:,}",
                f"{r['nodes']:,}",
                r["recipe"],
                "PyG conv, 1 layer" if r["mode"] == "pyg" else f"{r['mode']}, {r['layers']} x {r['hidden']}",
                r["node_order"],
                f"{r['order_seconds']:.2f}",
                f"{r['seconds']:.3f}",
                f"{r['ns_per_edge']:.1f}",
                f"{r['ns_per_edge_channel_layer']:.3f}",
                f"{r['ns_per_edge'] / base:.2f}",
            ]
        )
    out = markdown_table(header, lines, align="rrlllrrrrr") + [""]
    for key, (edges, ns) in last.items():
        recipe, mode, layers, order = key
        out.append(
            f"- {recipe} {mode} ({layers} layers), order {order}: ns/edge {first[key]:.1f} -> {ns:.1f} "
            f"at {edges:,} edges, {ns / first[key]:.2f}x the smallest graph's"
        )
    return out


def composition_lines(results: List[dict]) -> List[str]:
    """``--composition``: per row, the peak above the call's start and what was alive then, in node
    states (``[N, hidden]`` float32), by the operator and revgnn functions that allocated it."""
    out = []
    for r in results:
        if "at_peak_node_states" not in r:
            continue
        out += [
            "",
            f"{_recipe_label(r)} {r['mode']}: {r['peak_above_start_node_states']:.2f} node states "
            "above the call's start at its peak:",
            "",
        ]
        out += [f"- {units:.2f} ({count}x) {where}" for units, count, where in r["at_peak_node_states"]]
    return out


def _count(text: str) -> int:
    """``124M``, ``0.1M``, ``500k`` or ``2000000``: an edge count."""
    scale = {"k": 1e3, "m": 1e6, "g": 1e9}.get(text[-1:].lower(), 1)
    return int(round(float(text[:-1] if scale != 1 else text) * scale))


def parse(argv=None):
    from revgnn.data.ordering import NODE_ORDERS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--graph",
        default="proteins",
        help="proteins, products, one scaled down (products/40), or NODES:EDGES",
    )
    p.add_argument(
        "--sweep",
        default="",
        help="comma-separated edge counts (124M, 0.1M, 500k, 2000000): one graph each of EDGES / "
        "--degree nodes instead of --graph, and a table of ns per edge against the smallest",
    )
    p.add_argument("--degree", type=int, default=50, help="mean degree of the --sweep graphs (default: 50)")
    p.add_argument(
        "--generator",
        default="random",
        choices=sorted(GENERATORS),
        help="random: uniform edges; geometric: a 2-d lattice graph under random ids (default: random)",
    )
    p.add_argument(
        "--node-order",
        default="none",
        help=f"comma-separated node orders applied as data.node_order does, of {', '.join(NODE_ORDERS)} "
        "(default: none)",
    )
    p.add_argument("--recipes", default=",".join(RECIPES), help=f"comma-separated, of {', '.join(RECIPES)}")
    p.add_argument("--modes", default="train,infer", help="comma-separated: train, infer")
    p.add_argument("--layers", default="2", help="comma-separated depths (default: 2)")
    p.add_argument("--hidden", type=int, default=0, help="hidden channels (default: the size's recipe)")
    p.add_argument("--pyg", action="store_true", help="add one layer of PyG's own conv per recipe")
    p.add_argument(
        "--composition",
        action="store_true",
        help="profile the timed call's allocations and list what is alive at its peak, in node "
        "states [N, hidden] float32 (slow, seconds not comparable: for a scaled-down --graph)",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1, help="untimed calls before the timed one (default: 1)")
    p.add_argument("--repeat", type=int, default=1, help="timed calls, their median reported (default: 1)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per row")
    p.add_argument(
        "--memory-limit-gb",
        type=float,
        default=0.0,
        help="address-space limit per row (RLIMIT_AS): a row past it reports out of memory (default: none)",
    )
    p.add_argument("--out", default="bench_out/scale.md")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--recipe", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.recipes = [r for r in args.recipes.split(",") if r]
    unknown = [r for r in args.recipes if r not in RECIPES]
    if unknown:
        p.error(f"unknown recipe(s) {', '.join(unknown)}; choose from {', '.join(RECIPES)}")
    args.modes = [m for m in args.modes.split(",") if m]
    if any(m not in ("train", "infer") for m in args.modes):
        p.error("--modes takes train and/or infer")
    args.node_orders = [o for o in args.node_order.split(",") if o]
    bad = [o for o in args.node_orders if o not in NODE_ORDERS]
    if bad or not args.node_orders:
        p.error(f"--node-order takes {', '.join(NODE_ORDERS)}, got {args.node_order!r}")
    if args.degree < 1 or args.repeat < 1:
        p.error(f"--degree and --repeat must be >= 1, got {args.degree} and {args.repeat}")
    if args.child:
        args.layers = int(args.layers)
        args.node_order = args.node_orders[0]
    else:
        args.layers = [int(v) for v in args.layers.split(",") if v]
    try:
        sweep = [_count(v) for v in args.sweep.split(",") if v]
    except ValueError:
        p.error(f"--sweep takes edge counts such as 0.1M,1M,124M, got {args.sweep!r}")
    if any(e < 1 for e in sweep):
        p.error(f"--sweep takes positive edge counts, got {args.sweep!r}")
    args.graphs = [f"{max(1, e // args.degree)}:{e}" for e in sweep] or [args.graph]
    for graph in args.graphs:
        try:
            shape_of(graph)  # a bad --graph is an error before any child starts
        except ValueError as e:
            p.error(str(e))
    return args


def main(argv=None) -> List[dict]:
    args = parse(argv)
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return []
    results = []
    for row in rows_of(args):
        cmd = [sys.executable, "-m", "benchmarks.scale", "--child", "--graph", row["graph"]]
        cmd += ["--recipe", row["recipe"], "--mode", row["mode"], "--layers", str(row["layers"])]
        cmd += ["--generator", args.generator, "--node-order", row["node_order"]]
        cmd += ["--hidden", str(args.hidden), "--threads", str(args.threads)]
        cmd += ["--memory-limit-gb", str(args.memory_limit_gb), "--warmup", str(args.warmup)]
        cmd += ["--repeat", str(args.repeat)] + (["--composition"] if args.composition else [])
        try:
            result = run_child(cmd, env=child_env(), timeout=args.timeout)[-1]
        except ChildFailed as err:
            oom = any(m in err.stderr for m in ("can't allocate memory", "MemoryError", "std::bad_alloc"))
            oom = oom or err.returncode in (-9, 137)
            result = {**row, "error": "out of memory" if oom else f"failed ({err.returncode})"}
            result["stderr_tail"] = err.stderr.strip()[-1500:]  # where it ran out, in the JSON line
        print(json.dumps(result), flush=True)
        results.append(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.sweep:
        lines = sweep_table(results)
        head = f"Sweep: {args.generator} graphs of mean degree {args.degree}; {args.threads} threads.\n\n"
    else:
        lines = table(results)
        nodes, edges = shape_of(args.graph)[:2]
        head = f"Graph {args.graph} ({args.generator}): {nodes:,} nodes, {edges:,} edges; "
        head += f"{args.threads} threads.\n\n"
    if args.composition:
        lines += composition_lines(results)
    out.write_text(head + "\n".join(lines) + "\n")
    print("\n".join(lines))
    return results


if __name__ == "__main__":
    main()
