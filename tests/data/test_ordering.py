"""Node orders (revgnn.data.ordering): a permutation, a narrower bandwidth, and a relabelled data set
that is the same graph, the same splits and the same model outputs once mapped back."""

import pytest
import torch

from revgnn.data.ordering import bandwidth, node_order, original_ids, reorder
from revgnn.data.synthetic import proteins_like


def shuffled_grid(side=20, seed=0):
    """A ``side x side`` grid (both directions) under a random relabelling: bandwidth ~N, while an
    order by levels has bandwidth ~side."""
    ids = torch.arange(side * side).view(side, side)
    pairs = torch.cat(
        [
            torch.stack([ids[:, :-1].flatten(), ids[:, 1:].flatten()]),
            torch.stack([ids[:-1].flatten(), ids[1:].flatten()]),
        ],
        1,
    )
    edges = torch.cat([pairs, pairs.flip(0)], 1)
    perm = torch.randperm(side * side, generator=torch.Generator().manual_seed(seed))
    return perm[edges], side * side


@pytest.mark.parametrize("method", ["rcm", "degree", "none"])
def test_a_permutation(method):
    edges, n = shuffled_grid()
    order = node_order(edges, n + 5, method)  # 5 isolated nodes too
    assert order.dtype == torch.int64 and torch.equal(order.sort().values, torch.arange(n + 5))


def test_rcm_narrows_the_bandwidth():
    edges, n = shuffled_grid(side=20)
    order = node_order(edges, n, "rcm")
    new_id = torch.empty_like(order)
    new_id[order] = torch.arange(n)
    assert bandwidth(edges) > 300  # random labels: endpoints anywhere
    assert bandwidth(new_id[edges]) <= 2 * 20  # levels of a grid: about one side apart


def test_degree_puts_hubs_first():
    edges = torch.tensor([[0, 1, 2, 3, 0, 1], [3, 3, 3, 2, 2, 1]])
    assert node_order(edges, 4, "degree").tolist() == [3, 2, 1, 0]


def test_bad_input():
    with pytest.raises(ValueError, match="choose one of none, rcm, degree"):
        node_order(torch.zeros(2, 0, dtype=torch.long), 3, "metis!")
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):
        node_order(torch.tensor([[0, -1], [1, 2]]), 3, "rcm")


def test_reorder_is_the_same_graph_and_maps_back():
    ds = proteins_like(num_nodes=300, avg_degree=6, window=4, seed=1)
    ref = proteins_like(num_nodes=300, avg_degree=6, window=4, seed=1)
    reorder(ds, "rcm")
    reorder(ds, "degree")  # composed: still maps to the ids as loaded
    orig = original_ids(ds)
    assert torch.equal(ds.x, ref.x[orig]) and torch.equal(ds.y, ref.y[orig])
    for key in ref.split_idx:
        assert torch.equal(orig[ds.split_idx[key]].sort().values, ref.split_idx[key].sort().values)
    # the same multiset of (source, destination, features) in original ids; sorted by destination
    assert bool((ds.edge_index[1][1:] >= ds.edge_index[1][:-1]).all())

    def edges_of(ei, attr):
        rows = torch.cat([ei.t().double(), attr.double()], 1)
        return rows[torch.from_numpy(__import__("numpy").lexsort(rows.t().flip(0).numpy()))]

    assert torch.equal(edges_of(orig[ds.edge_index], ds.edge_attr), edges_of(ref.edge_index, ref.edge_attr))


def test_model_outputs_map_back():
    """A RevGNN in float64 on the reordered graph gives, mapped back, the original graph's outputs (to
    summation order: 1e-12)."""
    from revgnn.models import create_model

    ref = proteins_like(num_nodes=200, avg_degree=6, window=4, seed=2)
    ds = reorder(proteins_like(num_nodes=200, avg_degree=6, window=4, seed=2), "rcm")
    torch.manual_seed(0)
    model = (
        create_model(
            "revgnn_proteins_like",
            num_layers=3,
            in_channels=ref.in_channels,
            edge_channels=ref.edge_channels,
            out_channels=ref.num_classes,
            species_channels=ref.species_channels,
        )
        .double()
        .eval()
    )
    with torch.no_grad():
        a = model(ref.x.double(), ref.edge_index, ref.edge_attr.double())
        b = model(ds.x.double(), ds.edge_index, ds.edge_attr.double())
    back = torch.empty_like(b)
    back[original_ids(ds)] = b
    assert ((back - a).abs().max() / a.abs().max()).item() <= 1e-12
