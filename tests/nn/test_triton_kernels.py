"""The Triton kernels (revgnn.nn.triton_kernels) against the C++ kernels and float64 PyTorch.

Run on CPU tensors through Triton's interpreter, which needs ``TRITON_INTERPRET=1`` before
Triton is *first imported* in the process: Triton decides between interpreter and compiler when
a function is decorated with ``@triton.jit``, and its own library (``tl.sum``, ``tl.max``, ...)
is decorated on import. So this module sets the variable itself when Triton is not imported yet
(the file run alone: conftest imports only torch). In a whole test run another module has
imported PyG, which imports Triton, by the time this one is collected; then the tests here run
once, in a fresh ``pytest`` process with the variable set (one test in this process,
:func:`test_in_a_fresh_interpreter_process`): a few seconds of start-up rather than a subprocess
per test. Skipped where Triton is not installed. Graphs are tiny: the interpreter runs each
program in Python.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

if os.environ.get("TRITON_INTERPRET") != "1" and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"  # before Triton's first import (see the docstring)
#: Triton was imported in this process without the interpreter: run this file in a fresh one
OUTER = os.environ.get("TRITON_INTERPRET") != "1"

pytest.importorskip("triton")

from conftest import REPO, run_cli  # noqa: E402

from revgnn.nn import kernels  # noqa: E402
from revgnn.nn import triton_kernels as tk  # noqa: E402
from revgnn.nn.gen_max import gen_max_reference  # noqa: E402


@pytest.fixture(autouse=True)
def _interpreted_only(request):
    if OUTER and request.function is not test_in_a_fresh_interpreter_process:
        pytest.skip(
            "Triton was imported without TRITON_INTERPRET=1: run by test_in_a_fresh_interpreter_process"
        )


def test_in_a_fresh_interpreter_process():
    if not OUTER:
        assert tk.INTERPRETED
        return
    pytest_here = ["-m", "pytest", "-q", "-p", "no:cacheprovider", __file__]
    run_cli(*pytest_here, env={"TRITON_INTERPRET": "1"}, cwd=REPO, timeout=600)


EPS = 1e-7


def cpp(name):
    if not kernels.enabled():
        pytest.skip("REVGNN_KERNELS=0")
    module = kernels.load(name)
    if module is None:
        pytest.skip("the C++ kernels are not built here")
    return module


def graph(n=20, e=100, seed=0, isolated=3, dup=6, rows=None):
    """Destination-sorted edges: the last ``isolated`` nodes get no in-edges, ``dup`` parallel
    edges; sources from ``rows`` rows (default n). Returns ptr, src, dst."""
    g = torch.Generator().manual_seed(seed)
    rows = n if rows is None else rows
    src = torch.randint(0, rows, (e,), generator=g)
    dst = torch.randint(0, max(1, n - isolated), (e,), generator=g)
    src, dst = torch.cat([src, src[:dup]]), torch.cat([dst, dst[:dup]])
    dst, perm = torch.sort(dst, stable=True)
    src = src[perm].contiguous()
    ptr = torch.zeros(n + 1, dtype=torch.long)
    ptr[1:] = torch.cumsum(torch.bincount(dst, minlength=n), 0)
    return ptr, src, dst


def ints(*shape, lo=-3, hi=4, seed=1, dtype=torch.float32):
    """Small integers: every sum is exact in float32 and most maxima tie."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def edge_term(mode, e, c, d=4, dtype=torch.float32, seed=2):
    """(attr, wt, bias) for mode none / dense / factored / factored_nobias, integer-valued."""
    if mode == "none":
        return None, None, None
    if mode == "dense":
        return ints(e, c, lo=-2, hi=3, seed=seed, dtype=dtype), None, None
    raw = ints(e, d, lo=-2, hi=3, seed=seed, dtype=dtype)
    wt = ints(d, c, lo=-1, hi=2, seed=seed + 1, dtype=dtype)
    bias = ints(c, lo=-1, hi=2, seed=seed + 2, dtype=dtype) if mode == "factored" else None
    return raw, wt, bias


def reference(x, ptr, src, dst, attr, wt, bias, grad):
    """float64 PyTorch (revgnn.nn.gen_max.gen_max_reference): out and the gradients of x, attr, W^T, bias."""
    x64 = x.double().requires_grad_()
    leaves = [x64]
    term = None
    if attr is not None:
        a64 = attr.double().requires_grad_()
        leaves.append(a64)
        term = a64
        if wt is not None:
            w64 = wt.double().requires_grad_()
            leaves.append(w64)
            term = a64 @ w64
            if bias is not None:
                b64 = bias.double().requires_grad_()
                leaves.append(b64)
                term = term + b64
    out = gen_max_reference(x64, src, dst, ptr, term, EPS)
    grads = torch.autograd.grad(out, leaves, grad.double())
    return out.detach(), list(grads) + [None] * (4 - len(grads))


def close(a, b, tol):
    torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol, equal_nan=True)


