"""Times the per-epoch random partition of a proteins-sized graph into induced sub-graphs.

    .venv/bin/python -m benchmarks.partition                 # 132,534 nodes, 79,122,504 edges, 10 parts
    .venv/bin/python -m benchmarks.partition --edges 2000000 --repeats 5

The graph is random (ogbn-proteins' sizes, edges sorted by destination as the loader stores them, 8-d
float edge features). One measurement = ``partition_graph`` (draw the partition, find the edges inside
parts, group them by part, relabel to local ids) plus, for every part, gathering its node ids and edge
features, i.e. everything an epoch of training needs besides the model.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from revgnn.data.random_parts import partition_graph
from revgnn.utils.memory import peak_rss_bytes


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=132_534, help="nodes (default: ogbn-proteins)")
    parser.add_argument(
        "--edges", type=int, default=79_122_504, help="directed edges (default: ogbn-proteins)"
    )
    parser.add_argument("--edge-channels", type=int, default=8, help="edge feature width")
    parser.add_argument("--parts", type=int, default=10, help="parts K")
    parser.add_argument("--repeats", type=int, default=3, help="timed partitions (a new one each)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    g = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    dst = torch.randint(0, args.nodes, (args.edges,), generator=g).sort().values
    src = torch.randint(0, args.nodes, (args.edges,), generator=g)
    edge_index = torch.stack([src, dst])
    del src, dst
    edge_attr = torch.rand(args.edges, args.edge_channels, generator=g)
    print(
        f"graph: {args.nodes:,} nodes, {args.edges:,} edges, built in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )

    times, kept = [], 0
    for r in range(args.repeats):
        t0 = time.perf_counter()
        parts = partition_graph(edge_index, args.nodes, args.parts, torch.Generator().manual_seed(r))
        t_index = time.perf_counter() - t0
        kept = 0
        for sub in parts:
            attr = sub.edge_rows(edge_attr)
            kept += attr.size(0)
        t_total = time.perf_counter() - t0
        times.append(t_total)
        print(
            f"repeat {r}: partition {t_index:.2f} s, with edge-feature gathers {t_total:.2f} s "
            f"({kept:,} edges kept in {args.parts} parts)",
            flush=True,
        )
    peak_gb = peak_rss_bytes() / 2**30
    result = {
        "nodes": args.nodes,
        "edges": args.edges,
        "parts": args.parts,
        "threads": torch.get_num_threads(),
        "seconds_mean": sum(times) / len(times),
        "seconds_min": min(times),
        "kept_edges": kept,
        "peak_rss_gb": round(peak_gb, 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
