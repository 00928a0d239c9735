"""Per-layer forward/backward time of each conv block against the machine's memory bandwidth.

For generated graphs of proteins-like density (the paper's 10-part sub-graph:
13.2k nodes, 0.79M edges; and a smaller one) this measures, for one
pre-activation block of width ``--channels`` (a group of RevGNN-Deep: 40, with
the 80-wide shared edge embedding in factored form):

* forward without grad and forward + backward (medians of ``--reps``),
* the bytes the layer must move at least (inputs, outputs, edge index and
  gradients read or written once, fp32), and the machine's copy bandwidth
  (measured here, same run), giving "x the bandwidth bound",
* the floating-point operations the layer must do at least (its matrix
  products and the factored edge encoder; no recomputation) and the machine's
  fp32 matmul rate (measured here, same run), giving the compute bound; a
  layer can be no faster than the larger of the two bounds (the roofline),
* GENConv-max three ways, side by side: our C++ kernel (``gen_max``), our
  PyTorch fallback (``gen_max_torch``, what runs without a compiler) and PyG's
  GENConv (``gen_max_pyg``), same parameters; and the aggregation alone
  (``aggr_max``/``aggr_max_torch``: ``max_j relu(x_j + W a_ji + b) + eps``
  with the factored 8-d edge features, no norm or MLP).

    python -m benchmarks.layers                       # both graphs, all blocks
    python -m benchmarks.layers --graphs small --reps 3
    python -m benchmarks.layers --graphs 300:3000 --blocks gen_max,gcn --bandwidth-mib 8 --matmul-n 256

(``NODES:EDGES`` is a graph of any size; ``--bandwidth-mib`` and ``--matmul-n`` size the machine's two
reference measurements.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common import destination_sorted_graph, graph_size, markdown_table, median_after, time_calls

GRAPHS = {"proteins": (13_200, 790_000), "small": (2_000, 40_000)}
BLOCKS = (
    "aggr_max",
    "aggr_max_torch",
    "gen_max",
    "gen_max_torch",
    "gen_max_pyg",
    "gen_softmax",
    "gat",
    "sage",
    "gcn",
    "gin",
)


def bandwidth(reps: int = 10, mib: int = 256) -> float:
    """Copy bandwidth in bytes/s (read + write counted), the best of ``reps`` (as STREAM
    reports): on a shared machine the median moves widely from run to run."""
    import torch

    src = torch.ones(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    return 2 * src.numel() * 4 / min(time_calls(lambda: dst.copy_(src), reps))


def matmul_rate(reps: int = 5, n: int = 2048) -> float:
    """fp32 matrix-product rate in FLOP/s (a multiply-add counts 2), all threads, best of ``reps``."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    return 2 * n**3 / min(time_calls(lambda: a @ b, reps))


def min_flops(block: str, nodes: int, edges: int, channels: int, edge_dim: int = 8):
    """FLOPs of forward + backward that no implementation can avoid, or None where not counted.

    GEN: the factored edge encoder (2 E C d forward; its weight gradient through the N x C
    winners, 2 N C d) and the MLP's two GEMMs c -> 2c -> c (8 N C^2 forward, twice that
    backward). SAGE/GIN: two C x C GEMMs, GCN one (forward + 2 backward GEMMs each).
    """
    n, e, c, d = nodes, edges, channels, edge_dim
    edge_term = 2 * e * c * d + 2 * n * c * d
    if block.startswith("aggr_max"):
        return edge_term
    if block.startswith("gen_max"):
        return edge_term + 24 * n * c * c
    return {"sage": 12 * n * c * c, "gin": 12 * n * c * c, "gcn": 6 * n * c * c}.get(block)


def make(block: str, channels: int, hidden: int):
    from revgnn.nn import GATBlock, GCNBlock, GENBlock, GINBlock, SAGEBlock

    if block.startswith(("gen", "aggr")):
        aggr = "softmax" if block == "gen_softmax" else "max"
        return GENBlock(channels, edge_channels=hidden, aggr=aggr, learn_t=aggr == "softmax")
    return {
        "gat": lambda: GATBlock(channels, heads=2, edge_channels=hidden),
        "sage": lambda: SAGEBlock(channels),
        "gcn": lambda: GCNBlock(channels),
        "gin": lambda: GINBlock(channels),
    }[block]()


