"""Exactness, memory and error behaviour of revgnn.nn.GroupAddRev and WeightTied."""

import pytest
import torch
import torch_geometric.typing
from conftest import rel_err
from torch import nn

from revgnn.nn import (
    GATBlock,
    GCNBlock,
    GENBlock,
    GINBlock,
    GroupAddRev,
    PerGroup,
    SAGEBlock,
    Shared,
    SharedDropout,
    WeightTied,
)
from revgnn.utils import SavedTensorBytes

N, E = 24, 96


@pytest.fixture
def graph():
    g = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, N, (2, E), generator=g)
    return edge_index


BLOCK_FACTORIES = {
    "gen_max": lambda c: GENBlock(c, edge_channels=2 * c, aggr="max"),
    "gen_softmax_learn_t": lambda c: GENBlock(c, edge_channels=2 * c, aggr="softmax", learn_t=True),
    "gcn": lambda c: GCNBlock(c),
    "sage": lambda c: SAGEBlock(c),
    "gat_attn_dropout": lambda c: GATBlock(c, heads=2, edge_channels=2 * c, attn_dropout=0.3),
    "gin": lambda c: GINBlock(c),
    "gen_batchnorm": lambda c: GENBlock(c, edge_channels=2 * c, norm="batch"),
}


def make_stack(factory, depth, disable, groups=2, channels=8, seed=1, **kw):
    torch.manual_seed(seed)
    return nn.ModuleList(
        [GroupAddRev(factory(channels), num_groups=groups, disable=disable, **kw) for _ in range(depth)]
    ).double()


def run_stack(stack, x, edge_index, edge_attr=None, p=0.2, seed=5, loss_fn=None):
    torch.manual_seed(seed)
    x = x.clone().requires_grad_()
    mask = SharedDropout(p)(x)
    h = x
    edges = Shared(edge_attr)
    for block in stack:
        h = block(h, edge_index, edges, mask)
    loss = (h.sin() * h).sum() if loss_fn is None else loss_fn(h)
    loss.backward()
    grads = [x.grad] + [p.grad for p in stack.parameters()]
    if edge_attr is not None and edge_attr.requires_grad:
        grads.append(edge_attr.grad)
    return h.detach(), grads


@pytest.mark.parametrize("name", sorted(BLOCK_FACTORIES))
def test_reversible_matches_plain_at_depth_50(name, graph):
    """float64 gradients of inputs, edge features and every parameter, dropout on."""
    factory = BLOCK_FACTORIES[name]
    x = torch.randn(N, 16, dtype=torch.float64)
    edge_attr = torch.randn(E, 16, dtype=torch.float64)
    outs = []
    for disable in (False, True):
        stack = make_stack(factory, 50, disable)
        ea = edge_attr.clone().requires_grad_()
        outs.append(run_stack(stack, x, graph, ea if "gen" in name or "gat" in name else None))
    (h_rev, g_rev), (h_ref, g_ref) = outs
    assert rel_err(h_rev, h_ref) <= 1e-10
    assert len(g_rev) == len(g_ref)
    for a, b in zip(g_rev, g_ref):
        assert a is not None and b is not None
        assert rel_err(a, b) <= 1e-10


def test_without_torch_scatter(graph, monkeypatch):
    """The native PyTorch aggregation path (no torch-scatter) is exact too."""
    monkeypatch.setattr(torch_geometric.typing, "WITH_TORCH_SCATTER", False)
    test_reversible_matches_plain_at_depth_50("gen_max", graph)


class DropoutBlock(nn.Module):
    """A block with an ordinary nn.Dropout inside: needs RNG replay."""

    def __init__(self, c):
        super().__init__()
        self.lin = nn.Linear(c, c)
        self.drop = nn.Dropout(0.5)

    def reset_parameters(self):
        self.lin.reset_parameters()

    def forward(self, x, edge_index, edge_attr=None, mask=None):
        return self.drop(torch.tanh(self.lin(x)))


def test_nn_dropout_inside_block_is_replayed(graph):
    x = torch.randn(N, 8, dtype=torch.float64)
    res = [run_stack(make_stack(DropoutBlock, 50, d, channels=4), x, graph) for d in (False, True)]
    for a, b in zip(res[0][1], res[1][1]):
        assert rel_err(a, b) <= 1e-10


