"""A user block written against the public InvertibleModule contract: exactness in float64 against
a plain autograd reference (outputs and every gradient, dropout on), memory flat in depth, errors."""

import pytest
import torch
from conftest import rel_err
from torch import nn

from revgnn import nn as rnn
from revgnn.nn import InvertibleModule, WeightTied
from revgnn.utils import SavedTensorBytes

N, C, K = 40, 6, 3  # nodes, channels (two halves of 3), conditioning width


class AffineCoupling(InvertibleModule):
    r"""The user block: an affine coupling conditioned on an extra tensor ``cond``, with dropout,

    .. math::
        \mathbf{Y} = [\mathbf{X}_2 \,\|\, \mathbf{X}_1 \odot \exp(\tanh(S[\mathbf{X}_2 \| \mathbf{c}]))
        + T(\mathrm{Dropout}(\mathbf{X}_2))]

    (the halves swap, so a stack transforms both)."""

    def __init__(self, p=0.3, **kwargs):
        super().__init__(**kwargs)
        h = C // 2
        self.scale = nn.Linear(h + K, h)
        self.shift = nn.Sequential(nn.Linear(h, h), nn.Tanh(), nn.Linear(h, h))
        self.drop = nn.Dropout(p)

    def _terms(self, x2, cond):
        log_s = torch.tanh(self.scale(torch.cat([x2, cond], dim=-1)))
        return log_s, self.shift(self.replay_random("shift", self.drop, x2))

    def _forward(self, x, cond):
        x1, x2 = x.chunk(2, dim=-1)
        log_s, t = self._terms(x2, cond)
        return torch.cat([x2, x1 * log_s.exp() + t], dim=-1)

    def _inverse(self, y, cond):
        y1, y2 = y.chunk(2, dim=-1)
        log_s, t = self._terms(y1, cond)
        return torch.cat([(y2 - t) * (-log_s).exp(), y1], dim=-1)


def reference(block, x, cond):
    """The same function in plain autograd, written out from the block's submodules."""
    x1, x2 = x.chunk(2, dim=-1)
    log_s = torch.tanh(block.scale(torch.cat([x2, cond], dim=-1)))
    return torch.cat([x2, x1 * log_s.exp() + block.shift(block.drop(x2))], dim=-1)


def grads_of(blocks, x, cond, forward):
    """Output and gradients of input, conditioning and every parameter of a stack, dropout seeded."""
    x = x.clone().requires_grad_()
    cond = cond.clone().requires_grad_()
    torch.manual_seed(7)
    h = x
    for block in blocks:
        h = forward(block, h, cond)
    (h.sin() * h).sum().backward()
    return h.detach(), [x.grad, cond.grad] + [p.grad for p in blocks.parameters()]


def stack(depth, seed=0, **kwargs):
    torch.manual_seed(seed)
    return nn.ModuleList(AffineCoupling(**kwargs) for _ in range(depth)).double()


def test_user_block_matches_plain_autograd_with_dropout():
    x = torch.randn(N, C, dtype=torch.float64)
    cond = torch.randn(N, K, dtype=torch.float64)
    h_rev, g_rev = grads_of(stack(12), x, cond, lambda b, h, c: b(h, c))
    h_ref, g_ref = grads_of(stack(12), x, cond, reference)
    assert rel_err(h_rev, h_ref) <= 1e-12
    assert len(g_rev) == len(g_ref) == 2 + 12 * 6
    for a, b in zip(g_rev, g_ref):
        assert a is not None and rel_err(a, b) <= 1e-10


def test_without_rng_replay_the_dropout_gradient_is_wrong():
    """The check above can fail: without replay the inverse draws a different mask."""
    x = torch.randn(N, C, dtype=torch.float64)
    cond = torch.randn(N, K, dtype=torch.float64)
    _, g_rev = grads_of(stack(4, preserve_rng_state=False), x, cond, lambda b, h, c: b(h, c))
    _, g_ref = grads_of(stack(4), x, cond, reference)
    assert rel_err(g_rev[0], g_ref[0]) > 1e-3


def test_keep_input_weight_tied_and_two_backward_passes():
    x = torch.randn(N, C, dtype=torch.float64)
    cond = torch.randn(N, K, dtype=torch.float64)
    res = []
    for disable in (False, True):
        torch.manual_seed(0)
        tied = WeightTied(AffineCoupling(p=0.0, disable=disable, num_bwd_passes=2), 9, keep_every=3)
        tied = tied.double()
        xx = x.clone().requires_grad_()
        loss = tied(xx, cond).square().sum()
        g1 = torch.autograd.grad(loss, [xx, *tied.parameters()], retain_graph=True)
        g2 = torch.autograd.grad(loss, [xx, *tied.parameters()])
        res.append((g1, g2))
    (g1, g2), (r1, _) = res
    for a, b, r in zip(g1, g2, r1):
        assert rel_err(a, r) <= 1e-10 and rel_err(b, r) <= 1e-10


def saved_bytes(depth, disable):
    blocks = stack(depth, disable=disable)
    x = torch.randn(N, C, dtype=torch.float64, requires_grad=True)
    cond = torch.randn(N, K, dtype=torch.float64, requires_grad=True)
    with SavedTensorBytes() as saved:
        h = x
        for block in blocks:
            h = block(h, cond)
        loss = h.square().sum()
    loss.backward()
    return saved.bytes


def test_nothing_activation_sized_is_saved_per_block():
    # what is saved is the shared conditioning tensor (once) and the loss's input
    assert saved_bytes(2, False) == saved_bytes(24, False) <= (N * K + N * C) * 8
    # the measure sees the activations of the same stack in plain autograd
    assert saved_bytes(24, True) > 10 * saved_bytes(2, True)


def test_inverse_and_hand_off_between_blocks():
    blocks = stack(3, p=0.0).eval()
    x = torch.randn(N, C, dtype=torch.float64, requires_grad=True)
    cond = torch.randn(N, K, dtype=torch.float64)
    h = x
    for block in blocks:
        h = block(h, cond)
    for block in reversed(blocks):
        h = block.inverse(h, cond)
    assert rel_err(h, x.detach()) <= 1e-12
    y = blocks[0](x, cond)
    y.mul_(2)  # an in-place change of an output the block needs
    with pytest.raises(RuntimeError, match="modified in-place"):
        y.sum().backward()


def test_missing_hooks_are_named():
    class OnlyForward(InvertibleModule):
        def _forward(self, x):
            return x

    with pytest.raises(TypeError, match=r"OnlyForward .* does not implement _inverse\(self, y"):
        OnlyForward()

    class Neither(InvertibleModule):
        pass

    with pytest.raises(TypeError, match="_forward.* and _inverse"):
        Neither()


def test_reused_rng_key_is_an_error():
    class TwoDraws(AffineCoupling):
        def _forward(self, x, cond):
            self.replay_random("shift", self.drop, x)
            return super()._forward(x, cond)

    block = TwoDraws().double()
    x = torch.randn(N, C, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError, match="key 'shift' was used twice"):
        block(x, torch.zeros(N, K, dtype=torch.float64))


def test_public_exports():
    import revgnn

    assert rnn.InvertibleModule is InvertibleModule is revgnn.InvertibleModule
    assert issubclass(rnn.GroupAddRev, InvertibleModule)
