// Fused GENConv message + max aggregation over destination-sorted (CSC) edges, CPU.
//
//   h[i, c] = max_{e = (j -> i)} relu(x[j, c] + t[e, c]) + eps        (0 for nodes without in-edges)
//
// where the edge term t is absent, a dense [E, C] tensor, or kept factored as t = raw W^T + b with
// raw [E, d] (d = 8 on ogbn-proteins): the E x C edge encoding and the E x C messages are never
// written to memory. ReLU is monotone, so the max is taken over the pre-activations and the ReLU
// applied to the result. Forward keeps, per (node, channel), the winning edge as an int32 offset
// into the node's edge segment (-1 where the max is <= 0, so no gradient flows) and, per node, a
// flag telling whether some positive max was reached by several edges. Backward then costs
// O(N C d) instead of O(E C): the gradient goes to the winning edge only, except on flagged nodes,
// whose messages are recomputed and the gradient split evenly among the tied edges (what PyTorch's
// scatter_reduce "amax" backward does, and so PyG's GENConv).
//
// Threads: torch's intra-op pool (at::parallel_for), so torch.set_num_threads applies. A task gets
// at least torch's own grain of work (at::internal::GRAIN_SIZE elements, counted as edges x
// channels), as torch's element-wise ops do: a small graph runs in one thread instead of opening a
// parallel region whose join waits for every thread's time slice on a busy machine.
//
// Every result is bitwise the same on any number of threads: no sum is split by thread. Forward
// is parallel over destination nodes, each node's maximum taken by one task. Backward scatters
// into source rows, which different nodes share, so it is parallel over *channels*: the gradients
// of x, W and b are per channel, each task owns a range of channels and visits every node in
// order, so every element receives its terms in the order one thread would add them (and no
// per-thread buffer is needed). The edge features' gradient mixes a node's channels but each edge
// belongs to one node: a second pass, parallel over nodes, forms it.
//
// Shards (shard_forward / shard_backward): under SAR a worker aggregates its edges shard by shard,
// the sources of a shard being the rows fetched from their owner (any number of rows), the
// destinations its own nodes. Per shard these return the maximum without eps, the winners, the
// tie flags and per (node, channel) tie counts, so that revgnn/distributed/gen_max_sar.py merges
// shards into exactly the one-process result and gradient split.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kLanes = 8;  // channels per register block: one AVX register of float
constexpr int64_t kChunk = 6;  // register blocks processed together (6 x 8 = 48 channels)
constexpr int64_t kAhead = 8;  // forward prefetches the source row this many edges ahead

enum Mode { kNone = 0, kDense = 1, kFactored = 2 };

template <typename T, int MODE>
struct GenMax {
  const T* x;          // [N, C]
  const int64_t* ptr;  // [N + 1]
  const int64_t* src;  // [E]
  const T* attr;       // kDense: [E, C]; kFactored: raw [E, d]
  const T* wt;         // kFactored: W^T [d, C]
  const T* bias;       // kFactored: [C] or nullptr
  int64_t C, d;
  int64_t E;     // edges in all
  int64_t rows;  // rows of x (source nodes); the destinations are ptr's N (equal but for shards)

  // Destinations per parallel task: torch's grain of work at the mean in-degree.
  inline int64_t grain(int64_t N) const {
    const int64_t per_row = std::max<int64_t>(1, E / std::max<int64_t>(1, N)) * C;
    return std::max<int64_t>(1, at::internal::GRAIN_SIZE / per_row);
  }

  // Pre-activation messages of edge e for channels [c0, c0 + n), n <= kLanes (scalar reference).
  inline void message(T* __restrict m, int64_t e, int64_t c0, int64_t n) const {
    const T* __restrict xj = x + src[e] * C + c0;
    if constexpr (MODE == kFactored) {
      T t[kLanes];
      for (int64_t l = 0; l < n; ++l) t[l] = bias ? bias[c0 + l] : T(0);
      const T* __restrict er = attr + e * d;
      for (int64_t k = 0; k < d; ++k) {
        const T ek = er[k];
        const T* __restrict w = wt + k * C + c0;
        for (int64_t l = 0; l < n; ++l) t[l] += w[l] * ek;
      }
      for (int64_t l = 0; l < n; ++l) m[l] = xj[l] + t[l];
    } else if constexpr (MODE == kDense) {
      const T* __restrict a = attr + e * C + c0;
      for (int64_t l = 0; l < n; ++l) m[l] = xj[l] + a[l];
    } else {
      for (int64_t l = 0; l < n; ++l) m[l] = xj[l];
    }
  }

