"""Random partitions and induced sub-graphs (revgnn.data.random_parts) and the proteins_like generator."""

import torch

from revgnn.data.node_dataset import sum_edge_features
from revgnn.data.random_parts import partition_graph, random_partition
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