def bitwise(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


CASES = [("none", 5), ("dense", 13), ("factored", 40), ("factored_nobias", 13)]  # factored at 5: the NaN test


@pytest.mark.parametrize("mode,c", CASES)
def test_gen_max_matches_cpp_and_float64(mode, c):
    K = cpp("gen_max")
    n = 20
    ptr, src, dst = graph(n)
    x = ints(n, c)
    attr, wt, bias = edge_term(mode, src.numel(), c)
    out, arg, tied = tk.gen_max_forward(x, ptr, src, attr, wt, bias, EPS)
    ref = K.forward(x, ptr, src, attr, wt, bias, EPS)
    for a, b in zip((out, arg, tied), ref):  # integer messages: exact, so bitwise
        bitwise(a, b)
    assert tied.sum() > 0 and (arg == -1).any()
    grad = torch.randn(n, c, generator=torch.Generator().manual_seed(3))
    mine = tk.gen_max_backward(grad, arg, tied, x, ptr, src, attr, wt, bias, True, True, True, True)
    theirs = K.backward(grad, ref[1], ref[2], x, ptr, src, attr, wt, bias, True, True, True, True)
    out64, grads64 = reference(x, ptr, src, dst, attr, wt, bias, grad)
    close(out, out64, 1e-6)
    for name, a, b, g64 in zip(("x", "attr", "w", "b"), mine, theirs, grads64):
        assert (a is None) == (b is None), name  # undefined exactly where the C++ kernel's are
        if a is None:
            continue
        if name == "w":
            g64 = g64.t()  # the reference differentiates W^T [d, C]; both kernels return [C, d]
        assert a.shape == b.shape and a.dtype == b.dtype, name
        close(a, g64, 1e-5)
        close(a, b, 1e-5)
        if mode == "dense" and name == "attr":
            bitwise(a, b)  # one term per (edge, channel): g, or g / n on a tied node
    # determinism: repeated runs are bitwise equal
    again = tk.gen_max_backward(grad, arg, tied, x, ptr, src, attr, wt, bias, True, True, True, True)
    for a, b in zip(mine, again):
        if a is not None:
            bitwise(a, b)


@pytest.mark.parametrize("reduce", ["sum", "mean", "softmax"])
@pytest.mark.parametrize("mode,c", CASES)
def test_gen_aggr_matches_cpp_and_pytorch_float64(mode, c, reduce):
    """GEN sum / mean / softmax (issue #33 b) in float64: the Triton kernels equal the C++ kernel
    and the operator's PyTorch implementation within 1e-12 of each tensor's scale (only summation
    orders differ), the temperature's gradient included; repeated runs are bitwise equal."""
    from conftest import rel_err

    from revgnn.nn import ops

    K = cpp("gen_aggr")
    n = 20
    ptr, src, dst = graph(n)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(n, c, generator=g, dtype=torch.float64)
    attr, wt, bias = edge_term(mode, src.numel(), c, dtype=torch.float64)
    if attr is not None:  # not integer-valued: the softmax's weights are then generic
        attr = attr + torch.rand(attr.shape, generator=g, dtype=torch.float64)
    t = torch.tensor([-0.7], dtype=torch.float64) if reduce == "softmax" else None
    sperm = torch.sort(src, stable=True)[1]
    sptr = torch.searchsorted(src[sperm], torch.arange(n + 1))
    sdst = dst[sperm]
    mine = tk.gen_aggr_forward(x, ptr, src, attr, wt, bias, t, EPS, reduce)
    theirs = K.forward(x, ptr, src, attr, wt, bias, t, EPS, reduce)
    w = wt.t().contiguous() if wt is not None else None
    torch_ = ops._gen_aggr_torch(x, ptr, src, dst, attr, w, bias, t, EPS, reduce)
    for a, b, r in zip(mine, theirs, torch_):
        assert a.shape == b.shape == r.shape
        for other in (b, r):  # the softmax's maximum is -inf at nodes without in-edges
            assert torch.equal(a.isinf(), other.isinf())
            assert rel_err(a.nan_to_num(neginf=0.0), other.nan_to_num(neginf=0.0)) <= 1e-12
    grad = torch.randn(n, c, generator=g, dtype=torch.float64)
    args = (
        grad,
        *mine,
        x,
        ptr,
        src,
        sptr,
        sdst,
        sperm,
        attr,
        wt,
        bias,
        t,
        EPS,
        reduce,
        True,
        True,
        True,
        True,
        True,
    )
    grads = tk.gen_aggr_backward(*args)
    cgrads = K.backward(grad, *theirs, x, ptr, src, sptr, sdst, sperm, attr, wt, bias, t, EPS, reduce,
                        True, True, True, True, True)  # fmt: skip
    tgrads = ops._gen_aggr_backward_torch(grad, *torch_, x, ptr, src, dst, attr, w, bias, t, EPS, reduce,
                                          True, True, True, True, True)  # fmt: skip
    for name, a, b, r in zip(("x", "attr", "w", "b", "t"), grads, cgrads, tgrads):
        assert (a is None) == (b is None) == (r is None), name
        if a is not None:
            assert rel_err(a, b) <= 1e-12 and rel_err(a, r) <= 1e-12, name
    for a, b in zip(grads, tk.gen_aggr_backward(*args)):
        if a is not None:
            bitwise(a, b)


def test_gen_max_factored_float_tolerance():
    """Random (non-integer) factored terms: the edge term is rounded differently from the C++
    kernel (FMA, order), so out is compared with float64 within float32 rounding of the term and
    the winner must reach the float64 maximum within that bound."""
    n, c, d = 30, 13, 8
    ptr, src, dst = graph(n, isolated=2)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, c, generator=g)
    raw, wt, bias = (
        torch.randn(src.numel(), d, generator=g),
        torch.randn(d, c, generator=g),
        torch.randn(c, generator=g),
    )
    out, arg, tied = tk.gen_max_forward(x, ptr, src, raw, wt, bias, EPS)
    msg = x.double()[src] + raw.double() @ wt.double() + bias.double()
    # |fl(t) - t| <= (d + 1) u sum |terms| (u = 2^-24), plus the rounding of x + t
    bound = (
        (d + 2)
        * 2.0**-24
        * (x.double().abs()[src] + raw.double().abs() @ wt.double().abs() + bias.double().abs())
    )
    out64 = torch.full((n, c), float("-inf"), dtype=torch.float64).scatter_reduce(
        0, dst.view(-1, 1).expand_as(msg), msg, "amax", include_self=True
    )
    has = (ptr.diff() > 0).view(-1, 1)
    expect = torch.where(has, out64.clamp_min(0) + EPS, torch.zeros_like(out64))
    tol = torch.zeros(n, c, dtype=torch.float64).scatter_reduce(
        0, dst.view(-1, 1).expand_as(bound), bound, "amax", include_self=True
    )
    assert ((out.double() - expect).abs() <= tol + 2.0**-24 * expect.abs()).all()
    won = arg >= 0
    e = (ptr[:-1].view(-1, 1) + arg.long()).clamp_min(0)[won]
    chan = torch.arange(c).expand(n, c)[won]
    assert ((msg[e, chan] - out64[won]).abs() <= 2 * tol[won]).all()
    assert (~won | (out64 > 0)).all() and (won | (out64 <= tol)).all()
    # no ties here: backward takes the winners-only path for W and b
    assert not tied.any()
    grad = torch.randn(n, c, generator=g)
    mine = tk.gen_max_backward(grad, arg, tied, x, ptr, src, raw, wt, bias, True, True, True, True)
    _, grads64 = reference(x, ptr, src, dst, raw, wt, bias, grad)
    grads64[2] = grads64[2].t()
    for a, b in zip(mine, grads64):
        close(a, b, 1e-5)