def test_without_rng_replay_dropout_gradients_are_wrong(graph):
    """Documents why preserve_rng_state defaults to True (PyG's GroupAddRev behaviour)."""
    x = torch.randn(N, 8, dtype=torch.float64)
    rev = run_stack(make_stack(DropoutBlock, 10, False, channels=4, preserve_rng_state=False), x, graph)
    ref = run_stack(make_stack(DropoutBlock, 10, True, channels=4), x, graph)
    assert rel_err(rev[1][0], ref[1][0]) > 1e-3


def test_weight_tied_matches_plain(graph):
    x = torch.randn(N, 16, dtype=torch.float64)
    ea = torch.randn(E, 16, dtype=torch.float64)
    results = []
    for disable in (False, True):
        torch.manual_seed(3)
        block = GroupAddRev(GENBlock(8, edge_channels=16), num_groups=2, disable=disable)
        tied = WeightTied(block, 60).double()
        torch.manual_seed(4)
        xx = x.clone().requires_grad_()
        e = ea.clone().requires_grad_()
        mask = SharedDropout(0.2)(xx)
        out = tied(xx, graph, Shared(e), mask)
        (out * out.cos()).sum().backward()
        results.append([xx.grad, e.grad] + [p.grad for p in tied.parameters()])
    assert sum(p.numel() for p in tied.parameters()) == sum(p.numel() for p in block.parameters())
    for a, b in zip(*results):
        assert rel_err(a, b) <= 1e-10


def test_keep_every_bounds_reconstruction_and_stays_exact(graph):
    x = torch.randn(N, 16, dtype=torch.float64)
    res = []
    for disable, keep in ((False, 4), (True, 0)):
        torch.manual_seed(3)
        tied = WeightTied(
            GroupAddRev(GENBlock(8), num_groups=2, disable=disable), 20, keep_every=keep
        ).double()
        xx = x.clone().requires_grad_()
        tied(xx, graph).square().sum().backward()
        res.append([xx.grad] + [p.grad for p in tied.parameters()])
    for a, b in zip(*res):
        assert rel_err(a, b) <= 1e-10


def saved_bytes(depth, graph):
    stack = make_stack(BLOCK_FACTORIES["gen_max"], depth, False, channels=16)
    x = torch.randn(N, 32, dtype=torch.float64, requires_grad=True)
    ea = torch.randn(E, 32, dtype=torch.float64, requires_grad=True)
    with SavedTensorBytes() as saved:
        torch.manual_seed(0)
        mask = SharedDropout(0.1)(x)
        h = x
        for block in stack:
            h = block(h, graph, Shared(ea), mask)
        loss = h.square().sum()
    loss.backward()
    return saved.bytes


def test_saved_bytes_do_not_grow_with_depth(graph):
    small, large = saved_bytes(4, graph), saved_bytes(200, graph)
    assert small > 0
    assert large <= 1.05 * small


def test_plain_stack_saved_bytes_grow(graph):
    """Sanity check of the measure: the disabled (plain) stack stores activations."""

    def plain(depth):
        stack = make_stack(BLOCK_FACTORIES["gen_max"], depth, True, channels=16)
        x = torch.randn(N, 32, dtype=torch.float64, requires_grad=True)
        with SavedTensorBytes() as saved:
            h = x
            for block in stack:
                h = block(h, graph)
        return saved.bytes

    assert plain(40) > 5 * plain(4)


def test_one_forward_per_group_in_backward(graph):
    """Each f_i runs once in forward and once in backward (PyG: once + twice)."""
    calls = []

    class Counting(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.lin = nn.Linear(c, c)

        def forward(self, x, edge_index):
            calls.append(torch.is_grad_enabled())
            return torch.tanh(self.lin(x))

    block = GroupAddRev(Counting(4), num_groups=3, group_init="copy").double()
    x = torch.randn(N, 12, dtype=torch.float64, requires_grad=True)
    y = block(x, graph)
    assert calls == [False] * 3
    y.sum().backward()
    assert calls == [False] * 3 + [True] * 3


def test_multiple_backward_passes_and_autograd_grad(graph):
    x = torch.randn(N, 16, dtype=torch.float64)
    torch.manual_seed(0)
    rev = GroupAddRev(GENBlock(8), num_groups=2, num_bwd_passes=2).double()
    ref = GroupAddRev(GENBlock(8), num_groups=2, disable=True).double()
    ref.load_state_dict(rev.state_dict())
    grads = {}
    for name, block in (("rev", rev), ("ref", ref)):
        xx = x.clone().requires_grad_()
        h = block(block(xx, graph), graph)
        loss = h.square().sum()
        g1 = torch.autograd.grad(loss, [xx, *block.parameters()], retain_graph=True)
        g2 = torch.autograd.grad(loss, [xx, *block.parameters()])
        grads[name] = (g1, g2)
    for g1, g2, r1 in zip(*grads["rev"], grads["ref"][0]):
        assert rel_err(g1, r1) <= 1e-12 and rel_err(g2, r1) <= 1e-12


def test_backward_more_often_than_allowed_is_an_error(graph):
    block = GroupAddRev(GENBlock(8), num_groups=2).double()
    x = torch.randn(N, 16, dtype=torch.float64, requires_grad=True)
    loss = block(x, graph).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="num_bwd_passes=1"):
        loss.backward()