  // GCC/Clang vector extension: kLanes channels in registers (compiled to AVX/AVX-512/SSE/NEON).
  typedef T vec __attribute__((vector_size(kLanes * sizeof(T))));
  static inline vec load(const T* p) {
    vec v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static inline vec splat(T s) { return vec{} + s; }

  // Max over node i's edges for channels [c0, c0 + NB * kLanes), NB register blocks at once
  // (independent dependency chains; one block alone is bound by the compare-blend latency).
  // Returns whether a positive max was tied.
  template <int NB>
  inline bool blocks(int64_t i, int64_t c0, T eps, T* out, int32_t* arg) const {
    const int64_t e0 = ptr[i], e1 = ptr[i + 1];
    // the winner's offset (in the node's segment) and the tie flag live in integer lanes of
    // T's width: all lanes of the loop have one size
    using mask = decltype(vec{} > vec{});  // integer lanes, all ones where true
    using lane = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;  // mask's lane type
    vec acc[NB], b[NB];
    mask win[NB], tie[NB];
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      acc[j] = splat(-std::numeric_limits<T>::infinity());
      win[j] = mask{} - 1;
      tie[j] = mask{};
      b[j] = MODE == kFactored && bias ? load(bias + c0 + j * kLanes) : splat(T(0));
    }
    for (int64_t e = e0; e < e1; ++e) {
      if (e + kAhead < E) {  // the row of a source kAhead edges on (random: no hardware prefetch)
        const char* row = reinterpret_cast<const char*>(x + src[e + kAhead] * C + c0);
        for (int64_t off = 0; off < NB * kLanes * int64_t(sizeof(T)); off += 64) __builtin_prefetch(row + off);
      }
      const T* xj = x + src[e] * C + c0;
      const mask local = mask{} + static_cast<lane>(e - e0);
      vec m[NB];
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) m[j] = load(xj + j * kLanes);
      if constexpr (MODE == kFactored) {
        vec t[NB];
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) t[j] = b[j];
        const T* er = attr + e * d;
        for (int64_t k = 0; k < d; ++k) {
          const T ek = er[k];
          const T* w = wt + k * C + c0;
#pragma GCC unroll 8
          for (int j = 0; j < NB; ++j) t[j] += load(w + j * kLanes) * ek;
        }
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) m[j] += t[j];
      } else if constexpr (MODE == kDense) {
        const T* a = attr + e * C + c0;
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) m[j] += load(a + j * kLanes);
      }
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) {
        const auto gt = (m[j] > acc[j]) | (m[j] != m[j]);  // NaN sticks, as in scatter_reduce
        tie[j] = (tie[j] | (m[j] == acc[j])) & ~gt;
        acc[j] = gt ? m[j] : acc[j];
        win[j] = gt ? local : win[j];  // integer blend
      }
    }
    bool tied = false;
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      const vec tie_t = tie[j] ? splat(T(1)) : splat(T(0));
      tied |= finish(i, c0 + j * kLanes, kLanes, e1 > e0, reinterpret_cast<const T*>(&acc[j]),
                     reinterpret_cast<const lane*>(&win[j]), reinterpret_cast<const T*>(&tie_t), eps,
                     out, arg);
    }
    return tied;
  }

  // Same for a tail of n < kLanes channels, one lane at a time.
  inline bool tail(int64_t i, int64_t c0, int64_t n, T eps, T* out, int32_t* arg) const {
    const int64_t e0 = ptr[i], e1 = ptr[i + 1];
    T acc[kLanes], tie[kLanes], m[kLanes];
    int64_t win[kLanes];
    for (int64_t l = 0; l < n; ++l) {
      acc[l] = -std::numeric_limits<T>::infinity();
      win[l] = -1;
      tie[l] = T(0);
    }
    for (int64_t e = e0; e < e1; ++e) {
      message(m, e, c0, n);
      for (int64_t l = 0; l < n; ++l) {
        const bool gt = (m[l] > acc[l]) | (m[l] != m[l]);
        tie[l] = gt ? T(0) : (m[l] == acc[l] ? T(1) : tie[l]);
        acc[l] = gt ? m[l] : acc[l];
        win[l] = gt ? e - e0 : win[l];
      }
    }
    return finish(i, c0, n, e1 > e0, acc, win, tie, eps, out, arg);
  }

  // out = relu(max) + eps (0 without in-edges); winner offset or -1 where no gradient flows.
  template <typename W>
  inline bool finish(int64_t i, int64_t c0, int64_t n, bool has_edges, const T* acc,
                     const W* win, const T* tie, T eps, T* out, int32_t* arg) const {
    bool tied = false;
    T* o = out + i * C + c0;
    int32_t* a = arg + i * C + c0;
    for (int64_t l = 0; l < n; ++l) {
      const T v = acc[l];
      const bool pos = v > T(0);
      o[l] = has_edges ? (pos || v != v ? v : T(0)) + eps : T(0);
      a[l] = pos ? static_cast<int32_t>(win[l]) : -1;
      tied |= pos && tie[l] != T(0);
    }
    return tied;
  }
  void forward(int64_t N, T eps, T* out, int32_t* arg, uint8_t* tied) const {
    at::parallel_for(0, N, grain(N), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        bool any = false;
        // full blocks in chunks of at most kChunk, as even as possible (C = 80: 5 + 5)
        const int64_t full = C / kLanes, chunks = (full + kChunk - 1) / kChunk;
        int64_t c0 = 0;
        for (int64_t q = 0; q < chunks; ++q) {
          const int64_t nb = full * (q + 1) / chunks - full * q / chunks;
          switch (nb) {
            case 1: any |= blocks<1>(i, c0, eps, out, arg); break;
            case 2: any |= blocks<2>(i, c0, eps, out, arg); break;
            case 3: any |= blocks<3>(i, c0, eps, out, arg); break;
            case 4: any |= blocks<4>(i, c0, eps, out, arg); break;
            case 5: any |= blocks<5>(i, c0, eps, out, arg); break;
            default: any |= blocks<6>(i, c0, eps, out, arg); break;
          }
          c0 += nb * kLanes;
        }
        if (c0 < C) any |= tail(i, c0, C - c0, eps, out, arg);
        tied[i] = any;
      }
    });
  }

  // Gradient of one (edge, channel) message with upstream gradient g.
  inline void push(int64_t e, int64_t c, T g, T* gx, T* gattr, T* gw, T* gb) const {
    if (gx) gx[src[e] * C + c] += g;
    if constexpr (MODE == kDense) {
      if (gattr) gattr[e * C + c] += g;
    } else if constexpr (MODE == kFactored) {
      const T* er = attr + e * d;
      if (gw) {
        T* row = gw + c * d;
        if (d == kLanes) {  // ogbn-proteins' 8 edge features: one register
          const vec r = load(row) + load(er) * g;
          std::memcpy(row, &r, sizeof r);
        } else {
          for (int64_t k = 0; k < d; ++k) row[k] += g * er[k];
        }
      }
      if (gb) gb[c] += g;
      if (gattr) {
        T* gr = gattr + e * d;
        for (int64_t k = 0; k < d; ++k) gr[k] += g * wt[k * C + c];
      }
    }
  }

  // The winners are scattered over a node's edge segment. Reading the segment once in order
  // first (the hardware prefetcher follows a stream) and then the winners from cache is faster
  // than the scattered reads alone; software prefetches did not help (docs/bench/in_code.md).
  inline void touch_segment(int64_t i) const {
    auto touch = [](const char* begin, const char* end) {
      char sink = 0;
      for (const char* line = begin; line < end; line += 64) sink ^= *line;
      asm volatile("" : : "r"(sink));
    };
    touch(reinterpret_cast<const char*>(src + ptr[i]), reinterpret_cast<const char*>(src + ptr[i + 1]));
    if constexpr (MODE != kNone) {
      const int64_t width = MODE == kFactored ? d : C;
      touch(reinterpret_cast<const char*>(attr + ptr[i] * width),
            reinterpret_cast<const char*>(attr + ptr[i + 1] * width));
    }
  }

  // Node with a tied positive max, channels [cb, ce): recompute its messages, split each gradient
  // among the ties. msg, best and count are the caller's scratch (reused across nodes).
  void tied_node(int64_t i, int64_t cb, int64_t ce, const T* g, T* gx, T* gattr, T* gw, T* gb,
                 std::vector<T>& msg, std::vector<T>& best, std::vector<T>& count) const {
    const int64_t e0 = ptr[i], e1 = ptr[i + 1], deg = e1 - e0, n = ce - cb;
    msg.resize(deg * n);
    best.assign(n, -std::numeric_limits<T>::infinity());
    count.assign(n, T(0));
    for (int64_t e = e0; e < e1; ++e)
      for (int64_t c0 = cb; c0 < ce; c0 += kLanes)
        message(msg.data() + (e - e0) * n + (c0 - cb), e, c0, std::min(kLanes, ce - c0));
    for (int64_t k = 0; k < deg; ++k)
      for (int64_t c = 0; c < n; ++c) best[c] = std::max(best[c], msg[k * n + c]);
    for (int64_t k = 0; k < deg; ++k)
      for (int64_t c = 0; c < n; ++c) count[c] += msg[k * n + c] == best[c] ? T(1) : T(0);
    for (int64_t k = 0; k < deg; ++k)
      for (int64_t c = 0; c < n; ++c)
        if (best[c] > T(0) && msg[k * n + c] == best[c])
          push(e0 + k, cb + c, g[i * C + cb + c] / count[c], gx, gattr, gw, gb);
  }

  // Per (node, channel): how many edges reach the node's maximum where it is positive, else 0,
  // counted as tied_node counts them (so that a gradient of count * g / n handed to backward
  // gives g / n to every tied edge). Untied nodes have one winner where arg >= 0.
  void counts(int64_t N, const int32_t* arg, const uint8_t* tied, T* count) const {
    at::parallel_for(0, N, grain(N), [&](int64_t begin, int64_t end) {
      std::vector<T> msg, best(C), cnt(C);
      for (int64_t i = begin; i < end; ++i) {
        T* ci = count + i * C;
        if (!tied[i]) {
          for (int64_t c = 0; c < C; ++c) ci[c] = arg[i * C + c] >= 0 ? T(1) : T(0);
          continue;
        }
        const int64_t e0 = ptr[i], e1 = ptr[i + 1], deg = e1 - e0;
        msg.resize(deg * C);
        std::fill(best.begin(), best.end(), -std::numeric_limits<T>::infinity());
        std::fill(cnt.begin(), cnt.end(), T(0));
        for (int64_t e = e0; e < e1; ++e)
          for (int64_t c0 = 0; c0 < C; c0 += kLanes)
            message(msg.data() + (e - e0) * C + c0, e, c0, std::min(kLanes, C - c0));
        for (int64_t k = 0; k < deg; ++k)
          for (int64_t c = 0; c < C; ++c) best[c] = std::max(best[c], msg[k * C + c]);
        for (int64_t k = 0; k < deg; ++k)
          for (int64_t c = 0; c < C; ++c) cnt[c] += msg[k * C + c] == best[c] ? T(1) : T(0);
        for (int64_t c = 0; c < C; ++c) ci[c] = best[c] > T(0) ? cnt[c] : T(0);
      }
    });
  }

  // Gradients into gx [rows, C], gattr (like attr), gw [C, d], gb [C], each zeroed by the caller or
  // nullptr. Channels per task: at least torch's grain of work, a channel costing about one push
  // per node.
  void backward(int64_t N, const T* g, const int32_t* arg, const uint8_t* tied, T* gx, T* gattr, T* gw,
                T* gb) const {
    if (gx || gw || gb) {
      const int64_t channel_grain = std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(1, N));
      at::parallel_for(0, C, channel_grain, [&](int64_t cb, int64_t ce) {
        std::vector<T> msg, best, count;
        for (int64_t i = 0; i < N; ++i) {
          if (tied[i]) {
            tied_node(i, cb, ce, g, gx, nullptr, gw, gb, msg, best, count);
            continue;
          }
          const int64_t e0 = ptr[i];
          touch_segment(i);
          const int32_t* a = arg + i * C;
          const T* gi = g + i * C;
          for (int64_t c = cb; c < ce; ++c)
            if (a[c] >= 0) push(e0 + a[c], c, gi[c], gx, nullptr, gw, gb);
        }
      });
    }
    if (gattr && MODE != kNone) {
      at::parallel_for(0, N, grain(N), [&](int64_t begin, int64_t end) {
        std::vector<T> msg, best, count;
        for (int64_t i = begin; i < end; ++i) {
          if (tied[i]) {
            tied_node(i, 0, C, g, nullptr, gattr, nullptr, nullptr, msg, best, count);
            continue;
          }
          const int64_t e0 = ptr[i];
          const int32_t* a = arg + i * C;
          const T* gi = g + i * C;
          for (int64_t c = 0; c < C; ++c)
            if (a[c] >= 0) push(e0 + a[c], c, gi[c], nullptr, gattr, nullptr, nullptr);
        }
      });
    }
  }
};

