"""Where every random number of a run comes from: one run seed, named streams derived from it.

A run is a function of ``cfg.seed``. The model is initialised from ``torch.manual_seed(seed)`` on every
worker (the same weights everywhere); each worker's global generator then draws its dropout masks
(:func:`seed_worker`); everything else that is random has a generator of its own, seeded by
:func:`seed_stream` from ``(seed, epoch, purpose)``, so it depends on neither the worker, the thread count
nor what ran before it: a resumed run redraws the same partition, views and test views.

>>> seed_stream(0, 3, Stream.EVALUATION)
13
>>> seed_stream(0, 3, Stream.EVALUATION) != seed_stream(0, 3, Stream.TRAIN_BATCHES)
True
"""

from __future__ import annotations

import enum

import torch

__all__ = ["Stream", "seed_stream", "evaluation_seed", "seed_worker"]


class Stream(enum.IntEnum):
    """The purposes a run draws random numbers for, each with a generator of its own."""

    #: an epoch's random partition of the nodes (and its order of parts or graphs)
    TRAIN_BATCHES = 0
    #: the views of an in-training evaluation (of epoch 0 with ``trainer.fixed_eval_views``)
    EVALUATION = 1
    #: the fresh views of the final test of ``best.pt`` (``trainer.test_views``)
    CHECKPOINT_TEST = 2
    #: the dropout masks of worker ``rank`` of several (:func:`seed_worker`; the rank in the epoch's place)
    DROPOUT = 3


def seed_stream(seed: int, epoch: int, purpose: Stream) -> int:
    """A distinct generator seed for each (run seed, epoch, purpose); distinct for every
    ``0 <= purpose < 4`` and ``0 <= epoch < 1_000_003``."""
    return (seed * 1_000_003 + epoch) * 4 + int(purpose)


def evaluation_seed(seed: int, epoch: int, fixed_views: bool) -> int:
    """The seed of the views epoch ``epoch``'s evaluation scores on: the epoch's own, or epoch 0's
    for every epoch when the views are fixed (``trainer.fixed_eval_views``)."""
    return seed_stream(seed, 0 if fixed_views else epoch, Stream.EVALUATION)


def seed_worker(seed: int, rank: int, world_size: int) -> None:
    """Seeds this worker's global generator (dropout masks) after the model's initialisation.

    Of several workers, worker ``rank`` restarts at ``seed_stream(seed, rank, Stream.DROPOUT)``: its
    masks are distinct from every other worker's, from the numbers that initialised the weights, and
    from every stream of another seed's run, so a sweep over seeds never reuses one run's masks in
    another, and no worker's masks are the numbers its weights were drawn from. One worker
    continues the stream that initialised the model, as it always has: re-seeding it too would be one
    rule for both, but would change every published local trajectory (the default run's scores and
    the DEQ training figures of docs/bench/deq.md), which were measured this way."""
    if world_size > 1:
        torch.manual_seed(seed_stream(seed, rank, Stream.DROPOUT))