def test_inputs_without_grad_and_frozen_parameters(graph):
    x = torch.randn(N, 16, dtype=torch.float64)
    torch.manual_seed(0)
    rev = GroupAddRev(GENBlock(8), num_groups=2).double()
    ref = GroupAddRev(GENBlock(8), num_groups=2, disable=True).double()
    ref.load_state_dict(rev.state_dict())
    for block in (rev, ref):  # x needs no grad: only parameter gradients
        block(block(x, graph), graph).square().sum().backward()
    for a, b in zip(rev.parameters(), ref.parameters()):
        assert rel_err(a.grad, b.grad) <= 1e-12
    for block in (rev, ref):  # frozen parameters: only the input gradient
        block.requires_grad_(False)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    for block, xx in zip((rev, ref), xs):
        block(block(xx, graph), graph).square().sum().backward()
    assert rel_err(xs[0].grad, xs[1].grad) <= 1e-12


def test_eval_and_no_grad_leave_inputs_intact(graph):
    block = GroupAddRev(GENBlock(8), num_groups=2).double()
    x = torch.randn(N, 16, dtype=torch.float64, requires_grad=True)
    copy = x.detach().clone()
    block.eval()
    y_eval = block(x, graph)
    with torch.no_grad():
        y_ng = block(x, graph)
    block.train()
    y_train = block(x, graph)
    y_train.sum().backward()
    assert torch.equal(x.detach(), copy) and x.untyped_storage().nbytes() == copy.numel() * 8
    assert torch.allclose(y_eval, y_ng) and torch.allclose(y_eval, y_train)


def test_input_used_elsewhere_stays_correct(graph):
    """A block's output consumed by the next block and by a skip connection."""
    x = torch.randn(N, 16, dtype=torch.float64)
    res = []
    for disable in (False, True):
        torch.manual_seed(0)
        b1, b2 = (GroupAddRev(GENBlock(8), num_groups=2, disable=disable).double() for _ in range(2))
        xx = x.clone().requires_grad_()
        y1 = b1(xx, graph)
        y2 = b2(y1, graph)
        (y2 * y1).sum().backward()  # y1 saved by mul: must still be intact
        res.append([xx.grad, *b1.parameters(), *b2.parameters()])
    assert rel_err(res[0][0], res[1][0]) <= 1e-12


def test_batchnorm_running_stats_updated_once(graph):
    x = torch.randn(N, 16, dtype=torch.float64)
    stats = []
    for disable in (False, True):
        torch.manual_seed(0)
        stack = make_stack(lambda c: GENBlock(c, norm="batch"), 3, disable)
        for step in range(3):
            run_stack(stack, x + step, graph, p=0.0)
        bns = [m for m in stack.modules() if isinstance(m, nn.BatchNorm1d)]
        stats.append(
            [(m.running_mean.clone(), m.running_var.clone(), int(m.num_batches_tracked)) for m in bns]
        )
    for (m1, v1, n1), (m2, v2, n2) in zip(*stats):
        assert n1 == n2 == 3
        assert rel_err(m1, m2) <= 1e-12 and rel_err(v1, v2) <= 1e-12


