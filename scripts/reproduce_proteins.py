"""Runs an experiment over several seeds and writes a markdown table next to the paper's numbers.

    .venv/bin/python scripts/reproduce_proteins.py --experiment proteins_revgnn_deep --data-root data
    .venv/bin/python scripts/reproduce_proteins.py --experiment proteins_wt_revgnn --seeds 10 model.hidden_channels=80
    .venv/bin/python scripts/reproduce_proteins.py --smoke        # same pipeline, fake OGB graph, 1 epoch

Each seed is one ``python -m revgnn.train experiment=<name> seed=<s>`` process writing into
``<out>/seed_<s>``; its ``summary.json`` (best validation and the test score at that epoch) feeds the
table: mean ± unbiased standard deviation over seeds, parameters, peak memory and time per epoch.
``--smoke`` writes a tiny raw ogbn-proteins directory, shrinks the model to 2 layers x 8 channels and
runs 1 epoch per seed, so the whole path (OGB loader, training, multi-view evaluation, table) is checked
in a minute.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parents[1] / "revgnn" / "configs"

#: Paper test scores (Li et al., ICML 2021 and the cited reference implementations): (mean, std or None).
PAPER = {
    "proteins_revgnn_deep": ("RevGNN-Deep, test ROC-AUC", 87.74, 0.13),
    "proteins_revgnn_wide": ("RevGNN-Wide, test ROC-AUC", 88.24, 0.15),
    "proteins_resgnn_112": ("ResGNN-112x64, test ROC-AUC", 85.94, None),
    "proteins_wt_revgnn": ("WT-RevGNN-112x224, test ROC-AUC", 85.28, None),
    "proteins_deq_gnn": ("DEQ-GNN-224, test ROC-AUC", 85.84, None),
    "products_revgnn_112": ("RevGNN-112 (PyG example), test accuracy", 83.07, 0.30),
    "arxiv_revgat": ("RevGAT, test accuracy", 74.02, 0.18),
    "molhiv_revgnn_graphnorm": ("RevGNN + GraphNorm, ogbg-molhiv test ROC-AUC", 78.62, None),
    "molhiv_revgnn_batchnorm": ("RevGNN + BatchNorm, ogbg-molhiv test ROC-AUC", 77.82, None),
}


def _mean_std(values):
    mean = statistics.mean(values)
    std = statistics.stdev(values) if len(values) > 1 else float("nan")  # unbiased (n - 1)
    return mean, std


def _smoke_overrides(experiment: str, data_root: str) -> list[str]:
    """Shrinks whichever size keys the experiment's model config has."""
    from hydra import compose, initialize_config_dir
    import revgnn.config  # noqa: F401
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"experiment={experiment}"])
    out = [f"data.root={data_root}", "trainer.epochs=1", "trainer.train_parts=2", "trainer.eval_views=2",
           "trainer.eval_parts=2", "trainer.eval_every=1", "logger.progress_bar=false"]
    for key, value in (("num_layers", 2), ("hidden_channels", 8), ("max_iter", 3), ("pretrain_depth", 2)):
        if cfg.model.get(key) is not None:
            out.append(f"model.{key}={value}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", default="proteins_revgnn_deep", choices=sorted(PAPER))
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0 .. n-1 (default: 10)")
    parser.add_argument("--data-root", default=None, help="directory holding ogbn_proteins/ (data.root)")
    parser.add_argument("--out", default=None, help="output directory (default: reproduce/<experiment>)")
    parser.add_argument("--smoke", action="store_true", help="1 epoch, 2 seeds, tiny model, fake OGB data")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides passed to every run")
    args = parser.parse_args()

    out = Path(args.out or f"reproduce/{args.experiment}{'_smoke' if args.smoke else ''}")
    out.mkdir(parents=True, exist_ok=True)
    overrides = list(args.overrides)
    seeds = args.seeds
    if args.smoke:
        from revgnn.data.fake_ogb import write_fake_ogbn
        from revgnn.data.graphs import write_fake_ogbg
        root = out / "fake_ogb"
        name = "ogbn-proteins" if args.experiment.startswith("proteins") else \
            "ogbn-products" if args.experiment.startswith("products") else \
            "ogbg-molhiv" if args.experiment.startswith("molhiv") else "ogbn-arxiv"
        if not (root / name.replace("-", "_")).exists():
            if name.startswith("ogbg"):
                write_fake_ogbg(str(root), name, num_graphs=60)
            else:
                write_fake_ogbn(str(root), name, num_nodes=96, avg_degree=6)
        overrides = _smoke_overrides(args.experiment, str(root)) + overrides
        seeds = min(seeds, 2)
    elif args.data_root:
        overrides.append(f"data.root={args.data_root}")

    summaries = []
    for seed in range(seeds):
        run_dir = out / f"seed_{seed}"
        cmd = [sys.executable, "-m", "revgnn.train", f"experiment={args.experiment}", f"seed={seed}",
               f"output_dir={run_dir}", f"hydra.run.dir={run_dir}", *overrides]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        with open(run_dir / "summary.json") as f:
            summaries.append(json.load(f))

    label, paper_mean, paper_std = PAPER[args.experiment]
    valid = _mean_std([100 * s["highest_valid"] for s in summaries])
    test = _mean_std([100 * s["final_test"] for s in summaries])
    params = summaries[0]["num_parameters"]
    memory = max(s["peak_memory_mb"] for s in summaries)
    epoch_time = statistics.mean(s["epoch_time_s"] for s in summaries)
    device = summaries[0]["device"]
    paper = f"{paper_mean:.2f}" + (f" ± {paper_std:.2f}" if paper_std is not None else "")
    lines = [
        f"# {args.experiment}{' (smoke: fake data, 1 epoch — not a result)' if args.smoke else ''}",
        "",
        f"{len(summaries)} seeds; metric: {summaries[0]['metric']} × 100; mean ± unbiased std. "
        f"Extra overrides: `{' '.join(overrides) or 'none'}`.",
        "",
        "| | valid | test | #params | peak memory (MB, " + device + ") | time / epoch (s) |",
        "|---|---|---|---|---|---|",
        f"| this run | {valid[0]:.2f} ± {valid[1]:.2f} | {test[0]:.2f} ± {test[1]:.2f} | {params:,} | "
        f"{memory:.0f} | {epoch_time:.2f} |",
        f"| paper ({label}) | | {paper} | | | |",
        "",
        "Per seed (valid / test / best epoch): " + ", ".join(
            f"{s['seed']}: {100 * s['highest_valid']:.2f} / {100 * s['final_test']:.2f} / {s['best_epoch']}"
            for s in summaries),
        "",
    ]
    table = "\n".join(lines)
    (out / "results.md").write_text(table)
    print(table)
    print(f"written to {out / 'results.md'}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
