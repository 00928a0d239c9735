"""Device check of revgnn.nn.triton_kernels on CUDA: each Triton function against a float64
PyTorch reference on a random graph, with time per call and peak memory. Prints JSON lines.

    python scripts/gpu_check_triton.py                 # 20k nodes, 0.5M edges, C = 40, d = 8
    python scripts/gpu_check_triton.py --proteins      # + one layer on an ogbn-proteins-sized graph
    python scripts/gpu_check_triton.py --cpu-interpreter   # the script itself, tiny, on CPU

Errors (``err_*``) are max |a - b| / max(1, max |b|). Exits 1 if a float32 error exceeds 1e-4 or
a result is not bitwise repeatable; exits 0 printing a "no CUDA device" line where there is none
(the interpreter tests in tests/nn/test_triton_kernels.py cover the same functions on CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# compiled kernels on CUDA tensors, whatever the caller set; --cpu-interpreter checks this script
# itself on CPU through Triton's interpreter (set before Triton's first import)
CPU = "--cpu-interpreter" in sys.argv
if CPU:
    os.environ["TRITON_INTERPRET"] = "1"
else:
    os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402

DEVICE = torch.device("cuda")


FAILED = []  # checks outside their bounds: the script then exits 1


def emit(**fields) -> None:
    """One JSON line; a gen_max / layer_norm_relu line gets ``ok``: deterministic and, in float32,
    every error within 1e-4 of the float64 reference (bf16: reported, not judged)."""
    if "deterministic" in fields:
        errors = [v for k, v in fields.items() if k.startswith("err_") and v is not None]
        within = fields["dtype"] != str(torch.float32) or all(v <= 1e-4 for v in errors)
        fields["ok"] = bool(fields["deterministic"] and within)
        if not fields["ok"]:
            FAILED.append(fields["check"])
    print(json.dumps(fields), flush=True)


def timed(fn, reps: int = 5):
    """(result, median seconds per call, peak bytes allocated above the start) of fn()."""
    if CPU:  # the interpreter: one call, no memory statistics
        start = time.perf_counter()
        result = fn()
        return result, time.perf_counter() - start, None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()  # warm-up: compiles the kernels
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return result, times[len(times) // 2], peak


def err(a, b) -> float:
    """max |a - b| / max(1, max |b|): absolute for small values, relative for large sums."""
    if a is None or b is None:
        return float("nan") if (a is None) != (b is None) else 0.0
    if not a.numel():
        return 0.0
    a, b = a.double(), b.double()
    finite = torch.isfinite(b)
    scale = max(1.0, float(b[finite].abs().max())) if bool(finite.any()) else 1.0
    return float((a - b).abs().nan_to_num(0.0).max()) / scale


def random_graph(n: int, e: int, c: int, d: int, device, dtype, seed: int = 0):
    """Destination-sorted random edges: 2% of the nodes without in-edges, and 2% of the edges
    repeated (same source, destination and features), so that some positive maxima tie."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    dst = torch.randint(0, n - n // 50, (e,), generator=g)
    src = torch.randint(0, n, (e,), generator=g)
    raw = torch.randn(e, d, generator=g)
    k = e // 50
    dst, src, raw = torch.cat([dst, dst[:k]]), torch.cat([src, src[:k]]), torch.cat([raw, raw[:k]])
    dst, perm = torch.sort(dst, stable=True)
    src, raw = src[perm], raw[perm]
    ptr = torch.zeros(n + 1, dtype=torch.long)
    ptr[1:] = torch.cumsum(torch.bincount(dst, minlength=n), 0)
    x = torch.randn(n, c, generator=g)
    wt = torch.randn(d, c, generator=g) / d**0.5
    bias = torch.randn(c, generator=g) * 0.1
    to = lambda t: t.to(device)
    return (
        to(ptr),
        to(src),
        to(dst),
        to(x).to(dtype),
        to(raw).to(dtype),
        to(wt).to(dtype),
        to(bias).to(dtype),
    )