def test_argument_split_rule(graph):
    seen = []

    class Spy(nn.Module):
        def forward(self, x, edge_index, a, b=None):
            seen.append((a.shape if torch.is_tensor(a) else a, b.shape if torch.is_tensor(b) else b))
            return x * 0.5

    block = GroupAddRev(Spy(), num_groups=2)
    x = torch.randn(N, 6)
    block(x, graph, torch.randn(N, 6), b=torch.randn(E, 6))  # both have the width: split
    assert seen[-1] == (torch.Size([N, 3]), torch.Size([E, 3]))
    block(x, graph, Shared(torch.randn(E, 6)), b=torch.randn(E, 5))  # shared / other width
    assert seen[-1] == (torch.Size([E, 6]), torch.Size([E, 5]))
    block(x, graph, PerGroup(["first", "second"]))
    assert [s[0] for s in seen[-2:]] == ["first", "second"]
    with pytest.raises(ValueError, match="PerGroup argument has 3 values"):
        block(x, graph, PerGroup([1, 2, 3]))


def test_constructor_and_input_errors(graph):
    with pytest.raises(ValueError, match="at least 2 groups"):
        GroupAddRev(GENBlock(8), num_groups=1)
    with pytest.raises(ValueError, match="needs `num_groups`"):
        GroupAddRev(GENBlock(8))
    block = GroupAddRev(GENBlock(8), num_groups=3)
    with pytest.raises(ValueError, match="divisible by 3"):
        block(torch.randn(N, 16), graph)

    class Grow(nn.Module):
        def forward(self, x, edge_index):
            return torch.cat([x, x], dim=-1)

    with pytest.raises(ValueError, match="must keep the shape"):
        GroupAddRev(Grow(), num_groups=2)(torch.randn(N, 8, requires_grad=True), graph)


def test_inplace_change_of_output_is_an_error(graph):
    block = GroupAddRev(GENBlock(8), num_groups=2).double()
    x = torch.randn(N, 16, dtype=torch.float64, requires_grad=True)
    y = block(x, graph)
    y.mul_(2)
    with pytest.raises(RuntimeError, match="modified in-place"):
        y.sum().backward()


def test_consumer_without_backward_is_an_error(graph):
    b1, b2 = (GroupAddRev(GENBlock(8), num_groups=2).double() for _ in range(2))
    x = torch.randn(N, 16, dtype=torch.float64, requires_grad=True)
    y1 = b1(x, graph)
    b2(y1, graph)  # consumes y1, but its result is thrown away
    with pytest.raises(RuntimeError, match="y.clone()"):
        y1.sum().backward()


def test_inverse_reconstructs_input(graph):
    block = GroupAddRev(GENBlock(8, edge_channels=16), num_groups=2).double().eval()
    x = torch.randn(N, 16, dtype=torch.float64)
    ea = torch.randn(E, 16, dtype=torch.float64)
    y = block(x, graph, Shared(ea))
    assert rel_err(block.inverse(y, graph, Shared(ea)), x) <= 1e-12


def test_graphnorm_block_with_batch_vector(graph):
    """GraphNorm needs the per-node graph index; every group receives it whole."""
    batch = torch.arange(N) // 8  # three graphs
    x = torch.randn(N, 16, dtype=torch.float64)
    res = []
    for disable in (False, True):
        stack = make_stack(lambda c: GENBlock(c, norm="graph"), 10, disable)
        xx = x.clone().requires_grad_()
        h = xx
        for block in stack:
            h = block(h, graph, batch=batch)
        h.square().sum().backward()
        res.append([xx.grad] + [p.grad for p in stack.parameters()])
    for a, b in zip(*res):
        assert rel_err(a, b) <= 1e-10


# the C++ kernels and the operators' PyTorch implementation (REVGNN_KERNELS=0, which autocast reached
# inside the operator until it was turned off there)
KERNELS = pytest.mark.parametrize("kernels", ["1", "0"])


@KERNELS
def test_autocast_recomputation_matches_plain(graph, kernels, monkeypatch):
    """bf16 autocast (CPU here; CUDA the same way): backward recomputes under the
    forward's autocast state, so gradients equal the plain stack's up to fp32 rounding."""
    monkeypatch.setenv("REVGNN_KERNELS", kernels)
    x = torch.randn(N, 16)
    ea = torch.randn(E, 16)
    res = []
    for disable in (False, True):
        torch.manual_seed(1)
        stack = nn.ModuleList(
            [GroupAddRev(GENBlock(8, edge_channels=16), num_groups=2, disable=disable) for _ in range(8)]
        )
        res.append(bf16_autocast_grads(stack, x, ea, graph))
    for a, b in zip(*res):
        assert rel_err(a.float(), b.float()) <= 1e-5  # 1e-1 without re-entering autocast