def test_gen_max_nan_as_cpp():
    K = cpp("gen_max")
    n, c = 20, 5
    ptr, src, _ = graph(n)
    x = ints(n, c)
    x[2, 1] = float("nan")
    x[7, :] = float("nan")
    attr, wt, bias = edge_term("factored", src.numel(), c)
    mine = tk.gen_max_forward(x, ptr, src, attr, wt, bias, EPS)
    ref = K.forward(x, ptr, src, attr, wt, bias, EPS)
    assert mine[0].isnan().any()
    for a, b in zip(mine, ref):
        bitwise(a, b)
    grad = torch.randn(n, c, generator=torch.Generator().manual_seed(3))
    a = tk.gen_max_backward(grad, mine[1], mine[2], x, ptr, src, attr, wt, bias, True, True, True, True)
    b = K.backward(grad, ref[1], ref[2], x, ptr, src, attr, wt, bias, True, True, True, True)
    for u, v in zip(a, b):
        close(u, v, 1e-5)


@pytest.mark.parametrize("rows", [29, 9])
def test_shard_matches_cpp(rows):
    """SAR shards: sources from a fetched block of any row count, no eps, tie counts."""
    K = cpp("gen_max")
    n, c = 16, 13
    ptr, src, _ = graph(n, rows=rows)
    x = ints(rows, c)
    attr, wt, bias = edge_term("factored", src.numel(), c)
    mine = tk.gen_max_shard_forward(x, ptr, src, attr, wt, bias)
    ref = K.shard_forward(x, ptr, src, attr, wt, bias)
    for a, b in zip(mine, ref):
        bitwise(a, b)
    assert (mine[3] > 1).any()
    grad = torch.randn(n, c, generator=torch.Generator().manual_seed(4))
    a = tk.gen_max_shard_backward(grad, mine[1], mine[2], x, ptr, src, attr, wt, bias, True, True, True, True)
    b = K.shard_backward(grad, ref[1], ref[2], x, ptr, src, attr, wt, bias, True, True, True, True)
    assert a[0].shape == (rows, c)
    for u, v in zip(a, b):
        close(u, v, 1e-5)