def measure(block_name: str, nodes: int, edges: int, channels: int, hidden: int, reps: int):
    import os

    before = os.environ.get("REVGNN_KERNELS")
    if block_name.endswith("_torch"):  # the PyTorch fallback, as without a compiler
        os.environ["REVGNN_KERNELS"] = "0"  # read on every dispatch
    try:
        return _measure(block_name, nodes, edges, channels, hidden, reps)
    finally:
        if before is None:
            os.environ.pop("REVGNN_KERNELS", None)
        else:
            os.environ["REVGNN_KERNELS"] = before


def _measure(block_name: str, nodes: int, edges: int, channels: int, hidden: int, reps: int):
    import torch

    from revgnn.nn import LinearEdgeFeatures
    from revgnn.nn.gen_max import gen_max_aggregate

    torch.manual_seed(0)
    ei, raw = destination_sorted_graph(nodes, edges)
    shared = torch.nn.Linear(8, hidden)
    block = make(block_name, channels, hidden)
    x = torch.randn(nodes, channels)
    uses_edges = block_name.startswith(("gen", "aggr")) or block_name == "gat"

    def call(inp):
        if block_name == "gen_max_pyg":  # PyG's GENConv on the materialised encoding
            h = block.norm(inp).relu()
            return block.conv(h, ei, block.edge_encoder(shared(raw)))
        if block_name.startswith("aggr"):
            edge_term = LinearEdgeFeatures.from_linear(raw, shared).compose(block.edge_encoder)
            return gen_max_aggregate(inp, ei, edge_term, block.conv.eps)
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

    f, fb = (median_after(time_calls(fn, reps + 1)) for fn in (fwd, fwd_bwd))
    node_bytes = nodes * channels * 4
    edge_in = edges * 8 * 4 if uses_edges else 0
    index = edges * 8 + (nodes + 1) * 8
    # forward: read x, edges, index; write out. backward: read grad_out and x, read
    # index and edges again, write grad_x and the edge-input gradient.
    min_fwd = 2 * node_bytes + edge_in + index
    min_fwd_bwd = min_fwd + 3 * node_bytes + 2 * edge_in + index
    return dict(
        block=block_name,
        nodes=nodes,
        edges=edges,
        channels=channels,
        fwd_s=f,
        fwd_bwd_s=fb,
        min_bytes_fwd=min_fwd,
        min_bytes_fwd_bwd=min_fwd_bwd,
        min_flops_fwd_bwd=min_flops(block_name, nodes, edges, channels),
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--graphs", default="small,proteins", help=f"comma list of {', '.join(GRAPHS)}, NODES:EDGES"
    )
    parser.add_argument("--blocks", default=",".join(BLOCKS))
    parser.add_argument("--channels", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=80)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default="bench_out")
    parser.add_argument(
        "--bandwidth-mib", type=int, default=256, help="buffer of the copy-bandwidth measurement"
    )
    parser.add_argument("--matmul-n", type=int, default=2048, help="n of the n x n matmul-rate measurement")
    args = parser.parse_args(argv)
    try:
        sizes = {graph: graph_size(graph, GRAPHS) for graph in args.graphs.split(",")}
    except ValueError as e:
        parser.error(f"--graphs: {e}")

    from revgnn.utils.allocator import use_tcmalloc

    use_tcmalloc()
    import torch

    bw, rate = bandwidth(mib=args.bandwidth_mib), matmul_rate(n=args.matmul_n)
    rows = []
    for graph, (nodes, edges) in sizes.items():
        for block in args.blocks.split(","):
            row = measure(block, nodes, edges, args.channels, args.hidden, args.reps)
            bound = row["min_bytes_fwd_bwd"] / bw
            flops = row["min_flops_fwd_bwd"]
            compute = flops / rate if flops else None
            row.update(
                graph=graph,
                bandwidth_bound_s=bound,
                compute_bound_s=compute,
                bound_x=row["fwd_bwd_s"] / bound,
                roofline_x=row["fwd_bwd_s"] / max(bound, compute) if compute else None,
            )
            rows.append(row)
            print(json.dumps(row), flush=True)
    lines = [
        f"copy bandwidth: {bw / 1e9:.1f} GB/s, fp32 matmul: {rate / 1e9:.0f} GFLOP/s "
        f"({torch.get_num_threads()} threads); block width {args.channels}, edge embedding "
        f"{args.hidden} (factored from 8-d)",
        "",
    ]

    def cells(r):
        compute = r["compute_bound_s"]
        flops = (
            [f"{r['min_flops_fwd_bwd'] / 1e9:.2f}", f"{compute * 1e3:.2f}", f"{r['roofline_x']:.1f}"]
            if compute
            else ["-", "-", "-"]
        )
        return [
            r["graph"],
            r["block"],
            f"{r['fwd_s'] * 1e3:.1f}",
            f"{r['fwd_bwd_s'] * 1e3:.1f}",
            f"{r['min_bytes_fwd_bwd'] / 2**20:.0f}",
            f"{r['bandwidth_bound_s'] * 1e3:.2f}",
            f"{r['bound_x']:.1f}",
            *flops,
        ]

    header = ["graph", "block", "fwd ms", "fwd+bwd ms", "min MB moved", "bandwidth bound ms"]
    header += ["x bandwidth bound", "min GFLOP", "compute bound ms", "x roofline"]
    lines += markdown_table(header, map(cells, rows))
    by = {(r["graph"], r["block"]): r for r in rows}
    for graph in args.graphs.split(","):
        for a, b, what in (
            ("gen_max", "gen_max_pyg", "GEN-max block, C++ kernel vs PyG GENConv"),
            ("gen_max_torch", "gen_max_pyg", "GEN-max block, PyTorch fallback vs PyG GENConv"),
            ("gen_max", "gen_max_torch", "GEN-max block, C++ kernel vs PyTorch fallback"),
            ("aggr_max", "aggr_max_torch", "aggregation alone, C++ kernel vs PyTorch fallback"),
        ):
            ra, rb = by.get((graph, a)), by.get((graph, b))
            if ra and rb:
                lines.append(f"\n{graph}: {what}, fwd+bwd: {ra['fwd_bwd_s'] / rb['fwd_bwd_s']:.2f}x")
    text = "\n".join(lines)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "layers.md").write_text(text + "\n")
    (out / "layers.json").write_text(json.dumps(dict(bandwidth=bw, matmul_rate=rate, rows=rows), indent=1))
    plot(rows, out / "layers.png")
    print("\n" + text + f"\n\nwrote {out / 'layers.md'}, {out / 'layers.png'}")


