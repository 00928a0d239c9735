"""Fused LayerNorm -> ReLU (-> mask): equal to PyTorch's three ops, forward and backward."""

import pytest
import torch
import torch.nn.functional as F
from conftest import require_kernel
from torch import nn
from torch_geometric.nn import GENConv

from revgnn.nn import ops
from revgnn.nn.norm_act import layer_norm_relu, sequential_forward
from revgnn.utils import SavedTensorBytes


@pytest.fixture(autouse=True)
def kernel():
    require_kernel("layer_norm_relu")


def _norm(c, dtype, seed=0):
    torch.manual_seed(seed)
    norm = nn.LayerNorm(c).to(dtype)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    return norm


def _reference(x, norm, mask):
    h = F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps).relu()
    return h * mask if mask is not None else h


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("strided", [True, False])
@pytest.mark.parametrize("c", [40, 13, 80])
def test_matches_layer_norm_relu_mask(dtype, tol, masked, strided, c):
    """Values and gradients (input, weight, bias) equal PyTorch's; strided rows (a channel group of
    a wider tensor, as GroupAddRev passes) and widths that are not a multiple of the vector width."""
    n = 700
    norm = _norm(c, dtype)
    wide = torch.randn(n, 2 * c + 1, dtype=dtype) * 3 + 1
    x = (wide[:, c : 2 * c] if strided else wide[:, :c].contiguous()).requires_grad_()
    mask = None
    if masked:
        m = (torch.rand(n, 2 * c, dtype=dtype) > 0.3).to(dtype) / 0.7
        mask = m[:, :c] if strided else m[:, :c].contiguous()
    g = torch.randn(n, c, dtype=dtype)
    ours = layer_norm_relu(x, norm, mask)
    ref = _reference(x, norm, mask)
    assert ours.grad_fn is not None and "layer_norm_relu" in type(ours.grad_fn).__name__
    torch.testing.assert_close(ours, ref, rtol=tol, atol=tol)
    a = torch.autograd.grad(ours, [x, norm.weight, norm.bias], g)
    b = torch.autograd.grad(ref, [x, norm.weight, norm.bias], g)
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v, rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kernels", ["1", "0"])
def test_bool_mask_with_scale_equals_float_mask(dtype, kernels, monkeypatch):
    """A compact (bool) dropout mask with its scale gives the float mask's values and gradients
    bit for bit, on strided rows, through the C++ kernel and the PyTorch implementation."""
    from revgnn.nn import SharedDropout

    monkeypatch.setenv("REVGNN_KERNELS", kernels)
    n, c = 300, 24
    norm = _norm(c, dtype)
    dropout = SharedDropout(0.3)
    wide = torch.randn(n, 2 * c, dtype=dtype)
    torch.manual_seed(3)
    values = dropout(wide)
    torch.manual_seed(3)
    keep = dropout(wide, compact=True)
    assert keep.dtype == torch.bool and torch.equal(keep, values != 0)
    scale = dropout.scale(dtype)
    g = torch.randn(n, c, dtype=dtype)
    x = wide[:, c:].requires_grad_()
    results = []
    for mask, s in ((values[:, c:], 1.0), (keep[:, c:], scale)):
        out = layer_norm_relu(x, norm, mask, s)
        results.append((out, *torch.autograd.grad(out, [x, norm.weight, norm.bias], g)))
    for u, v in zip(*results):
        assert torch.equal(u, v)


def test_gradcheck():
    norm = _norm(11, torch.float64)
    x = torch.randn(30, 11, dtype=torch.float64, requires_grad=True)
    mask = (torch.rand(30, 11, dtype=torch.float64) > 0.5).double() * 2
    assert torch.autograd.gradcheck(
        lambda x, w, b: ops.layer_norm_relu(x, w, b, 1e-5, mask, 1.0)[0], (x, norm.weight, norm.bias)
    )


def test_thread_count_does_not_change_results():
    norm = _norm(40, torch.float32)
    x = torch.randn(5000, 40, requires_grad=True)
    g = torch.randn(5000, 40)
    threads = torch.get_num_threads()
    results = []
    try:
        for t in (1, 2, 4):
            torch.set_num_threads(t)
            out = layer_norm_relu(x, norm)
            results.append((out, *torch.autograd.grad(out, [x, norm.weight, norm.bias], g)))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        for u, v in zip(results[0], other):
            assert torch.equal(u, v)