int mode_of(const c10::optional<at::Tensor>& attr, const c10::optional<at::Tensor>& weight) {
  if (!attr.has_value()) return kNone;
  return weight.has_value() ? kFactored : kDense;
}

template <typename T, int MODE>
GenMax<T, MODE> make(const at::Tensor& x, const at::Tensor& ptr, const at::Tensor& src,
                     const c10::optional<at::Tensor>& attr, const c10::optional<at::Tensor>& wt,
                     const c10::optional<at::Tensor>& bias) {
  GenMax<T, MODE> k;
  k.x = x.data_ptr<T>();
  k.ptr = ptr.data_ptr<int64_t>();
  k.src = src.data_ptr<int64_t>();
  k.attr = attr.has_value() ? attr->data_ptr<T>() : nullptr;
  k.wt = wt.has_value() ? wt->data_ptr<T>() : nullptr;
  k.bias = bias.has_value() ? bias->data_ptr<T>() : nullptr;
  k.C = x.size(1);
  k.E = src.numel();
  k.rows = x.size(0);
  k.d = MODE == kFactored ? attr->size(1) : 0;
  return k;
}

template <typename Fn>
void dispatch(const at::Tensor& x, int mode, Fn&& fn) {
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "gen_max", [&] {
    if (mode == kNone) fn(scalar_t(), std::integral_constant<int, kNone>());
    else if (mode == kDense) fn(scalar_t(), std::integral_constant<int, kDense>());
    else fn(scalar_t(), std::integral_constant<int, kFactored>());
  });
}

