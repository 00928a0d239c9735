"""Training steps of zoo models compiled with ``torch.compile`` (inductor, CPU) against eager, side by side.

For each model (``--models``; node-level models that compile, ``docs/guides/blocks.md``) on a generated
graph (``--graph``: ``small`` = 2,000 nodes and 40k edges, ``proteins`` = the 13.2k-node, 0.79M-edge
sub-graph of one ogbn-proteins step), one step is forward + BCE loss + backward (no optimiser: the same
for both), in training mode. The two variants alternate call by call in one process (eager, compiled,
eager, ...), so a change in the machine's load hits both; the compile itself is one warm-up call and is
reported separately. Prints a markdown table (median step times, compiled / eager) and, with
``--json``, one JSON line per model. ``--graph NODES:EDGES`` runs a graph of any size and ``--backend``
another ``torch.compile`` backend (the tests run a tiny graph through ``aot_eager``).

    python -m benchmarks.compile                                  # all models, both graphs
    python -m benchmarks.compile --graph small --models revgnn_proteins_like --reps 5
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks.common import graph_size, markdown_table, median_after, proteins_subgraph

MODELS = ("revgnn_proteins_like", "revgnn_small", "wt_revgnn", "resgnn_small", "gnn_1layer", "mlp")
GRAPHS = {"small": (2_000, 40_000), "proteins": (13_200, 790_000)}


def measure(name: str, graph: str, reps: int, num_layers, backend: str = "inductor") -> dict:
    import torch

    from revgnn.engine.inference import as_edge_index
    from revgnn.models import create_model, model_info
    from revgnn.nn.graph_input import sort_edges

    nodes, edges = graph_size(graph, GRAPHS)
    x, edge_index, edge_attr, y = proteins_subgraph(nodes, edges, "cpu")
    edge_index, edge_attr = sort_edges(edge_index, edge_attr, nodes)
    edge_index = as_edge_index(edge_index.as_tensor(), nodes)  # as the loop hands batches (CSC filled)
    overrides = {"num_layers": num_layers} if num_layers and "num_layers" in model_info(name).defaults else {}
    torch.manual_seed(0)
    model = create_model(name, **overrides).train()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)

    def step(fn):
        def run():
            logits = fn(x, edge_index, edge_attr)
            torch.nn.functional.binary_cross_entropy_with_logits(logits, y).backward()
            model.zero_grad(set_to_none=True)

        return run

    start = time.perf_counter()
    step(compiled)()  # compiles
    compile_s = time.perf_counter() - start
    step(model)()  # warm-up
    times = {"eager": [], "compiled": []}
    for _ in range(reps):
        for variant, fn in (("eager", model), ("compiled", compiled)):
            start = time.perf_counter()
            step(fn)()
            times[variant].append(time.perf_counter() - start)
    eager, comp = median_after(times["eager"], 0), median_after(times["compiled"], 0)
    return dict(
        model=name,
        graph=graph,
        layers=overrides.get("num_layers", model_info(name).defaults.get("num_layers")),
        eager_ms=1e3 * eager,
        compiled_ms=1e3 * comp,
        ratio=comp / eager,
        compile_s=compile_s,
        threads=torch.get_num_threads(),
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--graph", default="both", help=f"{', '.join(GRAPHS)}, both or NODES:EDGES")
    parser.add_argument("--reps", type=int, default=7, help="measured steps per variant")
    parser.add_argument("--num-layers", type=int, default=None, help="override the models' depth")
    parser.add_argument("--json", action="store_true", help="also one JSON line per model")
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend")
    args = parser.parse_args(argv)
    graphs = list(GRAPHS) if args.graph == "both" else [args.graph]
    try:
        for graph in graphs:
            graph_size(graph, GRAPHS)
    except ValueError as e:
        parser.error(f"--graph: {e}")
    rows = []
    for graph in graphs:
        for name in args.models:
            r = measure(name, graph, args.reps, args.num_layers, args.backend)
            if args.json:
                print(json.dumps(r), flush=True)
            rows.append(
                [
                    r["graph"],
                    r["model"],
                    r["layers"] or "",
                    f"{r['eager_ms']:.1f}",
                    f"{r['compiled_ms']:.1f}",
                    f"{r['ratio']:.2f}",
                    f"{r['compile_s']:.0f}",
                ]
            )
    header = ["graph", "model", "layers", "eager ms", "compiled ms", "compiled / eager", "compile s"]
    print("\n".join(markdown_table(header, rows, "llrrrrr")))


if __name__ == "__main__":
    main()
