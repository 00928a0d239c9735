r"""Triton implementations of revgnn's fused kernels, call-compatible with ``revgnn/csrc``.

Each function here takes and returns exactly what the C++ entry point of the same name does
(``kernels.load("gen_max").forward`` etc.), so that a caller can swap one for the other; the tensors are
CUDA tensors, or CPU tensors with ``TRITON_INTERPRET=1`` set **before Triton is first imported**
in the process (Triton picks interpreter or compiler when a function is decorated, its own
``tl.sum``/``tl.max`` included; PyG imports Triton when it is installed, so set it before
importing ``torch_geometric`` too). :data:`INTERPRETED` says which. revgnn imports this module
only when the dispatch table (:mod:`revgnn.nn.dispatch`) picks Triton (a CUDA tensor, or
``REVGNN_KERNELS=triton``); :data:`AVAILABLE` is False where Triton is not installed (every
function then raises :class:`RuntimeError`). Launches go through
:func:`torch.library.wrap_triton` when :data:`WRAP_TRITON` is set (for ``triton_op`` bodies).
The kernels use only long-standing Triton language features (loads/stores with masks, reductions,
``where``, bitcasts, dynamic loops), meant to work from Triton 3.6 on; they have been compiled
with Triton 3.9 and 3.6.0 (``scripts/triton_compile_check.py``: every specialisation for sm_90,
and sm_80 with 3.9, without a GPU) and run only through the interpreter.

**GEN max aggregation** (:func:`gen_max_forward`, :func:`gen_max_backward`), over edges sorted by
destination (CSC pointer ``ptr`` ``[N + 1]``, sources ``src`` ``[E]``):

.. math::
    \mathbf{h}_{i,c} = \max_{e = (j \to i)} \mathrm{ReLU}(\mathbf{x}_{j,c} + \mathbf{t}_{e,c})
    + \epsilon \quad (0 \text{ without in-edges}), \qquad
    \mathbf{t}_e = \mathbf{W}\mathbf{a}_e + \mathbf{b}

with :math:`\mathbf{t}` absent, dense ``[E, C]``, or factored (raw :math:`\mathbf{a}` ``[E, d]``,
``wt`` = :math:`\mathbf{W}^\top` ``[d, C]``, bias ``[C]``): the factored term is formed per tile of
edges in registers, never as an :math:`E \times C` tensor. One program owns one destination node
(all its channels) and walks its edge segment in tiles of ``BE`` edges, keeping per channel the
running maximum (NaN-free), the number of edges reaching it, the first edge reaching it and
whether any message was NaN (a NaN makes the result NaN, as in the C++ kernel and
``scatter_reduce``). Outputs: ``out`` ``[N, C]``, ``arg`` ``[N, C]`` int32 (the winner's offset in
the node's segment, -1 where the max is :math:`\le 0` or NaN), ``tied`` ``[N]`` uint8 (some
positive max reached by several edges). The max, the winner and the tie flag are exact (no
rounding), so they equal the C++ kernel's bitwise whenever the messages do.

Backward: the gradient :math:`g_{ic}` goes to the winning edge, or, on a tied node, to every
edge reaching the (NaN-ignoring) positive maximum as :math:`g_{ic}/n_{ic}`; tied nodes' messages
are recomputed (a prepass, in which only tied nodes walk their edges, stores their maxima and
shares, ``[N, C]`` each). Nothing in backward synchronises with the host or has a shape that
depends on the data (how many nodes are tied), so that the wrappers can be traced.

**Determinism** (no float atomics anywhere; every sum has a fixed order that depends on the
problem's size only, so repeated runs are bitwise equal):

* ``grad_x`` is a *gather* over a source-sorted permutation of the edges (CSR by source,
  computed here from ``ptr``/``src`` and cached): the program of source row :math:`j` walks
  :math:`j`'s out-edges :math:`e = (j \to i)` in a fixed order and adds :math:`g_{ic}` where
  :math:`e` is :math:`i`'s winner for :math:`c` (or the share on a tied node);
* the edge-feature gradient is formed per edge (each edge belongs to one destination):
  dense ``[E, C]`` exactly :math:`g` or :math:`g/n`, factored
  :math:`\partial\mathbf{a}_{e} = \sum_c \partial t_{ec} \mathbf{W}_{c}`;
* ``grad_W`` ``[C, d]`` and ``grad_b`` ``[C]`` are partial sums over fixed blocks of
  ``NODE_BLOCK`` destination nodes, then summed over the blocks (``torch.sum``, fixed order).

**Shards** (:func:`gen_max_shard_forward`, :func:`gen_max_shard_backward`): the C++
``shard_forward``/``shard_backward`` of SAR (``revgnn/distributed/gen_max_sar.py``): ``x`` has any
number of rows, the destinations are ``ptr.numel() - 1``, no :math:`\epsilon`, plus ``count``
``[N, C]``: the edges reaching a positive maximum (1 at an untied node's winner, 0 elsewhere).

**GEN sum / mean / softmax** (:func:`gen_aggr_forward`, :func:`gen_aggr_backward`: the C++
``gen_aggr`` entry points, float32 and float64): one program per destination walks its segment in
tiles of ``BE`` edges, summing the messages (mean: divided by the degree) or, for the softmax,
keeping per channel a running maximum, denominator and numerator rescaled per tile; forward
stores the maximum and the denominator ``[N, C]``. Backward recomputes each message and softmax
weight: ``grad_x`` as a gather over the edges in source order (the operator's ``src_ptr``,
``src_dst``, ``src_perm``), the edge-feature gradient per edge, and ``grad_W``, ``grad_b`` and the
temperature's gradient as partial sums per fixed block of ``NODE_BLOCK`` destinations, added in
order. No tensor of ``E x C`` elements.

**LayerNorm + ReLU (+ mask)** (:func:`layer_norm_relu_forward`, :func:`layer_norm_relu_backward`):

.. math::
    \mathbf{h}_{ic} = \max\big((x_{ic} - \mu_i)\, r_i\, w_c + b_c,\ 0\big)\, m_{ic}, \qquad
    r_i = (\sigma^2_i + \epsilon)^{-1/2}

backward :math:`\partial x_{ic} = r_i (g_{ic} w_c - \overline{g w}_i - \hat x_{ic}
\overline{g w \hat x}_i)` with :math:`g` masked by the ReLU and :math:`m`; ``dw``, ``db`` summed per
fixed block of ``LN_ROWS`` rows, then over blocks in order. Rows of ``x`` and the mask may be
strided (a channel group of a wider tensor).

**Linear aggregations and SAGE max** (:func:`aggregate_forward`, :func:`aggregate_backward`,
:func:`segment_max_forward`, :func:`segment_max_backward`: ``revgnn/csrc/aggregate.cpp`` and
``segment_max.cpp``): :math:`\mathbf{o}_i = s_i \sum_{e = (j \to i)} w_e \mathbf{x}_j` (``s_i`` the
inverse clamped in-degree for the mean, else 1) and the per-channel maximum with tie counts; one
program per destination in forward, per source for ``grad_x`` (a gather over the source order the
caller passes: ``sptr``, ``sdst``, ``sperm``), per destination for the edge weights' gradient;
float32 and float64 only.

dtypes: float32, float64 and bfloat16 (bf16 loads are accumulated in float32; for bf16 the saved
LayerNorm statistics are float32, ``count`` is bf16 (exact up to 256 ties)). Channel counts need
not be multiples of the block: lanes are masked. Memory: beyond the outputs, forward allocates
nothing; backward allocates the source-sorted permutation (two int32 or int64 ``[E]``, cached per
graph; its construction holds up to 28 bytes per edge for a moment), two ``[N, C]`` buffers for
the tied nodes, and the ``[blocks, C, d]`` partial sums. No tensor of ``E x C`` elements.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

try:  # guarded: revgnn works without Triton; only this module needs it
    import triton
    import triton.language as tl

    AVAILABLE = True
except ImportError:  # pragma: no cover - exercised where Triton is not installed
    triton = None
    tl = None
    AVAILABLE = False

__all__ = [
    "AVAILABLE",
    "INTERPRETED",
    "gen_aggr_forward",
    "gen_aggr_backward",
    "gen_max_forward",
    "gen_max_backward",
    "gen_max_shard_forward",
    "gen_max_shard_backward",
    "layer_norm_relu_forward",
    "layer_norm_relu_backward",
    "source_order",
    "aggregate_forward",
    "aggregate_backward",
    "segment_max_forward",
    "segment_max_backward",
]

#: destination nodes per partial sum of grad_W / grad_b (fixed: results independent of the device)
NODE_BLOCK = 64
#: rows per partial sum of the LayerNorm weight / bias gradients (as the C++ kernel's ROWS)
LN_ROWS = 256
_NONE, _DENSE, _FACTORED = 0, 1, 2
_INT32_MAX = 2**31 - 1


if AVAILABLE:

    @triton.jit
    def _cast(v, DT: tl.constexpr):
        """``v.to(DT)``, rounding to nearest even for bf16 explicitly (Triton's interpreter
        truncates float32 -> bf16; compiled code rounds to nearest even, as this does)."""
        if DT == tl.bfloat16:
            bits = v.to(tl.float32).to(tl.uint32, bitcast=True)
            bits = bits + 0x7FFF + ((bits >> 16) & 1)
            return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        else:
            return v.to(DT)

    @triton.jit
    def _spread(flag, like):
        """A scalar condition as a block shaped like ``like`` (the interpreter mishandles
        ``block & scalar`` of booleans)."""
        return (tl.zeros_like(like).to(tl.int32) + flag.to(tl.int32)) != 0

    @triton.jit
    def _message(
        x_ptr, row, e, m2, c, C, d, attr_ptr, wt_ptr, bias_ptr,
        MODE: tl.constexpr, HAS_BIAS: tl.constexpr, ACC: tl.constexpr,
    ):  # fmt: skip
        """Pre-activation messages [BE, BC] of edges ``e`` from source rows ``row`` (masked m2)."""
        xv = tl.load(x_ptr + row[:, None] * C + c[None, :], mask=m2, other=0.0).to(ACC)
        if MODE == 2:
            cm = c < C
            if HAS_BIAS:
                t = tl.load(bias_ptr + c, mask=cm, other=0.0).to(ACC)[None, :] + tl.zeros_like(xv)
            else:
                t = tl.zeros_like(xv)
            em = tl.max(m2.to(tl.int32), axis=1) > 0
            for k in range(d):
                ek = tl.load(attr_ptr + e * d + k, mask=em, other=0.0).to(ACC)
                wk = tl.load(wt_ptr + k * C + c, mask=cm, other=0.0).to(ACC)
                t += ek[:, None] * wk[None, :]
            xv = xv + t
        elif MODE == 1:
            xv = xv + tl.load(attr_ptr + e[:, None] * C + c[None, :], mask=m2, other=0.0).to(ACC)
        return xv

    @triton.jit
    def _row_stats(
        x_ptr, src_ptr, attr_ptr, wt_ptr, bias_ptr, e0, e1, c, C, d,
        MODE: tl.constexpr, HAS_BIAS: tl.constexpr, ACC: tl.constexpr, BE: tl.constexpr,
        BC: tl.constexpr,
    ):  # fmt: skip
        """Over edges [e0, e1): per channel the NaN-free maximum, how many edges reach it, the
        first one reaching it (offset from e0) and whether some message was NaN."""
        cm = c < C
        best = tl.full([BC], float("-inf"), ACC)
        cnt = tl.zeros([BC], tl.int32)
        win = tl.full([BC], -1, tl.int32)
        nan = tl.zeros([BC], tl.int32)
        for s in range(e0, e1, BE):
            e = s + tl.arange(0, BE)
            em = e < e1
            m2 = em[:, None] & cm[None, :]
            row = tl.load(src_ptr + e, mask=em, other=0)
            m = _message(x_ptr, row, e, m2, c, C, d, attr_ptr, wt_ptr, bias_ptr, MODE, HAS_BIAS, ACC)
            isnan = m2 & (m != m)
            mm = tl.where(m2 & (m == m), m, float("-inf"))
            tmax = tl.max(mm, axis=0)
            eq = m2 & (mm == tmax[None, :])
            tcnt = tl.sum(eq.to(tl.int32), axis=0)
            off = (e - e0).to(tl.int32)
            twin = tl.min(tl.where(eq, off[:, None], 2147483647), axis=0)
            gt = tmax > best
            cnt = tl.where(gt, tcnt, tl.where(tmax == best, cnt + tcnt, cnt))
            win = tl.where(gt, twin, win)
            best = tl.where(gt, tmax, best)
            nan = tl.maximum(nan, tl.max(isnan.to(tl.int32), axis=0))
        return best, cnt, win, nan

    @triton.jit
    def _gen_max_fwd_kernel(
        x_ptr, ptr_ptr, src_ptr, attr_ptr, wt_ptr, bias_ptr, eps_ptr,
        out_ptr, arg_ptr, tied_ptr, count_ptr, C, d,
        MODE: tl.constexpr, HAS_BIAS: tl.constexpr, COUNT: tl.constexpr, ACC: tl.constexpr,
        BE: tl.constexpr, BC: tl.constexpr,
    ):  # fmt: skip
        i = tl.program_id(0).to(tl.int64)
        e0 = tl.load(ptr_ptr + i)
        e1 = tl.load(ptr_ptr + i + 1)
        c = tl.arange(0, BC)
        cm = c < C
        best, cnt, win, nan = _row_stats(
            x_ptr, src_ptr, attr_ptr, wt_ptr, bias_ptr, e0, e1, c, C, d, MODE, HAS_BIAS, ACC, BE, BC
        )
        eps = tl.load(eps_ptr).to(ACC)
        isnan = nan != 0
        pos = (best > 0) & (~isnan)
        v = tl.where(isnan, float("nan"), best)
        o = tl.where(pos | isnan, v, 0.0) + eps
        o = tl.where(e1 > e0, o, 0.0)
        tl.store(out_ptr + i * C + c, _cast(o, out_ptr.dtype.element_ty), mask=cm)
        tl.store(arg_ptr + i * C + c, tl.where(pos, win, -1), mask=cm)
        tie = tl.max(tl.where(cm & pos & (cnt > 1), 1, 0), axis=0)
        tl.store(tied_ptr + i, tie.to(tl.uint8))
        if COUNT:
            n = tl.where(tie != 0, tl.where(best > 0, cnt, 0), tl.where(pos, 1, 0))
            tl.store(count_ptr + i * C + c, _cast(n, count_ptr.dtype.element_ty), mask=cm)

    @triton.jit
    def _tie_stats_kernel(
        slot_ptr, grad_ptr, x_ptr, ptr_ptr, src_ptr, attr_ptr, wt_ptr, bias_ptr,
        best_ptr, share_ptr, C, d,
        MODE: tl.constexpr, HAS_BIAS: tl.constexpr, ACC: tl.constexpr, BE: tl.constexpr,
        BC: tl.constexpr,
    ):  # fmt: skip
        """Per node: if tied, its NaN-free maxima and each tied edge's share g / n (0 where the
        maximum is <= 0); an untied node walks no edges (and its row is never read)."""
        i = tl.program_id(0).to(tl.int64)
        e0 = tl.load(ptr_ptr + i)
        e1 = tl.load(ptr_ptr + i + 1)
        e1 = tl.where(tl.load(slot_ptr + i) >= 0, e1, e0)
        c = tl.arange(0, BC)
        cm = c < C
        best, cnt, win, nan = _row_stats(
            x_ptr, src_ptr, attr_ptr, wt_ptr, bias_ptr, e0, e1, c, C, d, MODE, HAS_BIAS, ACC, BE, BC
        )
        g = tl.load(grad_ptr + i * C + c, mask=cm, other=0.0).to(ACC)
        share = tl.where(best > 0, g / tl.maximum(cnt, 1).to(ACC), 0.0)
        tl.store(best_ptr + i * C + c, best, mask=cm)
        tl.store(share_ptr + i * C + c, share, mask=cm)

    @triton.jit
    def _edge_grad(
        grad_ptr, arg_ptr, slot_ptr, best_ptr, share_ptr, x_ptr, row, e, k, i, m2, c, C, d,
        attr_ptr, wt_ptr, bias_ptr, MODE: tl.constexpr, HAS_BIAS: tl.constexpr,
        HAS_TIES: tl.constexpr, ACC: tl.constexpr,
    ):  # fmt: skip
        """Gradient [BE, BC] of the messages of edges ``e`` (offset ``k`` in the segment of their
        destination ``i``, from source rows ``row``): g at an untied node's winner, the share at
        a tied node's tied edges, else 0."""
        if HAS_TIES:
            slot = tl.load(slot_ptr + i, mask=tl.max(m2.to(tl.int32), axis=1) > 0, other=-1).to(tl.int64)
        else:
            slot = tl.zeros_like(k).to(tl.int64) - 1
        um = m2 & (slot < 0)[:, None]
        a = tl.load(arg_ptr + i[:, None] * C + c[None, :], mask=um, other=-1)
        g = tl.load(grad_ptr + i[:, None] * C + c[None, :], mask=um, other=0.0).to(ACC)
        out = tl.where(a == k[:, None], g, 0.0)
        if HAS_TIES:
            tm = m2 & (slot >= 0)[:, None]
            msg = _message(x_ptr, row, e, tm, c, C, d, attr_ptr, wt_ptr, bias_ptr, MODE, HAS_BIAS, ACC)
            best = tl.load(best_ptr + slot[:, None] * C + c[None, :], mask=tm, other=0.0)
            share = tl.load(share_ptr + slot[:, None] * C + c[None, :], mask=tm, other=0.0)
            out = tl.where(tm & (best > 0) & (msg == best), share, out)
        return out

    @triton.jit
    def _grad_src_kernel(
        grad_ptr, arg_ptr, slot_ptr, best_ptr, share_ptr, x_ptr, ptr_ptr, sptr_ptr, sperm_ptr,
        sdst_ptr, attr_ptr, wt_ptr, bias_ptr, gx_ptr, C, d,
        MODE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_TIES: tl.constexpr, ACC: tl.constexpr,
        BE: tl.constexpr, BC: tl.constexpr,
    ):  # fmt: skip
        """grad_x of source row j: a gather over j's out-edges (source-sorted order)."""
        j = tl.program_id(0).to(tl.int64)
        o0 = tl.load(sptr_ptr + j)
        o1 = tl.load(sptr_ptr + j + 1)
        c = tl.arange(0, BC)
        cm = c < C
        acc = tl.zeros([BC], ACC)
        for s in range(o0, o1, BE):
            o = s + tl.arange(0, BE)
            om = o < o1
            m2 = om[:, None] & cm[None, :]
            e = tl.load(sperm_ptr + o, mask=om, other=0).to(tl.int64)
            i = tl.load(sdst_ptr + o, mask=om, other=0).to(tl.int64)
            k = (e - tl.load(ptr_ptr + i, mask=om, other=0)).to(tl.int32)
            row = tl.zeros_like(e) + j
            contrib = _edge_grad(
                grad_ptr, arg_ptr, slot_ptr, best_ptr, share_ptr, x_ptr, row, e, k, i, m2, c, C, d,
                attr_ptr, wt_ptr, bias_ptr, MODE, HAS_BIAS, HAS_TIES, ACC,
            )  # fmt: skip
            acc += tl.sum(contrib, axis=0)
        tl.store(gx_ptr + j * C + c, _cast(acc, gx_ptr.dtype.element_ty), mask=cm)

    @triton.jit
    def _grad_dst_kernel(
        grad_ptr, arg_ptr, slot_ptr, best_ptr, share_ptr, x_ptr, ptr_ptr, src_ptr,
        attr_ptr, wt_ptr, bias_ptr, ga_ptr, gw_ptr, gb_ptr, N, C, d,
        MODE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_TIES: tl.constexpr,
        NEED_A: tl.constexpr, NEED_W: tl.constexpr, NEED_B: tl.constexpr, ACC: tl.constexpr,
        NB: tl.constexpr, BE: tl.constexpr, BC: tl.constexpr, BD: tl.constexpr,
    ):  # fmt: skip
        """Per block of NB destination nodes: the edge-feature gradient of their edges and the
        block's partial sums of grad_W [C, d] and grad_b [C]. An untied node's W/b terms come from
        its winners alone (one gathered raw row per channel: O(C d)); its edges are walked only
        for the edge-feature gradient. A tied node's edges are walked (messages recomputed)."""
        blk = tl.program_id(0).to(tl.int64)
        c = tl.arange(0, BC)
        cm = c < C
        kk = tl.arange(0, BD)
        km = kk < d
        gw = tl.zeros([BC, BD], ACC)
        gb = tl.zeros([BC], ACC)
        for ii in range(NB):
            node = blk * NB + ii
            ok = node < N
            e0 = tl.load(ptr_ptr + node, mask=ok, other=0)
            e1 = tl.load(ptr_ptr + node + 1, mask=ok, other=0)
            if HAS_TIES:
                slot = tl.load(slot_ptr + node, mask=ok, other=-1)
            else:
                slot = tl.zeros_like(e0) - 1
            tied = slot >= 0
            if NEED_W or NEED_B:  # untied: the winners only
                um = cm & _spread(ok & (slot < 0), c)
                a = tl.load(arg_ptr + node * C + c, mask=um, other=-1)
                won = um & (a >= 0)
                g = tl.where(won, tl.load(grad_ptr + node * C + c, mask=won, other=0.0).to(ACC), 0.0)
                if NEED_B:
                    gb += g
                if NEED_W:
                    we = e0 + a.to(tl.int64)
                    wraw = tl.load(
                        attr_ptr + we[:, None] * d + kk[None, :], mask=won[:, None] & km[None, :], other=0.0
                    ).to(ACC)
                    gw += g[:, None] * wraw
            if NEED_A:
                e_end = e1
            else:
                e_end = tl.where(tied, e1, e0)
            for s in range(e0, e_end, BE):
                e = s + tl.arange(0, BE)
                em = e < e1
                m2 = em[:, None] & cm[None, :]
                row = tl.load(src_ptr + e, mask=em, other=0)
                i = tl.zeros_like(e) + node
                k = (e - e0).to(tl.int32)
                contrib = _edge_grad(
                    grad_ptr, arg_ptr, slot_ptr, best_ptr, share_ptr, x_ptr, row, e, k, i, m2, c, C,
                    d, attr_ptr, wt_ptr, bias_ptr, MODE, HAS_BIAS, HAS_TIES, ACC,
                )  # fmt: skip
                if NEED_A:
                    if MODE == 2:
                        for q in range(d):
                            wq = tl.load(wt_ptr + q * C + c, mask=cm, other=0.0).to(ACC)
                            gq = tl.sum(contrib * wq[None, :], axis=1)
                            tl.store(ga_ptr + e * d + q, _cast(gq, ga_ptr.dtype.element_ty), mask=em)
                    else:
                        tl.store(
                            ga_ptr + e[:, None] * C + c[None, :],
                            _cast(contrib, ga_ptr.dtype.element_ty),
                            mask=m2,
                        )
                if HAS_TIES and (NEED_W or NEED_B):  # tied nodes' terms (untied ones: above)
                    ct = tl.where(tied, contrib, 0.0)
                    if NEED_W:
                        raw = tl.load(
                            attr_ptr + e[:, None] * d + kk[None, :],
                            mask=em[:, None] & (km & _spread(tied, kk))[None, :],
                            other=0.0,
                        ).to(ACC)
                        gw += tl.sum(ct[:, :, None] * raw[:, None, :], axis=0)
                    if NEED_B:
                        gb += tl.sum(ct, axis=0)
        if NEED_W:
            tl.store(gw_ptr + blk * C * d + c[:, None] * d + kk[None, :], gw, mask=cm[:, None] & km[None, :])
        if NEED_B:
            tl.store(gb_ptr + blk * C + c, gb, mask=cm)

    @triton.jit
    def _ln_mask(ptrs, m2, s_ptr, BOOL_MASK: tl.constexpr, ACC: tl.constexpr):
        """The mask's values: loaded (typed like x), or the scale where a bool mask keeps."""
        if BOOL_MASK:
            keep = tl.load(ptrs, mask=m2, other=0) != 0
            return tl.where(keep, tl.load(s_ptr).to(ACC), 0.0)
        return tl.load(ptrs, mask=m2, other=0.0).to(ACC)

    @triton.jit
    def _ln_fwd_kernel(
        x_ptr, ldx, w_ptr, b_ptr, m_ptr, ldm, s_ptr, eps_ptr, out_ptr, mean_ptr, rstd_ptr, N, C,
        HAS_MASK: tl.constexpr, BOOL_MASK: tl.constexpr, ACC: tl.constexpr, BR: tl.constexpr,
        BC: tl.constexpr,
    ):  # fmt: skip
        r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
        c = tl.arange(0, BC)
        rm = r < N
        cm = c < C
        m2 = rm[:, None] & cm[None, :]
        x = tl.load(x_ptr + r[:, None] * ldx + c[None, :], mask=m2, other=0.0).to(ACC)
        mu = tl.sum(x, axis=1) / C
        dx = tl.where(m2, x - mu[:, None], 0.0)
        var = tl.sum(dx * dx, axis=1) / C
        eps = tl.load(eps_ptr).to(ACC)
        rstd = 1.0 / tl.sqrt(var + eps)
        w = tl.load(w_ptr + c, mask=cm, other=0.0).to(ACC)
        b = tl.load(b_ptr + c, mask=cm, other=0.0).to(ACC)
        y = dx * rstd[:, None] * w[None, :] + b[None, :]
        h = tl.where(y < 0, 0.0, y)  # NaN passes, as torch.relu
        if HAS_MASK:
            h = h * _ln_mask(m_ptr + r[:, None] * ldm + c[None, :], m2, s_ptr, BOOL_MASK, ACC)
        tl.store(out_ptr + r[:, None] * C + c[None, :], _cast(h, out_ptr.dtype.element_ty), mask=m2)
        tl.store(mean_ptr + r, mu.to(mean_ptr.dtype.element_ty), mask=rm)
        tl.store(rstd_ptr + r, rstd.to(rstd_ptr.dtype.element_ty), mask=rm)

    @triton.jit
    def _ln_bwd_kernel(
        go_ptr, x_ptr, ldx, w_ptr, b_ptr, m_ptr, ldm, s_ptr, mean_ptr, rstd_ptr, gx_ptr, gw_ptr,
        gb_ptr, N, C, HAS_MASK: tl.constexpr, BOOL_MASK: tl.constexpr, NEED_X: tl.constexpr,
        NEED_W: tl.constexpr, NEED_B: tl.constexpr, ACC: tl.constexpr, ROWS: tl.constexpr, BR: tl.constexpr,
        BC: tl.constexpr,
    ):  # fmt: skip
        blk = tl.program_id(0).to(tl.int64)
        c = tl.arange(0, BC)
        cm = c < C
        w = tl.load(w_ptr + c, mask=cm, other=0.0).to(ACC)
        b = tl.load(b_ptr + c, mask=cm, other=0.0).to(ACC)
        gw = tl.zeros([BC], ACC)
        gb = tl.zeros([BC], ACC)
        for r0 in range(0, ROWS, BR):
            r = blk * ROWS + r0 + tl.arange(0, BR)
            rm = r < N
            m2 = rm[:, None] & cm[None, :]
            x = tl.load(x_ptr + r[:, None] * ldx + c[None, :], mask=m2, other=0.0).to(ACC)
            mu = tl.load(mean_ptr + r, mask=rm, other=0.0).to(ACC)
            rs = tl.load(rstd_ptr + r, mask=rm, other=0.0).to(ACC)
            xhat = (x - mu[:, None]) * rs[:, None]
            y = xhat * w[None, :] + b[None, :]
            g = tl.load(go_ptr + r[:, None] * C + c[None, :], mask=m2, other=0.0).to(ACC)
            if HAS_MASK:
                g = g * _ln_mask(m_ptr + r[:, None] * ldm + c[None, :], m2, s_ptr, BOOL_MASK, ACC)
            g = tl.where(m2 & ~(y <= 0), g, 0.0)  # NaN passes, as torch's ReLU backward
            xhat = tl.where(m2, xhat, 0.0)
            if NEED_W:
                gw += tl.sum(g * xhat, axis=0)
            if NEED_B:
                gb += tl.sum(g, axis=0)
            if NEED_X:
                dxh = g * w[None, :]
                a1 = tl.sum(dxh, axis=1) / C
                a2 = tl.sum(dxh * xhat, axis=1) / C
                gx = (dxh - a1[:, None] - xhat * a2[:, None]) * rs[:, None]
                tl.store(gx_ptr + r[:, None] * C + c[None, :], _cast(gx, gx_ptr.dtype.element_ty), mask=m2)
        if NEED_W:
            tl.store(gw_ptr + blk * C + c, gw, mask=cm)
        if NEED_B:
            tl.store(gb_ptr + blk * C + c, gb, mask=cm)

    # ---- GEN sum / mean / softmax (issue #33 b)

    @triton.jit
    def _gen_aggr_fwd_kernel(
        x_ptr, ptr_ptr, src_ptr, attr_ptr, wt_ptr, bias_ptr, t_ptr, eps_ptr,
        out_ptr, top_ptr, den_ptr, C, d,
        MODE: tl.constexpr, HAS_BIAS: tl.constexpr, REDUCE: tl.constexpr, ACC: tl.constexpr,
        BE: tl.constexpr, BC: tl.constexpr,
    ):  # fmt: skip
        """One destination node: sum, mean or online softmax (running maximum, denominator and
        numerator, rescaled per tile of BE edges) of its messages."""
        i = tl.program_id(0).to(tl.int64)
        e0 = tl.load(ptr_ptr + i)
        e1 = tl.load(ptr_ptr + i + 1)
        c = tl.arange(0, BC)
        cm = c < C
        eps = tl.load(eps_ptr).to(ACC)
        temp = tl.load(t_ptr).to(ACC)
        acc = tl.zeros([BC], ACC)
        mx = tl.full([BC], float("-inf"), ACC)
        dn = tl.zeros([BC], ACC)
        for s in range(e0, e1, BE):
            e = s + tl.arange(0, BE)
            em = e < e1
            m2 = em[:, None] & cm[None, :]
            row = tl.load(src_ptr + e, mask=em, other=0)
            pre = _message(x_ptr, row, e, m2, c, C, d, attr_ptr, wt_ptr, bias_ptr, MODE, HAS_BIAS, ACC)
            m = tl.where(pre < 0, 0.0, pre) + eps  # NaN passes, as torch.relu
            if REDUCE == 2:
                sc = tl.where(m2, m * temp, float("-inf"))
                hi = tl.maximum(mx, tl.max(sc, axis=0))
                ref = tl.where(hi == float("-inf"), 0.0, hi)  # masked lanes: no -inf - -inf
                rescale = tl.exp(mx - ref)
                p = tl.where(m2, tl.exp(sc - ref[None, :]), 0.0)
                dn = dn * rescale + tl.sum(p, axis=0)
                acc = acc * rescale + tl.sum(p * m, axis=0)
                mx = hi
            else:
                acc += tl.sum(tl.where(m2, m, 0.0), axis=0)
        if REDUCE == 2:
            dn = dn + 1e-16  # PyG's softmax floor
            tl.store(top_ptr + i * C + c, mx.to(top_ptr.dtype.element_ty), mask=cm)
            tl.store(den_ptr + i * C + c, dn.to(den_ptr.dtype.element_ty), mask=cm)
            o = acc / dn
        elif REDUCE == 1:
            o = acc / tl.maximum(e1 - e0, 1).to(ACC)
        else:
            o = acc
        tl.store(out_ptr + i * C + c, o.to(out_ptr.dtype.element_ty), mask=cm)

    @triton.jit
    def _gen_aggr_edge_grad(
        grad_ptr, out_ptr, top_ptr, den_ptr, ptr_ptr, x_ptr, row, e, i, em, m2, c, C, d,
        attr_ptr, wt_ptr, bias_ptr, eps, temp,
        MODE: tl.constexpr, HAS_BIAS: tl.constexpr, REDUCE: tl.constexpr, ACC: tl.constexpr,
    ):  # fmt: skip
        """Per edge and channel [BE, BC]: the gradient of the pre-activation and the temperature's
        term g a (m - o)^2 (zero but for softmax)."""
        pre = _message(x_ptr, row, e, m2, c, C, d, attr_ptr, wt_ptr, bias_ptr, MODE, HAS_BIAS, ACC)
        at = i[:, None] * C + c[None, :]
        g = tl.load(grad_ptr + at, mask=m2, other=0.0).to(ACC)
        tg = tl.zeros_like(g)
        if REDUCE == 2:
            m = tl.where(pre < 0, 0.0, pre) + eps
            mi = tl.load(top_ptr + at, mask=m2, other=0.0).to(ACC)
            di = tl.load(den_ptr + at, mask=m2, other=1.0).to(ACC)
            oi = tl.load(out_ptr + at, mask=m2, other=0.0).to(ACC)
            ga = tl.where(m2, g * (tl.exp(temp * m - mi) / di), 0.0)
            centred = m - oi
            tg = ga * centred * centred
            g = ga * (1.0 + temp * centred)
        elif REDUCE == 1:
            deg = tl.load(ptr_ptr + i + 1, mask=em, other=1) - tl.load(ptr_ptr + i, mask=em, other=0)
            g = g / tl.maximum(deg, 1).to(ACC)[:, None]
        return tl.where(m2 & (pre > 0), g, 0.0), tg

    @triton.jit
    def _gen_aggr_src_kernel(
        grad_ptr, out_ptr, top_ptr, den_ptr, x_ptr, ptr_ptr, sptr_ptr, sperm_ptr, sdst_ptr,
        attr_ptr, wt_ptr, bias_ptr, t_ptr, eps_ptr, gx_ptr, C, d,
        MODE: tl.constexpr, HAS_BIAS: tl.constexpr, REDUCE: tl.constexpr, ACC: tl.constexpr,
        BE: tl.constexpr, BC: tl.constexpr,
    ):  # fmt: skip
        """grad_x of source row j: a gather over j's out-edges (source order, fixed)."""
        j = tl.program_id(0).to(tl.int64)
        o0 = tl.load(sptr_ptr + j)
        o1 = tl.load(sptr_ptr + j + 1)
        c = tl.arange(0, BC)
        cm = c < C
        eps = tl.load(eps_ptr).to(ACC)
        temp = tl.load(t_ptr).to(ACC)
        acc = tl.zeros([BC], ACC)
        for s in range(o0, o1, BE):
            o = s + tl.arange(0, BE)
            om = o < o1
            m2 = om[:, None] & cm[None, :]
            e = tl.load(sperm_ptr + o, mask=om, other=0).to(tl.int64)
            i = tl.load(sdst_ptr + o, mask=om, other=0).to(tl.int64)
            row = tl.zeros_like(e) + j
            gp, _ = _gen_aggr_edge_grad(
                grad_ptr, out_ptr, top_ptr, den_ptr, ptr_ptr, x_ptr, row, e, i, om, m2, c, C, d,
                attr_ptr, wt_ptr, bias_ptr, eps, temp, MODE, HAS_BIAS, REDUCE, ACC,
            )  # fmt: skip
            acc += tl.sum(gp, axis=0)
        tl.store(gx_ptr + j * C + c, acc.to(gx_ptr.dtype.element_ty), mask=cm)

    @triton.jit
    def _gen_aggr_dst_kernel(
        grad_ptr, out_ptr, top_ptr, den_ptr, x_ptr, ptr_ptr, src_ptr, attr_ptr, wt_ptr, bias_ptr,
        t_ptr, eps_ptr, ga_ptr, gw_ptr, gb_ptr, gt_ptr, N, C, d,
        MODE: tl.constexpr, HAS_BIAS: tl.constexpr, REDUCE: tl.constexpr,
        NEED_A: tl.constexpr, NEED_W: tl.constexpr, NEED_B: tl.constexpr, NEED_T: tl.constexpr,
        ACC: tl.constexpr, NB: tl.constexpr, BE: tl.constexpr, BC: tl.constexpr, BD: tl.constexpr,
    ):  # fmt: skip
        """Per block of NB destination nodes: the edge-feature gradient of their edges and the
        block's partial sums of grad_W [C, d], grad_b [C] and the temperature's terms [C]."""
        blk = tl.program_id(0).to(tl.int64)
        c = tl.arange(0, BC)
        cm = c < C
        kk = tl.arange(0, BD)
        km = kk < d
        eps = tl.load(eps_ptr).to(ACC)
        temp = tl.load(t_ptr).to(ACC)
        gw = tl.zeros([BC, BD], ACC)
        gb = tl.zeros([BC], ACC)
        gt = tl.zeros([BC], ACC)
        for ii in range(NB):
            node = blk * NB + ii
            ok = node < N
            e0 = tl.load(ptr_ptr + node, mask=ok, other=0)
            e1 = tl.load(ptr_ptr + node + 1, mask=ok, other=0)
            for s in range(e0, e1, BE):
                e = s + tl.arange(0, BE)
                em = e < e1
                m2 = em[:, None] & cm[None, :]
                row = tl.load(src_ptr + e, mask=em, other=0)
                i = tl.zeros_like(e) + node
                gp, tg = _gen_aggr_edge_grad(
                    grad_ptr, out_ptr, top_ptr, den_ptr, ptr_ptr, x_ptr, row, e, i, em, m2, c, C, d,
                    attr_ptr, wt_ptr, bias_ptr, eps, temp, MODE, HAS_BIAS, REDUCE, ACC,
                )  # fmt: skip
                if NEED_A:
                    if MODE == 2:
                        for q in range(d):
                            wq = tl.load(wt_ptr + q * C + c, mask=cm, other=0.0).to(ACC)
                            gq = tl.sum(gp * wq[None, :], axis=1)
                            tl.store(ga_ptr + e * d + q, gq.to(ga_ptr.dtype.element_ty), mask=em)
                    else:
                        tl.store(
                            ga_ptr + e[:, None] * C + c[None, :], gp.to(ga_ptr.dtype.element_ty), mask=m2
                        )
                if NEED_W:
                    raw = tl.load(
                        attr_ptr + e[:, None] * d + kk[None, :], mask=em[:, None] & km[None, :], other=0.0
                    ).to(ACC)
                    gw += tl.sum(gp[:, :, None] * raw[:, None, :], axis=0)
                if NEED_B:
                    gb += tl.sum(gp, axis=0)
                if NEED_T:
                    gt += tl.sum(tg, axis=0)
        if NEED_W:
            tl.store(gw_ptr + blk * C * d + c[:, None] * d + kk[None, :], gw, mask=cm[:, None] & km[None, :])
        if NEED_B:
            tl.store(gb_ptr + blk * C + c, gb, mask=cm)
        if NEED_T:
            tl.store(gt_ptr + blk * C + c, gt, mask=cm)


