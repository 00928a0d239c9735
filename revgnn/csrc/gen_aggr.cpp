// GENConv's sum / mean / softmax aggregations over destination-sorted (CSC) edges, CPU, without
// an E x C tensor in forward or backward.
//
//   m[e, c] = relu(x[src[e], c] + t[e, c]) + eps          (t: absent, dense [E, C], or raw W^T + b)
//   sum:     h[i, c] = sum_{e -> i} m[e, c]
//   mean:    h[i, c] = sum_{e -> i} m[e, c] / deg(i)
//   softmax: h[i, c] = sum_{e -> i} a[e, c] m[e, c],  a[e, c] = exp(T m[e, c] - M[i, c]) / D[i, c]
//
// (0 for nodes without in-edges; T the temperature). Forward is parallel over destinations, one
// task per node's segment, the softmax online (running maximum M, denominator D and numerator, each
// rescaled when the maximum grows), and returns M and D (D with PyG's 1e-16 floor added), [N, C]:
// what backward recomputes every weight from.
//
// Backward streams the edges again in destination order, recomputing each message and
//   dL/dm[e, c] = g[i, c]                         (sum)
//               = g[i, c] / deg(i)                (mean)
//               = g[i, c] a (1 + T (m - h[i, c])) (softmax)
// through the ReLU, what it reads of the destination i loaded once per node, the edge's features
// and source id read in order and x's row of the source at random (as forward). That row's
// gradient is added to at random too: into one N x C buffer per fixed block of destinations
// (backward_blocks, a function of the graph alone; the first block's buffer is gx itself), the
// buffers then summed in block order. The edge features' gradient is per edge (written once); W's,
// b's and T's are sums over all edges, formed per block and added block by block in order: every
// result is bitwise the same on any number of threads. (Walking the edges in source order instead,
// each source's gradient a sum in registers, reads every edge's features and ids at random: a
// cache miss per edge once they outgrow the cache, as at ogbn-proteins' size.)
//
// Speed: every loop over channels runs on register blocks of 64 bytes (32 where those cover the
// channels in fewer passes; GCC vector extension, as gen_max.cpp), several blocks per pass over a
// node's edges, the edge term formed in registers.
// The softmax takes one exp per element in forward (the weight of the new term or the rescaling of
// the old sums, the other being exp(0) = 1) and one in backward, both from vexp below. W's
// gradient is accumulated over tiles of kTile edges held in registers.
//
// Threads: torch's intra-op pool (at::parallel_for), a task getting at least torch's grain of work
// (edges x channels), so a small graph runs in one thread (as gen_max.cpp).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace {

enum Mode { kNone = 0, kDense = 1, kFactored = 2 };
enum Reduce { kSum = 0, kMean = 1, kSoftmax = 2 };

constexpr int64_t kBlocks = 8;       // most destination blocks of backward (see backward_blocks)
constexpr double kFloor = 1e-16;      // PyG's softmax adds it to every denominator
constexpr int64_t kAhead = 8;         // edges ahead whose rows are prefetched (random rows)
constexpr int64_t kChunk = 5;         // register blocks processed together (C = 80 float: 5)

// GCC/Clang vector extension: L lanes of T in registers (AVX/AVX-512/SSE/NEON, whatever -march
// gives); L = 1 for the channels after the last full block, so one code path serves both.
template <typename T, int L>
struct Vec {
  typedef T type __attribute__((vector_size(L * sizeof(T))));
};

