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
// Threads: torch's intra-op pool (at::parallel_for), a task getting at least torch's grain of work
// (edges x channels), so a small graph runs in one thread (as gen_max.cpp).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace {

enum Mode { kNone = 0, kDense = 1, kFactored = 2 };
enum Reduce { kSum = 0, kMean = 1, kSoftmax = 2 };

constexpr int64_t kBlocks = 256;     // source blocks of backward's parameter-gradient partial sums
constexpr double kFloor = 1e-16;      // PyG's softmax adds it to every denominator

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

  // Nodes (or sources) per task: torch's grain of work at the mean degree.
  int64_t grain() const {
    const int64_t per_row = std::max<int64_t>(1, E / std::max<int64_t>(1, N)) * C;
    return std::max<int64_t>(1, at::internal::GRAIN_SIZE / per_row);
  }

  // The pre-activations x[src[e]] + t[e] of edge e, all channels, into pre.
  inline void pre_activation(int64_t e, T* __restrict pre) const {
    const T* __restrict xj = x + src[e] * C;
    if constexpr (MODE == kFactored) {
      for (int64_t c = 0; c < C; ++c) pre[c] = bias ? bias[c] : T(0);
      const T* __restrict er = attr + e * d;
      for (int64_t k = 0; k < d; ++k) {
        const T ek = er[k];
        const T* __restrict w = wt + k * C;
        for (int64_t c = 0; c < C; ++c) pre[c] += w[c] * ek;
      }
      for (int64_t c = 0; c < C; ++c) pre[c] += xj[c];
    } else if constexpr (MODE == kDense) {
      const T* __restrict a = attr + e * C;
      for (int64_t c = 0; c < C; ++c) pre[c] = xj[c] + a[c];
    } else {
      for (int64_t c = 0; c < C; ++c) pre[c] = xj[c];
    }
  }

  static inline T message(T pre, T eps) { return (pre < T(0) ? T(0) : pre) + eps; }  // NaN passes

  void forward(T* out, T* top, T* denom) const {
    at::parallel_for(0, N, grain(), [&](int64_t begin, int64_t end) {
      std::vector<T> pre(C), acc(C), mx(C), dn(C);
      for (int64_t i = begin; i < end; ++i) {
        const int64_t e0 = ptr[i], e1 = ptr[i + 1];
        std::fill(acc.begin(), acc.end(), T(0));
        std::fill(mx.begin(), mx.end(), -std::numeric_limits<T>::infinity());
        std::fill(dn.begin(), dn.end(), T(0));
        for (int64_t e = e0; e < e1; ++e) {
          pre_activation(e, pre.data());
          if constexpr (REDUCE == kSoftmax) {
            for (int64_t c = 0; c < C; ++c) {
              const T m = message(pre[c], eps), s = temp * m;
              const T hi = std::max(mx[c], s);
              const T rescale = std::exp(mx[c] - hi), p = std::exp(s - hi);
              dn[c] = dn[c] * rescale + p;
              acc[c] = acc[c] * rescale + p * m;
              mx[c] = hi;
            }
          } else {
            for (int64_t c = 0; c < C; ++c) acc[c] += message(pre[c], eps);
          }
        }
        T* o = out + i * C;
        if constexpr (REDUCE == kSoftmax) {
          T* tp = top + i * C;
          T* dp = denom + i * C;
          for (int64_t c = 0; c < C; ++c) {
            dp[c] = dn[c] + T(kFloor);
            tp[c] = mx[c];
            o[c] = acc[c] / dp[c];
          }
        } else if constexpr (REDUCE == kMean) {
          const T deg = static_cast<T>(std::max<int64_t>(1, e1 - e0));
          for (int64_t c = 0; c < C; ++c) o[c] = acc[c] / deg;
        } else {
          for (int64_t c = 0; c < C; ++c) o[c] = acc[c];
        }
      }
    });
  }

  // Gradients into gx [N, C], gattr (like attr), gw [C, d], gb [C], gt [1] (each nullptr where not
  // needed; gx and gattr fully written here, the others added to by the caller's zeroed buffers).
  // Returns false where src_perm does not list every source's own edges (src[perm[k]] != s).
  bool backward(const T* g, const T* out, const T* top, const T* denom, const int64_t* dst,
                const int64_t* sptr, const int64_t* perm, T* gx, T* gattr, T* gw, T* gb, T* gt) const {
    const int64_t blocks = std::min<int64_t>(kBlocks, std::max<int64_t>(1, N));
    const int64_t dw = MODE == kFactored ? d : 0;
    const bool partials = gw || gb || gt;
    // per block: gw [C, d], gb [C], gt [1]
    const int64_t stride = C * dw + C + 1;
    std::vector<T> part(partials ? blocks * stride : 0, T(0));
    std::vector<char> consistent(blocks, 1);
    const int64_t block_grain = std::max<int64_t>(1, grain() * blocks / std::max<int64_t>(1, N));
    at::parallel_for(0, blocks, block_grain, [&](int64_t b0, int64_t b1) {
      std::vector<T> pre(C), gp(C);
      for (int64_t b = b0; b < b1; ++b) {
        T* pw = partials ? part.data() + b * stride : nullptr;
        T* pb = partials ? pw + C * dw : nullptr;
        T* pt = partials ? pb + C : nullptr;
        for (int64_t s = N * b / blocks; s < N * (b + 1) / blocks; ++s) {
          T* gxs = gx ? gx + s * C : nullptr;
          if (gxs) std::fill(gxs, gxs + C, T(0));
          for (int64_t k = sptr[s]; k < sptr[s + 1]; ++k) {
            const int64_t e = perm[k], i = dst[e];
            if (src[e] != s) {
              consistent[b] = 0;
              continue;
            }
            const T* gi = g + i * C;
            pre_activation(e, pre.data());
            if constexpr (REDUCE == kSoftmax) {
              const T* oi = out + i * C;
              const T* mi = top + i * C;
              const T* di = denom + i * C;
              T tsum = T(0);
              for (int64_t c = 0; c < C; ++c) {
                const T m = message(pre[c], eps);
                const T ga = gi[c] * (std::exp(temp * m - mi[c]) / di[c]);
                const T centred = m - oi[c];
                tsum += ga * centred * centred;  // = g a m (m - h) summed over a node's edges
                gp[c] = pre[c] > T(0) ? ga * (T(1) + temp * centred) : T(0);
              }
              if (pt) *pt += tsum;
            } else {
              const T scale = REDUCE == kMean ? T(1) / static_cast<T>(std::max<int64_t>(1, ptr[i + 1] - ptr[i])) : T(1);
              for (int64_t c = 0; c < C; ++c) gp[c] = pre[c] > T(0) ? gi[c] * scale : T(0);
            }
            if (gxs)
              for (int64_t c = 0; c < C; ++c) gxs[c] += gp[c];
            if constexpr (MODE == kDense) {
              if (gattr) std::copy(gp.begin(), gp.end(), gattr + e * C);
            } else if constexpr (MODE == kFactored) {
              const T* er = attr + e * d;
              if (gattr) {
                T* ga = gattr + e * d;
                for (int64_t q = 0; q < d; ++q) {
                  const T* w = wt + q * C;
                  T sum = T(0);
                  for (int64_t c = 0; c < C; ++c) sum += gp[c] * w[c];
                  ga[q] = sum;
                }
              }
              if (gw)
                for (int64_t c = 0; c < C; ++c)
                  for (int64_t q = 0; q < d; ++q) pw[c * d + q] += gp[c] * er[q];
              if (gb)
                for (int64_t c = 0; c < C; ++c) pb[c] += gp[c];
            }
          }
        }
      }
    });
    for (int64_t b = 0; b < (partials ? blocks : 0); ++b) {  // in block order: thread-count independent
      const T* pw = part.data() + b * stride;
      if (gw)
        for (int64_t j = 0; j < C * dw; ++j) gw[j] += pw[j];
      if (gb)
        for (int64_t c = 0; c < C; ++c) gb[c] += pw[C * dw + c];
      if (gt) *gt += pw[C * dw + C];
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
