"""Compile every Triton kernel specialisation revgnn.nn.triton_kernels launches, for a CUDA target,
on a machine without a GPU.

The interpreter (TRITON_INTERPRET=1, tests/nn/test_triton_kernels.py) runs the kernels' Python, but
not Triton's compiler, which is stricter (loop-carried types, scalar/block shapes, constexpr
rules). This records the launches the wrappers make on CPU tensors (instead of running them),
then compiles each distinct specialisation with ``triton.compile`` for an explicit target
(Triton's bundled LLVM and ptxas: no driver, no device). Prints one line per specialisation and
exits 1 if any fails.

    python scripts/triton_compile_check.py             # sm_90 (H100/H200), every dtype and path
    python scripts/triton_compile_check.py --arch 80   # sm_80 (A100)
    python scripts/triton_compile_check.py --quick     # float32 only, C = 40
    python scripts/triton_compile_check.py --smoke     # float32, C = 40, factored edges only
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.pop("TRITON_INTERPRET", None)  # compiled kernels, not interpreted ones

import torch  # noqa: E402


def record_launches(tk, dtypes, channels, smoke=False):
    """(kernel, args, kwargs) of every launch the wrappers make for these cases."""
    records = []

    class Recorder:
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            return lambda *a, **k: records.append((self.fn, a, k))

    originals = {n: getattr(tk, n) for n in dir(tk) if n.endswith("_kernel")}
    for name, fn in originals.items():
        setattr(tk, name, Recorder(fn))
    interpreted, tk.INTERPRETED = tk.INTERPRETED, True  # the wrappers' device check: CPU tensors here
    try:
        n, e, d = 20, 100, 8
        ptr = torch.linspace(0, e, n + 1).long()
        src = torch.randint(0, n, (e,))
        dst = torch.repeat_interleave(torch.arange(n), ptr.diff(), output_size=e)
        sperm = torch.sort(src, stable=True)[1]
        sptr = torch.searchsorted(src[sperm], torch.arange(n + 1))
        sdst = dst[sperm]
        for dt in dtypes:
            for c in channels:
                x = torch.randn(n, c).to(dt)
                raw, wt, b = torch.randn(e, d).to(dt), torch.randn(d, c).to(dt), torch.randn(c).to(dt)
                dense = torch.randn(e, c).to(dt)
                grad = torch.randn(n, c).to(dt)
                arg = torch.zeros(n, c, dtype=torch.int32)
                terms = [(None, None, None), (dense, None, None), (raw, wt, b), (raw, wt, None)]
                all_flags = [(True, True, True, True), (True, False, True, True)]
                if smoke:
                    terms, all_flags = terms[2:3], all_flags[:1]
                for attr, w, bb in terms:
                    tk.gen_max_forward(x, ptr, src, attr, w, bb, 1e-7)
                    tk.gen_max_shard_forward(x, ptr, src, attr, w, bb)
                    for tied in (torch.ones(n, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8)):
                        for flags in all_flags:
                            tk.gen_max_backward(grad, arg, tied, x, ptr, src, attr, w, bb, *flags)
                    if dt == torch.bfloat16:  # GEN sum / mean / softmax: float32 and float64 only
                        continue
                    temp = torch.ones(1, dtype=dt)
                    for reduce in ("mean", "softmax") if smoke else ("sum", "mean", "softmax"):
                        saved = tk.gen_aggr_forward(x, ptr, src, attr, w, bb, temp, 1e-7, reduce)
                        for flags in all_flags:
                            tk.gen_aggr_backward(
                                grad, *saved, x, ptr, src, sptr, sdst, sperm, attr, w, bb, temp, 1e-7, reduce,
                                *flags, flags[0],
                            )  # fmt: skip
                xl = torch.randn(n, 2 * c).to(dt)[:, :c]
                wl, bl = torch.randn(c).to(dt), torch.randn(c).to(dt)
                stats = torch.zeros(n, dtype=torch.float64 if dt == torch.float64 else torch.float32)
                for m in (torch.ones(n, c).to(dt),) if smoke else (None, torch.ones(n, c).to(dt)):
                    tk.layer_norm_relu_forward(xl, wl, bl, 1e-5, m, 1.0)
                    for flags in (
                        [(True, True, True)] if smoke else [(True, True, True), (False, True, False)]
                    ):
                        tk.layer_norm_relu_backward(grad, xl, wl, bl, stats, stats, m, 1.0, *flags, False)
                if dt in (torch.float32, torch.float64):  # the aggregations take no bfloat16
                    weight, perm, count = (
                        torch.randn(e).to(dt),
                        torch.arange(e),
                        torch.ones(n, c, dtype=torch.int32),
                    )
                    for wgt in (weight,) if smoke else (None, weight):
                        for mean in (True,) if smoke else (False, True):
                            tk.aggregate_forward(x, ptr, src, wgt, mean)
                            tk.aggregate_backward(grad, x, ptr, src, wgt, mean, ptr, src, perm, True, True)
                    tk.segment_max_forward(x, ptr, src)
                    tk.segment_max_backward(grad, x, x, count, ptr, src)
                if dt == torch.bfloat16:  # GAT attention: float32 and float64 only
                    continue
                heads, perm = 2, torch.arange(e)  # recorded, not run: any source order will do
                xp, hv = torch.randn(n, heads, c // heads).to(dt), torch.randn(n, heads).to(dt)
                wg, bg = torch.randn(heads, d).to(dt), torch.randn(heads).to(dt)
                gat_terms = [(raw, wg, bg)] if smoke else [(None, None, None), (raw, wg, bg), (raw, wg, None)]
                for attr, w, bb in gat_terms:
                    for p in (0.0, 0.3):
                        tk.gat_attention_forward(xp, hv, hv, hv, ptr, src, attr, w, bb, 0.2, p, 7)
                        if p > 0:  # a SAR shard's dropout ids
                            ids = (torch.arange(e), torch.arange(n))
                            tk.gat_attention_forward(xp, hv, hv, hv, ptr, src, attr, w, bb, 0.2, p, 7, *ids)
                            tk.gat_attention_backward(
                                xp, xp, hv, hv, xp, hv, hv, hv, ptr, src, attr, w, bb, 0.2, p, 7, ptr, src,
                                perm, True, *ids,
                            )  # fmt: skip
                        tk.gat_attention_backward(
                            xp,
                            xp,
                            hv,
                            hv,
                            xp,
                            hv,
                            hv,
                            hv,
                            ptr,
                            src,
                            attr,
                            w,
                            bb,
                            0.2,
                            p,
                            7,
                            ptr,
                            src,
                            perm,
                            True,
                        )
    finally:
        tk.INTERPRETED = interpreted
        for name, fn in originals.items():
            setattr(tk, name, fn)
    return records


_TYPES = {
    torch.float32: "fp32",
    torch.float64: "fp64",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.uint8: "u8",
}


def signature(fn, args, kwargs):
    """Triton's signature and constexprs of one launch (as its JIT would specialise it, less
    the divisibility hints)."""
    values = dict(zip([p.name for p in fn.params], args))
    values.update(kwargs)
    sig, const = {}, {}
    for p in fn.params:
        v = values[p.name]
        if p.is_constexpr:
            sig[p.name], const[p.name] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = "*" + _TYPES[v.dtype]
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            sig[p.name] = "i64" if abs(v) >= 2**31 else "i32"
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: argument {p.name} of type {type(v).__name__}")
    return sig, const


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x 10 (90: sm_90)")
    parser.add_argument("--quick", action="store_true", help="float32, C = 40 only")
    parser.add_argument("--smoke", action="store_true", help="float32, C = 40, factored edges only")
    args = parser.parse_args(argv)
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as err:
        print(f"skipped: {err}")
        return 0
    from revgnn.nn import triton_kernels as tk

    few = args.quick or args.smoke
    dtypes = (torch.float32,) if few else (torch.float32, torch.bfloat16, torch.float64)
    channels = (40,) if few else (40, 13, 200)
    target = GPUTarget("cuda", args.arch, 32)
    seen, failed, start = set(), 0, time.perf_counter()
    for fn, a, k in record_launches(tk, dtypes, channels, args.smoke):
        sig, const = signature(fn, a, k)
        key = (fn.__name__, tuple(sorted(sig.items())), tuple(sorted((n, str(v)) for n, v in const.items())))
        if key in seen:
            continue
        seen.add(key)
        label = f"{fn.__name__} {', '.join(f'{n}={v}' for n, v in const.items())}"
        try:
            triton.compile(ASTSource(fn, sig, const), target=target)
            print(f"ok   {label}", flush=True)
        except Exception as err:  # report every failure, then fail
            failed += 1
            print(f"FAIL {label}\n{str(err)[-1500:]}", flush=True)
    print(
        f"sm_{args.arch}: {len(seen)} specialisations compiled, {failed} failed, "
        f"{time.perf_counter() - start:.0f} s (Triton {triton.__version__})"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