template <typename V, typename T>
inline V load(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename V, typename T>
inline void store(T* p, const V& v) {
  std::memcpy(p, &v, sizeof v);
}
template <typename V, typename T>
inline V splat(T s) {
  return V{} + s;
}
template <typename T, typename V>
inline T hsum(const V& v) {  // lanes in order: a fixed function of the lane count
  constexpr int L = sizeof(V) / sizeof(T);
  T s = v[0];
  for (int l = 1; l < L; ++l) s += v[l];
  return s;
}

// exp(r)'s Taylor polynomial of degree D, sum_{k <= D} r^k / k!, by Horner's rule; each coefficient
// 1 / k! is a double quotient (k! exact for D <= 18) rounded once to T, unrolled to constants.
template <typename T, int D, typename V>
inline V exp_taylor(V r) {
  constexpr auto c = [] {
    std::array<T, D + 1> inv{};
    double f = 1;  // k!
    for (int k = 0; k <= D; ++k, f *= k) inv[k] = T(1.0 / f);
    return inv;
  }();
  V p = splat<V>(c[D]);
#pragma GCC unroll 16
  for (int k = D - 1; k >= 0; --k) p = p * r + c[k];
  return p;
}

// exp(x) for x <= 0 (the softmax's arguments, all relative to a running or saved maximum; the
// formula holds for x > 0 below the overflow threshold too), lane-wise: x = n ln2 + r with
// |r| <= ln2 / 2 (Cody-Waite: ln2 split in a head exact in n * head and a tail), exp(r) by its
// Taylor polynomial (degree 7 for float: truncation below 2^-30; 13 for double: below 2^-60),
// times 2^n built from the exponent bits in two factors, so that results down to the subnormals
// come out right. exp(-inf) = 0, NaN passes. Within ~2 ulp of std::exp, the same bits on every
// machine given the same FMA contraction; the cost of a few FMAs instead of a libm call per element.
template <typename T, typename V>
inline V vexp(V x) {
  using I = decltype(x > x);  // integer lanes of T's width
  constexpr bool single = sizeof(T) == 4;
  constexpr T lo = single ? T(-110) : T(-760);  // below: exp underflows to 0 anyway
  constexpr T log2e = T(1.4426950408889634074);
  constexpr T ln2_hi = single ? T(0.693359375) : T(6.93147180369123816490e-01);
  constexpr T ln2_lo = single ? T(-2.12194440e-4) : T(1.90821492927058770002e-10);
  constexpr T round = single ? T(12582912.0) : T(6755399441055744.0);  // 1.5 * 2^(digits - 1)
  constexpr int digits = std::numeric_limits<T>::digits - 1, bias = std::numeric_limits<T>::max_exponent - 1;
  x = x < lo ? splat<V>(lo) : x;  // NaN stays
  const V n = (x * log2e + round) - round;  // round to nearest
  const V r = (x - n * ln2_hi) - n * ln2_lo;
  const V p = exp_taylor<T, single ? 7 : 13>(r);
  const I k = __builtin_convertvector(n, I);  // NaN lanes: any value, p is NaN there
  const I k1 = k >> 1, k2 = k - k1;           // each factor 2^k1, 2^k2 a normal number
  const I b = I{} + bias;
  V s1, s2;
  const I e1 = (k1 + b) << digits, e2 = (k2 + b) << digits;
  std::memcpy(&s1, &e1, sizeof s1);
  std::memcpy(&s2, &e2, sizeof s2);
  return p * s1 * s2;
}

template <typename T, int MODE, int REDUCE>
struct GenAggr {
  const T* x;          // [N, C]
  const int64_t* ptr;  // [N + 1] over destinations
  const int64_t* src;  // [E]
  const T* attr;       // kDense: [E, C]; kFactored: raw [E, d]
  const T* wt;         // kFactored: W^T [d, C]
  const T* bias;       // kFactored: [C] or nullptr
  T temp, eps;
  int64_t N, C, d, E;
  // channels per register block: 64 bytes (one AVX-512 register; two AVX ones), on every machine,
  // so that the order of every sum is the same everywhere (16 float lanes measured 1.4x faster
  // than 8 for sum's forward + backward here)
  static constexpr int64_t kLanes = 64 / sizeof(T);

  // Nodes (or sources) per task: torch's grain of work at the mean degree.
  int64_t grain() const {
    const int64_t per_row = std::max<int64_t>(1, E / std::max<int64_t>(1, N)) * C;
    return std::max<int64_t>(1, at::internal::GRAIN_SIZE / per_row);
  }

  // The edge terms' bias of channels [c0, c0 + NB L).
  template <typename V, int NB>
  inline void load_bias(int64_t c0, V* b) const {
    constexpr int L = sizeof(V) / sizeof(T);
    for (int j = 0; j < NB; ++j) b[j] = MODE == kFactored && bias ? load<V>(bias + c0 + j * L) : V{};
  }

  // The pre-activations x[j] + t[e] of edge e for channels [c0, c0 + NB L), xj = x's row j from c0:
  // t = (b + sum_k raw[e, k] W^T[k]) in k's order, as gen_max.cpp forms it.
  template <typename V, int NB>
  inline void pre_activation(int64_t e, const T* xj, int64_t c0, const V* b, V* pre) const {
    constexpr int L = sizeof(V) / sizeof(T);
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) pre[j] = load<V>(xj + j * L);
    if constexpr (MODE == kFactored) {
      V t[NB];
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) t[j] = b[j];
      const T* er = attr + e * d;
      for (int64_t k = 0; k < d; ++k) {
        const T ek = er[k];
        const T* w = wt + k * C + c0;
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) t[j] += load<V>(w + j * L) * ek;
      }
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) pre[j] += t[j];
    } else if constexpr (MODE == kDense) {
      const T* a = attr + e * C + c0;
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) pre[j] += load<V>(a + j * L);
    }
  }

  // relu(pre) + eps, NaN passing (as PyG's ReLU)
  template <typename V>
  static inline V message(V pre, T eps) {
    return (pre < T(0) ? V{} : pre) + eps;
  }

  // Node i, channels [c0, c0 + NB L): the sum, mean or online softmax over its edges.
  template <typename V, int NB>
  inline void forward_block(int64_t i, int64_t c0, T* out, T* top, T* denom) const {
    constexpr int L = sizeof(V) / sizeof(T);
    const int64_t e0 = ptr[i], e1 = ptr[i + 1];
    V b[NB], acc[NB], mx[NB], dn[NB];
    load_bias<V, NB>(c0, b);
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      acc[j] = V{};
      mx[j] = splat<V>(-std::numeric_limits<T>::infinity());
      dn[j] = V{};
    }
    for (int64_t e = e0; e < e1; ++e) {
      if (e + kAhead < E) {  // the row of a source kAhead edges on (random: no hardware prefetch)
        const char* row = reinterpret_cast<const char*>(x + src[e + kAhead] * C + c0);
        for (int64_t off = 0; off < NB * L * int64_t(sizeof(T)); off += 64) __builtin_prefetch(row + off);
      }
      V pre[NB];
      pre_activation<V, NB>(e, x + src[e] * C + c0, c0, b, pre);
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) {
        const V m = message(pre[j], eps);
        if constexpr (REDUCE == kSoftmax) {
          // one exp per element: the new term's weight is exp(s - M) where the maximum M stays,
          // else the old sums are rescaled by exp(M - s) (the same values as two exps of
          // s - max(M, s) and M - max(M, s), one of which is exp(0) = 1)
          const V s = temp * m, diff = s - mx[j];
          const auto grows = diff > T(0);
          const V z = vexp<T>(grows ? -diff : diff);
          const V rescale = grows ? z : splat<V>(T(1)), p = grows ? splat<V>(T(1)) : z;
          dn[j] = dn[j] * rescale + p;
          acc[j] = acc[j] * rescale + p * m;
          mx[j] = grows ? s : mx[j];
        } else {
          acc[j] += m;
        }
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      const int64_t at = i * C + c0 + j * L;
      if constexpr (REDUCE == kSoftmax) {
        const V den = dn[j] + T(kFloor);
        store(denom + at, den);
        store(top + at, mx[j]);
        store(out + at, acc[j] / den);
      } else if constexpr (REDUCE == kMean) {
        store(out + at, acc[j] / static_cast<T>(std::max<int64_t>(1, e1 - e0)));
      } else {
        store(out + at, acc[j]);
      }
    }
  }

  // Calls fn(V(), NB as an integral_constant, c0) over the channels: full register blocks in chunks of
  // at most kChunk, as even as possible, then the channels past the last full block one by one. The
  // blocks are of kLanes lanes, or of half as many where those cover the channels and kLanes do not
  // (C = 40 float: five blocks of 8, one pass over the edges, instead of two of 16 and eight passes
  // of one channel each). Every pass walks all the edges, so fewer passes is what counts; the layout
  // is a function of C and T alone.
  template <typename Fn>
  inline void over_channels(Fn&& fn) const {
    using V = typename Vec<T, kLanes>::type;
    using VH = typename Vec<T, kLanes / 2>::type;
    using V1 = typename Vec<T, 1>::type;
    int64_t c0 = C % kLanes && C % (kLanes / 2) == 0 ? blocks<VH>(fn, kLanes / 2) : blocks<V>(fn, kLanes);
    for (; c0 < C; ++c0) fn(V1(), std::integral_constant<int, 1>(), c0);
  }

  // over_channels' full blocks of `lanes` lanes (V's); returns the channels they cover.
  template <typename V, typename Fn>
  inline int64_t blocks(Fn& fn, int64_t lanes) const {
    const int64_t full = C / lanes, chunks = (full + kChunk - 1) / kChunk;
    int64_t c0 = 0;
    for (int64_t q = 0; q < chunks; ++q) {
      const int64_t nb = full * (q + 1) / chunks - full * q / chunks;
      switch (nb) {
        case 1: fn(V(), std::integral_constant<int, 1>(), c0); break;
        case 2: fn(V(), std::integral_constant<int, 2>(), c0); break;
        case 3: fn(V(), std::integral_constant<int, 3>(), c0); break;
        case 4: fn(V(), std::integral_constant<int, 4>(), c0); break;
        default: fn(V(), std::integral_constant<int, 5>(), c0); break;
      }
      c0 += nb * lanes;
    }
    return c0;
  }

  void forward(T* out, T* top, T* denom) const {
    at::parallel_for(0, N, grain(), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        over_channels([&](auto v, auto nb, int64_t c0) {
          forward_block<decltype(v), decltype(nb)::value>(i, c0, out, top, denom);
        });
    });
  }

  // Per-block partial sums of the parameter gradients: pw [d, C] (W^T's layout: a row per raw
  // feature, contiguous in channels), pb [C], pt [1]; and the task's scratch for a tile of edges'
  // gradients and raw features (kTile x C, kTile x d).
  struct Partial {
    T* pw;
    T* pb;
    T* pt;
    T* tile;
    T* tile_attr;
  };
  static constexpr int64_t kTile = 16;

  // pw[q, c0 + j L] += sum over the tile's n edges of gp[k, j] raw[k, q]: QB rows of pw at once in
  // registers (no store per edge), the tile read from L1.
  template <typename V, int NB, int QB>
  inline void tile_rows(int64_t c0, int64_t n, int64_t q0, const Partial& part) const {
    constexpr int L = sizeof(V) / sizeof(T);
    for (int j = 0; j < NB; ++j) {
      V acc[QB];
#pragma GCC unroll 8
      for (int qq = 0; qq < QB; ++qq) acc[qq] = load<V>(part.pw + (q0 + qq) * C + c0 + j * L);
      for (int64_t k = 0; k < n; ++k) {
        const V v = load<V>(part.tile + k * NB * L + j * L);
        const T* a = part.tile_attr + k * d + q0;
#pragma GCC unroll 8
        for (int qq = 0; qq < QB; ++qq) acc[qq] += v * a[qq];
      }
#pragma GCC unroll 8
      for (int qq = 0; qq < QB; ++qq) store(part.pw + (q0 + qq) * C + c0 + j * L, acc[qq]);
    }
  }

  template <typename V, int NB>
  inline void flush_tile(int64_t c0, int64_t n, const Partial& part) const {
    int64_t q0 = 0;
    for (; q0 + 8 <= d; q0 += 8) tile_rows<V, NB, 8>(c0, n, q0, part);
    for (; q0 < d; ++q0) tile_rows<V, NB, 1>(c0, n, q0, part);
  }

  // Destination i's edges [ptr[i], ptr[i + 1]), channels [c0, c0 + NB L): dL/dm per edge through
  // the ReLU, added to the row of its source in gxb (the block's buffer for x's gradient), its
  // features' gradient, and the block's partials. What the edges read of i (g; mean: g / deg;
  // softmax: the saved maximum M, P = g / D and the output O) is loaded once, into registers.
  template <typename V, int NB>
  inline void backward_block(int64_t i, int64_t c0, const T* g, const T* out, const T* top, const T* denom,
                             T* gxb, T* gattr, const Partial& part) const {
    constexpr int L = sizeof(V) / sizeof(T), W = NB * L;
    const int64_t e0 = ptr[i], e1 = ptr[i + 1], at = i * C + c0;
    V b[NB], gi[NB], mx[NB], out_i[NB], gbs[NB], tsum[NB];
    load_bias<V, NB>(c0, b);
    const T scale = T(1) / static_cast<T>(std::max<int64_t>(1, e1 - e0));
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      gi[j] = load<V>(g + at + j * L);
      if constexpr (REDUCE == kMean) gi[j] = gi[j] * scale;
      if constexpr (REDUCE == kSoftmax) {
        gi[j] = gi[j] / load<V>(denom + at + j * L);
        mx[j] = load<V>(top + at + j * L);
        out_i[j] = load<V>(out + at + j * L);
      }
      gbs[j] = tsum[j] = V{};
    }
    int64_t tiled = 0;
    for (int64_t e = e0; e < e1; ++e) {
      if (e + kAhead < E) {  // the source's rows kAhead edges on (random: no hardware prefetch)
        const int64_t sa = src[e + kAhead] * C + c0;
        const char* xr = reinterpret_cast<const char*>(x + sa);
        for (int64_t off = 0; off < W * int64_t(sizeof(T)); off += 64) __builtin_prefetch(xr + off);
        if (gxb) {
          const char* gr = reinterpret_cast<const char*>(gxb + sa);
          for (int64_t off = 0; off < W * int64_t(sizeof(T)); off += 64) __builtin_prefetch(gr + off, 1);
        }
      }
      const int64_t s = src[e];
      V pre[NB], gp[NB];
      pre_activation<V, NB>(e, x + s * C + c0, c0, b, pre);
      if constexpr (REDUCE == kSoftmax) {
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) {
          // a = exp(T m - M) / D; g a = P exp(T m - M); dL/dm = g a (1 + T (m - O))
          const V m = message(pre[j], eps);
          const V ga = gi[j] * vexp<T>(temp * m - mx[j]);
          const V centred = m - out_i[j];
          tsum[j] += ga * centred * centred;  // = g a m (m - h) summed over a node's edges
          gp[j] = pre[j] > T(0) ? ga * (T(1) + temp * centred) : V{};
        }
      } else {
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) gp[j] = pre[j] > T(0) ? gi[j] : V{};
      }
      if (gxb) {
        T* row = gxb + s * C + c0;
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) store(row + j * L, load<V>(row + j * L) + gp[j]);
      }
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) gbs[j] += gp[j];
      if constexpr (MODE == kDense) {
        if (gattr)
#pragma GCC unroll 8
          for (int j = 0; j < NB; ++j) store(gattr + e * C + c0 + j * L, gp[j]);
      } else if constexpr (MODE == kFactored) {
        if (part.pw) {
#pragma GCC unroll 8
          for (int j = 0; j < NB; ++j) store(part.tile + tiled * W + j * L, gp[j]);
          std::memcpy(part.tile_attr + tiled * d, attr + e * d, d * sizeof(T));
          if (++tiled == kTile) {
            flush_tile<V, NB>(c0, tiled, part);
            tiled = 0;
          }
        }
        if (gattr)
          for (int64_t q = 0; q < d; ++q) {
            const T* w = wt + q * C + c0;
            V sum = gp[0] * load<V>(w);
#pragma GCC unroll 8
            for (int j = 1; j < NB; ++j) sum += gp[j] * load<V>(w + j * L);
            gattr[e * d + q] += hsum<T>(sum);
          }
      }
    }
    if constexpr (MODE == kFactored)
      if (tiled) flush_tile<V, NB>(c0, tiled, part);
    if (part.pb)  // b's gradient is the sum of all edges' dL/dm
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) store(part.pb + c0 + j * L, load<V>(part.pb + c0 + j * L) + gbs[j]);
    if constexpr (REDUCE == kSoftmax)
      if (part.pt) {
        V t = tsum[0];
#pragma GCC unroll 8
        for (int j = 1; j < NB; ++j) t += tsum[j];
        *part.pt += hsum<T>(t);
      }
  }

  // Backward's blocks of destinations (the edges split evenly): a function of the graph alone, at
  // most kBlocks, each at least torch's grain of work (edges x channels), and their buffers for x's
  // gradient (N x C each but the first's, which is gx) within a quarter of the edge index's bytes
  // (16 E), though two blocks where the work allows (ogbn-proteins' size, C = 40 float: 8 blocks,
  // 7 buffers of 21 MB; ogbn-products', C = 80: 2 blocks, one buffer of 0.78 GB).
  int64_t backward_blocks() const {
    const int64_t by_work = E * C / std::max<int64_t>(1, at::internal::GRAIN_SIZE);
    const int64_t by_memory = 1 + 4 * E / std::max<int64_t>(1, N * C * int64_t(sizeof(T)));
    return std::max<int64_t>(1, std::min({kBlocks, by_work, std::max<int64_t>(2, by_memory)}));
  }

  // Gradients into gx [N, C], gattr (like attr, zeroed by the caller), gw [C, d], gb [C], gt [1]
  // (each nullptr where not needed; the last three added to by the caller's zeroed buffers).
  void backward(const T* g, const T* out, const T* top, const T* denom, T* gx, T* gattr, T* gw, T* gb,
                T* gt) const {
    const int64_t blocks = backward_blocks();
    const int64_t dw = MODE == kFactored ? d : 0;
    const bool partials = gw || gb || gt;
    // block b's destinations: [first[b], first[b + 1]), the edge count split evenly
    std::vector<int64_t> first(blocks + 1, N);
    for (int64_t b = 0; b < blocks; ++b)
      first[b] = std::lower_bound(ptr, ptr + N, E * b / blocks) - ptr;
    first[0] = 0;
    // x's gradient: block 0 adds into gx, block b > 0 into its own buffer, summed in block order
    std::vector<T> buffers(gx ? (blocks - 1) * N * C : 0, T(0));
    if (gx) std::fill(gx, gx + N * C, T(0));
    // per block: pw [d, C], pb [C], pt [1]
    const int64_t stride = dw * C + C + 1;
    std::vector<T> part(partials ? blocks * stride : 0, T(0));
    at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      std::vector<T> tile(gw && dw ? kTile * (C + dw) : 0);
      for (int64_t b = b0; b < b1; ++b) {
        T* base = partials ? part.data() + b * stride : nullptr;
        const Partial p{gw && dw ? base : nullptr, gb ? base + dw * C : nullptr, gt ? base + dw * C + C : nullptr,
                        tile.data(), tile.data() + kTile * C};
        T* gxb = !gx ? nullptr : b == 0 ? gx : buffers.data() + (b - 1) * N * C;
        for (int64_t i = first[b]; i < first[b + 1]; ++i)
          over_channels([&](auto v, auto nb, int64_t c0) {
            backward_block<decltype(v), decltype(nb)::value>(i, c0, g, out, top, denom, gxb, gattr, p);
          });
      }
    });
    if (gx && blocks > 1)  // per element, the blocks in order
      at::parallel_for(0, N * C, at::internal::GRAIN_SIZE, [&](int64_t begin, int64_t end) {
        for (int64_t b = 1; b < blocks; ++b) {
          const T* buf = buffers.data() + (b - 1) * N * C;
          for (int64_t k = begin; k < end; ++k) gx[k] += buf[k];
        }
      });
    for (int64_t b = 0; b < (partials ? blocks : 0); ++b) {  // in block order: thread-count independent
      const T* pw = part.data() + b * stride;
      if (gw)
        for (int64_t c = 0; c < C; ++c)
          for (int64_t q = 0; q < dw; ++q) gw[c * dw + q] += pw[q * C + c];
      if (gb)
        for (int64_t c = 0; c < C; ++c) gb[c] += pw[dw * C + c];
      if (gt) *gt += pw[dw * C + C];
    }
  }
};

