"""Memory and speed of reversible stacks vs depth: revgnn vs PyG's GroupAddRev vs a plain stack.

One generated graph (default 20k nodes, 200k edges, 64 channels, 2 groups of
GENConv-max pre-activation blocks with a shared dropout mask and 8-d edge
features). For every depth and implementation a fresh process builds the
stack and runs training steps (forward + backward), so that its peak RSS
(``ru_maxrss``) belongs to that configuration alone. Printed per run:

* saved bytes: what autograd stores for backward (deterministic),
* peak RSS: what the user feels (process high-water mark, includes the graph),
* step time: median over the measured steps,
* parameter bytes: parameters and their gradients (2x) grow with depth in any
  implementation; "peak RSS - 2 x params" isolates what training adds.

Ratios (ours / PyG, ours / plain, depth D / smallest depth) come from the same
run. Every process is started through revgnn's launcher, which preloads
tcmalloc when installed (the default of our entry points); ``--allocators
system,tcmalloc`` adds glibc-malloc runs for comparison. Also measured, at the
same depths (or ``--drift-depths``; the published table: ``10,100,1001``): the
reconstruction drift of the input after inverting the whole stack, in float32 and
under bf16 autocast, with and without ``GroupAddRev(quantize=16)``, and (up to
``--grad-depth-limit`` layers) the bf16 input-gradient error against stored activations.

    python -m benchmarks.memory                        # full run (~20-30 min on 2 cores)
    python -m benchmarks.memory --depths 8,64 --nodes 2000 --edges 20000   # quick look (drift too)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from benchmarks.common import (
    ChildFailed,
    child_env,
    destination_sorted_graph,
    markdown_table,
    median_after,
    run_child,
    time_calls,
)

IMPLS = ("revgnn", "pyg", "plain")


def build_stack(impl: str, depth: int, channels: int):
    import torch
    from torch import nn

    from revgnn.nn import GENBlock, GroupAddRev

    torch.manual_seed(0)
    blocks = []
    for _ in range(depth):
        block = GENBlock(channels // 2, edge_channels=8, aggr="max")
        if impl == "pyg":
            from torch_geometric.nn import GroupAddRev as PyGGroupAddRev

            blocks.append(PyGGroupAddRev(block, num_groups=2))
        else:
            blocks.append(GroupAddRev(block, num_groups=2, disable=impl == "plain"))
    return nn.ModuleList(blocks)


def child(args) -> None:
    """Runs one (impl, depth) configuration and prints one JSON line."""
    import torch

    from revgnn.nn import Shared, SharedDropout
    from revgnn.utils import SavedTensorBytes, peak_rss_bytes
    from revgnn.utils.allocator import allocator

    edge_index, edge_attr = destination_sorted_graph(args.nodes, args.edges)
    stack = build_stack(args.impl, args.depth, args.channels)
    dropout = SharedDropout(0.1)
    x0 = torch.randn(args.nodes, args.channels)
    setup_rss = peak_rss_bytes()

    def step(count_saved: bool = False) -> int:
        x = x0.clone()  # PyG's GroupAddRev frees its input's storage
        mask = dropout(x)
        edges = edge_attr if args.impl == "pyg" else Shared(edge_attr)
        saved = SavedTensorBytes()
        if count_saved:
            saved.__enter__()
        h = x
        for block in stack:
            h = block(h, edge_index, edges, mask)
        loss = h.square().mean()
        if count_saved:
            saved.__exit__(None, None, None)
        loss.backward()
        for p in stack.parameters():
            p.grad = None
        return saved.bytes

    saved = []
    times = time_calls(lambda: saved.append(step(count_saved=True)), 1)  # also the warm-up
    times += time_calls(step, args.reps)
    print(
        json.dumps(
            dict(
                impl=args.impl,
                depth=args.depth,
                allocator=allocator(),
                saved_bytes=saved[0],
                peak_rss=peak_rss_bytes(),
                setup_rss=setup_rss,
                step_s=median_after(times),
                param_bytes=sum(p.numel() * p.element_size() for p in stack.parameters()),
                threads=torch.get_num_threads(),
            )
        )
    )


def drift(args) -> None:
    """Reconstruction error of the stack's input after inverting all blocks: float32, and
    under bf16 autocast (the GPU recipe; CPU autocast here, forward and inverse both under it),
    each with and without GroupAddRev's exact (quantized) coupling."""
    import torch

    from revgnn.nn import Shared

    edge_index, edge_attr = destination_sorted_graph(args.nodes, args.edges)
    results = []
    for depth in args.drift_depths:
        stack = build_stack("revgnn", depth, args.channels).eval()
        x = torch.randn(args.nodes, args.channels)
        for quantize in (None, 16):  # GroupAddRev(quantize=16): exact coupling on a 2^-16 grid
            for block in stack:
                block.quantize = quantize
            start = stack[0].to_grid(x)  # what an exact inverse returns: the input on the grid
            for precision in ("float32", "bf16 autocast"):
                with (
                    torch.no_grad(),
                    torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision != "float32"),
                ):
                    h = x
                    for block in stack:
                        h = block(h, edge_index, Shared(edge_attr))
                    scale = h.abs().max().item()
                    for block in reversed(stack):
                        h = block.inverse(h, edge_index, Shared(edge_attr))
                err = (h.float() - start).abs().max().item()
                row = dict(
                    depth=depth,
                    precision=precision,
                    quantize=quantize,
                    max_abs_err=err,
                    activation_max=scale,
                    rel_to_input=err / x.abs().max().item(),
                )
                if depth <= args.grad_depth_limit and precision != "float32":
                    row["input_grad_rel_err"] = bf16_grad_error(stack, x, edge_index, edge_attr)
                results.append(row)
    print(json.dumps(results))


