"""GEN sum / mean / softmax (``torch.ops.revgnn.gen_aggr``) against GEN max (``torch.ops.revgnn.gen_max``):
time ratios measured side by side in one process.

On a random destination-sorted graph with factored 8-d edge features (RevGNN-Deep's edge encoder,
never expanded), each aggregation's forward and backward (gradients of ``x``, ``W`` and ``b``, and of
the temperature for softmax) are timed in interleaved repetitions, one thread by default, as CPU time
(the thread's, or the process's with ``--threads`` > 1: time spent descheduled on a loaded machine
is not counted, cache and memory contention still is); the table gives each median and its ratio to
GEN max's forward + backward. Absolute times on a shared machine mean little, the ratios (same graph,
same moment) are what to compare (issue #33's target: sum and mean within 1.3x of max).

    python -m benchmarks.gen_aggr                              # 20k nodes, 2M edges, C = 80
    python -m benchmarks.gen_aggr --graph 2000:100000 --reps 5 --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics

from benchmarks.common import destination_sorted_graph, graph_size, markdown_table

GRAPHS = {"default": (20_000, 2_000_000), "small": (2_000, 100_000)}
REDUCES = ("max", "sum", "mean", "softmax")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--graph", default="default", help=f"{sorted(GRAPHS)} or NODES:EDGES")
    parser.add_argument("--channels", type=int, default=80)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--reduces", default=",".join(REDUCES), help="comma-separated subset of " + ",".join(REDUCES)
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = parser.parse_args(argv)
    reduces = args.reduces.split(",")
    unknown = set(reduces) - set(REDUCES)
    if unknown or "max" not in reduces:
        parser.error(f"--reduces must include max and name only {REDUCES}, got {args.reduces}")

    import time

    import torch

    from revgnn.nn import LinearEdgeFeatures
    from revgnn.nn.gen_max import gen_aggregate, gen_max_aggregate

    torch.set_num_threads(args.threads)
    nodes, edges = graph_size(args.graph, GRAPHS)
    edge_index, raw = destination_sorted_graph(nodes, edges)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(nodes, args.channels, generator=gen).requires_grad_()
    weight = (torch.randn(args.channels, raw.size(1), generator=gen) * 0.3).requires_grad_()
    bias = (torch.randn(args.channels, generator=gen) * 0.1).requires_grad_()
    t = torch.ones(1, requires_grad=True)
    grad = torch.randn(nodes, args.channels, generator=gen)

    def aggregate(reduce):
        feats = LinearEdgeFeatures(raw, weight, bias)
        if reduce == "max":
            return gen_max_aggregate(x, edge_index, feats)
        return gen_aggregate(x, edge_index, feats, reduce=reduce, t=t if reduce == "softmax" else None)

    clock = time.thread_time if args.threads == 1 else time.process_time
    times = {r: {"forward": [], "backward": []} for r in reduces}
    for rep in range(args.reps + 1):  # the first round warms up (kernel builds, caches)
        for reduce in reduces:
            start = clock()
            out = aggregate(reduce)
            mid = clock()
            out.backward(grad)
            end = clock()
            if rep:
                times[reduce]["forward"].append(mid - start)
                times[reduce]["backward"].append(end - mid)
            for p in (x, weight, bias, t):
                p.grad = None
    med = {r: {k: statistics.median(v) for k, v in times[r].items()} for r in reduces}
    base = med["max"]["forward"] + med["max"]["backward"]
    ns = 1e9 / (edges * args.channels)
    rows = [
        [
            r,
            f"{med[r]['forward'] * ns:.2f}",
            f"{med[r]['backward'] * ns:.2f}",
            f"{(med[r]['forward'] + med[r]['backward']) / base:.2f}",
        ]
        for r in reduces
    ]
    result = {
        "nodes": nodes,
        "edges": edges,
        "channels": args.channels,
        "threads": args.threads,
        "medians_s": med,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{nodes} nodes, {edges} edges, C = {args.channels}, {args.threads} thread(s), {args.reps} reps"
        )
        header = ["reduce", "forward ns/(E*C)", "backward ns/(E*C)", "fwd+bwd / max's"]
        print("\n".join(markdown_table(header, rows, align="lrrr")))
    return result


if __name__ == "__main__":
    main()
