"""Optimiser step over per-tensor parameters vs one flat buffer (FlatParameters), side by side.

Builds a deep model (default: ``revgnn_small`` at 1001 layers x 32 channels, 2 groups, as in
``benchmarks/cli_memory.py``: 20,030 parameter tensors), gives every parameter a random
gradient and times ``optimizer.step()`` (plus ``FlatParameters.sync()`` on the flat side, which
``revgnn-train`` runs before each step), median of ``--reps`` after one warm-up step. Also prints
how many tensors the optimiser holds and checks that both sides end with bitwise equal
parameters (element-wise optimisers update identically).

    python -m benchmarks.optimizer
    python -m benchmarks.optimizer --model revgnn_deep --num-layers 1001 --optim AdamW
"""

from __future__ import annotations

import argparse
import json

from benchmarks.common import median_after, time_calls


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="revgnn_small")
    parser.add_argument("--num-layers", type=int, default=1001)
    parser.add_argument("--hidden", type=int, default=32, help="hidden_channels (revgnn_small only)")
    parser.add_argument("--optim", default="Adam", help="a torch.optim class name")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)

    from revgnn.utils.allocator import use_tcmalloc

    use_tcmalloc()

    import torch

    from revgnn.models import create_model
    from revgnn.utils.optimizer import ModelOptimizer

    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = {"num_layers": args.num_layers}
    if args.model == "revgnn_small":
        overrides.update(hidden_channels=args.hidden, num_groups=2, aggr="mean")

    def run(flat_params: bool):
        torch.manual_seed(0)
        model = create_model(args.model, **overrides)
        wrapped = ModelOptimizer(model, lambda ps: getattr(torch.optim, args.optim)(ps, lr=1e-3), flat_params)
        optimizer, flat = wrapped.optimizer, wrapped.flat
        params = optimizer.param_groups[0]["params"]
        gen = torch.Generator().manual_seed(1)
        for p in model.parameters():  # the same gradients on both sides
            grad = torch.randn(p.shape, generator=gen)
            if flat is not None:
                p.grad.copy_(grad)
            else:
                p.grad = grad

        def step():
            if flat is not None:
                flat.sync()
            optimizer.step()

        return model, median_after(time_calls(step, args.reps + 1)), len(params)

    ref, t_ref, n_ref = run(False)
    flat_model, t_flat, n_flat = run(True)
    equal = all(torch.equal(p, q) for p, q in zip(ref.parameters(), flat_model.parameters()))
    print(
        json.dumps(
            dict(
                model=args.model,
                layers=args.num_layers,
                optim=args.optim,
                per_tensor_step_ms=round(t_ref * 1e3, 2),
                flat_step_ms=round(t_flat * 1e3, 2),
                ratio=round(t_flat / t_ref, 3),
                per_tensor_tensors=n_ref,
                flat_tensors=n_flat,
                bitwise_equal=equal,
                threads=torch.get_num_threads(),
            )
        )
    )


if __name__ == "__main__":
    main()