def test_gen_max_need_flags_and_empty_graphs():
    K = cpp("gen_max")
    n, c = 12, 5
    ptr, src, _ = graph(n, e=30)
    x = ints(n, c)
    attr, wt, bias = edge_term("factored", src.numel(), c)
    out, arg, tied = tk.gen_max_forward(x, ptr, src, attr, wt, bias, EPS)
    grad = torch.ones(n, c)
    for flags in [(False, True, False, True), (True, False, True, False), (False, False, False, False)]:
        a = tk.gen_max_backward(grad, arg, tied, x, ptr, src, attr, wt, bias, *flags)
        b = K.backward(grad, arg, tied, x, ptr, src, attr, wt, bias, *flags)
        for u, v in zip(a, b):
            assert (u is None) == (v is None)
            if u is not None:
                close(u, v, 1e-6)
    # no edges at all
    ptr0, src0 = torch.zeros(n + 1, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    raw0 = torch.zeros(0, 4)
    mine = tk.gen_max_forward(x, ptr0, src0, raw0, wt, bias, EPS)
    ref = K.forward(x, ptr0, src0, raw0, wt, bias, EPS)
    for u, v in zip(mine, ref):
        bitwise(u, v)
    a = tk.gen_max_backward(grad, mine[1], mine[2], x, ptr0, src0, raw0, wt, bias, True, True, True, True)
    b = K.backward(grad, ref[1], ref[2], x, ptr0, src0, raw0, wt, bias, True, True, True, True)
    for u, v in zip(a, b):
        bitwise(u, v)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_gen_max_dtypes(dtype):
    """float64 against the C++ kernel in float64; bf16 (accumulated in float32) against the C++
    kernel in float32 on the same (bf16-exact) values: out is its float32 result rounded."""
    K = cpp("gen_max")
    n, c = 20, 13
    ptr, src, _ = graph(n)
    x = ints(n, c, dtype=dtype)
    attr, wt, bias = edge_term("factored", src.numel(), c, dtype=dtype)
    base = torch.float64 if dtype == torch.float64 else torch.float32
    cast = lambda t: t.to(base) if t is not None else None
    mine = tk.gen_max_forward(x, ptr, src, attr, wt, bias, EPS)
    ref = K.forward(cast(x), ptr, src, cast(attr), cast(wt), cast(bias), EPS)
    bitwise(mine[0], ref[0].to(dtype))
    bitwise(mine[1], ref[1])
    bitwise(mine[2], ref[2])
    grad = torch.randn(n, c, generator=torch.Generator().manual_seed(3)).to(dtype)
    a = tk.gen_max_backward(grad, mine[1], mine[2], x, ptr, src, attr, wt, bias, True, True, True, True)
    b = K.backward(
        cast(grad),
        ref[1],
        ref[2],
        cast(x),
        ptr,
        src,
        cast(attr),
        cast(wt),
        cast(bias),
        True,
        True,
        True,
        True,
    )
    tol = 1e-12 if dtype == torch.float64 else 2e-2
    for u, v in zip(a, b):
        assert u.dtype == dtype
        close(u, v, tol)


class _Sizes(TorchDispatchMode):
    """Records the size in bytes of every tensor an op returns (under the interpreter this also
    sees Triton's own byte copies of the kernel arguments)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


def test_no_edge_by_channel_tensor():
    """Forward and backward with factored edge features allocate nothing of E x C elements:
    the largest tensor is x or grad_x (N x C), the raw features or their gradient (E x d) or an
    int64 edge index (E); E x C is 12 times the largest of these here."""
    n, c, d = 20, 48, 4
    ptr, src, _ = graph(n, e=400, isolated=2)
    x = ints(n, c)
    attr, wt, bias = edge_term("factored", src.numel(), c, d=d)
    E = src.numel()
    allowed = max(n * c * 4, E * d * 4, E * 8)
    assert E * c * 4 >= 12 * allowed
    with _Sizes() as fwd:
        out, arg, tied = tk.gen_max_forward(x, ptr, src, attr, wt, bias, EPS)
    grad = torch.ones(n, c)
    tk._ORDER_CACHE.clear()  # the source-sorted permutation is built inside the call
    with _Sizes() as bwd:
        tk.gen_max_backward(grad, arg, tied, x, ptr, src, attr, wt, bias, True, True, True, True)
    assert tied.any()
    assert fwd.largest <= allowed
    assert bwd.largest <= allowed
    with _Sizes() as shard:
        m, arg, tied, count = tk.gen_max_shard_forward(x, ptr, src, attr, wt, bias)
        tk.gen_max_shard_backward(grad, arg, tied, x, ptr, src, attr, wt, bias, True, True, True, True)
    assert shard.largest <= allowed


def ln_reference(x, w, b, eps, mask, grad):
    x64, w64, b64 = (t.double().requires_grad_() for t in (x, w, b))
    h = torch.nn.functional.layer_norm(x64, (x.size(1),), w64, b64, eps).relu()
    if mask is not None:
        h = h * mask.double()
    return h.detach(), torch.autograd.grad(h, (x64, w64, b64), grad.double())


@pytest.mark.parametrize("c", [5, 13, 40])
@pytest.mark.parametrize("bool_mask", [False, True])
def test_layer_norm_relu_matches_cpp_and_float64(c, bool_mask):
    """A float mask, or a bool one with its scale (its values: 1.25 where true)."""
    L = cpp("layer_norm_relu")
    n = 300  # two blocks of 256 rows in the weight gradient
    g = torch.Generator().manual_seed(c)
    wide = torch.randn(n, c + 7, generator=g)
    x = wide[:, 3 : 3 + c]  # strided rows: a channel slice of a wider tensor
    w, b = torch.randn(c, generator=g), torch.randn(c, generator=g)
    keep = (torch.rand(n, c + 2, generator=g) > 0.3)[:, :c] if c != 13 else None
    values = keep.float() * 1.25 if keep is not None else None
    mask, scale = (keep, 1.25) if bool_mask else (values, 1.0)
    grad = torch.randn(n, c, generator=g)
    out, mean, rstd = tk.layer_norm_relu_forward(x, w, b, 1e-5, mask, scale)
    ref = L.forward(x, w, b, 1e-5, mask, scale)
    for u, v in zip((out, mean, rstd), ref):
        close(u, v, 1e-5)
    h64, grads64 = ln_reference(x, w, b, 1e-5, values, grad)
    close(out, h64, 1e-5)
    mine = tk.layer_norm_relu_backward(grad, x, w, b, mean, rstd, mask, scale, True, True, True, False)
    theirs = L.backward(grad, x, w, b, ref[1], ref[2], mask, scale, True, True, True, False)
    for u, v, r in zip(mine, theirs, grads64):
        close(u, r, 1e-4)
        close(u, v, 1e-4)
    again = tk.layer_norm_relu_backward(grad, x, w, b, mean, rstd, mask, scale, True, True, True, False)
    for u, v in zip(mine, again):
        bitwise(u, v)
    for impl, ref_stats in ((tk.layer_norm_relu_backward, (mean, rstd)), (L.backward, ref[1:])):
        into = grad.clone()  # into_grad: grad_x written over the output gradient, equal bitwise
        inplace = impl(into, x, w, b, *ref_stats, mask, scale, True, True, True, True)
        assert inplace[0].data_ptr() == into.data_ptr()
        for u, v in zip(inplace, mine if impl is not L.backward else theirs):
            bitwise(u, v)
    for flags in [(True, False, False), (False, True, False), (False, False, True)]:
        some = tk.layer_norm_relu_backward(grad, x, w, b, mean, rstd, mask, scale, *flags, False)
        cpp_some = L.backward(grad, x, w, b, ref[1], ref[2], mask, scale, *flags, False)
        for u, v, full in zip(some, cpp_some, mine):
            assert (u is None) == (v is None)
            if u is not None:
                bitwise(u, full)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_layer_norm_relu_dtypes(dtype):
    n, c = 40, 13
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, c, generator=g).to(dtype)
    w, b = torch.randn(c, generator=g).to(dtype), torch.randn(c, generator=g).to(dtype)
    mask = (torch.rand(n, c, generator=g) > 0.3).to(dtype)
    grad = torch.randn(n, c, generator=g).to(dtype)
    out, mean, rstd = tk.layer_norm_relu_forward(x, w, b, 1e-5, mask, 1.0)
    h64, grads64 = ln_reference(x, w, b, 1e-5, mask, grad)
    tol = 1e-12 if dtype == torch.float64 else 3e-2
    assert out.dtype == dtype and mean.dtype == (torch.float32 if dtype == torch.bfloat16 else dtype)
    close(out, h64, tol)
    for u, r in zip(
        tk.layer_norm_relu_backward(grad, x, w, b, mean, rstd, mask, 1.0, True, True, True, False), grads64
    ):
        assert u.dtype == dtype
        close(u, r, tol if dtype == torch.float64 else 6e-2)


def test_gpu_check_script_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: scripts/gpu_check_triton.py runs the real check")
    run = run_cli(REPO / "scripts" / "gpu_check_triton.py", unset=["TRITON_INTERPRET"], timeout=120)
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"check": "triton", "skipped": "no CUDA device"}


def test_gpu_check_sh_runs_up_to_its_cuda_check(tmp_path):
    """``scripts/gpu_check.sh`` with this interpreter: every module its parts import loads (its
    preflight), then it stops at the CUDA check, naming it, before any part runs."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the script runs the real check")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "REVGNN_KERNELS")}
    env.update(PYTHON=sys.executable, OUT=str(tmp_path), GPU_SITE=str(tmp_path / "site"))
    run = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "lacks a package" not in run.stderr, run.stderr
    assert run.stderr.strip().endswith("AssertionError: no CUDA device"), run.stderr
    assert not (tmp_path / "gpu_check.jsonl").exists()  # no part ran