def check_gen_max(tk, n, e, c, d, dtype, eps=1e-7):
    from revgnn.nn.gen_max import gen_max_reference

    dev = DEVICE
    ptr, src, dst, x, raw, wt, bias = random_graph(n, e, c, d, dev, dtype)
    (out, arg, tied), t_fwd, m_fwd = timed(lambda: tk.gen_max_forward(x, ptr, src, raw, wt, bias, eps))
    grad = torch.randn(n, c, device=dev).to(dtype)
    call = lambda: tk.gen_max_backward(grad, arg, tied, x, ptr, src, raw, wt, bias, True, True, True, True)
    grads, t_bwd, m_bwd = timed(call)
    again = call()
    deterministic = all(torch.equal(a, b) for a, b in zip(grads, again))
    # float64 PyTorch reference (materialises E x C: fine at this size)
    x64, r64, w64, b64 = (t.double().requires_grad_() for t in (x, raw, wt, bias))
    ref = gen_max_reference(x64, src, dst, ptr, r64 @ w64 + b64, eps)
    gref = torch.autograd.grad(ref, (x64, r64, w64, b64), grad.double())
    emit(
        check="gen_max",
        dtype=str(dtype),
        nodes=n,
        edges=src.numel(),
        channels=c,
        d=d,
        tied_nodes=int(tied.sum()),
        err_out=err(out, ref),
        err_grad_x=err(grads[0], gref[0]),
        err_grad_attr=err(grads[1], gref[1]),
        err_grad_w=err(grads[2], gref[2].t()),
        err_grad_b=err(grads[3], gref[3]),
        deterministic=deterministic,
        forward_s=t_fwd,
        backward_s=t_bwd,
        forward_peak_bytes=m_fwd,
        backward_peak_bytes=m_bwd,
        edge_by_channel_bytes=src.numel() * c * x.element_size(),
    )
    m, arg_s, tied_s, count = tk.gen_max_shard_forward(x, ptr, src, raw, wt, bias)
    gs = tk.gen_max_shard_backward(grad, arg_s, tied_s, x, ptr, src, raw, wt, bias, True, True, True, True)
    emit(
        check="gen_max_shard",
        dtype=str(dtype),
        err_max=err(m + eps * (ptr.diff() > 0).view(-1, 1), out),
        count_ge2=int((count > 1).sum()),
        err_grad_x_vs_single=err(gs[0], grads[0]) if not bool(tied.any()) else None,
    )


def check_layer_norm(tk, n, c, dtype, eps=1e-5):
    dev = DEVICE
    g = torch.Generator(device="cpu").manual_seed(1)
    wide = torch.randn(n, 2 * c, generator=g).to(dev, dtype)
    x = wide[:, :c]  # strided rows, as a channel group
    w = torch.randn(c, generator=g).to(dev, dtype)
    b = torch.randn(c, generator=g).to(dev, dtype)
    mask = (torch.rand(n, c, generator=g) > 0.2).to(dev, dtype) * 1.25
    grad = torch.randn(n, c, generator=g).to(dev, dtype)
    (out, mean, rstd), t_fwd, m_fwd = timed(lambda: tk.layer_norm_relu_forward(x, w, b, eps, mask, 1.0))
    call = lambda: tk.layer_norm_relu_backward(grad, x, w, b, mean, rstd, mask, 1.0, True, True, True, False)
    grads, t_bwd, m_bwd = timed(call)
    again = call()
    x64, w64, b64 = (t.double().requires_grad_() for t in (x, w, b))
    h = torch.nn.functional.layer_norm(x64, (c,), w64, b64, eps).relu() * mask.double()
    gref = torch.autograd.grad(h, (x64, w64, b64), grad.double())
    emit(
        check="layer_norm_relu",
        dtype=str(dtype),
        rows=n,
        channels=c,
        err_out=err(out, h),
        err_grad_x=err(grads[0], gref[0]),
        err_grad_w=err(grads[1], gref[1]),
        err_grad_b=err(grads[2], gref[2]),
        deterministic=all(torch.equal(a, b) for a, b in zip(grads, again)),
        forward_s=t_fwd,
        backward_s=t_bwd,
        forward_peak_bytes=m_fwd,
        backward_peak_bytes=m_bwd,
    )