def bf16_autocast_grads(stack, x, ea, graph):
    """Gradients of the input and parameters of ``stack`` run under CPU bf16 autocast."""
    xx = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = xx
        for block in stack:
            h = block(h, graph, Shared(ea))
        loss = h.float().square().mean()
    loss.backward()
    return [xx.grad] + [p.grad for p in stack.parameters()]


def test_quantize_makes_inversion_bit_exact_and_keeps_gradients(graph):
    """quantize=q: the input comes back bit for bit (on the 2^-q grid) after 200 blocks, in
    float32 and under bf16 autocast, and float64 gradients equal the stored-activation
    stack's with the same quantization."""
    factory = BLOCK_FACTORIES["gen_max"]
    x = torch.randn(N, 16)
    ea = torch.randn(E, 16)
    stack = make_stack(factory, 200, False, quantize=16).float().eval()
    for autocast in (False, True):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            h = x
            for block in stack:
                h = block(h, graph, Shared(ea))
            for block in reversed(stack):
                h = block.inverse(h, graph, Shared(ea))
        assert torch.equal(h, stack[0].to_grid(x))
        assert (h - x).abs().max() <= 2.0**-17
    outs = []
    for disable in (False, True):
        q_stack = make_stack(factory, 40, disable, quantize=16)
        outs.append(run_stack(q_stack, x.double(), graph, ea.double().requires_grad_()))
    (h_rev, g_rev), (h_ref, g_ref) = outs
    assert torch.equal(h_rev, h_ref)
    for a, b in zip(g_rev, g_ref):
        assert rel_err(a, b) <= 1e-10


@KERNELS
def test_quantize_under_bf16_autocast_gradients_match_stored(graph, kernels, monkeypatch):
    """Under bf16 autocast the reversible backward recomputes every f_i on bit-exact inputs,
    so its gradients are those of the same stack with stored activations."""
    monkeypatch.setenv("REVGNN_KERNELS", kernels)
    factory = BLOCK_FACTORIES["gen_max"]
    x = torch.randn(N, 16)
    ea = torch.randn(E, 16)
    res = [
        bf16_autocast_grads(make_stack(factory, 60, disable, quantize=16).float(), x, ea, graph)
        for disable in (False, True)
    ]
    for a, b in zip(*res):
        assert rel_err(a.float(), b.float()) <= 1e-5


def test_quantize_validation_and_range_warning(graph):
    with pytest.raises(ValueError, match="fractional bits"):
        GroupAddRev(GCNBlock(4), num_groups=2, quantize=0)
    block = GroupAddRev(GCNBlock(4), num_groups=2, quantize=20)  # exact below 2^4 = 16
    assert "quantize=20" in repr(block)
    with pytest.warns(RuntimeWarning, match="no longer exact"):
        block(torch.full((N, 8), 100.0), graph)


class _Tanh(nn.Module):
    """A group function without graph arguments: tanh(W x)."""

    def __init__(self, channels):
        super().__init__()
        self.lin = nn.Linear(channels, channels)

    def forward(self, x):
        return self.lin(x).tanh()