int mode_of(const c10::optional<at::Tensor>& attr, const c10::optional<at::Tensor>& wt) {
  if (!attr.has_value()) return kNone;
  return wt.has_value() ? kFactored : kDense;
}

int reduce_of(const std::string& reduce) {
  if (reduce == "sum") return kSum;
  if (reduce == "mean") return kMean;
  TORCH_CHECK(reduce == "softmax", "gen_aggr: reduce must be 'sum', 'mean' or 'softmax', got '", reduce, "'");
  return kSoftmax;
}

template <typename Fn>
void dispatch(const at::Tensor& x, int mode, int reduce, Fn&& fn) {
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "gen_aggr", [&] {
    auto with_reduce = [&](auto m) {
      if (reduce == kSum) fn(scalar_t(), m, std::integral_constant<int, kSum>());
      else if (reduce == kMean) fn(scalar_t(), m, std::integral_constant<int, kMean>());
      else fn(scalar_t(), m, std::integral_constant<int, kSoftmax>());
    };
    if (mode == kNone) with_reduce(std::integral_constant<int, kNone>());
    else if (mode == kDense) with_reduce(std::integral_constant<int, kDense>());
    else with_reduce(std::integral_constant<int, kFactored>());
  });
}

void check_index(const at::Tensor& index, int64_t size, int64_t bound, const char* what) {
  TORCH_CHECK(index.scalar_type() == at::kLong && index.is_contiguous() && index.dim() == 1 && index.numel() == size,
              "gen_aggr: ", what, " must be a contiguous int64 [", size, "] tensor");
  if (size == 0) return;
  const auto range = at::aminmax(index);
  const int64_t lo = std::get<0>(range).item<int64_t>(), hi = std::get<1>(range).item<int64_t>();
  TORCH_CHECK(lo >= 0 && hi < bound, "gen_aggr: ", what, " holds values outside [0, ", bound, "): ", lo, "..", hi);
}

