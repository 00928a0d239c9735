"""The run's random streams (revgnn.engine.seeds): every (seed, index, purpose) its own generator,
and dropout masks that no other worker, stream or seed of a sweep shares."""

import itertools

import torch

from revgnn.engine.seeds import Stream, seed_stream, seed_worker


def test_streams_are_distinct_over_seeds_epochs_and_purposes():
    keys = list(itertools.product(range(30), range(30), Stream))
    values = {seed_stream(s, e, p) for s, e, p in keys}
    assert len(values) == len(keys)


def _masks_after(seed: int, rank: int, world_size: int) -> torch.Tensor:
    torch.manual_seed(seed)  # what the loop does before initialising the model
    seed_worker(seed, rank, world_size)
    return torch.rand(64)


def test_workers_of_a_sweep_never_share_dropout_masks():
    """Of several workers, no two (seed, rank) of a sweep draw the same masks, and no worker draws
    the numbers its seed's weights were initialised from."""
    draws = {(s, r): _masks_after(s, r, 2) for s in range(4) for r in range(2)}
    for (a, da), (b, db) in itertools.combinations(draws.items(), 2):
        assert not torch.equal(da, db), (a, b)
    for (s, _), d in draws.items():
        assert not torch.equal(d, torch.rand(64, generator=torch.Generator().manual_seed(s)))


def test_one_worker_continues_the_initialisation_stream():
    torch.manual_seed(3)
    state = torch.get_rng_state()
    seed_worker(3, 0, 1)
    assert torch.equal(torch.get_rng_state(), state)