def _chain_backward(mark, n=4096, channels=64, depth=3):
    from revgnn.nn.invertible import mark_internal
    from revgnn.utils.memory import LargestAllocation

    torch.manual_seed(0)
    blocks = nn.ModuleList(GroupAddRev(_Tanh(channels // 2), num_groups=2) for _ in range(depth)).double()
    x = torch.randn(n, channels, dtype=torch.float64, requires_grad=True)
    outs, h = [], x
    for block in blocks:
        h = block(h)
        outs.append(h)
    held = [o.detach().clone() for o in outs]
    if mark:
        mark_internal(h)
    loss = (h * h).sum()
    with LargestAllocation() as memory:
        loss.backward()
    intact = [torch.equal(o.detach(), c) for o, c in zip(outs[:-1], held[:-1])]
    return (
        memory.peak / (n * channels * 8),
        x.grad,
        [p.grad for p in blocks.parameters()],
        intact,
        outs[-1],
        held[-1],
    )


def test_backward_rebuilds_inputs_in_place_without_touching_held_outputs():
    """The input of a block is rebuilt in the storage of the tensor its consumer rebuilt (and in
    the last output's where the caller marks it internal), and its gradient in the storage of
    the output's gradient that nothing but autograd holds: a backward's peak stays within 3.1
    node states of float64 here (y rebuilt in place, grad_y turned into grad_x, and the group
    function's own few half-width tensors), one more with the last output not marked; outputs
    the caller holds keep their values, and gradients are unchanged."""
    peak, gx, gp, intact, last, held_last = _chain_backward(mark=False)
    peak_marked, gx_m, gp_m, intact_m, last_m, _ = _chain_backward(mark=True)
    assert all(intact) and all(intact_m)
    assert torch.equal(last.detach(), held_last)  # not marked: the caller's output is intact
    assert torch.equal(gx, gx_m) and all(torch.equal(a, b) for a, b in zip(gp, gp_m))
    assert peak_marked <= peak - 0.99, (peak, peak_marked)
    assert peak_marked <= 3.1, peak_marked  # + the parameters' gradients


def _held_gradients(hold, channels=16, n=64, depth=3):
    """Gradients of a chain of reversible blocks whose middle output also feeds ``0.5 * y.sum()``
    (a second consumer) and whose outputs' gradients the caller may ``hold`` through tensor
    hooks: (x's gradient, the parameters', the held gradients as they are after backward and as
    they were when the hooks ran)."""
    torch.manual_seed(0)
    blocks = nn.ModuleList(GroupAddRev(_Tanh(channels // 2), num_groups=2) for _ in range(depth)).double()
    x = torch.randn(n, channels, dtype=torch.float64, requires_grad=True)
    held, copies, h, extra = [], [], x, 0
    for i, block in enumerate(blocks):
        h = block(h)
        if hold:
            h.register_hook(lambda g: held.append(g) or copies.append(g.clone()))
        if i == 1:
            extra = 0.5 * h.sum()
    ((h * h).sum() + extra).backward()
    return x.grad, [p.grad for p in blocks.parameters()], held, copies


def test_gradient_rewritten_only_where_nothing_else_holds_it():
    """A block writes its input's gradient into its output's gradient only where autograd alone
    holds that: gradients the caller keeps through tensor hooks, and a gradient to which a
    second consumer's is added, keep their values, and every gradient equals the one a chain
    whose gradients are never rewritten computes."""
    from revgnn.nn import invertible

    gx, gp, held, copies = _held_gradients(hold=True)
    assert len(held) == 3 and all(torch.equal(a, b) for a, b in zip(held, copies))
    gx_free, gp_free, _, _ = _held_gradients(hold=False)
    original = invertible._gradient_is_scratch
    try:
        invertible._gradient_is_scratch = lambda *a: False
        gx_ref, gp_ref, _, _ = _held_gradients(hold=False)
    finally:
        invertible._gradient_is_scratch = original
    for got in ((gx, gp), (gx_free, gp_free)):
        assert torch.equal(got[0], gx_ref) and all(torch.equal(a, b) for a, b in zip(got[1], gp_ref))


def test_gradient_scratch_seen_where_only_autograd_holds_it():
    """The condition itself: the gradient a consuming block passes on is scratch; one a hook keeps,
    or one ``torch.autograd.grad`` returns to its caller, is not."""
    from revgnn.nn import invertible

    seen = []
    original = invertible._gradient_is_scratch

    def spy(*args):
        seen.append(original(*args))
        return seen[-1]

    torch.manual_seed(0)
    blocks = nn.ModuleList(GroupAddRev(_Tanh(4), num_groups=2) for _ in range(3)).double()
    x = torch.randn(16, 8, dtype=torch.float64, requires_grad=True)
    invertible._gradient_is_scratch = spy
    try:
        h1 = blocks[0](x)
        h = blocks[2](blocks[1](h1))
        (h * h).sum().backward()
        assert seen == [False, True, True]  # the last output is not marked internal
        seen.clear()
        h1 = blocks[0](x)
        h1.register_hook(lambda g: g)  # a hook that only reads is one reference, gone again
        h1.register_hook(lambda g: kept.append(g))
        kept = []
        h = blocks[2](blocks[1](h1))
        (h * h).sum().backward()
        assert seen == [False, True, False]
        seen.clear()
        h1 = blocks[0](x)
        h = blocks[2](blocks[1](h1))
        torch.autograd.grad((h * h).sum(), [h1, x])
        assert seen[:2] == [False, True] and seen[2:] in ([], [False])
    finally:
        invertible._gradient_is_scratch = original