// Shapes, dtypes and index ranges (an id out of range would read or write outside the tensors).
void check(const at::Tensor& x, const at::Tensor& ptr, const at::Tensor& src, const c10::optional<at::Tensor>& attr,
           const c10::optional<at::Tensor>& wt, const c10::optional<at::Tensor>& bias,
           const c10::optional<at::Tensor>& temp, int reduce) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous(), "gen_aggr: x must be a contiguous CPU [N, C] tensor");
  const int64_t N = x.size(0), E = src.numel();
  check_index(src, E, N, "src");
  TORCH_CHECK(ptr.scalar_type() == at::kLong && ptr.is_contiguous() && ptr.numel() == N + 1,
              "gen_aggr: ptr must be a contiguous int64 [N + 1] tensor");
  TORCH_CHECK(ptr[0].item<int64_t>() == 0 && ptr[N].item<int64_t>() == E && (N == 0 || (ptr.diff() >= 0).all().item<bool>()),
              "gen_aggr: ptr must rise from 0 to the edge count");
  if (attr.has_value()) {
    TORCH_CHECK(attr->scalar_type() == x.scalar_type() && attr->is_contiguous() && attr->dim() == 2 && attr->size(0) == E,
                "gen_aggr: edge features must be a contiguous [E, *] tensor of x's dtype");
    if (wt.has_value()) {
      TORCH_CHECK(wt->scalar_type() == x.scalar_type() && wt->is_contiguous() && wt->dim() == 2 &&
                  wt->size(0) == attr->size(1) && wt->size(1) == x.size(1), "gen_aggr: W^T must be a contiguous [d, C] tensor");
      TORCH_CHECK(!bias.has_value() || (bias->scalar_type() == x.scalar_type() && bias->is_contiguous() && bias->numel() == x.size(1)),
                  "gen_aggr: bias must be a contiguous [C] tensor");
    } else {
      TORCH_CHECK(attr->size(1) == x.size(1), "gen_aggr: dense edge features must be [E, C]");
    }
  }
  TORCH_CHECK(reduce != kSoftmax || (temp.has_value() && temp->numel() == 1 && temp->scalar_type() == x.scalar_type()),
              "gen_aggr: softmax takes its temperature as a one-element tensor of x's dtype");
}

