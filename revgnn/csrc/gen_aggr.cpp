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
// Backward streams the edges again, in *source* order (src_ptr [N + 1] over sources, src_perm [E]
// the destination-sorted edge ids listed by source), recomputing each message and
//   dL/dm[e, c] = g[i, c]                         (sum)
//               = g[i, c] / deg(i)                (mean)
//               = g[i, c] a (1 + T (m - h[i, c])) (softmax)
// through the ReLU to x[src[e]]: each source's row is a segment sum owned by one task (no atomics).
// The edge features' gradient is per edge (written once); W's, b's and T's are sums over all edges,
// formed per fixed block of sources (kBlocks, a function of the graph alone) and added block by
// block in order: every result is bitwise the same on any number of threads.
//
// Speed: every loop over channels runs on register blocks of 64 bytes (GCC vector extension, as
// gen_max.cpp), several blocks per pass over a node's edges, the edge term formed in registers.
// The softmax takes one exp per element in forward (the weight of the new term or the rescaling of
// the old sums, the other being exp(0) = 1) and one in backward, both from vexp below. Backward
// first lays out per destination what its edges read (mean: g / deg; softmax: M, g / D and the
// output side by side), so an edge touches one run of memory; W's gradient is accumulated over
// tiles of kTile edges held in registers, b's is the sum of the gx rows.
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

