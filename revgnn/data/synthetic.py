"""``proteins_like``: a generated graph with ogbn-proteins' schema whose labels need depth.

Schema (as ogbn-proteins after :func:`revgnn.data.ogbn.load_ogbn`): undirected graph stored with both edge
directions, 8-d edge features in (0, 1) shared by both directions, node features = per-node sum of the
edge features ‖ an 8-way species one-hot, 112 binary tasks, a split by species (train/valid/test never
share a species), evaluated with OGB's ``ogbn-proteins`` ROC-AUC.

Generative story. Every node ``i`` carries a hidden vector ``z_i ~ N(0, I_L)`` that is never observed
directly. Within a species, nodes sit on a ring and link to random nodes at most ``window`` positions
away, so the graph has locality: a ``k``-hop ball covers about ``2 k window`` ring positions. An edge's
features are ``sigmoid(W (z_i + z_j) + noise)``, so a node's own features (the sum over its edges)
reveal ``z_i`` blurred by its neighbours. Task ``t`` thresholds ``u_t . (P^{k_t} z)_i``, with ``P``
the mean over neighbours and ``k_t`` cycling through ``1 .. max_hops``: an MLP sees about hop 0-1, a
1-layer GNN about hop 1-2, and only a deeper GNN resolves the far-reaching tasks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from revgnn.data.ordering import NodeOrder
from revgnn.utils.ranges import Range

if TYPE_CHECKING:  # torch is imported in the function: the config schema reads this signature
    from revgnn.data.node_dataset import NodeDataset

__all__ = ["proteins_like"]


def proteins_like(
    num_nodes: Annotated[int, Range(1)] = 6000,
    avg_degree: Annotated[int, Range(2)] = 16,
    window: Annotated[int, Range(1)] = 20,
    num_species: Annotated[int, Range(1)] = 8,
    num_tasks: Annotated[int, Range(1)] = 112,
    edge_channels: Annotated[int, Range(1)] = 8,
    latent_channels: Annotated[int, Range(1)] = 4,
    max_hops: Annotated[int, Range(1)] = 6,
    edge_noise: Annotated[float, Range(0)] = 0.5,
    valid_species: Annotated[int, Range(0)] = 1,
    test_species: Annotated[int, Range(0)] = 2,
    seed: int = 0,
    node_order: NodeOrder = "none",
) -> NodeDataset:
    """Generates the ``proteins_like`` data set (see the module docstring for the construction).

    Args:
        num_nodes (int): Total nodes, split evenly over species (default: :obj:`6000`).
        avg_degree (int): Expected undirected degree before de-duplication (default: :obj:`16`).
        window (int): Ring distance within which a node links (default: :obj:`20`).
        num_species (int): Species, i.e. width of the one-hot (default: :obj:`8`, as ogbn-proteins).
        num_tasks (int): Binary tasks (default: :obj:`112`, as ogbn-proteins).
        edge_channels (int): Edge feature width (default: :obj:`8`, as ogbn-proteins).
        latent_channels (int): Width of the hidden node vector ``z`` (default: :obj:`4`).
        max_hops (int): Tasks look ``1 .. max_hops`` hops away (default: :obj:`6`).
        edge_noise (float): Std of the logit noise on edge features (default: :obj:`0.5`).
        valid_species (int): Species held out for validation (default: :obj:`1`).
        test_species (int): Species held out for test (default: :obj:`2`).
        seed (int): Generator seed; the data set is a pure function of the arguments (default: :obj:`0`).
        node_order (str): ``"none"``, ``"rcm"`` or ``"degree"``: relabel the nodes once generated
            (:func:`~revgnn.data.ordering.reorder`; the species rings are local already).
            (default: :obj:`"none"`)
    """
    import torch

    from revgnn.data.node_dataset import NodeDataset, species_one_hot, sum_edge_features
    from revgnn.data.ordering import reorder

    if num_species < valid_species + test_species + 1:
        raise ValueError(
            f"num_species={num_species} leaves no training species "
            f"(valid_species={valid_species}, test_species={test_species})"
        )
    per_species = num_nodes // num_species
    if per_species < 2 * window + 2:
        raise ValueError(
            f"num_nodes={num_nodes} gives {per_species} nodes per species, fewer than "
            f"2 * window + 2 = {2 * window + 2}; lower window or raise num_nodes"
        )
    if avg_degree < 2:
        raise ValueError(f"avg_degree must be >= 2, got {avg_degree}")
    g = torch.Generator().manual_seed(seed)
    n = per_species * num_species

    # Local random links on one ring per species; each undirected pair drawn once.
    half = avg_degree // 2
    src = torch.arange(n).repeat_interleave(half)
    offset = torch.randint(1, window + 1, (src.numel(),), generator=g)
    ring_pos = src % per_species
    dst = src - ring_pos + (ring_pos + offset) % per_species
    pair = torch.stack([torch.minimum(src, dst), torch.maximum(src, dst)])
    pair = torch.unique(pair, dim=1)

    z = torch.randn(n, latent_channels, generator=g)
    w_edge = torch.randn(edge_channels, latent_channels, generator=g) / latent_channels**0.5
    bias = torch.randn(edge_channels, generator=g) - 1.0  # mostly small values, as in proteins
    logits = (
        (z[pair[0]] + z[pair[1]]) @ w_edge.t()
        + bias
        + edge_noise * torch.randn(pair.size(1), edge_channels, generator=g)
    )
    pair_attr = torch.sigmoid(logits)

    edge_index = torch.cat([pair, pair.flip(0)], dim=1)
    edge_attr = torch.cat([pair_attr, pair_attr], dim=0)

    # Task t thresholds the hops[t]-step mean-propagated hidden vector along u_t, at a per-task rate.
    hops = torch.arange(num_tasks) % max_hops + 1
    u = torch.randn(num_tasks, latent_channels, generator=g)
    u = u / u.norm(dim=1, keepdim=True)
    rate = 0.1 + 0.4 * torch.rand(num_tasks, generator=g)
    deg = torch.bincount(edge_index[1], minlength=n).clamp(min=1).unsqueeze(-1).float()
    y = torch.zeros(n, num_tasks)
    h = z
    for k in range(1, max_hops + 1):
        h = torch.zeros_like(h).index_add_(0, edge_index[1], h[edge_index[0]]) / deg
        tasks = (hops == k).nonzero().view(-1)
        if tasks.numel() == 0:
            continue
        score = h @ u[tasks].t()
        thresh = torch.quantile(score, 1 - rate[tasks], dim=0).diagonal()
        y[:, tasks] = (score > thresh).float()

    species = torch.arange(n) // per_species
    one_hot, _ = species_one_hot(species)
    x = torch.cat([sum_edge_features(edge_index, edge_attr, n), one_hot], dim=1)

    train_species = num_species - valid_species - test_species
    split_idx = {
        "train": (species < train_species).nonzero().view(-1),
        "valid": ((species >= train_species) & (species < train_species + valid_species)).nonzero().view(-1),
        "test": (species >= train_species + valid_species).nonzero().view(-1),
    }
    ds = NodeDataset(
        name="proteins_like",
        x=x,
        edge_index=edge_index,
        edge_attr=edge_attr,
        y=y,
        split_idx=split_idx,
        task="multilabel",
        num_classes=num_tasks,
        evaluator="ogbn-proteins",
        species_channels=num_species,
        info={"hops": hops.tolist(), "seed": seed},
    )
    return reorder(ds.sorted_by_destination(), node_order)