_FLOATS = (torch.float32, torch.float64, torch.bfloat16)
#: the kernels run through Triton's interpreter (``TRITON_INTERPRET=1`` when this was imported):
#: they then take CPU tensors, and only CPU tensors
INTERPRETED = AVAILABLE and type(_gen_max_fwd_kernel).__name__ == "InterpretedFunction"


#: launch through :func:`torch.library.wrap_triton` (set True when these functions are the body of
#: a ``torch.library.triton_op``, so that ``torch.compile`` sees the kernels); plain launches by
#: default
WRAP_TRITON = False


def _launch(kernel):
    return torch.library.wrap_triton(kernel) if WRAP_TRITON else kernel


def _require(x: Tensor) -> None:
    if not AVAILABLE:
        raise RuntimeError("revgnn.nn.triton_kernels needs Triton (pip install triton)")
    if (x.device.type == "cpu") != INTERPRETED:
        raise RuntimeError(
            "revgnn.nn.triton_kernels: CPU tensors need TRITON_INTERPRET=1 set before this module is "
            "imported (Triton's interpreter); compiled kernels need CUDA tensors"
            if x.device.type == "cpu"
            else "revgnn.nn.triton_kernels was imported with TRITON_INTERPRET=1: it takes CPU tensors only"
        )


def _acc(dtype: torch.dtype):
    """Accumulation dtype: float64 for float64, float32 otherwise (bf16 accumulates in float32)."""
    return (tl.float64, torch.float64) if dtype == torch.float64 else (tl.float32, torch.float32)


