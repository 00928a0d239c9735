#!/usr/bin/env python
"""One GENConv-max layer, forward + backward: SAR through the kernel vs one process vs today's SAR.

On a generated proteins-sized graph (default: the paper's 10-part proteins
sub-graph, 13.2k nodes and 0.79M edges, 8-d edge features, as
``benchmarks.layers``) one pre-activation GENBlock of width ``--channels`` (a
group of RevGNN-Deep: 40) with the shared 80-wide edge embedding in factored
form runs forward + backward (gradients of the input and all parameters)

* ``one_process``: the block on the full graph (``revgnn.nn.gen_max.gen_conv``,
  the C++ kernel, factored edge features);
* ``sar_kernel``: the same block under SAR at P = 1 (``SARGENConv``, the kernel
  per shard: ``revgnn.distributed.gen_max_sar``);
* ``sar_torch``: the same under SAR through the PyTorch path (the factored
  features expanded to E x C, ``sequential_aggregate``), which is what SAR
  ran before the kernel path and still runs without the kernel.

Variants are interleaved round by round and the median of ``--reps`` rounds is
reported with its ratio to ``one_process``, side by side in one run; also the
bytes each saves for backward (``SavedTensorBytes``). On a shared machine only
these ratios mean something.

    python -m benchmarks.sar_kernel
    python -m benchmarks.sar_kernel --nodes 132534 --edges 4000000 --reps 3
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics

from benchmarks.common import destination_sorted_graph, time_calls

VARIANTS = ("one_process", "sar_kernel", "sar_torch")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=13_200)
    parser.add_argument("--edges", type=int, default=790_000)
    parser.add_argument("--channels", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=80, help="width of the shared edge embedding")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--json", default=None, help="also write results here")
    args = parser.parse_args(argv)

    import torch

    from revgnn.distributed import convs
    from revgnn.distributed.convs import convert_to_sar
    from revgnn.distributed.partition import build_partitions
    from revgnn.distributed.sar import SARGraph
    from revgnn.nn import GENBlock, LinearEdgeFeatures
    from revgnn.nn.kernels import load
    from revgnn.utils import SavedTensorBytes

    if load("gen_max") is None:
        raise SystemExit("the gen_max kernel is not available (compiler? REVGNN_KERNELS?)")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ei, raw = destination_sorted_graph(args.nodes, args.edges)
    plain = ei.as_tensor()
    graph = SARGraph(build_partitions(plain, args.nodes, 1, edge_attr=raw)[0])
    x = torch.randn(args.nodes, args.channels)
    shared = torch.nn.Linear(8, args.hidden)
    block = GENBlock(args.channels, edge_channels=args.hidden, aggr="max")
    sar_block = convert_to_sar(copy.deepcopy(block))
    x_loc, raw_loc = x[graph.node_ids], graph.edge_attr
    real_sar_gen_max = convs.sar_gen_max

    def run(variant):
        if variant == "one_process":
            mod, inp, g, e = block, x, ei, raw
        else:
            mod, inp, g, e = sar_block, x_loc, graph, raw_loc
        inp = inp.clone().requires_grad_()
        params = [*mod.parameters(), *shared.parameters()]
        convs.sar_gen_max = (lambda *a, **k: None) if variant == "sar_torch" else real_sar_gen_max
        try:
            with SavedTensorBytes() as saved:
                out = mod(inp, g, LinearEdgeFeatures.from_linear(e, shared))
            torch.autograd.grad(out, [inp, *params], torch.ones_like(out))
        finally:
            convs.sar_gen_max = real_sar_gen_max
        return saved.bytes

    times = {v: [] for v in args.variants}
    saved = {v: run(v) for v in args.variants}  # warm-up (kernel build, caches)
    for _ in range(args.reps):
        for v in args.variants:
            times[v] += time_calls(lambda: run(v), 1)
    med = {v: statistics.median(ts) for v, ts in times.items()}
    base = med.get("one_process", next(iter(med.values())))
    print(
        f"GENBlock max, {args.channels} channels, factored {args.hidden}-wide edge "
        f"embedding of 8-d features; {args.nodes} nodes, {args.edges} edges; "
        f"{args.threads} thread(s); median of {args.reps} interleaved rounds"
    )
    print(f"{'variant':<14}{'fwd+bwd ms':>12}{'x one_process':>15}{'saved MiB':>11}")
    for v in args.variants:
        print(f"{v:<14}{1e3 * med[v]:>12.1f}{med[v] / base:>15.2f}{saved[v] / 2**20:>11.1f}")
    result = dict(vars(args), median_s=med, times_s=times, saved_bytes=saved)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
