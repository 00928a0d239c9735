"""CUDA correctness (skipped without a GPU; scripts/gpu_check.sh runs these on one)."""

import pytest
import torch
from torch import nn

from revgnn.nn import GATBlock, GENBlock, GroupAddRev, Shared, SharedDropout

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

N, E = 64, 512


def run(block_factory, disable, dtype, autocast=False):
    torch.manual_seed(0)
    device = torch.device("cuda")
    stack = nn.ModuleList(
        [GroupAddRev(block_factory(), num_groups=2, disable=disable) for _ in range(20)]
    ).to(device, dtype)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, 16, generator=g).to(device, dtype).requires_grad_()
    ei = torch.randint(0, N, (2, E), generator=g).to(device)
    ea = torch.randn(E, 16, generator=g).to(device, dtype)
    torch.manual_seed(2)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        mask = SharedDropout(0.2)(x)
        h = x
        for block in stack:
            h = block(h, ei, Shared(ea), mask)
        loss = h.float().square().mean()
    loss.backward()
    return [x.grad] + [p.grad for p in stack.parameters()]


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize(
    "name,factory",
    [
        ("gen_max", lambda: GENBlock(8, edge_channels=16)),
        ("gat_attn_dropout", lambda: GATBlock(8, heads=2, edge_channels=16, attn_dropout=0.3)),
    ],
)
def test_cuda_reversible_matches_plain_float64(name, factory):
    for a, b in zip(run(factory, False, torch.float64), run(factory, True, torch.float64)):
        assert rel(a, b) <= 1e-10


def test_cuda_bf16_autocast_close_to_plain():
    factory = lambda: GENBlock(8, edge_channels=16)  # noqa: E731
    for a, b in zip(run(factory, False, torch.float32, True), run(factory, True, torch.float32, True)):
        assert rel(a.float(), b.float()) <= 1e-4
