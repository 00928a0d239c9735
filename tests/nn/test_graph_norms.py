"""Norms inside reversible blocks on batches of graphs: GraphNorm, BatchNorm, LayerNorm.

Reversible (memory-free) and plain (``disable=True`` / ``reversible=False``) runs must agree to float64
round-off: outputs, gradients of inputs, edge features and every parameter; BatchNorm's running
statistics after several optimiser steps.
"""

import pytest
import torch
from conftest import rel_err
from torch import nn

from revgnn.models import create_model
from revgnn.nn import GENBlock, GroupAddRev, Shared, SharedDropout

N, E, G = 30, 120, 3


def assert_grads_equal(g_rev, g_ref, tol=1e-10):
    """Per-tensor relative error; a gradient that is zero in exact arithmetic (a bias just before a
    mean-subtracting norm) is compared relative to the largest gradient instead of its round-off."""
    assert len(g_rev) == len(g_ref)
    scale = max(b.abs().max().item() for b in g_ref if b is not None)
    for a, b in zip(g_rev, g_ref):
        assert (a is None) == (b is None)
        if a is not None:
            assert rel_err(a, b, floor=1e-6 * scale) <= tol


@pytest.fixture
def graphs():
    """Three graphs of 10 nodes each (edges stay inside their graph), float64 features."""
    g = torch.Generator().manual_seed(0)
    batch = torch.arange(N) // (N // G)
    src = torch.randint(0, N // G, (E,), generator=g)
    dst = torch.randint(0, N // G, (E,), generator=g)
    offset = torch.randint(0, G, (E,), generator=g) * (N // G)
    edge_index = torch.stack([src + offset, dst + offset])
    x = torch.randn(N, 16, generator=g, dtype=torch.float64) * 2 + 1
    edge_attr = torch.randn(E, 16, generator=g, dtype=torch.float64)
    return x, edge_index, edge_attr, batch


def stack_grads(norm, disable, graphs, depth=20):
    x, edge_index, edge_attr, batch = graphs
    torch.manual_seed(1)
    stack = nn.ModuleList(
        [
            GroupAddRev(
                GENBlock(8, edge_channels=16, aggr="softmax", learn_t=True, norm=norm),
                num_groups=2,
                disable=disable,
            )
            for _ in range(depth)
        ]
    ).double()
    torch.manual_seed(5)
    x = x.clone().requires_grad_()
    ea = edge_attr.clone().requires_grad_()
    mask = SharedDropout(0.2)(x)
    h = x
    for block in stack:
        h = block(h, edge_index, Shared(ea), mask, batch=batch)
    (h.sin() * h).sum().backward()
    return h.detach(), [x.grad, ea.grad] + [p.grad for p in stack.parameters()]


@pytest.mark.parametrize("norm", ["graph", "batch", "layer", None])
def test_reversible_stack_matches_plain_with_norm(norm, graphs):
    (h_rev, g_rev), (h_ref, g_ref) = (stack_grads(norm, d, graphs) for d in (False, True))
    assert rel_err(h_rev, h_ref) <= 1e-10
    assert all(g is not None for g in g_rev + g_ref)
    assert_grads_equal(g_rev, g_ref)


def test_graphnorm_uses_per_graph_statistics(graphs):
    """Shifting one graph's features changes only that graph's output (BatchNorm would mix graphs)."""
    x, edge_index, edge_attr, batch = graphs
    torch.manual_seed(1)
    block = GroupAddRev(GENBlock(8, edge_channels=16, aggr="softmax", norm="graph"), num_groups=2).double()
    y = block(x, edge_index, Shared(edge_attr), batch=batch)
    x2 = x.clone()
    x2[batch == 2] = x2[batch == 2] * 3 + 5
    y2 = block(x2, edge_index, Shared(edge_attr), batch=batch)
    assert torch.allclose(y[batch != 2], y2[batch != 2], atol=1e-12)
    assert not torch.allclose(y[batch == 2], y2[batch == 2])


def mol_batch(seed, num_graphs=4, nodes=8, edges=16):
    """A batch of random graphs with OGB's categorical atom (9) and bond (3) features."""
    g = torch.Generator().manual_seed(seed)
    n = num_graphs * nodes
    x = torch.stack([torch.randint(0, 2, (n,), generator=g) for _ in range(9)], dim=1)
    offset = torch.randint(0, num_graphs, (edges * num_graphs,), generator=g) * nodes
    ei = torch.stack(
        [
            torch.randint(0, nodes, offset.shape, generator=g) + offset,
            torch.randint(0, nodes, offset.shape, generator=g) + offset,
        ]
    )
    ea = torch.stack([torch.randint(0, 2, (ei.size(1),), generator=g) for _ in range(3)], dim=1)
    y = torch.randint(0, 2, (num_graphs, 1), generator=g).double()
    return x, ei, ea, torch.arange(n) // nodes, y


def mol_model(norm, reversible, **kw):
    torch.manual_seed(3)
    return create_model(
        "revgnn_mol_small",
        hidden_channels=16,
        num_layers=6,
        dropout=0.2,
        norm=norm,
        reversible=reversible,
        **kw,
    ).double()


@pytest.mark.parametrize(
    "norm,readout", [("graph", "mean"), ("batch", "attention"), ("layer", "sum"), (None, "max")]
)
def test_graph_model_reversible_matches_plain(norm, readout):
    x, ei, ea, batch, y = mol_batch(0)
    res = []
    for reversible in (True, False):
        model = mol_model(norm, reversible, readout=readout)
        torch.manual_seed(7)
        out = model(x, ei, ea, batch)
        torch.nn.functional.binary_cross_entropy_with_logits(out, y).backward()
        res.append((out.detach(), [p.grad for p in model.parameters()]))
    (o1, g1), (o2, g2) = res
    assert o1.shape == (4, 1)
    assert rel_err(o1, o2) <= 1e-10
    assert_grads_equal(g1, g2)


def test_batchnorm_running_stats_equal_plain_after_steps():
    """Several Adam steps on different batches: running stats updated once per step (not 2-3 times),
    so they, the parameters and eval-mode outputs equal the non-reversible model's."""
    states = []
    for reversible in (True, False):
        model = mol_model("batch", reversible)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        torch.manual_seed(11)
        for step in range(4):
            x, ei, ea, batch, y = mol_batch(step + 1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x, ei, ea, batch), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        x, ei, ea, batch, _ = mol_batch(99)
        with torch.no_grad():
            out = model(x, ei, ea, batch)
        bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm1d)]
        states.append((bns, dict(model.named_parameters()), out))
    (bn_rev, p_rev, out_rev), (bn_ref, p_ref, out_ref) = states
    assert len(bn_rev) == len(bn_ref) == 6 * 2 + 1  # one per group per block, one before the readout
    for a, b in zip(bn_rev, bn_ref):
        assert int(a.num_batches_tracked) == int(b.num_batches_tracked) == 4
        assert rel_err(a.running_mean, b.running_mean) <= 1e-10
        assert rel_err(a.running_var, b.running_var) <= 1e-10
    for name in p_ref:
        assert rel_err(p_rev[name], p_ref[name]) <= 1e-9, name
    assert rel_err(out_rev, out_ref) <= 1e-9


@pytest.mark.parametrize("norm", ["graph", "batch"])
def test_graph_model_saved_bytes_flat_in_depth(norm):
    """The GraphNorm / BatchNorm reversible model stores no per-layer activations for backward."""
    from revgnn.utils import SavedTensorBytes

    x, ei, ea, batch, y = mol_batch(0)

    def saved(depth):
        model = create_model("revgnn_mol_small", num_layers=depth, hidden_channels=16, norm=norm)
        with SavedTensorBytes() as s:
            loss = model(x, ei, ea, batch).sum()
        loss.backward()
        return s.bytes

    assert saved(64) <= 1.05 * saved(2)