def bf16_grad_error(stack, x, edge_index, edge_attr) -> float:
    """Relative error of the input gradient under bf16 autocast: the reversible stack (inputs
    reconstructed in backward) against the same stack storing its activations."""
    import torch

    from revgnn.nn import Shared

    grads = []
    for disable in (False, True):
        for block in stack:
            block.disable = disable
        xx = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = xx
            for block in stack:
                h = block(h, edge_index, Shared(edge_attr))
            loss = h.float().square().mean()
        loss.backward()
        grads.append(xx.grad)
    for block in stack:
        block.disable = False
    return ((grads[0] - grads[1]).norm() / grads[1].norm()).item()


def _graph_args(args) -> list:
    """The graph's and stack's sizes, for a child's command line."""
    return ["--nodes", args.nodes, "--edges", args.edges, "--channels", args.channels]


def spawn(args, impl: str, depth: int, alloc: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        __spec__.name,
        "--child",
        "--impl",
        impl,
        "--depth",
        str(depth),
        *_graph_args(args),
        "--reps",
        str(args.reps if depth < 512 else 0),
    ]
    try:
        return run_child(cmd, child_env(alloc))[-1]
    except ChildFailed as e:
        return dict(impl=impl, depth=depth, allocator=alloc, error=e.stderr.strip()[-300:])