def proteins_layer(tk, c=40, d=8, eps=1e-7):
    """One GEN max layer (forward + backward) on a synthetic graph of ogbn-proteins' size:
    132,534 nodes, 79,122,504 edges, 8 edge features; time and peak memory only."""
    dev = torch.device("cuda")
    n, e = 132_534, 79_122_504
    torch.manual_seed(0)
    dst = torch.sort(torch.randint(0, n, (e,), device=dev)).values
    ptr = torch.zeros(n + 1, dtype=torch.long, device=dev)
    ptr[1:] = torch.cumsum(torch.bincount(dst, minlength=n), 0)
    del dst
    src = torch.randint(0, n, (e,), device=dev)
    raw = torch.rand(e, d, device=dev)
    wt = torch.randn(d, c, device=dev) / d**0.5
    bias = torch.zeros(c, device=dev)
    x = torch.randn(n, c, device=dev)
    (out, arg, tied), t_fwd, m_fwd = timed(
        lambda: tk.gen_max_forward(x, ptr, src, raw, wt, bias, eps), reps=3
    )
    grad = torch.randn(n, c, device=dev)
    _, t_bwd, m_bwd = timed(
        lambda: tk.gen_max_backward(grad, arg, tied, x, ptr, src, raw, wt, bias, True, True, True, True),
        reps=3,
    )
    emit(
        check="gen_max_proteins_size",
        nodes=n,
        edges=e,
        channels=c,
        d=d,
        forward_s=t_fwd,
        backward_s=t_bwd,
        forward_peak_bytes=m_fwd,
        backward_peak_bytes=m_bwd,
        inputs_bytes=sum(t.numel() * t.element_size() for t in (ptr, src, raw, x)),
        edge_by_channel_bytes=e * c * 4,
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20_000)
    parser.add_argument("--edges", type=int, default=500_000)
    parser.add_argument("--channels", type=int, default=40)
    parser.add_argument("--proteins", action="store_true", help="also one layer at ogbn-proteins size")
    parser.add_argument("--cpu-interpreter", action="store_true", help="tiny sizes on CPU (interpreter)")
    args = parser.parse_args(argv)
    global DEVICE
    if args.cpu_interpreter:
        DEVICE = torch.device("cpu")
        args.nodes, args.edges, args.channels, args.proteins = 60, 300, 13, False
    elif not torch.cuda.is_available():
        emit(check="triton", skipped="no CUDA device")
        return 0
    from revgnn.nn import triton_kernels as tk

    if not tk.AVAILABLE:
        emit(check="triton", skipped="Triton is not installed")
        return 0
    import triton

    name = "cpu (Triton interpreter)" if args.cpu_interpreter else torch.cuda.get_device_name()
    emit(check="triton", device=name, torch=torch.__version__, triton=triton.__version__)
    start = time.perf_counter()
    small = (40, 200) if args.cpu_interpreter else (2_000, 40_000)
    rows = 300 if args.cpu_interpreter else 100_000
    for dtype in (torch.float32, torch.bfloat16):
        check_gen_max(tk, args.nodes, args.edges, args.channels, 8, dtype)
        check_gen_max(tk, *small, 13, 3, dtype)  # a channel count off the block size
        check_layer_norm(tk, rows, args.channels, dtype)
    check_layer_norm(tk, rows, 13, torch.float32)
    if args.proteins:
        proteins_layer(tk)
    emit(check="triton_done", seconds=time.perf_counter() - start, failed=FAILED)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