template <typename T, int MODE, int REDUCE>
GenAggr<T, MODE, REDUCE> make(const at::Tensor& x, const at::Tensor& ptr, const at::Tensor& src,
                              const c10::optional<at::Tensor>& attr, const c10::optional<at::Tensor>& wt,
                              const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& temp, double eps) {
  GenAggr<T, MODE, REDUCE> k;
  k.x = x.data_ptr<T>();
  k.ptr = ptr.data_ptr<int64_t>();
  k.src = src.data_ptr<int64_t>();
  k.attr = attr.has_value() ? attr->data_ptr<T>() : nullptr;
  k.wt = wt.has_value() ? wt->data_ptr<T>() : nullptr;
  k.bias = bias.has_value() ? bias->data_ptr<T>() : nullptr;
  k.temp = REDUCE == kSoftmax ? temp->item<T>() : T(1);
  k.eps = static_cast<T>(eps);
  k.N = x.size(0);
  k.C = x.size(1);
  k.E = src.numel();
  k.d = MODE == kFactored ? attr->size(1) : 0;
  return k;
}

std::vector<at::Tensor> forward(const at::Tensor& x, const at::Tensor& ptr, const at::Tensor& src,
                                const c10::optional<at::Tensor>& attr, const c10::optional<at::Tensor>& wt,
                                const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& temp,
                                double eps, const std::string& reduce_name) {
  const int reduce = reduce_of(reduce_name);
  check(x, ptr, src, attr, wt, bias, temp, reduce);
  const int64_t N = x.size(0), C = x.size(1);
  auto out = at::empty({N, C}, x.options());
  auto top = reduce == kSoftmax ? at::empty({N, C}, x.options()) : at::empty({0}, x.options());
  auto denom = reduce == kSoftmax ? at::empty({N, C}, x.options()) : at::empty({0}, x.options());
  dispatch(x, mode_of(attr, wt), reduce, [&](auto tag, auto mode, auto red) {
    using T = decltype(tag);
    make<T, decltype(mode)::value, decltype(red)::value>(x, ptr, src, attr, wt, bias, temp, eps)
        .forward(out.data_ptr<T>(), top.data_ptr<T>(), denom.data_ptr<T>());
  });
  return {out, top, denom};
}

