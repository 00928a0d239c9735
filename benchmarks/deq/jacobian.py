"""For the last checkpoint of each ``train`` run in ``--out-dir``, what a training solve faces on
``--seeds`` training batches: the model's own solve's evaluations, and at the fixed point
||J||_F^2 / d, the spectral radius and how many nodes the dominant eigenvector lives on.

Example::

    .venv/bin/python -m benchmarks.deq jacobian --out-dir RUNS --arms none jac_reg_weight=0.5 \
        --seeds-list 0 1 --seeds 2
"""

from __future__ import annotations

import os

from benchmarks.common import markdown_table
from benchmarks.deq.common import parser


def jacobian_at_equilibrium(model, task, part_seed: int) -> dict:
    """One training solve of a trained DEQ-GNN: the first batch ``task`` draws from a generator seeded
    with ``part_seed`` (as the trainer draws its batches), one forward in training mode (one dropout
    mask, the model's own solver, tolerance and budget; no gradient, so no loss term). Returns that
    solve's evaluations, and at the fixed point (Anderson to 1e-9) ||J||_F^2 / d (20 Rademacher
    probes), the spectral radius (200 power iterations) and the participation ratio of the dominant
    eigenvector's per-node mass from the same iterations, 1 / sum_i m_i^2 (the number of nodes it
    effectively lives on)."""
    import torch

    from revgnn.deq import get_solver, jacobian_frobenius, power_iteration

    batch = next(next(task.train_steps(torch.Generator().manual_seed(part_seed), "cpu")).batches)
    captured = []  # the map's inputs, as DEQGNN.forward hands them to its DEQ
    hook = model.deq.register_forward_pre_hook(lambda _module, args: captured.append(args))
    model.train()
    torch.manual_seed(part_seed)  # the dropout mask
    try:
        with torch.no_grad():
            model(*batch.inputs)
    finally:
        hook.remove()
    inputs, solve = captured[0], dict(model.deq.stats)

    def f(z):
        return model.layer(z, *inputs)

    with torch.no_grad():
        z_star = get_solver("anderson")(f, torch.zeros_like(inputs[0]), max_iter=400, tol=1e-9).z
    z = z_star.requires_grad_()
    fz = f(z)
    gen = torch.Generator().manual_seed(part_seed)
    frobenius = jacobian_frobenius(fz, z, 20, generator=gen, create_graph=False).item() / z.numel()
    v, rho = power_iteration(fz, z, 200, gen)
    if v is None:  # J^T v = 0: no dominant direction to locate
        participation = float("nan")
    else:
        mass = v.square().sum(1)
        participation = 1.0 / (mass / mass.sum()).square().sum().item()
    return {
        "evals": int(solve["forward_steps"]),
        "converged": bool(solve["forward_converged"]),
        "frobenius": frobenius,
        "rho": rho,
        "participation": participation,
        "nodes": z.size(0),
    }


def bench_jacobian(args) -> None:
    """For the last checkpoint of each run ``train`` left in ``--out-dir`` (arms x seeds): what the
    solver faces at the end of training (:func:`jacobian_at_equilibrium`, ``--seeds`` batches)."""
    import warnings

    import torch
    from hydra.utils import instantiate

    from revgnn.config.store import register_configs
    from revgnn.deq import DEQConvergenceWarning
    from revgnn.engine.checkpoint import load_trained
    from revgnn.engine.loop import build_model
    from revgnn.engine.tasks import make_task, shapes

    register_configs()

    if not args.out_dir:
        raise SystemExit("jacobian: give --out-dir, the folder of a train run")
    warnings.simplefilter("ignore", DEQConvergenceWarning)  # the table says which solves did not converge
    torch.set_num_threads(args.threads)
    table = []
    for arm in args.arms:
        for seed in args.seeds_list:
            trained = load_trained(os.path.join(args.out_dir, f"{arm.folder}_s{seed}", "last.pt"))
            cfg = trained.config
            ds = instantiate(cfg.data)
            model = build_model(cfg.model, shapes(ds))
            model.load_state_dict(trained.model_state)
            model.set_epoch(trained.epoch)  # the equilibrium phase, after any unrolled pretraining
            task = make_task(ds, cfg.trainer)
            for part_seed in range(args.seeds):
                r = jacobian_at_equilibrium(model, task, part_seed)
                budget = f"{model.deq.solver} to {model.deq.tol:g}, budget {model.deq.max_iter}"
                evals = f"{r['evals']}" if r["converged"] else f">{r['evals']} (not reached)"
                table.append(
                    [
                        arm.label,
                        seed,
                        trained.epoch,
                        part_seed,
                        f"{evals} ({budget})",
                        f"{r['frobenius']:.4f}",
                        f"{r['rho']:.3f}",
                        f"{r['participation']:.1f} of {r['nodes']}",
                    ]
                )
    header = [
        "arm",
        "seed",
        "epoch",
        "batch",
        "evaluations of the training solve",
        "‖J‖²_F / d",
        "spectral radius",
        "dominant eigenvector: participation ratio (nodes)",
    ]
    print("\n".join(markdown_table(header, table, align="llrrrrrr")), flush=True)


def main(argv=None, prog=None) -> None:
    p = parser(
        __doc__,
        prog,
        ["--threads", "--seeds", "--arms", "--seeds-list"],
        seeds="training batches per run",
        arms="the arms of the train run",
        seeds_list="its seeds",
    )
    p.add_argument("--out-dir", help="the folder of a train run")
    bench_jacobian(p.parse_args(argv))


if __name__ == "__main__":
    main()