constexpr int64_t kBlocks = 256;     // source blocks of backward's parameter-gradient partial sums
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
  // at most kChunk, as even as possible, then the channels past the last full block one by one.
  template <typename Fn>
  inline void over_channels(Fn&& fn) const {
    using V = typename Vec<T, kLanes>::type;
    using V1 = typename Vec<T, 1>::type;
    const int64_t full = C / kLanes, chunks = (full + kChunk - 1) / kChunk;
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
      c0 += nb * kLanes;
    }
    for (; c0 < C; ++c0) fn(V1(), std::integral_constant<int, 1>(), c0);
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

  // What backward reads per destination, one row of `width` per node: sum: g; mean: g / deg;
  // softmax: per chunk of channels [c0, c0 + w) the three runs M (saved maximum), P = g / D and
  // O (output), so that an edge touches one contiguous run instead of four rows.
  int64_t node_width() const { return REDUCE == kSoftmax ? 3 * C : C; }

  void node_rows(const T* g, const T* out, const T* top, const T* denom, T* rows) const {
    at::parallel_for(0, N, std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(1, C)),
                     [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const T* gi = g + i * C;
        T* r = rows + i * node_width();
        if constexpr (REDUCE == kSoftmax) {
          over_channels([&](auto v, auto nb, int64_t c0) {
            const int64_t w = decltype(nb)::value * int64_t(sizeof(v) / sizeof(T));
            for (int64_t c = 0; c < w; ++c) {
              r[3 * c0 + c] = top[i * C + c0 + c];
              r[3 * c0 + w + c] = gi[c0 + c] / denom[i * C + c0 + c];
              r[3 * c0 + 2 * w + c] = out[i * C + c0 + c];
            }
          });
        } else {
          const T scale = T(1) / static_cast<T>(std::max<int64_t>(1, ptr[i + 1] - ptr[i]));
          for (int64_t c = 0; c < C; ++c) r[c] = gi[c] * scale;
        }
      }
    });
  }

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

  // Source s's edges (k in [sptr[s], sptr[s + 1]), edge perm[k] into dst[perm[k]]), channels
  // [c0, c0 + NB L): dL/dm per edge through the ReLU, summed into gx[s] and the partials.
  template <typename V, int NB>
  inline void backward_block(int64_t s, int64_t c0, const T* rows, const int64_t* dst, const int64_t* sptr,
                             const int64_t* perm, T* gx, T* gattr, const Partial& part, bool& own) const {
    constexpr int L = sizeof(V) / sizeof(T), W = NB * L;
    const int64_t k0 = sptr[s], k1 = sptr[s + 1], width = node_width();
    const int64_t run = REDUCE == kSoftmax ? 3 * c0 : c0;  // this chunk's run in a node's row
    V b[NB], gxs[NB], tsum[NB];
    load_bias<V, NB>(c0, b);
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) gxs[j] = tsum[j] = V{};
    const T* xs = x + s * C + c0;
    int64_t tiled = 0;
    bool listed = true;  // every edge listed for s has source s (checked on the first chunk)
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t e = perm[k], i = dst[e];
      if (c0 == 0) listed &= src[e] == s;
      if (k + kAhead < E) {  // the destination's run kAhead edges on (and its edge's features)
        const int64_t ea = perm[k + kAhead];
        const char* r = reinterpret_cast<const char*>(rows + dst[ea] * width + run);
        for (int64_t off = 0; off < (REDUCE == kSoftmax ? 3 : 1) * W * int64_t(sizeof(T)); off += 64)
          __builtin_prefetch(r + off);
        if constexpr (MODE == kFactored) __builtin_prefetch(attr + ea * d);
        if (k + 2 * kAhead < E) {
          __builtin_prefetch(dst + perm[k + 2 * kAhead]);
          __builtin_prefetch(src + perm[k + 2 * kAhead]);
        }
      }
      V pre[NB], gp[NB];
      pre_activation<V, NB>(e, xs, c0, b, pre);
      const T* r = rows + i * width + run;
      if constexpr (REDUCE == kSoftmax) {
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) {
          // a = exp(T m - M) / D; g a = P exp(T m - M); dL/dm = g a (1 + T (m - O))
          const V m = message(pre[j], eps);
          const V ga = load<V>(r + W + j * L) * vexp<T>(temp * m - load<V>(r + j * L));
          const V centred = m - load<V>(r + 2 * W + j * L);
          tsum[j] += ga * centred * centred;  // = g a m (m - h) summed over a node's edges
          gp[j] = pre[j] > T(0) ? ga * (T(1) + temp * centred) : V{};
        }
      } else {
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) gp[j] = pre[j] > T(0) ? load<V>(r + j * L) : V{};
      }
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) gxs[j] += gp[j];
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
    own &= listed;
    if constexpr (MODE == kFactored)
      if (tiled) flush_tile<V, NB>(c0, tiled, part);
    if (gx)
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) store(gx + s * C + c0 + j * L, gxs[j]);
    if (part.pb)  // b's gradient is the sum of all edges' dL/dm: each source's gx row
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) store(part.pb + c0 + j * L, load<V>(part.pb + c0 + j * L) + gxs[j]);
    if constexpr (REDUCE == kSoftmax)
      if (part.pt) {
        V t = tsum[0];
#pragma GCC unroll 8
        for (int j = 1; j < NB; ++j) t += tsum[j];
        *part.pt += hsum<T>(t);
      }
  }

  // Gradients into gx [N, C], gattr (like attr, zeroed by the caller), gw [C, d], gb [C], gt [1]
  // (each nullptr where not needed; the last three added to by the caller's zeroed buffers).
  // Returns false where src_perm does not list every source's own edges (src[perm[k]] != s).
  bool backward(const T* g, const T* out, const T* top, const T* denom, const int64_t* dst,
                const int64_t* sptr, const int64_t* perm, T* gx, T* gattr, T* gw, T* gb, T* gt) const {
    const int64_t blocks = std::min<int64_t>(kBlocks, std::max<int64_t>(1, N));
    const int64_t dw = MODE == kFactored ? d : 0;
    const bool partials = gw || gb || gt;
    std::vector<T> node;  // sum reads g itself
    if (REDUCE != kSum) {
      node.resize(N * node_width());
      node_rows(g, out, top, denom, node.data());
    }
    const T* rows = REDUCE == kSum ? g : node.data();
    // per block: pw [d, C], pb [C], pt [1]
    const int64_t stride = dw * C + C + 1;
    std::vector<T> part(partials ? blocks * stride : 0, T(0));
    std::vector<char> consistent(blocks, 1);
    const int64_t block_grain = std::max<int64_t>(1, grain() * blocks / std::max<int64_t>(1, N));
    at::parallel_for(0, blocks, block_grain, [&](int64_t b0, int64_t b1) {
      std::vector<T> tile(gw && dw ? kTile * (C + dw) : 0);
      for (int64_t b = b0; b < b1; ++b) {
        T* base = partials ? part.data() + b * stride : nullptr;
        const Partial p{gw && dw ? base : nullptr, gb ? base + dw * C : nullptr, gt ? base + dw * C + C : nullptr,
                        tile.data(), tile.data() + kTile * C};
        for (int64_t s = N * b / blocks; s < N * (b + 1) / blocks; ++s) {
          bool own = true;  // (a mismatch fails the call: the edge's values do not matter then)
          over_channels([&](auto v, auto nb, int64_t c0) {
            backward_block<decltype(v), decltype(nb)::value>(s, c0, rows, dst, sptr, perm, gx, gattr, p, own);
          });
          if (!own) consistent[b] = 0;
        }
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
    return std::all_of(consistent.begin(), consistent.end(), [](char ok) { return ok != 0; });
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
std::vector<at::Tensor> backward(const at::Tensor& grad, const at::Tensor& out, const at::Tensor& top,
                                 const at::Tensor& denom, const at::Tensor& x, const at::Tensor& ptr,
                                 const at::Tensor& src, const at::Tensor& dst, const at::Tensor& src_ptr,
                                 const at::Tensor& src_perm, const c10::optional<at::Tensor>& attr,
                                 const c10::optional<at::Tensor>& wt, const c10::optional<at::Tensor>& bias,
                                 const c10::optional<at::Tensor>& temp, double eps, const std::string& reduce_name,
                                 bool need_x, bool need_attr, bool need_w, bool need_b, bool need_t) {
  const int reduce = reduce_of(reduce_name);
  check(x, ptr, src, attr, wt, bias, temp, reduce);
  const int64_t N = x.size(0), C = x.size(1), E = src.numel();
  check_index(dst, E, N, "dst");
  check_index(src_perm, E, E, "src_perm");
  TORCH_CHECK(src_ptr.scalar_type() == at::kLong && src_ptr.is_contiguous() && src_ptr.numel() == N + 1 &&
              src_ptr[0].item<int64_t>() == 0 && src_ptr[N].item<int64_t>() == E &&
              (N == 0 || (src_ptr.diff() >= 0).all().item<bool>()),
              "gen_aggr: src_ptr must be a contiguous int64 [N + 1] tensor rising from 0 to the edge count");
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
    const bool ok = make<T, decltype(m)::value, decltype(red)::value>(x, ptr, src, attr, wt, bias, temp, eps)
        .backward(grad.data_ptr<T>(), out.data_ptr<T>(), cp(top), cp(denom), dst.data_ptr<int64_t>(),
                  src_ptr.data_ptr<int64_t>(), src_perm.data_ptr<int64_t>(), p(gx), p(ga), p(gw), p(gb), p(gt));
    TORCH_CHECK(ok, "gen_aggr: src_ptr and src_perm do not list the edges by their source (src[src_perm[k]] "
                "must be the source whose segment k lies in)");
  });
  return {gx, ga, gw, gb, gt.defined() ? gt.view_as(*temp) : gt};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "GENConv sum / mean / softmax aggregation, forward");
  m.def("backward", &backward, "GENConv sum / mean / softmax aggregation, backward");
}