// The kernels index x with src and the edges with ptr unchecked: a pointer that does not run from 0
// to E without decreasing, or a source outside x's rows, would read (and in backward write) out of
// bounds. One O(N + E) pass over integers before the O(E C) work: always on (see the commit that
// added it for the measured cost), so no input can corrupt memory whoever calls the kernel.
void check_graph(const at::Tensor& ptr, const at::Tensor& src, int64_t rows) {
  const int64_t n = ptr.numel() - 1, E = src.numel();
  const int64_t* p = ptr.data_ptr<int64_t>();
  TORCH_CHECK(p[0] == 0 && p[n] == E, "gen_max: ptr must run from 0 to E = ", E, ", got ", p[0], " to ", p[n]);
  bool monotone = true;
  for (int64_t i = 0; i < n; ++i) monotone &= p[i] <= p[i + 1];
  TORCH_CHECK(monotone, "gen_max: ptr must be non-decreasing (destination-sorted edges)");
  const int64_t* s = src.data_ptr<int64_t>();
  bool inside = true;  // one unsigned comparison catches negative ids too
  for (int64_t e = 0; e < E; ++e) inside &= static_cast<uint64_t>(s[e]) < static_cast<uint64_t>(rows);
  TORCH_CHECK(inside, "gen_max: every source id must be in [0, ", rows, ") (the rows of x)");
}

