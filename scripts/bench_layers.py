"""Per-layer forward/backward time of each conv block against the machine's memory bandwidth.

For generated graphs of proteins-like density (the paper's 10-part sub-graph:
13.2k nodes, 0.79M edges; and a smaller one) this measures, for one
pre-activation block of width ``--channels`` (a group of RevGNN-Deep: 40, with
the 80-wide shared edge embedding in factored form):

* forward without grad and forward + backward (medians of ``--reps``),
* the bytes the layer must move at least (inputs, outputs, edge index and
  gradients read or written once, fp32), and the machine's copy bandwidth
  (measured here, same run), giving "x the bandwidth bound",
* our fused GENConv-max path next to PyG's GENConv (same parameters), side by side.

    python scripts/bench_layers.py                       # both graphs, all blocks
    python scripts/bench_layers.py --graphs small --reps 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

GRAPHS = {"proteins": (13_200, 790_000), "small": (2_000, 40_000)}
BLOCKS = ("gen_max", "gen_max_pyg", "gen_softmax", "gat", "sage", "gcn", "gin")


def bandwidth(reps: int = 5, mib: int = 256) -> float:
    """Copy bandwidth in bytes/s (read + write counted)."""
    import torch

    src = torch.ones(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t)
    return 2 * src.numel() * 4 / statistics.median(times)


def make(block: str, channels: int, hidden: int):
    from revgnn.nn import GATBlock, GCNBlock, GENBlock, GINBlock, SAGEBlock

    if block.startswith("gen"):
        aggr = "softmax" if block == "gen_softmax" else "max"
        return GENBlock(channels, edge_channels=hidden, aggr=aggr, learn_t=aggr == "softmax")
    return {"gat": lambda: GATBlock(channels, heads=2, edge_channels=hidden),
            "sage": lambda: SAGEBlock(channels), "gcn": lambda: GCNBlock(channels),
            "gin": lambda: GINBlock(channels)}[block]()


def measure(block_name: str, nodes: int, edges: int, channels: int, hidden: int, reps: int):
    import torch
    from torch_geometric import EdgeIndex

    from revgnn.nn import LinearEdgeFeatures

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, nodes, (2, edges), generator=g)
    raw = torch.rand(edges, 8, generator=g)
    perm = (ei[1] * nodes + ei[0]).argsort()
    ei, raw = EdgeIndex(ei[:, perm], sparse_size=(nodes, nodes), sort_order="col"), raw[perm]
    shared = torch.nn.Linear(8, hidden)
    block = make(block_name, channels, hidden)
    x = torch.randn(nodes, channels)
    uses_edges = block_name.startswith("gen") or block_name == "gat"

    def call(inp):
        if block_name == "gen_max_pyg":  # PyG's GENConv on the materialised encoding
            h = block.norm(inp).relu()
            return block.conv(h, ei, block.edge_encoder(shared(raw)))
        edges_in = LinearEdgeFeatures.from_linear(raw, shared) if uses_edges else None
        return block(inp, ei, edges_in)

    def fwd():
        with torch.no_grad():
            call(x)

    xr = x.clone().requires_grad_()
    params = [*block.parameters(), *shared.parameters()]

    def fwd_bwd():
        out = call(xr)
        torch.autograd.grad(out, [xr, *params], torch.ones_like(out), allow_unused=True)

    def timed(fn):
        fn()
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    f, fb = timed(fwd), timed(fwd_bwd)
    node_bytes = nodes * channels * 4
    edge_in = edges * 8 * 4 if uses_edges else 0
    index = edges * 8 + (nodes + 1) * 8
    # forward: read x, edges, index; write out. backward: read grad_out and x, read
    # index and edges again, write grad_x and the edge-input gradient.
    min_fwd = 2 * node_bytes + edge_in + index
    min_fwd_bwd = min_fwd + 3 * node_bytes + 2 * edge_in + index
    return dict(block=block_name, nodes=nodes, edges=edges, channels=channels,
                fwd_s=f, fwd_bwd_s=fb, min_bytes_fwd=min_fwd, min_bytes_fwd_bwd=min_fwd_bwd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", default="small,proteins")
    parser.add_argument("--blocks", default=",".join(BLOCKS))
    parser.add_argument("--channels", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=80)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default="bench_out")
    args = parser.parse_args()

    from revgnn.utils.launch import use_tcmalloc
    use_tcmalloc()
    import torch

    bw = bandwidth()
    rows = []
    for graph in args.graphs.split(","):
        nodes, edges = GRAPHS[graph]
        for block in args.blocks.split(","):
            row = measure(block, nodes, edges, args.channels, args.hidden, args.reps)
            row.update(graph=graph, bound_x=row["fwd_bwd_s"] / (row["min_bytes_fwd_bwd"] / bw))
            rows.append(row)
            print(json.dumps(row), flush=True)
    lines = [f"copy bandwidth: {bw / 1e9:.1f} GB/s ({torch.get_num_threads()} threads); "
             f"block width {args.channels}, edge embedding {args.hidden} (factored from 8-d)", "",
             "| graph | block | fwd ms | fwd+bwd ms | min MB moved (fwd+bwd) | bound ms | x bound |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        bound = r["min_bytes_fwd_bwd"] / bw
        lines.append(f"| {r['graph']} | {r['block']} | {r['fwd_s'] * 1e3:.1f} | {r['fwd_bwd_s'] * 1e3:.1f} "
                     f"| {r['min_bytes_fwd_bwd'] / 2**20:.0f} | {bound * 1e3:.2f} | {r['bound_x']:.1f} |")
    by = {(r["graph"], r["block"]): r for r in rows}
    for graph in args.graphs.split(","):
        ours, pyg = by.get((graph, "gen_max")), by.get((graph, "gen_max_pyg"))
        if ours and pyg:
            lines.append(f"\n{graph}: fused GEN-max vs PyG GENConv, fwd+bwd: "
                         f"{ours['fwd_bwd_s'] / pyg['fwd_bwd_s']:.2f}x")
    text = "\n".join(lines)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "layers.md").write_text(text + "\n")
    (out / "layers.json").write_text(json.dumps(dict(bandwidth=bw, rows=rows), indent=1))
    print("\n" + text)


if __name__ == "__main__":
    main()