def _pow2(n: int, least: int = 16) -> int:
    return max(least, triton.next_power_of_2(max(1, int(n))))


def _edge_block(bc: int, budget: int = 2048) -> int:
    """Edges per tile: about ``budget`` elements of [BE, BC] (at least 2)."""
    return max(2, min(64, budget // bc))


def _mode(attr: Optional[Tensor], wt: Optional[Tensor]) -> int:
    if attr is None:
        return _NONE
    return _FACTORED if wt is not None else _DENSE


def _check(x, ptr, src, attr, wt, bias, square: bool) -> None:
    _require(x)
    if x.dim() != 2 or not x.is_contiguous() or x.dtype not in _FLOATS:
        raise RuntimeError("gen_max: x must be a contiguous [N, C] float32/float64/bfloat16 tensor")
    if (
        ptr.dtype != torch.long
        or src.dtype != torch.long
        or not ptr.is_contiguous()
        or not src.is_contiguous()
    ):
        raise RuntimeError("gen_max: ptr and src must be contiguous int64")
    if ptr.numel() < 1 or (square and ptr.numel() != x.size(0) + 1):
        raise RuntimeError("gen_max: ptr must have N + 1 entries")
    if attr is not None:
        if (
            attr.dtype != x.dtype
            or not attr.is_contiguous()
            or attr.dim() != 2
            or attr.size(0) != src.numel()
        ):
            raise RuntimeError("gen_max: edge features must be a contiguous [E, *] tensor of x's dtype")
        if wt is not None:
            if (
                wt.dtype != x.dtype
                or not wt.is_contiguous()
                or wt.dim() != 2
                or tuple(wt.shape)
                != (
                    attr.size(1),
                    x.size(1),
                )
            ):
                raise RuntimeError("gen_max: W^T must be a contiguous [d, C] tensor")
            if bias is not None and (
                bias.dtype != x.dtype or not bias.is_contiguous() or bias.numel() != x.size(1)
            ):
                raise RuntimeError("gen_max: bias must be a contiguous [C] tensor")
        elif attr.size(1) != x.size(1):
            raise RuntimeError("gen_max: dense edge features must be [E, C]")


def _scalar(value: float, dtype: torch.dtype, device) -> Tensor:
    """A scalar argument (eps, a mask's scale) as a one-element tensor in the accumulation type (a
    float64 input gets it in float64, not as Triton's float32 scalar argument)."""
    return torch.full((1,), float(value), dtype=_acc(dtype)[1], device=device)


_eps = _scalar


def _forward(x, ptr, src, attr, wt, bias, eps: float, count: bool):
    N, C = ptr.numel() - 1, x.size(1)
    mode = _mode(attr, wt)
    out = torch.empty((N, C), dtype=x.dtype, device=x.device)
    arg = torch.empty((N, C), dtype=torch.int32, device=x.device)
    tied = torch.empty((N,), dtype=torch.uint8, device=x.device)
    cnt = torch.empty((N, C), dtype=x.dtype, device=x.device) if count else out
    if N > 0:
        bc = _pow2(C)
        acc, _ = _acc(x.dtype)
        _launch(_gen_max_fwd_kernel)[(N,)](
            x, ptr, src, attr if attr is not None else x, wt if wt is not None else x,
            bias if bias is not None else x, _eps(eps, x.dtype, x.device), out, arg, tied, cnt,
            C, attr.size(1) if mode == _FACTORED else 0,
            MODE=mode, HAS_BIAS=bias is not None and mode == _FACTORED, COUNT=count, ACC=acc,
            BE=_edge_block(bc), BC=bc,
        )  # fmt: skip
    return out, arg, tied, cnt


def gen_max_forward(
    x: Tensor,
    ptr: Tensor,
    src: Tensor,
    attr: Optional[Tensor],
    wt: Optional[Tensor],
    bias: Optional[Tensor],
    eps: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(out [N, C], arg [N, C] int32, tied [N] uint8)``, as ``kernels.load("gen_max").forward``."""
    _check(x, ptr, src, attr, wt, bias, True)
    out, arg, tied, _ = _forward(x, ptr, src, attr, wt, bias, eps, False)
    return out, arg, tied


def gen_max_shard_forward(
    x: Tensor, ptr: Tensor, src: Tensor, attr: Optional[Tensor], wt: Optional[Tensor], bias: Optional[Tensor]
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(max [N, C], arg, tied, count [N, C])`` over one SAR shard (``N = ptr.numel() - 1``, any
    number of rows of ``x``, no eps), as ``kernels.load("gen_max").shard_forward``."""
    _check(x, ptr, src, attr, wt, bias, False)
    return _forward(x, ptr, src, attr, wt, bias, 0.0, True)


_ORDER_CACHE: list = []  # [(key, tensors kept alive, result)], most recent last
_ORDER_CACHE_SIZE = 4


def source_order(ptr: Tensor, src: Tensor, rows: int) -> Tuple[Tensor, Tensor, Tensor]:
    """The edges in source order: ``(sptr [rows + 1] int64, sperm [E], sdst [E])``, where
    ``sperm[o]`` is the destination-order index of the ``o``-th edge by (source, edge index) and
    ``sdst[o]`` its destination; int32 when the graph fits, else int64. Cached for the last few
    graphs (by storage, version and shape), since every layer of a model uses the same one; not
    cached while ``torch.compile`` traces (no storage there). Shapes depend on the sizes only."""
    key = None
    if not torch.compiler.is_compiling():
        key = (src.data_ptr(), src.numel(), src._version, ptr.data_ptr(), ptr.numel(), ptr._version, rows)
        key += (src.device,)
        for k, _, value in _ORDER_CACHE:
            if k == key:
                return value
    N, E = ptr.numel() - 1, src.numel()
    index = torch.int32 if max(E, N, rows) < _INT32_MAX else torch.int64
    keys, sperm = torch.sort(src, stable=True)
    sptr = torch.searchsorted(keys, torch.arange(rows + 1, dtype=keys.dtype, device=src.device))
    del keys
    dst = torch.repeat_interleave(torch.arange(N, device=src.device), ptr.diff(), output_size=E)
    sdst = dst.index_select(0, sperm).to(index)
    del dst
    sperm = sperm.to(index)
    value = (sptr, sperm, sdst)
    if key is None:
        return value
    _ORDER_CACHE.append((key, (ptr, src), value))
    del _ORDER_CACHE[:-_ORDER_CACHE_SIZE]
    return value


def _backward(grad, arg, tied, x, ptr, src, attr, wt, bias, need_x, need_attr, need_w, need_b):
    N, C, rows = ptr.numel() - 1, x.size(1), x.size(0)
    mode = _mode(attr, wt)
    d = attr.size(1) if mode == _FACTORED else 0
    has_bias = bias is not None and mode == _FACTORED
    dev, dt = x.device, x.dtype
    acc, acc_t = _acc(dt)
    need_attr = bool(need_attr) and mode != _NONE
    need_w = bool(need_w) and mode == _FACTORED
    need_b = bool(need_b) and has_bias
    gx = torch.empty((rows, C), dtype=dt, device=dev) if need_x else None
    ga = torch.empty_like(attr) if need_attr else None
    gw = gb = None
    dummy = x
    bc = _pow2(C)
    be = _edge_block(bc)
    common = dict(MODE=mode, HAS_BIAS=has_bias, ACC=acc, BC=bc)
    a_ = attr if attr is not None else dummy
    w_ = wt if wt is not None else dummy
    b_ = bias if has_bias else dummy
    # tied nodes: their NaN-free maxima and each tied edge's share, [N, C] (static shapes and
    # no host synchronisation: nothing here depends on how many nodes are tied)
    has_ties = N > 0
    if has_ties:
        slot = torch.where(
            tied.view(-1) != 0,
            torch.arange(N, dtype=torch.int32, device=dev),
            torch.full((), -1, dtype=torch.int32, device=dev),
        )
        best = torch.empty((N, C), dtype=acc_t, device=dev)
        share = torch.empty((N, C), dtype=acc_t, device=dev)
        _launch(_tie_stats_kernel)[(N,)](
            slot, grad, x, ptr, src, a_, w_, b_, best, share, C, d, BE=be, **common
        )  # fmt: skip
    else:
        slot = best = share = dummy
    if need_x and rows > 0:
        sptr, sperm, sdst = source_order(ptr, src, rows)
        _launch(_grad_src_kernel)[(rows,)](
            grad, arg, slot, best, share, x, ptr, sptr, sperm, sdst, a_, w_, b_, gx, C, d,
            HAS_TIES=has_ties, BE=be, **common,
        )  # fmt: skip
    if need_attr or need_w or need_b:
        blocks = max(1, math.ceil(N / NODE_BLOCK))
        bd = _pow2(d, 2) if mode == _FACTORED else 2
        be_w = max(2, min(be, 8192 // (bc * bd))) if need_w else be
        gw_part = torch.empty((blocks, C, d), dtype=acc_t, device=dev) if need_w else dummy
        gb_part = torch.empty((blocks, C), dtype=acc_t, device=dev) if need_b else dummy
        if N > 0:
            _launch(_grad_dst_kernel)[(blocks,)](
                grad, arg, slot, best, share, x, ptr, src, a_, w_, b_,
                ga if need_attr else dummy, gw_part, gb_part, N, C, d,
                HAS_TIES=has_ties, NEED_A=need_attr, NEED_W=need_w, NEED_B=need_b,
                NB=NODE_BLOCK, BE=be_w, BD=bd, **common,
            )  # fmt: skip
        elif need_w or need_b:
            gw_part = gw_part.zero_() if need_w else gw_part
            gb_part = gb_part.zero_() if need_b else gb_part
        if need_w:
            gw = gw_part.sum(0).to(dt)
        if need_b:
            gb = gb_part.sum(0).to(dt)
    if need_x and rows == 0:
        gx = torch.zeros((0, C), dtype=dt, device=dev)
    return gx, ga, gw, gb


def gen_max_backward(
    grad: Tensor,
    arg: Tensor,
    tied: Tensor,
    x: Tensor,
    ptr: Tensor,
    src: Tensor,
    attr: Optional[Tensor],
    wt: Optional[Tensor],
    bias: Optional[Tensor],
    need_x: bool,
    need_attr: bool,
    need_w: bool,
    need_b: bool,
):
    """``(grad_x [N, C], grad_attr, grad_w [C, d], grad_b [C])``, each :obj:`None` where not needed
    or not applicable (as the C++ kernel's undefined tensors), as ``kernels.load("gen_max").backward``."""
    _check(x, ptr, src, attr, wt, bias, True)
    if grad.shape != x.shape or not grad.is_contiguous() or grad.dtype != x.dtype:
        raise RuntimeError("gen_max: grad must be contiguous and shaped like x")
    return _backward(grad, arg, tied, x, ptr, src, attr, wt, bias, need_x, need_attr, need_w, need_b)


def gen_max_shard_backward(
    grad: Tensor,
    arg: Tensor,
    tied: Tensor,
    x: Tensor,
    ptr: Tensor,
    src: Tensor,
    attr: Optional[Tensor],
    wt: Optional[Tensor],
    bias: Optional[Tensor],
    need_x: bool,
    need_attr: bool,
    need_w: bool,
    need_b: bool,
):
    """Backward of one shard: ``grad`` ``[N, C]`` over the destinations, grad_x ``[rows of x, C]``;
    as ``kernels.load("gen_max").shard_backward``."""
    _check(x, ptr, src, attr, wt, bias, False)
    N, C = ptr.numel() - 1, x.size(1)
    if grad.dim() != 2 or tuple(grad.shape) != (N, C) or not grad.is_contiguous() or grad.dtype != x.dtype:
        raise RuntimeError("gen_max: grad must be a contiguous [N, C] tensor of x's dtype")
    if arg.dtype != torch.int32 or arg.numel() != N * C or tied.dtype != torch.uint8 or tied.numel() != N:
        raise RuntimeError("gen_max: arg [N, C] int32 and tied [N] uint8 from shard_forward")
    return _backward(grad, arg, tied, x, ptr, src, attr, wt, bias, need_x, need_attr, need_w, need_b)


def _ln_check(x, w, b, mask) -> None:
    _require(x)
    if x.dim() != 2 or x.stride(1) != 1 or x.dtype not in _FLOATS:
        raise RuntimeError("layer_norm_relu: x must be [N, C] with contiguous rows")
    if not (w.is_contiguous() and b.is_contiguous() and w.numel() == x.size(1) and b.numel() == x.size(1)):
        raise RuntimeError("layer_norm_relu: weight and bias must be contiguous [C]")
    if w.dtype != x.dtype or b.dtype != x.dtype:
        raise RuntimeError("layer_norm_relu: dtypes differ")
    if mask is not None and (
        mask.shape != x.shape or mask.stride(1) != 1 or mask.dtype not in (x.dtype, torch.bool)
    ):
        raise RuntimeError(
            "layer_norm_relu: mask must be shaped like x, typed like x or bool, with contiguous rows"
        )


def _ln_stats_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype == torch.bfloat16 else dtype


def _ln_rows(bc: int) -> int:
    return max(1, min(LN_ROWS, 4096 // bc))


def layer_norm_relu_forward(
    x: Tensor, w: Tensor, b: Tensor, eps: float, mask: Optional[Tensor], mask_scale: float
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(out [N, C], mean [N], rstd [N])``, as ``kernels.load("layer_norm_relu").forward`` (mean and
    rstd are float32 for a bf16 input); a bool ``mask`` stands for ``mask_scale`` where it keeps."""
    _ln_check(x, w, b, mask)
    N, C = x.shape
    out = torch.empty((N, C), dtype=x.dtype, device=x.device)
    sd = _ln_stats_dtype(x.dtype)
    mean = torch.empty((N,), dtype=sd, device=x.device)
    rstd = torch.empty((N,), dtype=sd, device=x.device)
    if N > 0:
        bc = _pow2(C)
        br = _ln_rows(bc)
        _launch(_ln_fwd_kernel)[(triton.cdiv(N, br),)](
            x, x.stride(0), w, b, mask if mask is not None else x, mask.stride(0) if mask is not None else 0,
            _scalar(mask_scale, x.dtype, x.device), _scalar(eps, x.dtype, x.device), out, mean, rstd, N, C,
            HAS_MASK=mask is not None, BOOL_MASK=mask is not None and mask.dtype == torch.bool,
            ACC=_acc(x.dtype)[0], BR=br, BC=bc,
        )  # fmt: skip
    return out, mean, rstd


def layer_norm_relu_backward(
    grad_out: Tensor,
    x: Tensor,
    w: Tensor,
    b: Tensor,
    mean: Tensor,
    rstd: Tensor,
    mask: Optional[Tensor],
    mask_scale: float,
    need_x: bool,
    need_w: bool,
    need_b: bool,
    into_grad: bool,
):
    """``(grad_x, grad_w, grad_b)``, each :obj:`None` where not needed, as
    ``kernels.load("layer_norm_relu").backward``; grad_w/grad_b summed per fixed block of ``LN_ROWS`` rows,
    then over the blocks in order. ``into_grad``: grad_x overwrites ``grad_out`` (each program loads
    its rows of ``grad_out`` before it stores their grad_x)."""
    _ln_check(x, w, b, mask)
    if not grad_out.is_contiguous() or grad_out.shape != x.shape:
        raise RuntimeError("layer_norm_relu: bad grad")
    N, C = x.shape
    acc, acc_t = _acc(x.dtype)
    blocks = max(1, triton.cdiv(N, LN_ROWS))
    gx = (grad_out if into_grad else torch.empty((N, C), dtype=x.dtype, device=x.device)) if need_x else None
    gw = torch.zeros((blocks, C), dtype=acc_t, device=x.device) if need_w else None
    gb = torch.zeros((blocks, C), dtype=acc_t, device=x.device) if need_b else None
    if N > 0 and (need_x or need_w or need_b):
        bc = _pow2(C)
        _launch(_ln_bwd_kernel)[(blocks,)](
            grad_out, x, x.stride(0), w, b, mask if mask is not None else x,
            mask.stride(0) if mask is not None else 0, _scalar(mask_scale, x.dtype, x.device), mean, rstd,
            gx if need_x else x, gw if need_w else x, gb if need_b else x, N, C,
            HAS_MASK=mask is not None, BOOL_MASK=mask is not None and mask.dtype == torch.bool,
            NEED_X=bool(need_x), NEED_W=bool(need_w), NEED_B=bool(need_b),
            ACC=acc, ROWS=LN_ROWS, BR=min(_ln_rows(bc), LN_ROWS), BC=bc,
        )  # fmt: skip
    return (
        gx,
        gw.sum(0).to(w.dtype) if need_w else None,
        gb.sum(0).to(b.dtype) if need_b else None,
    )


# ------------------------------------------------- linear aggregations and SAGE max (#33 a)
# The Triton versions of revgnn/csrc/aggregate.cpp and segment_max.cpp, call-compatible with their
# entry points: one program per output row (a destination in forward, a source for grad_x), which
# walks its edge segment in tiles of BE edges; no atomics, every sum in a fixed order. float32 and
# float64 (accumulated in their own dtype).

if AVAILABLE:

    @triton.jit
    def _agg_fwd_kernel(
        x_ptr, ptr_ptr, src_ptr, w_ptr, out_ptr, C,
        HAS_W: tl.constexpr, MEAN: tl.constexpr, ACC: tl.constexpr, BE: tl.constexpr, BC: tl.constexpr,
    ):  # fmt: skip
        i = tl.program_id(0).to(tl.int64)
        e0 = tl.load(ptr_ptr + i)
        e1 = tl.load(ptr_ptr + i + 1)
        c = tl.arange(0, BC)
        cm = c < C
        acc = tl.zeros([BC], ACC)
        for s in range(e0, e1, BE):
            e = s + tl.arange(0, BE)
            em = e < e1
            m2 = em[:, None] & cm[None, :]
            row = tl.load(src_ptr + e, mask=em, other=0)
            xv = tl.load(x_ptr + row[:, None] * C + c[None, :], mask=m2, other=0.0).to(ACC)
            if HAS_W:
                xv = xv * tl.load(w_ptr + e, mask=em, other=0.0).to(ACC)[:, None]
            acc += tl.sum(xv, axis=0)
        if MEAN:  # PyG divides the sum by the clamped count
            acc = acc / tl.maximum(e1 - e0, 1).to(ACC)
        tl.store(out_ptr + i * C + c, acc, mask=cm)

    @triton.jit
    def _agg_src_kernel(
        g_ptr, ptr_ptr, sptr_ptr, sdst_ptr, sperm_ptr, w_ptr, gx_ptr, C,
        HAS_W: tl.constexpr, MEAN: tl.constexpr, ACC: tl.constexpr, BE: tl.constexpr, BC: tl.constexpr,
    ):  # fmt: skip
        """grad_x of source row j: sum over j's out-edges e = (j -> i) of w_e g_i (/ deg_i)."""
        j = tl.program_id(0).to(tl.int64)
        o0 = tl.load(sptr_ptr + j)
        o1 = tl.load(sptr_ptr + j + 1)
        c = tl.arange(0, BC)
        cm = c < C
        acc = tl.zeros([BC], ACC)
        for s in range(o0, o1, BE):
            o = s + tl.arange(0, BE)
            om = o < o1
            m2 = om[:, None] & cm[None, :]
            i = tl.load(sdst_ptr + o, mask=om, other=0)
            gv = tl.load(g_ptr + i[:, None] * C + c[None, :], mask=m2, other=0.0).to(ACC)
            if MEAN:
                deg = tl.load(ptr_ptr + i + 1, mask=om, other=1) - tl.load(ptr_ptr + i, mask=om, other=0)
                gv = gv / tl.maximum(deg, 1).to(ACC)[:, None]
            if HAS_W:
                e = tl.load(sperm_ptr + o, mask=om, other=0)
                gv = gv * tl.load(w_ptr + e, mask=om, other=0.0).to(ACC)[:, None]
            acc += tl.sum(gv, axis=0)
        tl.store(gx_ptr + j * C + c, acc, mask=cm)

    @triton.jit
    def _agg_w_kernel(
        g_ptr, x_ptr, ptr_ptr, src_ptr, gw_ptr, C,
        MEAN: tl.constexpr, ACC: tl.constexpr, BE: tl.constexpr, BC: tl.constexpr,
    ):  # fmt: skip
        """grad_w of the edges into destination i: <g_i (/ deg_i), x_j> per edge."""
        i = tl.program_id(0).to(tl.int64)
        e0 = tl.load(ptr_ptr + i)
        e1 = tl.load(ptr_ptr + i + 1)
        c = tl.arange(0, BC)
        cm = c < C
        gi = tl.load(g_ptr + i * C + c, mask=cm, other=0.0).to(ACC)
        if MEAN:
            gi = gi / tl.maximum(e1 - e0, 1).to(ACC)
        for s in range(e0, e1, BE):
            e = s + tl.arange(0, BE)
            em = e < e1
            m2 = em[:, None] & cm[None, :]
            row = tl.load(src_ptr + e, mask=em, other=0)
            xv = tl.load(x_ptr + row[:, None] * C + c[None, :], mask=m2, other=0.0).to(ACC)
            tl.store(gw_ptr + e, tl.sum(xv * gi[None, :], axis=1), mask=em)

    @triton.jit
    def _smax_fwd_kernel(
        x_ptr, ptr_ptr, src_ptr, out_ptr, count_ptr, C,
        ACC: tl.constexpr, BE: tl.constexpr, BC: tl.constexpr,
    ):  # fmt: skip
        """Per channel the maximum over i's in-edges (NaN wins; 0 without in-edges) and how many
        edges reach it (0 where it is NaN)."""
        i = tl.program_id(0).to(tl.int64)
        e0 = tl.load(ptr_ptr + i)
        e1 = tl.load(ptr_ptr + i + 1)
        c = tl.arange(0, BC)
        cm = c < C
        best = tl.full([BC], float("-inf"), ACC)
        cnt = tl.zeros([BC], tl.int32)
        nan = tl.zeros([BC], tl.int32)
        for s in range(e0, e1, BE):
            e = s + tl.arange(0, BE)
            em = e < e1
            m2 = em[:, None] & cm[None, :]
            row = tl.load(src_ptr + e, mask=em, other=0)
            m = tl.load(x_ptr + row[:, None] * C + c[None, :], mask=m2, other=0.0).to(ACC)
            nan = tl.maximum(nan, tl.max((m2 & (m != m)).to(tl.int32), axis=0))
            mm = tl.where(m2 & (m == m), m, float("-inf"))
            tmax = tl.max(mm, axis=0)
            tcnt = tl.sum((m2 & (m == m) & (mm == tmax[None, :])).to(tl.int32), axis=0)
            gt = tmax > best
            cnt = tl.where(gt, tcnt, tl.where(tmax == best, cnt + tcnt, cnt))
            best = tl.where(gt, tmax, best)
        isnan = nan != 0
        o = tl.where(isnan, float("nan"), best)
        o = tl.where(e1 > e0, o, 0.0)
        cnt = tl.where(isnan | (e1 == e0), 0, cnt)
        tl.store(out_ptr + i * C + c, o, mask=cm)
        tl.store(count_ptr + i * C + c, cnt, mask=cm)

    @triton.jit
    def _smax_bwd_kernel(
        g_ptr, x_ptr, out_ptr, count_ptr, sptr_ptr, sdst_ptr, gx_ptr, C,
        ACC: tl.constexpr, BE: tl.constexpr, BC: tl.constexpr,
    ):  # fmt: skip
        """grad_x of source row j: g_i / (count_i + [out_i == 0]) over j's out-edges reaching
        their destination's maximum (torch's scatter_reduce amax split, as segment_max.cpp)."""
        j = tl.program_id(0).to(tl.int64)
        o0 = tl.load(sptr_ptr + j)
        o1 = tl.load(sptr_ptr + j + 1)
        c = tl.arange(0, BC)
        cm = c < C
        xj = tl.load(x_ptr + j * C + c, mask=cm, other=0.0).to(ACC)
        acc = tl.zeros([BC], ACC)
        for s in range(o0, o1, BE):
            o = s + tl.arange(0, BE)
            om = o < o1
            m2 = om[:, None] & cm[None, :]
            i = tl.load(sdst_ptr + o, mask=om, other=0)
            at = i[:, None] * C + c[None, :]
            oi = tl.load(out_ptr + at, mask=m2, other=0.0).to(ACC)
            gi = tl.load(g_ptr + at, mask=m2, other=0.0).to(ACC)
            ki = tl.load(count_ptr + at, mask=m2, other=1) + (oi == 0).to(tl.int32)
            hit = m2 & (xj[None, :] == oi)
            acc += tl.sum(tl.where(hit, gi / tl.maximum(ki, 1).to(ACC), 0.0), axis=0)
        tl.store(gx_ptr + j * C + c, acc, mask=cm)


def _agg_check(name: str, x: Tensor, *index: Tensor) -> None:
    _require(x)
    if x.dim() != 2 or not x.is_contiguous() or x.dtype not in (torch.float32, torch.float64):
        raise RuntimeError(f"{name}: x must be a contiguous [N, C] float32/float64 tensor")
    if any(t.dtype != torch.long or not t.is_contiguous() for t in index):
        raise RuntimeError(f"{name}: the graph's index tensors must be contiguous int64")


def aggregate_forward(x: Tensor, ptr: Tensor, src: Tensor, weight: Optional[Tensor], mean: bool) -> Tensor:
    """``out [N, C]``, as ``kernels.load("aggregate").forward``."""
    _agg_check("aggregate", x, ptr, src)
    N, C = ptr.numel() - 1, x.size(1)
    out = torch.empty((N, C), dtype=x.dtype, device=x.device)
    if N > 0:
        bc = _pow2(C)
        _launch(_agg_fwd_kernel)[(N,)](
            x, ptr, src, weight if weight is not None else x, out, C,
            HAS_W=weight is not None, MEAN=bool(mean), ACC=_acc(x.dtype)[0], BE=_edge_block(bc), BC=bc,
        )  # fmt: skip
    return out


def aggregate_backward(
    grad: Tensor,
    x: Tensor,
    ptr: Tensor,
    src: Tensor,
    weight: Optional[Tensor],
    mean: bool,
    sptr: Tensor,
    sdst: Tensor,
    sperm: Tensor,
    need_x: bool,
    need_w: bool,
) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """``(grad_x, grad_w)``, each :obj:`None` where not needed, as ``kernels.load("aggregate").backward``."""
    _agg_check("aggregate", x, ptr, src, sptr, sdst, sperm)
    if not grad.is_contiguous() or grad.shape != x.shape or grad.dtype != x.dtype:
        raise RuntimeError("aggregate: grad must be contiguous and shaped like x")
    N, C = x.shape
    need_w = need_w and weight is not None
    gx = torch.empty((N, C), dtype=x.dtype, device=x.device) if need_x else None
    gw = torch.empty((src.numel(),), dtype=x.dtype, device=x.device) if need_w else None
    bc = _pow2(C)
    acc = _acc(x.dtype)[0]
    if N > 0 and need_x:
        _launch(_agg_src_kernel)[(N,)](
            grad, ptr, sptr, sdst, sperm, weight if weight is not None else x, gx, C,
            HAS_W=weight is not None, MEAN=bool(mean), ACC=acc, BE=_edge_block(bc), BC=bc,
        )  # fmt: skip
    if N > 0 and need_w:
        _launch(_agg_w_kernel)[(N,)](
            grad, x, ptr, src, gw, C, MEAN=bool(mean), ACC=acc, BE=_edge_block(bc), BC=bc
        )  # fmt: skip
    return gx, gw


def segment_max_forward(x: Tensor, ptr: Tensor, src: Tensor) -> Tuple[Tensor, Tensor]:
    """``(out [N, C], count [N, C] int32)``, as ``kernels.load("segment_max").forward``."""
    _agg_check("segment_max", x, ptr, src)
    N, C = ptr.numel() - 1, x.size(1)
    out = torch.empty((N, C), dtype=x.dtype, device=x.device)
    count = torch.empty((N, C), dtype=torch.int32, device=x.device)
    if N > 0:
        bc = _pow2(C)
        _launch(_smax_fwd_kernel)[(N,)](
            x, ptr, src, out, count, C, ACC=_acc(x.dtype)[0], BE=_edge_block(bc), BC=bc
        )  # fmt: skip
    return out, count


def segment_max_backward(
    grad: Tensor, x: Tensor, out: Tensor, count: Tensor, sptr: Tensor, sdst: Tensor
) -> Tensor:
    """``grad_x [N, C]``, as ``kernels.load("segment_max").backward``."""
    _agg_check("segment_max", x, sptr, sdst)
    if any(not t.is_contiguous() or t.shape != x.shape for t in (grad, out, count)):
        raise RuntimeError("segment_max: grad, out and count must be contiguous and shaped like x")
    N, C = x.shape
    gx = torch.empty((N, C), dtype=x.dtype, device=x.device)
    if N > 0:
        bc = _pow2(C)
        _launch(_smax_bwd_kernel)[(N,)](
            grad, x, out, count, sptr, sdst, gx, C, ACC=_acc(x.dtype)[0], BE=_edge_block(bc), BC=bc
        )  # fmt: skip
    return gx


# ---------------------------------------------------------------- GEN sum / mean / softmax

_GEN_REDUCES = {"sum": 0, "mean": 1, "softmax": 2}


def _gen_aggr_check(x, ptr, src, attr, wt, bias, t, reduce: str) -> int:
    _check(x, ptr, src, attr, wt, bias, True)
    if x.dtype not in (torch.float32, torch.float64):
        raise RuntimeError("gen_aggr: x must be float32 or float64")
    if reduce not in _GEN_REDUCES:
        raise RuntimeError(f"gen_aggr: reduce must be 'sum', 'mean' or 'softmax', got {reduce!r}")
    if reduce == "softmax" and (t is None or t.numel() != 1 or t.dtype != x.dtype):
        raise RuntimeError("gen_aggr: softmax takes its temperature as a one-element tensor of x's dtype")
    return _GEN_REDUCES[reduce]


def gen_aggr_forward(
    x: Tensor,
    ptr: Tensor,
    src: Tensor,
    attr: Optional[Tensor],
    wt: Optional[Tensor],
    bias: Optional[Tensor],
    t: Optional[Tensor],
    eps: float,
    reduce: str,
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(out [N, C], top, denom)`` (``[N, C]`` for softmax, else empty), as
    ``kernels.load("gen_aggr").forward``."""
    red = _gen_aggr_check(x, ptr, src, attr, wt, bias, t, reduce)
    N, C = x.shape
    mode = _mode(attr, wt)
    out = torch.empty((N, C), dtype=x.dtype, device=x.device)
    saved = (N, C) if red == 2 else (0,)
    top = torch.empty(saved, dtype=x.dtype, device=x.device)
    den = torch.empty(saved, dtype=x.dtype, device=x.device)
    if N > 0:
        bc = _pow2(C)
        _launch(_gen_aggr_fwd_kernel)[(N,)](
            x, ptr, src, attr if attr is not None else x, wt if wt is not None else x,
            bias if bias is not None else x, t if t is not None else _eps(1.0, x.dtype, x.device),
            _eps(eps, x.dtype, x.device), out, top if red == 2 else out, den if red == 2 else out,
            C, attr.size(1) if mode == _FACTORED else 0,
            MODE=mode, HAS_BIAS=bias is not None and mode == _FACTORED, REDUCE=red, ACC=_acc(x.dtype)[0],
            BE=_edge_block(bc), BC=bc,
        )  # fmt: skip
    return out, top, den


def gen_aggr_backward(
    grad: Tensor,
    out: Tensor,
    top: Tensor,
    denom: Tensor,
    x: Tensor,
    ptr: Tensor,
    src: Tensor,
    src_ptr: Tensor,
    src_dst: Tensor,
    src_perm: Tensor,
    attr: Optional[Tensor],
    wt: Optional[Tensor],
    bias: Optional[Tensor],
    t: Optional[Tensor],
    eps: float,
    reduce: str,
    need_x: bool,
    need_attr: bool,
    need_w: bool,
    need_b: bool,
    need_t: bool,
):
    """``(grad_x, grad_attr, grad_w [C, d], grad_b [C], grad_t [1])``, each :obj:`None` where not
    needed or not applicable, as ``kernels.load("gen_aggr").backward``. grad_x is a gather over
    the source order (``src_ptr``, ``src_dst``, ``src_perm``); the rest per fixed block of ``NODE_BLOCK``
    destinations, the blocks' partial sums added in order."""
    red = _gen_aggr_check(x, ptr, src, attr, wt, bias, t, reduce)
    if grad.shape != x.shape or not grad.is_contiguous() or grad.dtype != x.dtype:
        raise RuntimeError("gen_aggr: grad must be contiguous and shaped like x")
    N, C = x.shape
    E = src.numel()
    if src_ptr.numel() != N + 1 or src_perm.numel() != E or src_dst.numel() != E:
        raise RuntimeError("gen_aggr: src_ptr [N + 1], src_dst [E] and src_perm [E] must describe the graph")
    mode = _mode(attr, wt)
    d = attr.size(1) if mode == _FACTORED else 0
    has_bias = bias is not None and mode == _FACTORED
    dev, dt = x.device, x.dtype
    acc, acc_t = _acc(dt)
    need_attr = bool(need_attr) and mode != _NONE
    need_w = bool(need_w) and mode == _FACTORED
    need_b = bool(need_b) and has_bias
    need_t = bool(need_t) and red == 2
    gx = torch.zeros((N, C), dtype=dt, device=dev) if need_x else None
    ga = torch.zeros_like(attr) if need_attr else None
    gw = gb = gt = None
    bc = _pow2(C)
    be = _edge_block(bc)
    temp = t if t is not None else _eps(1.0, dt, dev)
    saved = (top, denom) if red == 2 else (x, x)
    common = dict(MODE=mode, HAS_BIAS=has_bias, REDUCE=red, ACC=acc, BC=bc)
    a_ = attr if attr is not None else x
    w_ = wt if wt is not None else x
    b_ = bias if has_bias else x
    eps_t = _eps(eps, dt, dev)
    if need_x and N > 0:
        _launch(_gen_aggr_src_kernel)[(N,)](
            grad, out, *saved, x, ptr, src_ptr, src_perm, src_dst, a_, w_, b_, temp, eps_t, gx, C, d,
            BE=be, **common,
        )  # fmt: skip
    if need_attr or need_w or need_b or need_t:
        blocks = max(1, math.ceil(N / NODE_BLOCK))
        bd = _pow2(d, 2) if mode == _FACTORED else 2
        be_w = max(2, min(be, 8192 // (bc * bd))) if need_w else be
        part = {
            name: torch.zeros(shape, dtype=acc_t, device=dev) if need else x
            for name, shape, need in (
                ("w", (blocks, C, d), need_w),
                ("b", (blocks, C), need_b),
                ("t", (blocks, C), need_t),
            )
        }
        if N > 0:
            _launch(_gen_aggr_dst_kernel)[(blocks,)](
                grad, out, *saved, x, ptr, src, a_, w_, b_, temp, eps_t,
                ga if need_attr else x, part["w"], part["b"], part["t"], N, C, d,
                NEED_A=need_attr, NEED_W=need_w, NEED_B=need_b, NEED_T=need_t,
                NB=NODE_BLOCK, BE=be_w, BD=bd, **common,
            )  # fmt: skip
        if need_w:
            gw = part["w"].sum(0).to(dt)
        if need_b:
            gb = part["b"].sum(0).to(dt)
        if need_t:
            gt = part["t"].sum().to(dt).view_as(t)
    return gx, ga, gw, gb, gt


# ------------------------------------------------------------------------- (c) GAT attention
#
# torch.ops.revgnn.gat_attention's Triton version, call-compatible with revgnn/csrc/gat_attention.cpp
# (the formulas: revgnn.nn.ops.gat_attention). Forward: one program per (destination, head), an
# online softmax over tiles of BE edges (self loop first). Backward: pass A per (destination, head)
# recomputes each edge's dL/dz and writes it to an [E, H] buffer (E x H, no channels), from which
# the edge-feature, w and b gradients are two small matrix products; pass B per (source, head)
# walks the source order (rowptr, col, perm) for the a_src and xp gradients: gathers, no atomics.
# The dropout ids are the edges' positions and E + i for the loops, or the optional edge_key [E] /
# loop_key [N] (KEYS / LOOP_KEYS), as in the C++ kernel.

if AVAILABLE:

    @triton.jit
    def _gat_mix32(x):
        """revgnn.nn.ops._mix32 on int64 values in [0, 2^32): the same constants and masks (the mask
        as an int64 block: a literal 2^32 - 1 would not fit Triton's int32 literals)."""
        m32 = tl.full([1], 0xFFFFFFFF, tl.int64)
        x = x ^ (x >> 16)
        x = (x * 0x7FEB352D) & m32
        x = x ^ (x >> 15)
        x = (x * 0x2C1B3C6D) & m32
        x = x ^ (x >> 16)
        x = (x * 0x297A2D39) & m32
        return x ^ (x >> 15)

    @triton.jit
    def _gat_kappa(key, ids, h, threshold, scale, DROPOUT: tl.constexpr):
        """The dropout scale of edge ids ``ids`` (int64 block), head ``h``: scale kept, 0 dropped."""
        if DROPOUT:
            x = _gat_mix32(key ^ (ids & tl.full([1], 0xFFFFFFFF, tl.int64)))
            x = _gat_mix32(x ^ h)
            return tl.where((x >> 8) >= threshold, scale, 0.0 * scale)
        else:
            return tl.where(ids >= 0, 1.0 + 0.0 * scale, 0.0 * scale)

    @triton.jit
    def _gat_edge_ids(ekey_ptr, e, em, KEYS: tl.constexpr):
        """The dropout ids of the edges ``e`` (destination order, int64 block): ``edge_key[e]`` or ``e``."""
        if KEYS:
            return tl.load(ekey_ptr + e, mask=em, other=0).to(tl.int64)
        else:
            return e

    @triton.jit
    def _gat_loop_ids(lkey_ptr, one, E, LOOP_KEYS: tl.constexpr):
        """The dropout ids of the self loops of nodes ``one`` ([1] block): ``loop_key[i]`` or ``E + i``."""
        if LOOP_KEYS:
            return tl.load(lkey_ptr + one).to(tl.int64)
        else:
            return E + one

    @triton.jit
    def _gat_logit(
        asrc_ptr, adst_ptr, attr_ptr, w_ptr, b_ptr, j, i, e, valid, h, H, d,
        EDGES: tl.constexpr, HAS_BIAS: tl.constexpr, ACC: tl.constexpr, BD: tl.constexpr,
    ):  # fmt: skip
        """Pre-LeakyReLU logits [BE] of edges ``e`` (j -> i, blocks) for head ``h``."""
        z = tl.load(asrc_ptr + j * H + h, mask=valid, other=0.0).to(ACC)
        z += tl.load(adst_ptr + i * H + h, mask=valid, other=0.0).to(ACC)
        if EDGES:
            kk = tl.arange(0, BD)
            km = kk < d
            a = tl.load(attr_ptr + e[:, None] * d + kk[None, :], mask=valid[:, None] & km[None, :], other=0.0)
            wv = tl.load(w_ptr + h * d + kk, mask=km, other=0.0).to(ACC)
            t = tl.sum(a.to(ACC) * wv[None, :], axis=1)
            if HAS_BIAS:
                t += tl.load(b_ptr + h).to(ACC)
            z += t
        return z

    @triton.jit
    def _gat_fwd_kernel(
        xp_ptr, asrc_ptr, adst_ptr, loop_ptr, ptr_ptr, src_ptr, attr_ptr, w_ptr, b_ptr, par_ptr,
        out_ptr, top_ptr, den_ptr, ekey_ptr, lkey_ptr, key, threshold, E, H, C, d,
        EDGES: tl.constexpr, HAS_BIAS: tl.constexpr, DROPOUT: tl.constexpr, KEYS: tl.constexpr,
        LOOP_KEYS: tl.constexpr, ACC: tl.constexpr, BE: tl.constexpr, BC: tl.constexpr, BD: tl.constexpr,
    ):  # fmt: skip
        i = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
        c = tl.arange(0, BC)
        cm = c < C
        slope = tl.load(par_ptr).to(ACC)
        scale = tl.load(par_ptr + 1).to(ACC)
        one = tl.zeros([1], tl.int64) + i
        z0 = tl.load(asrc_ptr + one * H + h).to(ACC) + tl.load(adst_ptr + one * H + h).to(ACC)
        z0 += tl.load(loop_ptr + one * H + h).to(ACC)
        m = tl.max(tl.where(z0 > 0, z0, z0 * slope), axis=0)  # the self loop starts the softmax
        dsum = 1.0 + 0.0 * m
        ids0 = _gat_loop_ids(lkey_ptr, one, E, LOOP_KEYS)
        k0 = tl.sum(_gat_kappa(key, ids0, h, threshold, scale, DROPOUT), axis=0)
        acc = k0 * tl.load(xp_ptr + (i * H + h) * C + c, mask=cm, other=0.0).to(ACC)
        e0 = tl.load(ptr_ptr + i)
        e1 = tl.load(ptr_ptr + i + 1)
        for s in range(e0, e1, BE):
            e = s + tl.arange(0, BE)
            em = e < e1
            j = tl.load(src_ptr + e, mask=em, other=0).to(tl.int64)
            valid = em & (j != i)
            z = _gat_logit(
                asrc_ptr, adst_ptr, attr_ptr, w_ptr, b_ptr, j, tl.zeros_like(j) + i, e, valid, h, H, d,
                EDGES, HAS_BIAS, ACC, BD,
            )  # fmt: skip
            sc = tl.where(valid, tl.where(z > 0, z, z * slope), float("-inf"))
            mnew = tl.maximum(m, tl.max(sc, axis=0))
            r = tl.exp(m - mnew)
            pe = tl.where(valid, tl.exp(sc - mnew), 0.0)
            ids = _gat_edge_ids(ekey_ptr, e, em, KEYS)
            kp = _gat_kappa(key, ids, h, threshold, scale, DROPOUT) * pe
            xv = tl.load(
                xp_ptr + (j[:, None] * H + h) * C + c[None, :], mask=valid[:, None] & cm[None, :], other=0.0
            )
            dsum = dsum * r + tl.sum(pe, axis=0)
            acc = acc * r + tl.sum(kp[:, None] * xv.to(ACC), axis=0)
            m = mnew
        tl.store(out_ptr + (i * H + h) * C + c, (acc / dsum).to(out_ptr.dtype.element_ty), mask=cm)
        tl.store(top_ptr + i * H + h, m.to(top_ptr.dtype.element_ty))
        tl.store(den_ptr + i * H + h, dsum.to(den_ptr.dtype.element_ty))

    @triton.jit
    def _gat_bwd_dst_kernel(
        g_ptr, out_ptr, top_ptr, den_ptr, xp_ptr, asrc_ptr, adst_ptr, loop_ptr, ptr_ptr, src_ptr,
        attr_ptr, w_ptr, b_ptr, par_ptr, dz_ptr, gdst_ptr, gloop_ptr, ekey_ptr, lkey_ptr, key, threshold,
        E, H, C, d,
        EDGES: tl.constexpr, HAS_BIAS: tl.constexpr, DROPOUT: tl.constexpr, KEYS: tl.constexpr,
        LOOP_KEYS: tl.constexpr, ACC: tl.constexpr, BE: tl.constexpr, BC: tl.constexpr, BD: tl.constexpr,
    ):  # fmt: skip
        """Pass A, per (destination i, head h): dL/dz of each in-edge into dz [E, H], and the
        a_dst and self-loop gradients."""
        i = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
        c = tl.arange(0, BC)
        cm = c < C
        slope = tl.load(par_ptr).to(ACC)
        scale = tl.load(par_ptr + 1).to(ACC)
        gi = tl.load(g_ptr + (i * H + h) * C + c, mask=cm, other=0.0).to(ACC)
        go = tl.sum(gi * tl.load(out_ptr + (i * H + h) * C + c, mask=cm, other=0.0).to(ACC), axis=0)
        mx = tl.load(top_ptr + i * H + h).to(ACC)
        dn = tl.load(den_ptr + i * H + h).to(ACC)
        one = tl.zeros([1], tl.int64) + i
        z0 = tl.load(asrc_ptr + one * H + h).to(ACC) + tl.load(adst_ptr + one * H + h).to(ACC)
        z0 += tl.load(loop_ptr + one * H + h).to(ACC)
        a0 = tl.exp(tl.where(z0 > 0, z0, z0 * slope) - mx) / dn
        q0 = _gat_kappa(key, _gat_loop_ids(lkey_ptr, one, E, LOOP_KEYS), h, threshold, scale, DROPOUT)
        q0 = q0 * tl.sum(gi * tl.load(xp_ptr + (i * H + h) * C + c, mask=cm, other=0.0).to(ACC), axis=0)
        ds0 = a0 * (q0 - go)
        dz0 = tl.sum(tl.where(z0 > 0, ds0, ds0 * slope), axis=0)
        tl.store(gloop_ptr + i * H + h, dz0.to(gloop_ptr.dtype.element_ty))
        accd = dz0
        e0 = tl.load(ptr_ptr + i)
        e1 = tl.load(ptr_ptr + i + 1)
        for s in range(e0, e1, BE):
            e = s + tl.arange(0, BE)
            em = e < e1
            j = tl.load(src_ptr + e, mask=em, other=0).to(tl.int64)
            valid = em & (j != i)
            z = _gat_logit(
                asrc_ptr, adst_ptr, attr_ptr, w_ptr, b_ptr, j, tl.zeros_like(j) + i, e, valid, h, H, d,
                EDGES, HAS_BIAS, ACC, BD,
            )  # fmt: skip
            alpha = tl.where(valid, tl.exp(tl.where(z > 0, z, z * slope) - mx) / dn, 0.0)
            xv = tl.load(
                xp_ptr + (j[:, None] * H + h) * C + c[None, :], mask=valid[:, None] & cm[None, :], other=0.0
            )
            ids = _gat_edge_ids(ekey_ptr, e, em, KEYS)
            q = _gat_kappa(key, ids, h, threshold, scale, DROPOUT) * tl.sum(gi[None, :] * xv.to(ACC), axis=1)
            ds = alpha * (q - go)
            dz = tl.where(valid, tl.where(z > 0, ds, ds * slope), 0.0)
            accd += tl.sum(dz, axis=0)
            tl.store(dz_ptr + e * H + h, dz.to(dz_ptr.dtype.element_ty), mask=em)
        tl.store(gdst_ptr + i * H + h, accd.to(gdst_ptr.dtype.element_ty))

    @triton.jit
    def _gat_bwd_src_kernel(
        g_ptr, top_ptr, den_ptr, xp_ptr, asrc_ptr, adst_ptr, loop_ptr, attr_ptr, w_ptr, b_ptr, par_ptr,
        rowptr_ptr, col_ptr, perm_ptr, dz_ptr, gloop_ptr, gxp_ptr, gsrc_ptr, ekey_ptr, lkey_ptr, key,
        threshold, E, H, C, d,
        EDGES: tl.constexpr, HAS_BIAS: tl.constexpr, DROPOUT: tl.constexpr, KEYS: tl.constexpr,
        LOOP_KEYS: tl.constexpr, ACC: tl.constexpr, BE: tl.constexpr, BC: tl.constexpr, BD: tl.constexpr,
    ):  # fmt: skip
        """Pass B, per (source j, head h), over j's out-edges in source order: the a_src and xp
        gradients (the self loop's terms first)."""
        j = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
        c = tl.arange(0, BC)
        cm = c < C
        slope = tl.load(par_ptr).to(ACC)
        scale = tl.load(par_ptr + 1).to(ACC)
        one = tl.zeros([1], tl.int64) + j
        z0 = tl.load(asrc_ptr + one * H + h).to(ACC) + tl.load(adst_ptr + one * H + h).to(ACC)
        z0 += tl.load(loop_ptr + one * H + h).to(ACC)
        a0 = tl.exp(tl.where(z0 > 0, z0, z0 * slope) - tl.load(top_ptr + one * H + h).to(ACC))
        a0 = a0 / tl.load(den_ptr + one * H + h).to(ACC)
        ids0 = _gat_loop_ids(lkey_ptr, one, E, LOOP_KEYS)
        ka0 = tl.sum(_gat_kappa(key, ids0, h, threshold, scale, DROPOUT) * a0, axis=0)
        gx = ka0 * tl.load(g_ptr + (j * H + h) * C + c, mask=cm, other=0.0).to(ACC)
        accs = tl.load(gloop_ptr + j * H + h).to(ACC)
        o0 = tl.load(rowptr_ptr + j)
        o1 = tl.load(rowptr_ptr + j + 1)
        for s in range(o0, o1, BE):
            o = s + tl.arange(0, BE)
            om = o < o1
            e = tl.load(perm_ptr + o, mask=om, other=0).to(tl.int64)
            i = tl.load(col_ptr + o, mask=om, other=0).to(tl.int64)
            valid = om & (i != j)
            accs += tl.sum(tl.load(dz_ptr + e * H + h, mask=valid, other=0.0).to(ACC), axis=0)
            z = _gat_logit(
                asrc_ptr, adst_ptr, attr_ptr, w_ptr, b_ptr, tl.zeros_like(i) + j, i, e, valid, h, H, d,
                EDGES, HAS_BIAS, ACC, BD,
            )  # fmt: skip
            mx = tl.load(top_ptr + i * H + h, mask=valid, other=0.0).to(ACC)
            dn = tl.load(den_ptr + i * H + h, mask=valid, other=1.0).to(ACC)
            alpha = tl.where(valid, tl.exp(tl.where(z > 0, z, z * slope) - mx) / dn, 0.0)
            ids = _gat_edge_ids(ekey_ptr, e, valid, KEYS)
            ka = _gat_kappa(key, ids, h, threshold, scale, DROPOUT) * alpha
            gv = tl.load(
                g_ptr + (i[:, None] * H + h) * C + c[None, :], mask=valid[:, None] & cm[None, :], other=0.0
            )
            gx += tl.sum(ka[:, None] * gv.to(ACC), axis=0)
        tl.store(gxp_ptr + (j * H + h) * C + c, gx.to(gxp_ptr.dtype.element_ty), mask=cm)
        tl.store(gsrc_ptr + j * H + h, accs.to(gsrc_ptr.dtype.element_ty))


def _gat_setup(xp, attr, edge_w, edge_b, slope: float, p: float, seed: int, edge_key=None, loop_key=None):
    """Shared launch arguments: (edges?, bias?, dropout?, key, threshold, params tensor [slope,
    scale] in xp's dtype (float scalars would reach the kernel as float32), the dropout ids or
    stand-ins, constexprs)."""
    _require(xp)
    if xp.dim() != 3 or not xp.is_contiguous():
        raise ValueError("gat_attention: xp must be a contiguous [N, H, C]")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"attention dropout must be in [0, 1), got {p}")
    threshold = int(round(p * 2**24))  # revgnn.nn.ops.dropout_threshold (ops imports this module)
    key = 0
    if p > 0:  # revgnn.nn.ops._mix32 of the seed, on the host
        x = int(seed) & 0xFFFFFFFF
        for shift, mult in ((16, 0x7FEB352D), (15, 0x2C1B3C6D), (16, 0x297A2D39)):
            x = ((x ^ (x >> shift)) * mult) & 0xFFFFFFFF
        key = x ^ (x >> 15)
    par = torch.tensor([slope, 1.0 / (1.0 - p)], dtype=torch.float64).to(xp.dtype).to(xp.device)
    edges = attr is not None
    d = attr.size(1) if edges else 0
    acc, _ = _acc(xp.dtype)
    meta = dict(
        EDGES=edges, HAS_BIAS=edges and edge_b is not None, DROPOUT=p > 0,
        KEYS=p > 0 and edge_key is not None, LOOP_KEYS=p > 0 and loop_key is not None,
        ACC=acc, BE=16, BC=_pow2(xp.size(2), 2), BD=_pow2(d, 2),
    )  # fmt: skip
    # (their sizes and dtype are checked by revgnn.nn.ops.gat_attention, the caller)
    if any(t is not None and not t.is_contiguous() for t in (edge_key, loop_key)):
        raise ValueError("gat_attention: edge_key and loop_key must be contiguous")
    dummy = lambda t: t if t is not None else xp  # noqa: E731
    keys = (dummy(edge_key), dummy(loop_key))
    return (dummy(attr), dummy(edge_w), dummy(edge_b), par), key, threshold, d, keys, meta


def gat_attention_forward(
    xp: Tensor, a_src: Tensor, a_dst: Tensor, loop: Tensor, ptr: Tensor, src: Tensor,
    attr: Optional[Tensor], edge_w: Optional[Tensor], edge_b: Optional[Tensor],
    slope: float, p: float, seed: int, edge_key: Optional[Tensor] = None, loop_key: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """``(out [N, H, C], max [N, H], den [N, H])``, as ``kernels.load("gat_attention").forward``."""
    (attr_, w_, b_, par), key, threshold, d, ids, meta = _gat_setup(
        xp, attr, edge_w, edge_b, slope, p, seed, edge_key, loop_key
    )
    n, heads, c = xp.shape
    out, top, den = torch.empty_like(xp), torch.empty_like(a_src), torch.empty_like(a_src)
    if n > 0:
        _launch(_gat_fwd_kernel)[(n, heads)](
            xp, a_src, a_dst, loop, ptr, src, attr_, w_, b_, par, out, top, den, *ids, key, threshold,
            src.numel(), heads, c, d, **meta,
        )  # fmt: skip
    return out, top, den


def gat_attention_backward(
    grad: Tensor, out: Tensor, top: Tensor, den: Tensor, xp: Tensor, a_src: Tensor, a_dst: Tensor,
    loop: Tensor, ptr: Tensor, src: Tensor, attr: Optional[Tensor], edge_w: Optional[Tensor],
    edge_b: Optional[Tensor], slope: float, p: float, seed: int, rowptr: Tensor, col: Tensor,
    perm: Tensor, need_attr: bool, edge_key: Optional[Tensor] = None, loop_key: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """``(xp, a_src, a_dst, loop, attr, edge_w, edge_b)`` gradients (empty where the input is
    absent, or attr's not asked for), as ``kernels.load("gat_attention").backward``."""
    (attr_, w_, b_, par), key, threshold, d, ids, meta = _gat_setup(
        xp, attr, edge_w, edge_b, slope, p, seed, edge_key, loop_key
    )
    n, heads, c = xp.shape
    e = src.numel()
    _, acc_dtype = _acc(xp.dtype)
    dz = torch.zeros((e, heads), dtype=acc_dtype, device=xp.device)
    g_dst, g_loop = torch.empty_like(a_dst), torch.empty((n, heads), dtype=acc_dtype, device=xp.device)
    g_xp, g_src = torch.empty_like(xp), torch.empty_like(a_src)
    if n > 0:
        common = (*ids, key, threshold, e, heads, c, d)
        _launch(_gat_bwd_dst_kernel)[(n, heads)](
            grad, out, top, den, xp, a_src, a_dst, loop, ptr, src, attr_, w_, b_, par, dz, g_dst,
            g_loop, *common, **meta,
        )  # fmt: skip
        _launch(_gat_bwd_src_kernel)[(n, heads)](
            grad, top, den, xp, a_src, a_dst, loop, attr_, w_, b_, par, rowptr, col, perm, dz, g_loop,
            g_xp, g_src, *common, **meta,
        )  # fmt: skip
    g_attr, g_w, g_b = (xp.new_empty(0) for _ in range(3))  # distinct: a custom op's outputs may not alias
    if attr is not None:
        g_w = (dz.t() @ attr.to(acc_dtype)).to(xp.dtype)
        if need_attr:
            g_attr = (dz @ edge_w.to(acc_dtype)).to(xp.dtype)
        if edge_b is not None:
            g_b = dz.sum(0).to(xp.dtype)
    return g_xp, g_src, g_dst, g_loop.to(xp.dtype), g_attr, g_w, g_b


__all__ += ["gat_attention_forward", "gat_attention_backward"]
