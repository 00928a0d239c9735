"""``revgnn-evaluate``: evaluates a checkpoint written by revgnn-train with multi-view inference.

    revgnn-evaluate outputs/proteins_revgnn_deep/<run>/best.pt --views 10 --parts 3

The model and data are rebuilt from the config stored in the checkpoint (``--data-root`` points an OGB
data set elsewhere). Prints the OGB metric on train / valid / test as JSON. Node-level data: ``V`` views x
``K`` parts, logits averaged; graph-level data: batched graphs (views and parts do not apply).
``--predictions out.pt`` also saves node-level logits, ``[N, C]`` float32 (``torch.save``), row ``i`` for
node ``i`` of the data set as loaded, whatever ``data.node_order`` the run trained in.
"""

from __future__ import annotations

import argparse
import json
from typing import Optional, Sequence

from revgnn.cli import ranged


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="revgnn-evaluate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint", help="best.pt or last.pt of a revgnn-train run")
    parser.add_argument(
        "--views", type=ranged(int, 1), default=None, help="views V (default: the run's trainer.eval_views)"
    )
    parser.add_argument(
        "--parts", type=ranged(int, 1), default=None, help="parts K per view (default: trainer.eval_parts)"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the inference partitions (default: the one training used at the "
        "checkpoint's epoch, so the logged score is reproduced)",
    )
    parser.add_argument("--data-root", default=None, help="override data.root (OGB data sets)")
    parser.add_argument(
        "--predictions",
        default=None,
        metavar="PATH",
        help="save the node-level logits scored, [N, C] float32 (torch.save), in the data set's original "
        "node ids",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu, cuda, cuda:N or auto (CUDA when available) (default: cpu)",
    )
    return parser


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)

    import torch
    from hydra.utils import instantiate

    from revgnn.config.store import import_modules
    from revgnn.engine.backends import resolve_device
    from revgnn.engine.checkpoint import load_trained
    from revgnn.engine.loop import build_model
    from revgnn.engine.seeds import evaluation_seed
    from revgnn.engine.tasks import make_task, shapes
    from revgnn.errors import ConfigError

    try:
        device = resolve_device(args.device, "--device")
        trained = load_trained(args.checkpoint)
        cfg = trained.config
        import_modules(cfg.get("imports"))  # what registered the run's own model, conv, ...
    except (ConfigError, FileNotFoundError) as e:  # the machine or the file: no usage text
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    if args.data_root is not None:
        if "root" not in cfg.data:
            parser.error(
                f"--data-root given but data set {cfg.data.get('name', cfg.data._target_)} has no root"
            )
        cfg.data.root = args.data_root
    ds = instantiate(cfg.data)
    model = build_model(cfg.model, shapes(ds))
    model.load_state_dict(trained.model_state)
    model.to(device)
    cfg.trainer.eval_views = views = args.views if args.views is not None else cfg.trainer.eval_views
    cfg.trainer.eval_parts = parts = args.parts if args.parts is not None else cfg.trainer.eval_parts
    # the views training scored this checkpoint on: fixed ones are drawn from the run's seed alone
    fixed = bool(cfg.trainer.get("fixed_eval_views"))
    seed = args.seed if args.seed is not None else evaluation_seed(cfg.seed, trained.epoch, fixed)
    task = make_task(ds, cfg.trainer)  # node level: multi-view inference; graph level: batched graphs
    generator = torch.Generator().manual_seed(seed)
    if args.predictions is None:
        scores = task.evaluate(model, generator, device)
    elif task.level != "node":
        parser.error(f"--predictions saves node-level logits; {task.name} is graph-level")
    else:
        from revgnn.data.ordering import in_original_order
        from revgnn.engine.checkpoint import atomic_save

        logits = task.node_logits(model, generator, device)
        scores = task.scorer(logits)
        atomic_save(in_original_order(ds, logits), args.predictions)
    print(
        json.dumps(
            {
                "checkpoint": args.checkpoint,
                "epoch": trained.epoch,
                "views": views,
                "parts": parts,
                "metric": task.metric,
                **scores,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