// Returns grad_x [N, C], grad_attr, grad_w [C, d], grad_b [C], grad_t [1] (each empty where not needed).
// The edges' source order (src_ptr, src_dst, src_perm), which the Triton kernel gathers x's gradient
// over, is not read here: this backward walks the destination order.
std::vector<at::Tensor> backward(const at::Tensor& grad, const at::Tensor& out, const at::Tensor& top,
                                 const at::Tensor& denom, const at::Tensor& x, const at::Tensor& ptr,
                                 const at::Tensor& src, const at::Tensor& src_ptr, const at::Tensor& src_dst,
                                 const at::Tensor& src_perm, const c10::optional<at::Tensor>& attr,
                                 const c10::optional<at::Tensor>& wt, const c10::optional<at::Tensor>& bias,
                                 const c10::optional<at::Tensor>& temp, double eps, const std::string& reduce_name,
                                 bool need_x, bool need_attr, bool need_w, bool need_b, bool need_t) {
  const int reduce = reduce_of(reduce_name);
  check(x, ptr, src, attr, wt, bias, temp, reduce);
  const int64_t N = x.size(0), C = x.size(1);
  for (const at::Tensor* t : {&grad, &out})
    TORCH_CHECK(t->sizes() == x.sizes() && t->is_contiguous() && t->scalar_type() == x.scalar_type(),
                "gen_aggr: grad and out must be contiguous and shaped like x");
  if (reduce == kSoftmax)
    for (const at::Tensor* t : {&top, &denom})
      TORCH_CHECK(t->sizes() == x.sizes() && t->is_contiguous() && t->scalar_type() == x.scalar_type(),
                  "gen_aggr: the softmax's saved maximum and denominator must be shaped like x");
  const int mode = mode_of(attr, wt);
  const int64_t d = mode == kFactored ? attr->size(1) : 0;
  auto opts = x.options();
  at::Tensor gx = need_x ? at::empty({N, C}, opts) : at::Tensor();
  at::Tensor ga = need_attr && mode != kNone ? at::zeros_like(*attr) : at::Tensor();
  at::Tensor gw = need_w && mode == kFactored ? at::zeros({C, d}, opts) : at::Tensor();
  at::Tensor gb = need_b && mode == kFactored && bias.has_value() ? at::zeros({C}, opts) : at::Tensor();
  at::Tensor gt = need_t && reduce == kSoftmax ? at::zeros({1}, opts) : at::Tensor();
  dispatch(x, mode, reduce, [&](auto tag, auto m, auto red) {
    using T = decltype(tag);
    auto p = [](at::Tensor& t) { return t.defined() ? t.data_ptr<T>() : nullptr; };
    auto cp = [](const at::Tensor& t) { return t.numel() ? t.data_ptr<T>() : nullptr; };
    make<T, decltype(m)::value, decltype(red)::value>(x, ptr, src, attr, wt, bias, temp, eps)
        .backward(grad.data_ptr<T>(), out.data_ptr<T>(), cp(top), cp(denom), p(gx), p(ga), p(gw), p(gb), p(gt));
  });
  return {gx, ga, gw, gb, gt.defined() ? gt.view_as(*temp) : gt};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "GENConv sum / mean / softmax aggregation, forward");
  m.def("backward", &backward, "GENConv sum / mean / softmax aggregation, backward");
}
