"""The fused GENConv max aggregation equals PyG's GENConv exactly (float64)."""
import pytest
import torch
import torch_geometric.typing
from torch_geometric import EdgeIndex

from revgnn.nn import GENBlock
from revgnn.nn.aggr import gen_max_aggregate
from revgnn.utils import SavedTensorBytes


def graph(n=40, e=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n - 3, (2, e), generator=g)  # the last 3 nodes get no edges
    ei = torch.cat([ei, ei[:, :5]], dim=1)             # and some parallel edges
    return ei


@pytest.mark.parametrize("scatter", [True, False])
@pytest.mark.parametrize("sorted_input", [True, False])
def test_gen_block_matches_pyg_genconv(scatter, sorted_input, monkeypatch):
    monkeypatch.setattr(torch_geometric.typing, "WITH_TORCH_SCATTER",
                        scatter and torch_geometric.typing.WITH_TORCH_SCATTER)
    n, c = 40, 6
    ei = graph(n)
    torch.manual_seed(0)
    block = GENBlock(c, edge_channels=5).double()
    x = torch.randn(n, c, dtype=torch.float64)
    ea = torch.randn(ei.size(1), 5, dtype=torch.float64)
    if sorted_input:
        perm = (ei[1] * n + ei[0]).argsort()
        ei_in, ea = EdgeIndex(ei[:, perm], sparse_size=(n, n), sort_order="col"), ea[perm]
        ei = ei[:, perm]
    else:
        ei_in = ei
    results = []
    for fused in (True, False):
        xx, ee = x.clone().requires_grad_(), ea.clone().requires_grad_()
        h = block.norm(xx).relu()
        if fused:
            out = block.conv_forward(h, ei_in, ee)
        else:
            out = block.conv(h, ei, block.edge_encoder(ee))
        (out * out.sin()).sum().backward()
        grads = [xx.grad, ee.grad] + [p.grad.clone() for p in block.parameters()]
        block.zero_grad()
        results.append((out.detach(), grads))
    (o1, g1), (o2, g2) = results
    assert torch.allclose(o1, o2, rtol=0, atol=1e-13)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, rtol=1e-11, atol=1e-13)


def test_fused_aggregation_saves_less_than_pyg():
    """One E x C tensor (the ReLU'd messages) + the N x C maximum + indices; PyG's GENConv
    path keeps more."""
    from torch_geometric.nn import GENConv

    n, e, c = 50, 2000, 8
    ei = EdgeIndex(graph(n, e), sparse_size=(n, n)).sort_by("col")[0]
    x = torch.randn(n, c, requires_grad=True)
    ea = torch.randn(ei.size(1), c, requires_grad=True)
    with SavedTensorBytes() as ours:
        gen_max_aggregate(x, ei, ea)
    conv = GENConv(c, c, aggr="max")
    with SavedTensorBytes() as pyg:
        conv.propagate(ei, x=(x, x), edge_attr=ea)
    assert ours.bytes == ei.size(1) * c * 4 + n * c * 4 + 2 * ei.size(1) * 8
    assert ours.bytes < pyg.bytes