void check(const at::Tensor& x, const at::Tensor& ptr, const at::Tensor& src,
           const c10::optional<at::Tensor>& attr, const c10::optional<at::Tensor>& wt,
           const c10::optional<at::Tensor>& bias, bool square = true) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous(), "gen_max: x must be a contiguous CPU [N, C] tensor");
  TORCH_CHECK(ptr.scalar_type() == at::kLong && src.scalar_type() == at::kLong && ptr.is_contiguous() && src.is_contiguous(),
              "gen_max: ptr and src must be contiguous int64");
  TORCH_CHECK(!square || ptr.numel() == x.size(0) + 1, "gen_max: ptr must have N + 1 entries");
  TORCH_CHECK(ptr.numel() >= 1, "gen_max: ptr must have N + 1 entries");
  const int64_t E = src.numel();
  check_graph(ptr, src, x.size(0));
  if (attr.has_value()) {
    TORCH_CHECK(attr->scalar_type() == x.scalar_type() && attr->is_contiguous() && attr->dim() == 2 && attr->size(0) == E,
                "gen_max: edge features must be a contiguous [E, *] tensor of x's dtype");
    if (wt.has_value()) {
      TORCH_CHECK(wt->scalar_type() == x.scalar_type() && wt->is_contiguous() && wt->dim() == 2 &&
                  wt->size(0) == attr->size(1) && wt->size(1) == x.size(1), "gen_max: W^T must be a contiguous [d, C] tensor");
      TORCH_CHECK(!bias.has_value() || (bias->scalar_type() == x.scalar_type() && bias->is_contiguous() && bias->numel() == x.size(1)),
                  "gen_max: bias must be a contiguous [C] tensor");
    } else {
      TORCH_CHECK(attr->size(1) == x.size(1), "gen_max: dense edge features must be [E, C]");
    }
  }
}