def test_reversible_model_through_the_triton_kernels(monkeypatch):
    """The functions are the operators' Triton implementation: a 3-layer reversible GENConv model (2
    groups, factored edge features, a dropout mask) under ``REVGNN_KERNELS=triton`` runs them and gives
    the float64 PyTorch path's loss and gradients (to float32 rounding)."""

    from torch_geometric import EdgeIndex

    from revgnn.nn import GENBlock, GroupAddRev, LinearEdgeFeatures

    calls = {}

    def counted(fn):
        def call(*args):
            calls[fn.__name__] = calls.get(fn.__name__, 0) + 1
            return fn(*args)

        return call

    # the dispatch table looks its Triton functions up in triton_kernels on every call
    for name in (
        "gen_max_forward",
        "gen_max_backward",
        "layer_norm_relu_forward",
        "layer_norm_relu_backward",
    ):
        monkeypatch.setattr(tk, name, counted(getattr(tk, name)))
    n, c, e, d = 16, 8, 64, 3
    ptr, src, dst = graph(n, e=e)
    ei = EdgeIndex(torch.stack([src, dst]), sparse_size=(n, n), sort_order="col")
    g = torch.Generator().manual_seed(0)
    x0, raw0 = torch.randn(n, c, generator=g), torch.randn(src.numel(), d, generator=g)
    mask0 = (torch.rand(n, c // 2, generator=g) > 0.2).float() * 1.25
    torch.manual_seed(0)
    layers0 = torch.nn.ModuleList(
        GroupAddRev(GENBlock(c // 2, edge_channels=16), num_groups=2) for _ in range(3)
    )
    encoder0 = torch.nn.Linear(d, 16)

    def run(dtype, kernels_on):
        monkeypatch.setenv("REVGNN_KERNELS", "triton" if kernels_on else "0")
        layers = [copy.to(dtype) for copy in copy_of(layers0)]
        encoder = copy_of([encoder0])[0].to(dtype)
        x = x0.to(dtype).requires_grad_()
        h = x
        for layer in layers:
            h = layer(h, ei, LinearEdgeFeatures.from_linear(raw0.to(dtype), encoder), mask0.to(dtype))
        loss = h.square().mean()
        params = [p for m in (*layers, encoder) for p in m.parameters()]
        grads = torch.autograd.grad(loss, [x, *params])
        return loss.detach(), grads

    loss, grads = run(torch.float32, True)
    # 3 layers x 2 groups: forward, the reversible recomputation, backward (the MLP's LayerNorm-ReLU
    # once more in it)
    assert calls == {
        "gen_max_forward": 12,
        "gen_max_backward": 6,
        "layer_norm_relu_forward": 30,
        "layer_norm_relu_backward": 12,
    }, calls
    loss64, grads64 = run(torch.float64, False)
    close(loss, loss64, 1e-5)
    for a, b in zip(grads, grads64):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5 * b.abs().max().item())


def copy_of(modules):
    import copy

    return [copy.deepcopy(m) for m in modules]


def test_kernels_compile_for_sm90():
    """The interpreter does not run Triton's compiler, which is stricter: compile the float32
    factored-edge specialisations for sm_90 (no GPU needed; Triton's own LLVM and ptxas), in a
    subprocess because this process has the interpreted kernels. (Every dtype and path, sm_90
    and sm_80: ``python scripts/triton_compile_check.py [--arch 80]``, a few minutes.)"""
    script = REPO / "scripts" / "triton_compile_check.py"
    run = run_cli(script, "--smoke", "--arch", "90", unset=["TRITON_INTERPRET"], timeout=300)
    assert "0 failed" in run.stdout.splitlines()[-1] or run.stdout.startswith("skipped")


class _Recorder(torch.optim.Optimizer):
    """An optimiser whose step records the gradients it is handed (``train_step`` frees them after
    the update)."""

    def __init__(self, params):
        super().__init__(params, {})
        self.grads = None

    def step(self, closure=None):
        self.grads = [p.grad.detach().clone() for group in self.param_groups for p in group["params"]]


def _train_step(model_name, ds, mode, dtype, launches=None):
    """Loss and gradients of the first step of ``revgnn.engine.loop.train_step`` (a 2-part epoch of
    ``ds``, the loop's own task and loss) for the registered model under ``REVGNN_KERNELS=mode``; the
    Triton kernels it launches are counted into ``launches`` by name."""
    from types import SimpleNamespace

    from revgnn.engine.backends import LocalBackend
    from revgnn.engine.loop import train_step
    from revgnn.engine.run import Run
    from revgnn.engine.tasks import NodeTask
    from revgnn.models.registry import create_model
    from revgnn.utils.optimizer import ModelOptimizer

    os.environ["REVGNN_KERNELS"] = mode
    torch.manual_seed(0)
    overrides = dict(num_layers=2, hidden_channels=16)
    model = create_model(model_name, **overrides).to(dtype)
    tc = SimpleNamespace(train_parts=2, parts_per_step=None, partition="balanced", shuffle_parts=False)
    task = NodeTask(ds, tc)
    step = next(task.train_steps(torch.Generator().manual_seed(0), "cpu"))
    optimizer = ModelOptimizer(model, _Recorder, flat=False)
    launch = tk._launch
    if launches is not None:

        def counted(kernel):
            name = kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__
            launches[name] = launches.get(name, 0) + 1
            return launch(kernel)

        tk._launch = counted
    try:
        torch.manual_seed(1)  # the dropout masks: the same draws in every run
        loss, _ = train_step(Run(model, task, optimizer, LocalBackend(None)), step)
    finally:
        tk._launch = launch
    return loss, optimizer.optimizer.grads


@pytest.mark.parametrize("model_name,aggr", [("revgnn_proteins_like", "mean"), ("revgnn_small", "max")])
def test_training_step_runs_the_triton_kernels(monkeypatch, model_name, aggr):
    """One step of the loop's ``train_step`` on the default model (GEN mean) and a GEN-max RevGNN
    (each: the aggregation, the pre-activation and the MLP's LayerNorm+ReLU) under
    ``REVGNN_KERNELS=triton`` launches the Triton kernel of every operator
    call that the model's structure implies, and gives the float64 PyTorch path's loss and
    gradients as closely as PyTorch's own float32 path does.

    Tolerance: the float32 PyTorch path's deviation from float64 on the same step measures how
    float32 rounding propagates through this computation; the Triton kernels round differently
    (other summation orders) but not worse in order, so per tensor their deviation is bounded by 4x
    that plus 16 float32 units of the tensor's scale (for a tensor where PyTorch happens to round
    exactly)."""
    import dataclasses

    from revgnn.data.synthetic import proteins_like

    monkeypatch.setenv("REVGNN_KERNELS", "triton")  # restored after the test
    ds = proteins_like(num_nodes=48, avg_degree=6, window=2)  # 172 edges
    launches = {}
    loss, grads = _train_step(model_name, ds, "triton", torch.float32, launches)
    # 2 reversible layers of 2 groups: every group op runs in the forward (no grad), again in the
    # backward's recomputation, and its backward once
    L, G = 2, 2
    # the pre-activation LayerNorm+ReLU and the MLP's (whose backward recomputes its forward once
    # more), and the aggregation with its backward kernels
    expected = {"_ln_fwd_kernel": (2 * 2 + 1) * L * G, "_ln_bwd_kernel": 2 * L * G}
    if aggr == "mean":
        expected.update(
            _gen_aggr_fwd_kernel=2 * L * G, _gen_aggr_src_kernel=L * G, _gen_aggr_dst_kernel=L * G
        )
    else:
        expected.update(_gen_max_fwd_kernel=2 * L * G, _tie_stats_kernel=L * G)
        expected.update(_grad_src_kernel=L * G, _grad_dst_kernel=L * G)
    assert launches == expected
    loss32, grads32 = _train_step(model_name, ds, "0", torch.float32)
    ds64 = dataclasses.replace(ds, x=ds.x.double(), edge_attr=ds.edge_attr.double())
    loss64, grads64 = _train_step(model_name, ds64, "0", torch.float64)
    unit = torch.finfo(torch.float32).eps

    def bound(mine, theirs, ref):
        err, err_torch = abs(mine - ref), abs(theirs - ref)
        assert err <= 4 * err_torch + 16 * unit * abs(ref), (err, err_torch, ref)

    bound(loss, loss32, loss64)
    assert len(grads) == len(grads32) == len(grads64)
    for g, g32, g64 in zip(grads, grads32, grads64):
        scale = g64.abs().max().item()
        err, err_torch = ((t.double() - g64).abs().max().item() for t in (g, g32))
        assert err <= 4 * err_torch + 16 * unit * scale, (err, err_torch, scale)


def test_sar_shards_take_the_triton_kernels(monkeypatch):
    """The dispatch table sends SAR's shard operators to Triton under ``REVGNN_KERNELS=triton`` (as
    on CUDA tensors, where SAR used to be gated to the C++ kernel): a SAR GENConv max with factored
    edge features on one part launches the shard kernels and equals the one-process float64
    reference (the same function; only summation orders differ, so 1e-12)."""
    from conftest import rel_err
    from sar_cases import FactoredGEN, N, make_graph

    from revgnn.distributed.convs import convert_to_sar
    from revgnn.distributed.partition import build_partitions
    from revgnn.distributed.sar import SARGraph
    from revgnn.nn import LinearEdgeFeatures

    monkeypatch.setenv("REVGNN_KERNELS", "triton")
    ei, x, ea = make_graph()
    x, ea = x.double(), ea.double()
    graph = SARGraph(build_partitions(ei, N, 1, edge_attr=ea)[0])
    torch.manual_seed(0)
    ref = FactoredGEN().double()
    sar = convert_to_sar(FactoredGEN().double())
    sar.load_state_dict(ref.state_dict())
    xr, er = x.clone().requires_grad_(), ea.clone().requires_grad_()
    monkeypatch.setenv("REVGNN_KERNELS", "0")
    out_ref = ref(xr, ei, er)
    w = torch.randn(out_ref.shape, dtype=torch.float64)
    (out_ref * w).sum().backward()
    monkeypatch.setenv("REVGNN_KERNELS", "triton")
    launches = {}
    launch = tk._launch

    def counted(kernel):
        name = kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__
        launches[name] = launches.get(name, 0) + 1
        return launch(kernel)

    monkeypatch.setattr(tk, "_launch", counted)
    nid, eid = graph.node_ids, graph.edge_ids
    xl, el = x[nid].clone().requires_grad_(), ea[eid].clone().requires_grad_()
    out = sar.conv(xl, graph, LinearEdgeFeatures.from_linear(el, sar.enc))
    (out * w[nid]).sum().backward()
    assert launches.get("_gen_max_fwd_kernel", 0) >= 1 and launches.get("_grad_dst_kernel", 0) >= 1, launches
    assert rel_err(out, out_ref[nid]) <= 1e-12
    assert rel_err(xl.grad, xr.grad[nid]) <= 1e-12
    assert rel_err(el.grad, er.grad[eid]) <= 1e-12
    for p, q in zip(sar.parameters(), ref.parameters()):
        assert rel_err(p.grad, q.grad) <= 1e-12


# ---- linear aggregations and SAGE max (revgnn::aggregate, revgnn::segment_max)


def source_csr(ptr, src, dst):
    """sptr, sdst, sperm: the edges in source order (as revgnn.nn.graph_input.segments)."""
    n = ptr.numel() - 1
    sperm = src.argsort(stable=True)
    sptr = torch.searchsorted(src[sperm], torch.arange(n + 1))
    return sptr, dst[sperm].contiguous(), sperm


@pytest.mark.parametrize("mean", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("c", [5, 40])
def test_aggregate_matches_cpp_and_float64(mean, weighted, c):
    from revgnn.nn.ops import _aggregate_backward_torch, _aggregate_torch

    module = cpp("aggregate")
    ptr, src, dst = graph()
    sptr, sdst, sperm = source_csr(ptr, src, dst)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(ptr.numel() - 1, c, generator=g, dtype=torch.float64)
    w = torch.randn(src.numel(), generator=g, dtype=torch.float64) if weighted else None
    grad = torch.randn(x.shape, generator=g, dtype=torch.float64)
    out = tk.aggregate_forward(x, ptr, src, w, mean)
    gx, gw = tk.aggregate_backward(grad, x, ptr, src, w, mean, sptr, sdst, sperm, True, True)
    ref = [
        _aggregate_torch(x, ptr, src, w, mean),
        *_aggregate_backward_torch(grad, x, ptr, src, w, mean, True, True),
    ]
    theirs = [
        module.forward(x, ptr, src, w, mean),
        *module.backward(grad, x, ptr, src, w, mean, sptr, sdst, sperm, True, True),
    ]
    for mine, want, other in zip([out, gx, gw], ref, theirs):
        if want is None:
            assert mine is None
            continue
        close(mine, want, 1e-13)
        close(mine, other, 1e-13)
    # integer features in float32: every sum is exact, so all three agree bitwise
    xi, gi = ints(*x.shape), ints(*x.shape, seed=5)
    wi = ints(src.numel(), lo=-2, hi=3, seed=6) if weighted else None
    bitwise(tk.aggregate_forward(xi, ptr, src, wi, False), module.forward(xi, ptr, src, wi, False))
    mine = tk.aggregate_backward(gi, xi, ptr, src, wi, False, sptr, sdst, sperm, True, True)
    theirs = module.backward(gi, xi, ptr, src, wi, False, sptr, sdst, sperm, True, True)
    for a, b in zip(mine, theirs):
        assert (a is None) == (b is None)
        if a is not None:
            bitwise(a, b)


@pytest.mark.parametrize("c", [5, 40])
def test_segment_max_matches_cpp_with_ties_nan_and_isolated_nodes(c):
    from revgnn.nn.ops import _segment_max_backward_torch, _segment_max_torch

    module = cpp("segment_max")
    ptr, src, dst = graph(e=160)
    sptr, sdst, _ = source_csr(ptr, src, dst)
    x = ints(ptr.numel() - 1, c, lo=-2, hi=2, dtype=torch.float64)  # many ties, many at 0
    x[2, 1] = float("nan")
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    out, count = tk.segment_max_forward(x, ptr, src)
    ref_out, ref_count = _segment_max_torch(x, ptr, src)
    cpp_out, cpp_count = module.forward(x, ptr, src)
    for a, b in ((out, ref_out), (out, cpp_out), (count, ref_count), (count, cpp_count)):
        bitwise(a, b)
    gx = tk.segment_max_backward(grad, x, out, count, sptr, sdst)
    close(gx, _segment_max_backward_torch(grad, x, out, count, ptr, src), 1e-13)
    close(gx, module.backward(grad, x, out, count, sptr, sdst), 1e-13)
    assert ((count > 1) & (out == 0)).any() and out.isnan().any()


@pytest.mark.parametrize("kind", ["sage_mean", "sage_max", "gin", "gcn"])
def test_blocks_through_the_triton_aggregations(monkeypatch, kind):
    """A block's conv under REVGNN_KERNELS=triton runs the Triton aggregation and gives the PyTorch
    path's output and gradients (float64)."""
    from revgnn.nn import GCNBlock, GINBlock, SAGEBlock

    blocks = {
        "sage_mean": lambda: SAGEBlock(6, aggr="mean"),
        "sage_max": lambda: SAGEBlock(6, aggr="max"),
        "gin": lambda: GINBlock(6),
        "gcn": lambda: GCNBlock(6),
    }
    ptr, src, dst = graph()
    ei = torch.stack([src, dst])
    torch.manual_seed(0)
    block = blocks[kind]().double()
    x = torch.randn(ptr.numel() - 1, 6, dtype=torch.float64)
    results = []
    launches = {}
    launch = tk._launch

    def counted(kernel):
        name = kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__
        launches[name] = launches.get(name, 0) + 1
        return launch(kernel)

    for mode in ("triton", "0"):
        monkeypatch.setenv("REVGNN_KERNELS", mode)
        monkeypatch.setattr(tk, "_launch", counted if mode == "triton" else launch)
        xx = x.clone().requires_grad_()
        out = block.conv_forward(xx, ei, None)
        out.backward(torch.ones_like(out))
        results.append([out.detach(), xx.grad] + [p.grad.clone() for p in block.conv.parameters()])
        block.zero_grad()
    for a, b in zip(*results):
        close(a, b, 1e-12)
    fwd, bwd = (
        ("_smax_fwd_kernel", "_smax_bwd_kernel")
        if kind == "sage_max"
        else ("_agg_fwd_kernel", "_agg_src_kernel")
    )
    assert launches == {fwd: 1, bwd: 1}


def test_kernel_checks_stop_a_broken_graph_before_a_triton_kernel_launches(monkeypatch):
    """Under ``REVGNN_KERNEL_CHECKS=1`` (the suite's setting) a pointer or source id that would make a
    Triton kernel read out of bounds is an error in the operator, and no kernel launches."""
    from revgnn.nn import ops

    monkeypatch.setenv("REVGNN_KERNELS", "triton")
    monkeypatch.setenv("REVGNN_KERNEL_CHECKS", "1")
    launches = []
    launch = tk._launch
    monkeypatch.setattr(tk, "_launch", lambda kernel: launches.append(kernel) or launch(kernel))
    x = torch.randn(4, 3)
    ptr, src = torch.tensor([0, 1, 2, 3, 4]), torch.tensor([0, 1, 2, 3])
    ops.gen_max(x, ptr, src, None, None, None, EPS)  # valid: runs the Triton kernel
    assert launches
    launches.clear()
    for bad_ptr, bad_src in (
        (ptr, torch.tensor([0, 1, 4, 3])),
        (ptr, torch.tensor([0, -1, 2, 3])),
        (torch.tensor([0, 1, 3, 2, 4]), src),
        (torch.tensor([0, 1, 2, 3, 5]), src),
    ):
        with pytest.raises(ValueError, match="(ptr must|source id)"):
            ops.gen_max(x, bad_ptr, bad_src, None, None, None, EPS)
    assert not launches


@pytest.mark.parametrize(
    "p,edges,dtype",
    [(0.0, False, torch.float64), (0.4, True, torch.float64), (0.4, True, torch.float32)],
)
def test_gat_attention_matches_cpp(monkeypatch, p, edges, dtype):
    """A GAT block (2 heads, factored edge features, self loops, duplicates, isolated nodes) under
    ``REVGNN_KERNELS=triton`` runs the Triton functions and gives the C++ kernel's output and
    gradients: float64 to rounding, float32 within a few times the C++ kernel's own float32 error
    (against its float64 result); with dropout both draw the same mask from the hash."""
    from revgnn.nn import GATBlock, LinearEdgeFeatures

    cpp("gat_attention")
    calls = []
    for name in ("gat_attention_forward", "gat_attention_backward"):
        fn = getattr(tk, name)
        monkeypatch.setattr(tk, name, lambda *a, _fn=fn, _name=name: calls.append(_name) or _fn(*a))
    n = 24
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, n - 3, (2, 120), generator=g)
    ei = torch.cat([ei, ei[:, :5], torch.tensor([[4, 5], [4, 5]])], 1)
    x = torch.randn(n, 8, dtype=torch.float64, generator=g)
    raw = torch.randn(ei.size(1), 3, dtype=torch.float64, generator=g)

    def run(mode, dt):
        monkeypatch.setenv("REVGNN_KERNELS", mode)
        torch.manual_seed(0)
        block = GATBlock(8, heads=2, edge_channels=5 if edges else None, attn_dropout=p).to(dt)
        lin = torch.nn.Linear(3, 5).to(dt)
        for param in block.conv.parameters():
            torch.nn.init.normal_(param, std=0.5)
        xx, rr = x.to(dt).requires_grad_(), raw.to(dt).requires_grad_()
        torch.manual_seed(5)
        out = block(xx, ei, LinearEdgeFeatures.from_linear(rr, lin) if edges else None)
        (out * out.sin()).sum().backward()
        params = [q for q in [*block.parameters(), *lin.parameters()] if q.grad is not None]
        return [out.detach(), xx.grad, *([rr.grad] if edges else []), *[q.grad for q in params]]

    tri = run("triton", dtype)
    assert calls == ["gat_attention_forward", "gat_attention_backward"]
    ref = run("1", dtype)

    def rel(a, b):  # relative to the whole tensor's scale
        return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()

    if dtype == torch.float64:
        for a, b in zip(tri, ref):
            assert rel(a, b) <= 1e-12
    else:
        exact = run("1", torch.float64)
        for a, b, r in zip(tri, ref, exact):
            assert rel(a, r) <= 4 * rel(b, r) + 1e-6


def test_gat_attention_dropout_ids_match_cpp(monkeypatch):
    """The Triton GAT kernels draw the dropout mask of the ids passed (``edge_key``, ``loop_key``:
    a SAR shard's global ids) as the C++ kernel does: float64 outputs and gradients to rounding."""
    from conftest import gat_operator_case, gat_operator_run

    cpp("gat_attention")
    case = gat_operator_case()
    calls = []
    for name in ("gat_attention_forward", "gat_attention_backward"):
        fn = getattr(tk, name)
        monkeypatch.setattr(tk, name, lambda *a, _fn=fn, _name=name: calls.append(_name) or _fn(*a))
    monkeypatch.setenv("REVGNN_KERNELS", "triton")
    tri = gat_operator_run(case, 0.4, case["key"], case["loop_key"])
    assert calls == ["gat_attention_forward", "gat_attention_backward"]
    monkeypatch.setenv("REVGNN_KERNELS", "1")
    ref = gat_operator_run(case, 0.4, case["key"], case["loop_key"])
    assert ((ref[0] - gat_operator_run(case, 0.4)[0]).abs().max() > 1e-3).item()  # the ids change the mask
    for a, b in zip(tri, ref):
        assert ((a - b).abs().max() / b.abs().max()).item() <= 1e-12


@pytest.mark.parametrize("kind", ["sage_mean", "sage_max", "gin", "gcn"])
def test_sar_aggregation_shards_take_the_triton_kernels(monkeypatch, kind):
    """SAR's SAGE, GIN and GCN shards (revgnn.distributed.aggregate_sar) reach the Triton
    aggregations through the dispatch table under ``REVGNN_KERNELS=triton`` (as on CUDA tensors): on
    one part they launch the forward and backward kernels once each and equal PyG's conv on the
    full graph in float64 (the same sums in other orders, so 1e-12)."""
    from conftest import rel_err
    from sar_cases import F_IN, N, make_graph
    from torch_geometric.nn import GCNConv, GINConv, SAGEConv

    from revgnn.distributed.convs import convert_to_sar
    from revgnn.distributed.partition import build_partitions
    from revgnn.distributed.sar import SARGraph

    convs = {
        "sage_mean": lambda: SAGEConv(F_IN, 6, aggr="mean"),
        "sage_max": lambda: SAGEConv(F_IN, 6, aggr="max"),
        "gin": lambda: GINConv(torch.nn.Linear(F_IN, 6)),
        "gcn": lambda: GCNConv(F_IN, 6),
    }
    ei, x, _ = make_graph()
    x = x.double()
    graph = SARGraph(build_partitions(ei, N, 1)[0])
    torch.manual_seed(0)
    ref = convs[kind]().double()
    sar = convert_to_sar(convs[kind]().double())
    sar.load_state_dict(ref.state_dict())
    monkeypatch.setenv("REVGNN_KERNELS", "0")
    xr = x.clone().requires_grad_()
    out_ref = ref(xr, ei)
    w = torch.randn(out_ref.shape, dtype=torch.float64)
    (out_ref * w).sum().backward()
    monkeypatch.setenv("REVGNN_KERNELS", "triton")
    launches = {}
    launch = tk._launch

    def counted(kernel):
        name = kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__
        launches[name] = launches.get(name, 0) + 1
        return launch(kernel)

    monkeypatch.setattr(tk, "_launch", counted)
    nid = graph.node_ids
    xl = x[nid].clone().requires_grad_()
    out = sar(xl, graph)
    (out * w[nid]).sum().backward()
    fwd, bwd = (
        ("_smax_fwd_kernel", "_smax_bwd_kernel")
        if kind == "sage_max"
        else ("_agg_fwd_kernel", "_agg_src_kernel")
    )
    assert launches == {fwd: 1, bwd: 1}, launches
    assert rel_err(out, out_ref[nid]) <= 1e-12
    assert rel_err(xl.grad, xr.grad[nid]) <= 1e-12
    for p, q in zip(sar.parameters(), ref.parameters()):
        assert rel_err(p.grad, q.grad) <= 1e-12