def test_nan_propagates_like_torch():
    """A NaN input row, and a NaN bias entry (NaN pre-activation in every row), give NaN where
    torch does, forward and backward (ReLU's backward passes NaN pre-activations' gradient)."""
    norm = _norm(8, torch.float64)
    x = torch.randn(4, 8, dtype=torch.float64)
    x[1, 3] = float("nan")
    ours, ref = layer_norm_relu(x, norm), _reference(x, norm, None)
    assert torch.equal(ours.isnan(), ref.isnan()) and ours[1].isnan().all()
    torch.testing.assert_close(ours[~ours.isnan()], ref[~ref.isnan()], rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        norm.bias[2] = float("nan")
    x = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    g = torch.randn(6, 8, dtype=torch.float64)
    a = torch.autograd.grad(layer_norm_relu(x, norm), [x, norm.weight, norm.bias], g)
    b = torch.autograd.grad(_reference(x, norm, None), [x, norm.weight, norm.bias], g)
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-12, equal_nan=True)
    assert not a[2][2].isnan() and a[2][2] != 0


def test_mask_with_grad_double_backward_subclass_and_hooks_are_not_silently_wrong():
    """What the kernel does not do falls back to PyTorch's ops (a mask that needs a gradient, a
    LayerNorm subclass, forward hooks); a double backward through the kernel raises."""
    norm = _norm(8, torch.float64)
    x = torch.randn(20, 8, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(20, 8, dtype=torch.float64, requires_grad=True)
    (gm,) = torch.autograd.grad(layer_norm_relu(x, norm, mask).sum(), [mask])
    (gm_ref,) = torch.autograd.grad(_reference(x, norm, mask).sum(), [mask])
    torch.testing.assert_close(gm, gm_ref, rtol=1e-12, atol=1e-12)
    (gx,) = torch.autograd.grad(layer_norm_relu(x, norm).pow(2).sum(), [x], create_graph=True)
    with pytest.raises(RuntimeError, match="no autograd formula was registered"):
        gx.sum().backward()

    class Shifted(nn.LayerNorm):
        def forward(self, h):
            return super().forward(h) + 1.0

    seq = nn.Sequential(Shifted(8), nn.ReLU()).double()
    torch.testing.assert_close(sequential_forward(seq, x), seq(x), rtol=0, atol=0)
    seq = nn.Sequential(nn.LayerNorm(8), nn.ReLU()).double()
    calls = []
    seq[0].register_forward_hook(lambda *args: calls.append(1))
    torch.testing.assert_close(sequential_forward(seq, x), seq(x), rtol=1e-12, atol=1e-12)
    assert len(calls) == 2


def test_falls_back_where_the_kernel_does_not_apply(monkeypatch):
    """Autocast takes the module's own ops; bf16 input and no kernel the operator's PyTorch
    implementation: the same function."""
    norm = _norm(16, torch.float32)
    x = torch.randn(50, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer_norm_relu(x, norm)
        assert out.grad_fn is None or "layer_norm_relu" not in type(out.grad_fn).__name__
        torch.testing.assert_close(out, _reference(x, norm, None))
    xb = x.bfloat16().requires_grad_()
    normb = _norm(16, torch.bfloat16)
    assert not ops.uses_kernel("layer_norm_relu", xb, normb.weight, normb.bias)
    torch.testing.assert_close(layer_norm_relu(xb, normb), _reference(xb, normb, None), rtol=0, atol=0)
    monkeypatch.setenv("REVGNN_KERNELS", "0")
    torch.testing.assert_close(layer_norm_relu(x, norm), _reference(x, norm, None), rtol=0, atol=0)


def test_sequential_forward_is_genconv_mlp():
    """GENConv's MLP (Linear, LayerNorm, ReLU, Dropout(0), Linear) through the fused path equals
    calling it; a dropout with p > 0 is kept."""
    torch.manual_seed(0)
    conv = GENConv(12, 12, num_layers=2, norm="layer").double()
    x = torch.randn(60, 12, dtype=torch.float64, requires_grad=True)
    ours, ref = sequential_forward(conv.mlp, x), conv.mlp(x)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    ga = torch.autograd.grad(ours.sin().sum(), [x, *conv.mlp.parameters()])
    gb = torch.autograd.grad(ref.sin().sum(), [x, *conv.mlp.parameters()])
    for u, v in zip(ga, gb):
        torch.testing.assert_close(u, v, rtol=1e-11, atol=1e-12)
    seq = nn.Sequential(nn.LayerNorm(12), nn.ReLU(), nn.Dropout(0.5)).double()
    torch.manual_seed(1)
    a = sequential_forward(seq, x)
    torch.manual_seed(1)
    torch.testing.assert_close(a, seq(x), rtol=1e-12, atol=1e-12)
    assert (a == 0).float().mean() > 0.5  # ReLU zeros plus dropped entries


def test_saves_less_for_backward_than_three_ops():
    """Deterministic memory claim: the fused op keeps the row statistics besides its inputs; the
    three ops also keep the normalised values and the ReLU output ([N, C] each)."""
    norm = _norm(40, torch.float32)
    x = torch.randn(2000, 40, requires_grad=True)
    mask = torch.ones(2000, 40) * 2
    with SavedTensorBytes() as fused:
        layer_norm_relu(x, norm, mask)
    with SavedTensorBytes() as plain:
        _reference(x, norm, mask)
    row = 2000 * 4
    assert fused.bytes == x.numel() * 4 + mask.numel() * 4 + 2 * row
    assert plain.bytes - fused.bytes >= x.numel() * 4


def _grads_through_scale(x, norm, mask, weight, scratch=True, monkeypatch=None):
    """``x``'s and the norm's gradients of ``sum(layer_norm_relu(x) * weight)``: the fused op's
    output gradient is the product's, a fresh tensor only autograd holds."""
    if not scratch:
        monkeypatch.setattr(ops, "_is_scratch", lambda *a: False)
    out = layer_norm_relu(x, norm, mask)
    grads = torch.autograd.grad((out * weight).sum(), [x, norm.weight, norm.bias])
    if not scratch:
        monkeypatch.undo()
    return out, grads


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kernels", ["1", "0"])
@pytest.mark.parametrize("masked", [True, False])
def test_backward_into_the_output_gradient_is_bitwise_the_same(dtype, kernels, masked, monkeypatch):
    """The gradient for ``x`` written over a scratch output gradient equals the one written to a
    new tensor, bit for bit, through the C++ kernel and PyTorch; and the in-place operator ran."""
    monkeypatch.setenv("REVGNN_KERNELS", kernels)
    norm = _norm(24, dtype)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 24, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.randn(300, 24, generator=g, dtype=dtype)
    mask = (torch.rand(300, 24, generator=g) > 0.3).to(dtype) * 2 if masked else None
    calls = []
    inplace = ops._layer_norm_relu_grads

    def counted(*args):
        calls.append(args[-1])
        return inplace(*args)

    monkeypatch.setattr(ops, "_layer_norm_relu_grads", counted)
    out, grads = _grads_through_scale(x, norm, mask, weight)
    assert calls == [True]
    out2, plain = _grads_through_scale(x, norm, mask, weight, scratch=False, monkeypatch=monkeypatch)
    assert calls == [True, False]
    assert torch.equal(out, out2)
    for a, b in zip(grads, plain):
        assert a.dtype == dtype and torch.equal(a, b)


def test_backward_writes_no_second_node_state():
    """Deterministic memory claim (profiler allocation events): the backward of
    ``sum(layer_norm_relu(x) * w)`` allocates the product's gradient ``[N, C]`` and, with the input
    gradient written over it, no second ``[N, C]`` tensor."""
    from revgnn.utils.memory import LargestAllocation

    n, c = 4096, 64
    norm = _norm(c, torch.float32)
    x = torch.randn(n, c, requires_grad=True)
    weight = torch.randn(n, c)
    state = n * c * 4
    peaks = []
    for scratch in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            if not scratch:
                mp.setattr(ops, "_is_scratch", lambda *a: False)
            loss = (layer_norm_relu(x, norm) * weight).sum()
            with LargestAllocation() as alloc:
                torch.autograd.grad(loss, [x, norm.weight, norm.bias])
            peaks.append(alloc.peak)
    assert peaks[0] < 1.5 * state <= 2 * state <= peaks[1]


def test_backward_leaves_gradients_that_callers_hold_alone():
    """A hook that keeps the output gradient, ``retain_grad``, ``autograd.grad``'s ``grad_outputs``
    and a gradient ``autograd.grad`` returns are never overwritten: the gradients equal the
    unfused three ops', and the held tensors keep their values."""
    norm = _norm(16, torch.float64)
    g = torch.Generator().manual_seed(2)
    x0 = torch.randn(50, 16, generator=g, dtype=torch.float64)
    weight = torch.randn(50, 16, generator=g, dtype=torch.float64)

    def reference(x):
        return torch.autograd.grad((_reference(x, norm, None) * weight).sum(), x)[0]

    expect = reference(x0.clone().requires_grad_())

    x = x0.clone().requires_grad_()
    out = layer_norm_relu(x, norm)
    kept = []
    out.register_hook(lambda gr: kept.append(gr))
    (out * weight).sum().backward()
    assert torch.equal(kept[0], weight) and torch.allclose(x.grad, expect, rtol=1e-12, atol=0)

    x = x0.clone().requires_grad_()
    out = layer_norm_relu(x, norm)
    out.retain_grad()
    (out * weight).sum().backward()
    assert torch.equal(out.grad, weight) and torch.allclose(x.grad, expect, rtol=1e-12, atol=0)

    x = x0.clone().requires_grad_()
    given = weight.clone()
    (gx,) = torch.autograd.grad(layer_norm_relu(x, norm), x, grad_outputs=given)
    assert torch.equal(given, weight) and torch.allclose(gx, expect, rtol=1e-12, atol=0)

    x = x0.clone().requires_grad_()
    out = layer_norm_relu(x, norm)
    g_out, gx = torch.autograd.grad((out * weight).sum(), [out, x])
    assert torch.equal(g_out, weight) and torch.allclose(gx, expect, rtol=1e-12, atol=0)


def _mlp(dtype, pyg):
    torch.manual_seed(0)
    if pyg:
        seq = GENConv(24, 24, aggr="max", num_layers=2, norm="layer", bias=True).mlp
    else:
        seq = nn.Sequential(
            nn.Linear(24, 48), nn.LayerNorm(48), nn.ReLU(), nn.Dropout(0.0), nn.Linear(48, 24)
        )
    seq = seq.to(dtype)
    with torch.no_grad():
        seq[1].weight.normal_()
        seq[1].bias.normal_()
    return seq


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kernels", ["1", "0"])
@pytest.mark.parametrize("pyg", [True, False])
def test_norm_relu_linear_is_bitwise_the_two_operators(dtype, kernels, pyg, monkeypatch):
    """GENConv's MLP through :func:`sequential_forward` (LayerNorm-ReLU and the next linear layer
    as one autograd function) equals ``layer_norm_relu`` then the linear layer, outputs and every
    gradient bit for bit, for a strided output gradient too."""
    monkeypatch.setenv("REVGNN_KERNELS", kernels)
    seq = _mlp(dtype, pyg)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(700, 24, generator=g, dtype=dtype, requires_grad=True)
    wide = torch.randn(700, 30, generator=g, dtype=dtype)
    params = [x, *seq.parameters()]
    for upstream in (wide[:, :24], wide[:, :24].contiguous()):
        out = sequential_forward(seq, x)
        assert type(out.grad_fn).__name__ == "_NormReluLinearBackward"
        grads = torch.autograd.grad(out, params, upstream)
        ref = seq[4](layer_norm_relu(seq[0](x), seq[1]))
        expect = torch.autograd.grad(ref, params, upstream)
        assert torch.equal(out, ref)
        for a, b in zip(grads, expect):
            assert torch.equal(a, b)
    frozen = [p.requires_grad_(False) for p in seq[4].parameters()]  # only some gradients asked for
    out = sequential_forward(seq, x)
    ref = seq[4](layer_norm_relu(seq[0](x), seq[1]))
    for a, b in zip(torch.autograd.grad(out, [x], wide[:, :24]), torch.autograd.grad(ref, [x], wide[:, :24])):
        assert torch.equal(a, b)
    assert frozen


def test_norm_relu_linear_keeps_one_hidden_state_less():
    """Deterministic memory claim (profiler allocation events and saved bytes): through
    :func:`sequential_forward` the MLP keeps the hidden ``[N, 2C]`` input of LayerNorm-ReLU but not
    its output, and its backward peaks at two ``[N, 2C]`` tensors alive, not three."""
    from revgnn.utils.memory import LargestAllocation

    seq = _mlp(torch.float32, True)
    n = 4096
    x = torch.randn(n, 24, requires_grad=True)
    upstream = torch.randn(n, 24)
    hidden = n * 48 * 4
    params = [x, *seq.parameters()]

    def plain():
        return seq[4](layer_norm_relu(seq[0](x), seq[1]))

    peaks, saved = [], []
    for fn in (lambda: sequential_forward(seq, x), plain):
        with LargestAllocation() as alloc:
            with SavedTensorBytes() as kept:
                out = fn()  # [N, C]: half a hidden state
            torch.autograd.grad(out, params, upstream)
            del out
        saved.append(kept.bytes)
        peaks.append(alloc.peak)
    assert saved[1] - saved[0] == hidden
    # the output and two hidden states (plus row statistics) against the output and three
    assert peaks[0] < 3 * hidden and peaks[1] >= 3.5 * hidden