std::vector<at::Tensor> forward(const at::Tensor& x, const at::Tensor& ptr, const at::Tensor& src,
                                const c10::optional<at::Tensor>& attr, const c10::optional<at::Tensor>& wt,
                                const c10::optional<at::Tensor>& bias, double eps) {
  check(x, ptr, src, attr, wt, bias);
  const int64_t N = x.size(0), C = x.size(1);
  auto out = at::empty({N, C}, x.options());
  auto arg = at::empty({N, C}, x.options().dtype(at::kInt));
  auto tied = at::empty({N}, x.options().dtype(at::kByte));
  dispatch(x, mode_of(attr, wt), [&](auto tag, auto mode) {
    using T = decltype(tag);
    make<T, decltype(mode)::value>(x, ptr, src, attr, wt, bias)
        .forward(N, static_cast<T>(eps), out.data_ptr<T>(), arg.data_ptr<int32_t>(), tied.data_ptr<uint8_t>());
  });
  return {out, arg, tied};
}

// The gradients and the kernel's backward over N destinations, shared by both entry points:
// grad_x [rows of x, C], grad_attr, grad_w [C, d], grad_b [C] (each empty where not needed).
std::vector<at::Tensor> run_backward(const at::Tensor& grad, const at::Tensor& arg, const at::Tensor& tied,
                                     const at::Tensor& x, const at::Tensor& ptr, const at::Tensor& src,
                                     const c10::optional<at::Tensor>& attr, const c10::optional<at::Tensor>& wt,
                                     const c10::optional<at::Tensor>& bias, int64_t N, bool need_x,
                                     bool need_attr, bool need_w, bool need_b) {
  const int64_t C = x.size(1);
  TORCH_CHECK(arg.scalar_type() == at::kInt && arg.is_contiguous() && arg.numel() == N * C &&
              tied.scalar_type() == at::kByte && tied.is_contiguous() && tied.numel() == N,
              "gen_max: arg [N, C] int32 and tied [N] uint8 from forward");
  {  // a winner offset indexes its node's segment: -1 (none) or below the node's in-degree
    const int64_t* p = ptr.data_ptr<int64_t>();
    const int32_t* a = arg.data_ptr<int32_t>();
    bool inside = true;
    for (int64_t i = 0; i < N; ++i) {
      // in unsigned arithmetic -1 + 1 = 0 and every offset outside [-1, degree) lands at or above
      // degree + 1: one comparison per element, which vectorises
      const uint32_t bound = static_cast<uint32_t>(std::min<int64_t>(p[i + 1] - p[i], INT32_MAX)) + 1u;
      uint32_t bad = 0;
      for (int64_t c = 0; c < C; ++c) bad |= static_cast<uint32_t>(static_cast<uint32_t>(a[i * C + c]) + 1u >= bound);
      inside &= bad == 0;
    }
    TORCH_CHECK(inside, "gen_max: arg must hold winner offsets from forward (-1, or below each in-degree)");
  }
  const int mode = mode_of(attr, wt);
  const int64_t d = mode == kFactored ? attr->size(1) : 0;
  auto opts = x.options();
  at::Tensor gx = need_x ? at::zeros({x.size(0), C}, opts) : at::Tensor();
  at::Tensor ga = need_attr && mode != kNone ? at::zeros_like(*attr) : at::Tensor();
  at::Tensor gw = need_w && mode == kFactored ? at::zeros({C, d}, opts) : at::Tensor();
  at::Tensor gb = need_b && mode == kFactored && bias.has_value() ? at::zeros({C}, opts) : at::Tensor();
  dispatch(x, mode, [&](auto tag, auto m) {
    using T = decltype(tag);
    auto p = [](at::Tensor& t) { return t.defined() ? t.data_ptr<T>() : nullptr; };
    make<T, decltype(m)::value>(x, ptr, src, attr, wt, bias)
        .backward(N, grad.data_ptr<T>(), arg.data_ptr<int32_t>(), tied.data_ptr<uint8_t>(),
                  p(gx), p(ga), p(gw), p(gb));
  });
  return {gx, ga, gw, gb};
}

