"""One training step of a zoo model on a proteins-sized generated sub-graph: time and peak memory.

The paper trains on random 10-part partitions of ogbn-proteins, so one step sees a
sub-graph of about 13.2k nodes and 0.79M directed edges (8-d edge features,
16-d node input, 112 binary tasks). This script generates a graph of that size,
runs warm-up + measured steps (forward, BCE loss, backward, grad-norm clip,
Adam over one flat parameter buffer as revgnn-train does, or per tensor with
``--per-tensor``) and prints the median step time and peak memory: RSS on CPU,
``torch.cuda.max_memory_allocated`` on GPU. ``--num-layers`` runs a shallower
copy of the model (e.g. on CPU, where 1001 layers take minutes per step); the
per-layer time is printed so the full depth can be extrapolated, and is marked
as extrapolated.

    python -m benchmarks.step --model revgnn_deep --num-layers 20          # CPU, scaled
    python -m benchmarks.step --model revgnn_deep --device cuda            # full 1001 layers
    python -m benchmarks.step --model revgnn_deep --device cuda --reversible pyg   # PyG's GroupAddRev
"""

from __future__ import annotations

import argparse
import json

from benchmarks.common import median_after, proteins_subgraph, time_calls, with_pyg_group_add_rev


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="revgnn_deep")
    parser.add_argument(
        "--num-layers", type=int, default=None, help="override the depth (default: the model's own)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--nodes", type=int, default=13_200)
    parser.add_argument("--edges", type=int, default=790_000)
    parser.add_argument("--steps", type=int, default=2, help="measured steps after one warm-up")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU recipe)")
    parser.add_argument(
        "--quantize", type=int, default=None, help="GroupAddRev(quantize=q): exact coupling (e.g. 16)"
    )
    parser.add_argument(
        "--reversible",
        choices=("revgnn", "pyg"),
        default="revgnn",
        help="the reversible blocks' wrapper: ours, or PyG's GroupAddRev around the same groups",
    )
    parser.add_argument(
        "--per-tensor",
        action="store_true",
        help="Adam over each parameter tensor (default: one flat buffer, as revgnn-train)",
    )
    args = parser.parse_args(argv)
    if args.reversible == "pyg" and args.quantize is not None:
        parser.error("--quantize is revgnn's GroupAddRev option; PyG's (--reversible pyg) has none")

    from revgnn.utils.allocator import use_tcmalloc

    use_tcmalloc()

    import torch

    from revgnn.models import count_parameters, create_model
    from revgnn.utils import peak_rss_bytes
    from revgnn.utils.optimizer import ModelOptimizer

    device = torch.device(args.device)
    overrides = {} if args.num_layers is None else {"num_layers": args.num_layers}
    if args.quantize is not None:
        overrides["quantize"] = args.quantize
    model = create_model(args.model, **overrides)
    if args.reversible == "pyg" and not with_pyg_group_add_rev(model):
        raise SystemExit(f"--reversible pyg: {args.model} has no reversible block")
    model = model.to(device)
    with torch.device("meta"):  # the registered depth, without allocating the full model
        full_depth = getattr(create_model(args.model), "num_layers", None)
    x, edge_index, edge_attr, y = proteins_subgraph(args.nodes, args.edges, device)
    optimizer = ModelOptimizer(
        model, lambda ps: torch.optim.Adam(ps, lr=1e-3), flat=not args.per_tensor, max_norm=1.0
    )
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
            out = model(x, edge_index, edge_attr)
        loss = loss_fn(out.float(), y)
        loss.backward()
        optimizer.step()  # as revgnn-train: sync, clip, update, clear

    sync = torch.cuda.synchronize if device.type == "cuda" else None
    model.train()
    (warmup,) = time_calls(step, 1, sync)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = [warmup] + time_calls(step, args.steps, sync)
    depth = getattr(model, "num_layers", None)
    result = dict(
        model=args.model,
        depth=depth,
        params=count_parameters(model),
        device=str(device),
        nodes=args.nodes,
        edges=args.edges,
        bf16=args.bf16,
        quantize=args.quantize,
        reversible=args.reversible,
        flat_params=optimizer.flat is not None,
        step_s=median_after(times),
        warmup_s=warmup,
        threads=torch.get_num_threads(),
    )
    if device.type == "cuda":
        result["peak_gpu_bytes"] = torch.cuda.max_memory_allocated(device)
    result["peak_rss_bytes"] = peak_rss_bytes()
    if depth and full_depth and full_depth != depth:
        result["full_depth"] = full_depth
        result["extrapolated_step_s"] = result["step_s"] / depth * full_depth
    print(json.dumps(result))


if __name__ == "__main__":
    main()