def plot(rows, path: Path) -> None:
    """One panel per graph: forward + backward time of each block (log scale), with its
    bandwidth bound and, where counted, its compute bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    graphs = list(dict.fromkeys(r["graph"] for r in rows))
    fig, axes = plt.subplots(1, len(graphs), figsize=(6 * len(graphs), 4.5), squeeze=False)
    for ax, graph in zip(axes[0], graphs):
        sel = [r for r in rows if r["graph"] == graph]
        ys = range(len(sel))
        ax.barh(ys, [r["fwd_bwd_s"] * 1e3 for r in sel], color="tab:blue", label="forward + backward")
        ax.scatter(
            [r["bandwidth_bound_s"] * 1e3 for r in sel],
            ys,
            marker="|",
            s=300,
            color="tab:red",
            label="bandwidth bound",
            zorder=3,
        )
        comp = [(r["compute_bound_s"] * 1e3, y) for r, y in zip(sel, ys) if r["compute_bound_s"]]
        if comp:
            ax.scatter(*zip(*comp), marker="|", s=300, color="tab:green", label="compute bound", zorder=3)
        ax.set_yticks(list(ys), [r["block"] for r in sel])
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("ms (log scale)")
        ax.set_title(
            f"{graph}: {sel[0]['nodes']:,} nodes, {sel[0]['edges']:,} edges, {sel[0]['channels']} ch"
        )
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