// Returns grad_x [N, C], grad_attr, grad_w [C, d], grad_b [C] (each empty where not needed).
std::vector<at::Tensor> backward(const at::Tensor& grad, const at::Tensor& arg, const at::Tensor& tied,
                                 const at::Tensor& x, const at::Tensor& ptr, const at::Tensor& src,
                                 const c10::optional<at::Tensor>& attr, const c10::optional<at::Tensor>& wt,
                                 const c10::optional<at::Tensor>& bias, bool need_x, bool need_attr,
                                 bool need_w, bool need_b) {
  check(x, ptr, src, attr, wt, bias);
  TORCH_CHECK(grad.sizes() == x.sizes() && grad.is_contiguous() && grad.scalar_type() == x.scalar_type(),
              "gen_max: grad must be contiguous and shaped like x");
  return run_backward(grad, arg, tied, x, ptr, src, attr, wt, bias, x.size(0), need_x, need_attr, need_w, need_b);
}

// A shard of a distributed (SAR) graph: the sources are the rows of x (a fetched block, any
// count), the destinations the ptr.numel() - 1 local nodes. Returns, per destination and
// channel, the maximum ReLU'd pre-activation (no eps; 0 without edges), the winner offsets and
// tie flags of forward, and the tie counts of GenMax::counts.
std::vector<at::Tensor> shard_forward(const at::Tensor& x, const at::Tensor& ptr, const at::Tensor& src,
                                      const c10::optional<at::Tensor>& attr, const c10::optional<at::Tensor>& wt,
                                      const c10::optional<at::Tensor>& bias) {
  check(x, ptr, src, attr, wt, bias, false);
  const int64_t N = ptr.numel() - 1, C = x.size(1);
  auto out = at::empty({N, C}, x.options());
  auto arg = at::empty({N, C}, x.options().dtype(at::kInt));
  auto tied = at::empty({N}, x.options().dtype(at::kByte));
  auto count = at::empty({N, C}, x.options());
  dispatch(x, mode_of(attr, wt), [&](auto tag, auto mode) {
    using T = decltype(tag);
    auto k = make<T, decltype(mode)::value>(x, ptr, src, attr, wt, bias);
    k.forward(N, T(0), out.data_ptr<T>(), arg.data_ptr<int32_t>(), tied.data_ptr<uint8_t>());
    k.counts(N, arg.data_ptr<int32_t>(), tied.data_ptr<uint8_t>(), count.data_ptr<T>());
  });
  return {out, arg, tied, count};
}

// backward for a shard: grad [N, C] over the destinations, grad_x [rows of x, C].
std::vector<at::Tensor> shard_backward(const at::Tensor& grad, const at::Tensor& arg, const at::Tensor& tied,
                                       const at::Tensor& x, const at::Tensor& ptr, const at::Tensor& src,
                                       const c10::optional<at::Tensor>& attr, const c10::optional<at::Tensor>& wt,
                                       const c10::optional<at::Tensor>& bias, bool need_x, bool need_attr,
                                       bool need_w, bool need_b) {
  check(x, ptr, src, attr, wt, bias, false);
  const int64_t N = ptr.numel() - 1, C = x.size(1);
  TORCH_CHECK(grad.dim() == 2 && grad.size(0) == N && grad.size(1) == C && grad.is_contiguous() &&
              grad.scalar_type() == x.scalar_type(), "gen_max: grad must be a contiguous [N, C] tensor of x's dtype");
  TORCH_CHECK(arg.scalar_type() == at::kInt && arg.is_contiguous() && arg.numel() == N * C &&
              tied.scalar_type() == at::kByte && tied.is_contiguous() && tied.numel() == N,
              "gen_max: arg [N, C] int32 and tied [N] uint8 from shard_forward");
  return run_backward(grad, arg, tied, x, ptr, src, attr, wt, bias, N, need_x, need_attr, need_w, need_b);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "fused GENConv max aggregation, forward");
  m.def("backward", &backward, "fused GENConv max aggregation, backward");
  m.def("shard_forward", &shard_forward, "GENConv max over one shard of a SAR graph: max, winners, ties, tie counts");
  m.def("shard_backward", &shard_backward, "GENConv max over one shard of a SAR graph, backward");
}
