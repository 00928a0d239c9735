"""DEQ benchmarks on a generated proteins-like graph, one module each, sharing :mod:`benchmarks.deq.common`:

1. :mod:`~benchmarks.deq.solvers`: function evaluations of fixed-point, Anderson and Broyden to a
   relative residual on the DEQ-GNN layer, untrained and after a few training steps.
2. :mod:`~benchmarks.deq.step`: one training step of DEQ-GNN vs WT-RevGNN vs RevGNN at equal width
   (bytes saved for backward, peak-RSS growth, step time), each model in its own process.
3. :mod:`~benchmarks.deq.peer`: revgnn against torchdeq 0.1.0 (``pip install -e .[bench]``) on the same
   float64 maps: evaluations, implicit-gradient error, bytes saved for backward. Counts, not timings.
4. :mod:`~benchmarks.deq.train`: DEQ-GNN trained on ``proteins_like`` through the training loop, arms of
   model overrides x seeds; ``--record FILE`` keeps each run's per-epoch max evaluations as JSON.
5. :mod:`~benchmarks.deq.broyden_memory`: evaluations Broyden needs against its memory on held-out maps.
6. :mod:`~benchmarks.deq.jacobian`: for the last checkpoint of each ``train`` run, what a training solve
   faces: its evaluations, ||J||_F^2 / d, the spectral radius and where the dominant eigenvector lives.

Each runs as ``python -m benchmarks.deq.<module> ...`` or, as the docs write it, ``python -m
benchmarks.deq <name> ...`` (``broyden-memory`` for :mod:`~benchmarks.deq.broyden_memory`).

Examples::

    .venv/bin/python -m benchmarks.deq solvers --nodes 4000 --hidden 64 --seeds 3
    .venv/bin/python -m benchmarks.deq step --nodes 4000 --hidden 64 --steps 3
    .venv/bin/python -m benchmarks.deq peer --nodes 2000 --max-iter 100
    .venv/bin/python -m benchmarks.deq train --nodes 2000 --epochs 50 --seeds-list 0 1 \
        --arms none jac_reg_weight=0.1
    .venv/bin/python -m benchmarks.deq broyden-memory --nodes 2000 --max-iter 300 --threads 1
    .venv/bin/python -m benchmarks.deq jacobian --out-dir RUNS --arms none jac_reg_weight=0.5 \
        --seeds-list 0 1 --seeds 2
"""
