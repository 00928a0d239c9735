"""SAR exactness: distributed (gloo, spawned workers on 127.0.0.1) vs the
single-process PyG model on the full graph, float64, elementwise.

One spawn per world size runs every check, since starting workers (importing
torch + PyG) dominates the cost on small machines.
"""
from __future__ import annotations

import pytest
import torch

from revgnn.distributed.launch import run_workers
from revgnn.distributed.partition import build_partitions

RTOL = 1e-9
N, E, F_IN, F_EDGE = 48, 260, 8, 6


def make_graph(seed: int = 0):
    """Small directed multigraph with self loops, duplicate edges and one
    node without incoming edges."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, N, (2, E), generator=g)
    ei[1][ei[1] == N - 1] = 0  # node N-1: no incoming edges
    ei[:, :4] = torch.tensor([[3, 3, 5, 7], [3, 3, 9, 7]])  # loops, dups
    x = torch.randn(N, F_IN, generator=g, dtype=torch.float64)
    ea = torch.randn(E, F_EDGE, generator=g, dtype=torch.float64)
    return ei, x, ea


def make_parts(world_size: int, kind: str) -> torch.Tensor:
    """Node assignments: 'metis', 'random', 'unbalanced' (30/12/6 split)
    or 'empty' (part 1 owns no node, so every shard from it is empty)."""
    ei, _, _ = make_graph()
    if kind == 'unbalanced':
        parts = torch.zeros(N, dtype=torch.long)
        parts[30:42], parts[42:] = 1, 2
        return parts[torch.randperm(N, generator=torch.Generator()
                                    .manual_seed(1))]
    if kind == 'empty':
        g = torch.Generator().manual_seed(2)
        parts = torch.randint(0, world_size - 1, (N, ), generator=g)
        return torch.where(parts >= 1, parts + 1, parts)
    from revgnn.distributed.partition import partition_nodes
    return partition_nodes(ei, N, world_size, method=kind, seed=0)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        raise AssertionError(f'shape {tuple(a.shape)} vs {tuple(b.shape)}')
    scale = b.abs().max().item() if b.numel() else 0.0
    return (a - b).abs().max().item() / max(scale, 1e-30) if a.numel() else 0.


def _conv_models():
    """(name, constructor, uses_edge_attr) for every aggregation kind."""
    from torch_geometric.nn import GATConv, GENConv, GINConv, SAGEConv
    from torch.nn import Linear, ReLU, Sequential

    return [
        ('sum/GIN', lambda: GINConv(Sequential(Linear(F_IN, 16), ReLU(),
                                               Linear(16, 8)), train_eps=True),
         False),
        ('mean/SAGE', lambda: SAGEConv(F_IN, 8, aggr='mean'), False),
        ('max/SAGE', lambda: SAGEConv(F_IN, 8, aggr='max'), False),
        ('max/GEN', lambda: GENConv(F_IN, 8, aggr='max', edge_dim=F_EDGE,
                                    norm='layer', bias=True), True),
        ('softmax/GEN', lambda: GENConv(F_IN, 8, aggr='softmax', learn_t=True,
                                        t=0.7, edge_dim=F_EDGE, norm='layer',
                                        bias=True), True),
        ('softmax/GEN-nolearn', lambda: GENConv(F_IN, F_IN, aggr='softmax',
                                                t=1.3, norm='layer'), False),
        ('GAT', lambda: GATConv(F_IN, 5, heads=3, edge_dim=F_EDGE), True),
        ('GAT-mean-heads', lambda: GATConv(F_IN, 4, heads=2, concat=False,
                                           add_self_loops=False), False),
    ]


def _compare_model(name, build, uses_edges, graph, part, forward_ref,
                   forward_sar, out_dim_seed=7):
    """Runs the reference on the full graph and SAR on the local part;
    returns a list of (name, what, rel err)."""
    import torch.distributed as dist

    from revgnn.distributed.comm import all_reduce_gradients
    ei, x_full, ea_full = make_graph()
    torch.manual_seed(1234)
    ref = build().double()
    torch.manual_seed(1234)
    sar = build().double()
    sar.load_state_dict(ref.state_dict())
    from revgnn.distributed.convs import convert_to_sar
    convert_to_sar(sar)

    x_ref = x_full.clone().requires_grad_()
    ea_ref = ea_full.clone().requires_grad_()
    out_ref = forward_ref(ref, x_ref, ei, ea_ref if uses_edges else None)
    w = torch.randn(out_ref.shape, generator=torch.Generator().manual_seed(
        out_dim_seed), dtype=torch.float64)
    (out_ref * w).sum().backward()

    nid, eid = graph.node_ids, graph.edge_ids
    x_loc = x_full[nid].clone().requires_grad_()
    ea_loc = ea_full[eid].clone().requires_grad_()
    out = forward_sar(sar, x_loc, graph, ea_loc if uses_edges else None)
    (out * w[nid]).sum().backward()
    params = list(sar.parameters())
    if dist.is_initialized():
        all_reduce_gradients(params)
    errs = [(name, 'output', rel_err(out, out_ref[nid])),
            (name, 'grad x', rel_err(x_loc.grad, x_ref.grad[nid]))]
    if uses_edges:
        errs.append((name, 'grad edge_attr',
                     rel_err(ea_loc.grad, ea_ref.grad[eid])))
    for (pn, p_ref), p in zip(ref.named_parameters(), params):
        g_ref = p_ref.grad if p_ref.grad is not None else torch.zeros_like(
            p_ref)
        errs.append((name, f'grad {pn}', rel_err(p.grad, g_ref)))
    return errs


def _call_conv(model, x, edge_index, edge_attr):
    if edge_attr is None:
        return model(x, edge_index)
    return model(x, edge_index, edge_attr)


def _rev_model():
    from revgnn.models.revgnn import RevGNN
    return RevGNN(F_IN, 8, 3, num_layers=20, num_groups=2, conv='gen',
                  edge_channels=F_EDGE, aggr='max')


def _rev_model_softmax():
    from revgnn.models.revgnn import RevGNN
    return RevGNN(F_IN, 8, 3, num_layers=6, num_groups=2, conv='gen',
                  edge_channels=F_EDGE, aggr='softmax', learn_t=True)


def _worker_exactness(rank, world_size, kind, with_models):
    torch.set_default_dtype(torch.float64)
    from revgnn.distributed.sar import SARGraph
    ei, x, ea = make_graph()
    parts = build_partitions(ei, N, world_size, parts=make_parts(
        world_size, kind), edge_attr=ea, node_data={'x': x})
    graph = SARGraph(parts[rank], timeout_s=60)
    assert torch.equal(graph.edge_attr, ea[graph.edge_ids])
    errs = []
    for name, build, uses_edges in _conv_models():
        errs += _compare_model(name, build, uses_edges, graph, parts[rank],
                               _call_conv, _call_conv)
    if with_models:
        errs += _compare_model('RevGNN-20-GEN-max', _rev_model, True, graph,
                               parts[rank], _call_conv, _call_conv)
        errs += _compare_model('RevGNN-6-GEN-softmax', _rev_model_softmax,
                               True, graph, parts[rank], _call_conv,
                               _call_conv)
    return errs


def _check(results):
    bad = []
    for r in results:
        for name, what, err in r.value:
            if not err <= RTOL:
                bad.append(f'rank {r.rank} {name} {what}: rel err {err:.3e}')
    assert not bad, '\n'.join(bad)


@pytest.mark.parametrize('world_size,kind,with_models', [
    (1, 'metis', True),
    (2, 'metis', True),
    (3, 'unbalanced', False),
    (4, 'empty', True),
])
def test_sar_matches_single_process(world_size, kind, with_models):
    results = run_workers(_worker_exactness, world_size, kind, with_models,
                          timeout_s=60, wall_s=240, threads=1)
    _check(results)
