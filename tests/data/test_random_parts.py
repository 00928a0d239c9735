"""Random partitions and induced sub-graphs (revgnn.data.random_parts) and the proteins_like generator."""

import pytest
import torch

from revgnn.data.node_dataset import NodeDataset, sum_edge_features
from revgnn.data.random_parts import destination_key, partition_graph, random_partition
from revgnn.data.synthetic import proteins_like


def _reference_subgraph(edge_index, part, k):
    """Slow, obviously correct induced sub-graph of part k (global -> local via a dict)."""
    nodes = sorted((part == k).nonzero().view(-1).tolist())
    local = {v: i for i, v in enumerate(nodes)}
    edges = [
        (local[s], local[d], e)
        for e, (s, d) in enumerate(edge_index.t().tolist())
        if s in local and d in local
    ]
    return nodes, edges


def test_random_partition_is_balanced_and_seeded():
    part = random_partition(103, 10, torch.Generator().manual_seed(0))
    counts = torch.bincount(part, minlength=10)
    assert counts.min() >= 10 and counts.max() <= 11 and counts.sum() == 103
    again = random_partition(103, 10, torch.Generator().manual_seed(0))
    assert torch.equal(part, again)


def test_partition_matches_reference_and_keeps_destination_order():
    g = torch.Generator().manual_seed(1)
    n = 60
    edge_index = torch.randint(0, n, (2, 500), generator=g)
    key = edge_index[1] * n + edge_index[0]
    edge_index = edge_index[:, key.argsort()]
    parts = partition_graph(edge_index, n, 4, torch.Generator().manual_seed(2))
    part = torch.empty(n, dtype=torch.long)
    for k, sub in enumerate(parts):
        part[sub.node_idx] = k
    covered = 0
    for k, sub in enumerate(parts):
        nodes, edges = _reference_subgraph(edge_index, part, k)
        assert sub.node_idx.tolist() == nodes
        assert sub.edge_index.t().tolist() == [[s, d] for s, d, _ in edges]
        assert sub.edge_ids.tolist() == [e for _, _, e in edges]
        dst = sub.edge_index[1]
        assert bool((dst[1:] >= dst[:-1]).all())  # still sorted by destination
        covered += sub.num_nodes
    assert covered == n


@pytest.mark.parametrize("edge_channels", [None, 3])
def test_destination_sort_equals_the_stable_permutation(edge_channels):
    """Without edge features the sort decodes its sorted keys; with them it permutes: both equal the
    edges (and features) taken in the stable order of their keys, on a graph with repeated edges,
    self loops and isolated nodes, and node ids whose keys pass 2^32."""
    g = torch.Generator().manual_seed(3)
    n = 70_000  # keys j N + i up to ~4.9e9
    used = torch.randint(0, n, (40,), generator=g)  # 40 of 70,000 nodes: the rest isolated
    edge_index = used[torch.randint(0, 40, (2, 400), generator=g)]
    edge_index = torch.cat([edge_index, edge_index[:, :60], used[:5].repeat(2, 1)], dim=1)
    edge_attr = None if edge_channels is None else torch.rand(edge_index.size(1), edge_channels, generator=g)
    order = torch.sort(destination_key(edge_index, n), stable=True).indices
    y = torch.zeros(n, 1, dtype=torch.long)
    split = {k: torch.tensor([i]) for i, k in enumerate(("train", "valid", "test"))}
    ds = NodeDataset(
        "g", torch.zeros(n, 1), edge_index.clone(), edge_attr, y, split, "multiclass", 2, "accuracy"
    )
    ds = ds.sorted_by_destination()
    assert ds.edge_index.is_contiguous() and torch.equal(ds.edge_index, edge_index[:, order])
    if edge_attr is not None:
        assert torch.equal(ds.edge_attr, edge_attr[order])
    before = ds.edge_index
    assert ds.sorted_by_destination().edge_index is before  # sorted already: kept as it is


def test_whole_graph_part_gathers_nothing():
    """A one-part partition hands the graph's own node and edge rows on (no copy); a part of several
    gathers them."""
    g = torch.Generator().manual_seed(4)
    edge_index = torch.randint(0, 30, (2, 200), generator=g)
    x, edge_attr = torch.rand(30, 4, generator=g), torch.rand(200, 2, generator=g)
    whole = partition_graph(edge_index, 30, 1)[0]
    assert whole.edge_ids is None and whole.edge_index is edge_index
    assert whole.node_rows(x) is x and whole.edge_rows(edge_attr) is edge_attr
    for sub in partition_graph(edge_index, 30, 3, g):
        assert torch.equal(sub.node_rows(x), x[sub.node_idx])
        assert torch.equal(sub.edge_rows(edge_attr), edge_attr[sub.edge_ids])


def test_proteins_like_schema():
    ds = proteins_like(num_nodes=800, avg_degree=8, window=8, max_hops=3, seed=3)
    assert ds.x.shape == (800, 16) and ds.edge_attr.shape[1] == 8 and ds.y.shape == (800, 112)
    assert ds.species_channels == 8 and ds.task == "multilabel" and ds.evaluator == "ogbn-proteins"
    assert torch.allclose(ds.x[:, :8], sum_edge_features(ds.edge_index, ds.edge_attr, 800))
    assert torch.equal(ds.x[:, 8:].sum(1), torch.ones(800))
    # undirected with symmetric features; split by species, disjoint
    fwd = {(s, d): a for (s, d), a in zip(ds.edge_index.t().tolist(), ds.edge_attr.tolist())}
    assert all(fwd[(d, s)] == a for (s, d), a in fwd.items())
    species = ds.x[:, 8:].argmax(1)
    sets = {k: set(species[v].tolist()) for k, v in ds.split_idx.items()}
    assert not (sets["train"] & sets["valid"]) and not (sets["train"] & sets["test"])
    assert not (sets["valid"] & sets["test"])
    rates = ds.y.mean(0)
    assert bool(((rates > 0.02) & (rates < 0.7)).all())
    again = proteins_like(num_nodes=800, avg_degree=8, window=8, max_hops=3, seed=3)
    assert torch.equal(ds.y, again.y) and torch.equal(ds.edge_index, again.edge_index)