def parse_args(argv=None) -> argparse.Namespace:
    """The command line; ``drift_depths`` is a list of depths, ``--depths``' unless given."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="8,64,256,1001")
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument(
        "--allocators",
        default="tcmalloc",
        help="comma list of tcmalloc,system (default: the launcher's default)",
    )
    parser.add_argument("--nodes", type=int, default=20_000)
    parser.add_argument("--edges", type=int, default=200_000)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--plain-limit-gb",
        type=float,
        default=12.0,
        help="skip the plain stack where its projected saved bytes exceed this",
    )
    parser.add_argument(
        "--drift-depths",
        default=None,
        help="depths of the reconstruction drift measurement (default: --depths; empty: none)",
    )
    parser.add_argument(
        "--grad-depth-limit",
        type=int,
        default=100,
        help="also compare bf16 input gradients (reversible vs stored) up to this depth",
    )
    parser.add_argument("--out", default="bench_out")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--drift", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--impl", help=argparse.SUPPRESS)
    parser.add_argument("--depth", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    depths = args.depths if args.drift_depths is None else args.drift_depths
    args.drift_depths = [int(d) for d in depths.split(",") if d]
    return args


def main(argv=None) -> None:
    args = parse_args(argv)

    from revgnn.utils.allocator import use_tcmalloc

    if os.environ.get("REVGNN_ALLOCATOR", "tcmalloc") != "system":
        use_tcmalloc()
    if args.child:
        return child(args)
    if args.drift:
        return drift(args)

    depths = [int(d) for d in args.depths.split(",")]
    impls = args.impls.split(",")
    rows = []
    for alloc in args.allocators.split(","):
        plain_per_layer = None
        for depth in depths:
            for impl in impls:
                if impl == "plain" and plain_per_layer is not None:
                    projected = plain_per_layer * depth / 2**30
                    if projected > args.plain_limit_gb:
                        print(f"skip plain at depth {depth}: ~{projected:.0f} GB saved", flush=True)
                        continue
                row = spawn(args, impl, depth, alloc)
                if impl == "plain" and "saved_bytes" in row:
                    plain_per_layer = row["saved_bytes"] / depth
                rows.append(row)
                print(json.dumps(row), flush=True)
    try:
        drift_rows = run_child(
            [
                sys.executable,
                "-m",
                __spec__.name,
                "--drift",
                *_graph_args(args),
                "--drift-depths",
                ",".join(map(str, args.drift_depths)),
                "--grad-depth-limit",
                str(args.grad_depth_limit),
            ],
            child_env(),
        )[-1]
    except ChildFailed:
        drift_rows = []
    report(rows, drift_rows, args)


def report(rows, drift_rows, args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "memory.json").write_text(json.dumps(dict(rows=rows, drift=drift_rows), indent=1))
    ok = [r for r in rows if "error" not in r]
    get = {(r["impl"], r["depth"], r["allocator"]): r for r in ok}
    lines = [
        f"graph: {args.nodes} nodes, {args.edges} edges, {args.channels} channels, "
        f"2 groups of GENConv-max blocks, shared dropout 0.1",
        "",
    ]

    def cells(r):
        pyg = get.get(("pyg", r["depth"], r["allocator"]))
        plain = get.get(("plain", r["depth"], r["allocator"]))
        ratio = lambda ref: f"{r['step_s'] / ref['step_s']:.2f}" if ref else "-"
        lean = (r["peak_rss"] - 2 * r["param_bytes"]) / 2**20 if "param_bytes" in r else float("nan")
        return [
            r["allocator"],
            r["depth"],
            r["impl"],
            f"{r['saved_bytes'] / 2**20:.1f}",
            f"{r['peak_rss'] / 2**20:.0f}",
            f"{lean:.0f}",
            f"{r['step_s']:.2f}",
            ratio(pyg),
            ratio(plain),
        ]

    header = ["allocator", "depth", "impl", "saved MB", "peak RSS MB", "peak RSS - 2 x params MB"]
    lines += markdown_table([*header, "step s", "step / PyG", "step / plain"], map(cells, ok))
    lines.append("")
    for alloc in sorted({r["allocator"] for r in ok}):
        for impl in IMPLS:
            series = sorted((r["depth"], r) for r in ok if r["impl"] == impl and r["allocator"] == alloc)
            if len(series) >= 2:
                (d0, r0), (d1, r1) = series[0], series[-1]
                lines.append(
                    f"- {alloc} {impl}: depth {d1} vs {d0}: saved bytes "
                    f"{r1['saved_bytes'] / r0['saved_bytes']:.3f}x, peak RSS "
                    f"{r1['peak_rss'] / r0['peak_rss']:.3f}x"
                )
    for r in (r for r in rows if "error" in r):
        lines.append(f"- {r['allocator']} {r['impl']} depth {r['depth']}: failed ({r['error'][-120:]})")
    if drift_rows:
        lines += [
            "",
            "reconstruction drift (invert the whole stack, eval mode; bf16 autocast on the CPU "
            "stands in for the GPU recipe):",
            "",
        ]
        lines += [
            f"- {d['depth']} layers, {d.get('precision', 'float32')}"
            f"{', quantize=%d' % d['quantize'] if d.get('quantize') else ''}: max |x_rec - x| = "
            f"{d['max_abs_err']:.2e} (activations up to {d['activation_max']:.1f})"
            + (
                f"; input gradient vs stored activations: rel err {d['input_grad_rel_err']:.1e}"
                if "input_grad_rel_err" in d
                else ""
            )
            for d in drift_rows
        ]
        lines += [
            "",
            "(with quantize, x is the input rounded to the 2^-16 grid, which is what an exact "
            "inverse returns)",
        ]
    text = "\n".join(lines)
    (out / "memory.md").write_text(text + "\n")
    print("\n" + text)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for alloc in sorted({r["allocator"] for r in ok}):
        for impl in IMPLS:
            series = sorted((r["depth"], r) for r in ok if r["impl"] == impl and r["allocator"] == alloc)
            if not series:
                continue
            d = [s[0] for s in series]
            label = f"{impl} ({alloc})"
            axes[0].plot(d, [s[1]["peak_rss"] / 2**30 for s in series], "o-", label=label)
            axes[1].plot(d, [s[1]["step_s"] for s in series], "o-", label=label)
    for ax, title in zip(axes, ("peak RSS (GB)", "step time (s)")):
        ax.set_xscale("log")
        ax.set_xlabel("depth (reversible blocks)")
        ax.set_title(title)
        ax.legend(fontsize=8)
    if axes[1].has_data():
        axes[1].set_yscale("log")
    fig.tight_layout()
    fig.savefig(out / "memory.png", dpi=120)
    print(f"\nwrote {out / 'memory.md'}, {out / 'memory.png'}")


if __name__ == "__main__":
    main()
