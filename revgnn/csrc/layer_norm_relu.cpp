// Fused pre-activation: LayerNorm over the last dimension, ReLU, and an optional multiplicative
// (dropout) mask, forward and backward in one pass over the rows each.
//
//   y_ic = (x_ic - mu_i) * rstd_i * w_c + b_c,   rstd_i = 1 / sqrt(var_i + eps)   (biased var)
//   h_ic = max(y_ic, 0) * m_ic
//
// The mask is typed like x, or bool with a scale s (m_ic = s where kept, 0 where dropped: a
// quarter of a float mask's bytes, the same products as the float mask holding s).
//
// PyTorch runs this as three ops (layer_norm, relu, mul) and three more in backward, each a pass
// over the [N, C] tensor, with per-row overhead that dominates at GNN widths (C = 40..256).
// Saved for backward: mu and rstd ([N]); y and the ReLU mask are recomputed from x.
//
// Backward per row, with g_ic = dL/dh_ic * m_ic * [not y_ic <= 0] and xhat = (x - mu) * rstd:
//   dx_ic = rstd_i * (g_ic w_c - mean_c(g w) - xhat_ic * mean_c(g w xhat))
//   dw_c = sum_i g_ic xhat_ic,   db_c = sum_i g_ic
// dw and db are summed per fixed block of ROWS rows and the blocks then in order, so results do
// not depend on the number of threads. Rows of x and the mask may be strided (a channel group of
// a wider tensor); elements within a row must be contiguous.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t ROWS = 256;  // rows per partial sum of dw, db (fixed: thread-count independent)
constexpr int64_t L = 8;       // lanes of the explicit vectors below

// GCC/Clang vector extension (as in gen_max.cpp): explicit vectors give predictable code for
// rows this short, where the auto-vectoriser's versioned loops cost more than the arithmetic.
template <typename T>
struct V {
  typedef T vec __attribute__((vector_size(L * sizeof(T))));
  static inline vec load(const T* p) {
    vec v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static inline void store(T* p, vec v) { std::memcpy(p, &v, sizeof v); }
  static inline vec splat(T s) { return vec{} + s; }
  // L mask values from a mask typed like x (M = T), or from a bool mask and its scale
  template <typename M>
  static inline vec mask(const M* p, T scale) {
    if constexpr (std::is_same_v<M, bool>) {
      vec v;
      for (int64_t l = 0; l < L; ++l) v[l] = p[l] ? scale : static_cast<T>(0);
      return v;
    } else {
      return load(p);
    }
  }
  template <typename M>
  static inline T mask1(const M* p, T scale) {
    if constexpr (std::is_same_v<M, bool>) {
      return *p ? scale : static_cast<T>(0);
    } else {
      return *p;
    }
  }
  static inline T hsum(vec v) {
    T s = 0;
    for (int64_t l = 0; l < L; ++l) s += v[l];
    return s;
  }
};

template <typename T, bool HasMask, typename M = T>
void forward_rows(const T* x, int64_t ldx, const T* w, const T* b, const M* m, int64_t ldm, T scale,
                  T* out, T* mean, T* rstd, int64_t N, int64_t C, double eps) {
  using vec = typename V<T>::vec;
  const int64_t CV = C - C % L;  // channels in full vectors; the rest one at a time
  // at least torch's grain of work per task (at::internal::GRAIN_SIZE elements), as its own ops
  at::parallel_for(0, N, std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(1, C)),
                   [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* xi = x + i * ldx;
      vec sv = vec{};
      for (int64_t c = 0; c < CV; c += L) sv += V<T>::load(xi + c);
      T s = V<T>::hsum(sv);
      for (int64_t c = CV; c < C; ++c) s += xi[c];
      const T mu = s / static_cast<T>(C);
      vec vv = vec{};
      for (int64_t c = 0; c < CV; c += L) {
        const vec d = V<T>::load(xi + c) - mu;
        vv += d * d;
      }
      T v = V<T>::hsum(vv);
      for (int64_t c = CV; c < C; ++c) v += (xi[c] - mu) * (xi[c] - mu);
      const T r = static_cast<T>(1) / std::sqrt(v / static_cast<T>(C) + static_cast<T>(eps));
      mean[i] = mu;
      rstd[i] = r;
      T* oi = out + i * C;
      const M* mi = HasMask ? m + i * ldm : nullptr;
      for (int64_t c = 0; c < CV; c += L) {
        const vec y = (V<T>::load(xi + c) - mu) * r * V<T>::load(w + c) + V<T>::load(b + c);
        vec h = y < 0 ? vec{} : y;  // NaN passes, as torch.relu
        if constexpr (HasMask) h *= V<T>::mask(mi + c, scale);
        V<T>::store(oi + c, h);
      }
      for (int64_t c = CV; c < C; ++c) {
        const T y = (xi[c] - mu) * r * w[c] + b[c];
        T h = y < 0 ? static_cast<T>(0) : y;
        if constexpr (HasMask) h *= V<T>::mask1(mi + c, scale);
        oi[c] = h;
      }
    }
  });
}

template <typename T, bool HasMask, typename M = T>
void backward_rows(const T* go, const T* x, int64_t ldx, const T* w, const T* b, const M* m,
                   int64_t ldm, T scale, const T* mean, const T* rstd, T* gx, T* gw_part, T* gb_part,
                   int64_t N, int64_t C) {
  using vec = typename V<T>::vec;
  const int64_t CV = C - C % L;
  const int64_t blocks = (N + ROWS - 1) / ROWS;
  at::parallel_for(0, blocks, std::max<int64_t>(1, at::internal::GRAIN_SIZE / (ROWS * std::max<int64_t>(1, C))),
                   [&](int64_t bb, int64_t be) {
    std::vector<T> g(C), xh(C);
    for (int64_t blk = bb; blk < be; ++blk) {
      T* gw = gw_part ? gw_part + blk * C : nullptr;
      T* gb = gb_part ? gb_part + blk * C : nullptr;
      if (gw) std::fill(gw, gw + C, static_cast<T>(0));
      if (gb) std::fill(gb, gb + C, static_cast<T>(0));
      const int64_t end = std::min(N, (blk + 1) * ROWS);
      for (int64_t i = blk * ROWS; i < end; ++i) {
        const T* xi = x + i * ldx;
        const T* goi = go + i * C;
        const M* mi = HasMask ? m + i * ldm : nullptr;
        const T mu = mean[i], r = rstd[i];
        vec s1v = vec{}, s2v = vec{};
        for (int64_t c = 0; c < CV; c += L) {
          const vec xhat = (V<T>::load(xi + c) - mu) * r;
          const vec wc = V<T>::load(w + c);
          const vec y = xhat * wc + V<T>::load(b + c);
          vec gc = V<T>::load(goi + c);
          if constexpr (HasMask) gc *= V<T>::mask(mi + c, scale);
          gc = y <= 0 ? vec{} : gc;  // NaN passes, as torch's ReLU backward
          V<T>::store(g.data() + c, gc);
          V<T>::store(xh.data() + c, xhat);
          const vec dxh = gc * wc;
          s1v += dxh;
          s2v += dxh * xhat;
        }
        T s1 = V<T>::hsum(s1v), s2 = V<T>::hsum(s2v);
        for (int64_t c = CV; c < C; ++c) {
          const T xhat = (xi[c] - mu) * r;
          const T y = xhat * w[c] + b[c];
          T gc = goi[c];
          if constexpr (HasMask) gc *= V<T>::mask1(mi + c, scale);
          gc = y <= 0 ? static_cast<T>(0) : gc;
          g[c] = gc;
          xh[c] = xhat;
          s1 += gc * w[c];
          s2 += gc * w[c] * xhat;
        }
        const T* gp = g.data();
        const T* xp = xh.data();
        if (gw) {
          for (int64_t c = 0; c < CV; c += L)
            V<T>::store(gw + c, V<T>::load(gw + c) + V<T>::load(gp + c) * V<T>::load(xp + c));
          for (int64_t c = CV; c < C; ++c) gw[c] += gp[c] * xp[c];
        }
        if (gb) {
          for (int64_t c = 0; c < CV; c += L) V<T>::store(gb + c, V<T>::load(gb + c) + V<T>::load(gp + c));
          for (int64_t c = CV; c < C; ++c) gb[c] += gp[c];
        }
        if (gx) {
          const T a1 = s1 / static_cast<T>(C), a2 = s2 / static_cast<T>(C);
          T* gxi = gx + i * C;
          for (int64_t c = 0; c < CV; c += L)
            V<T>::store(gxi + c, (V<T>::load(gp + c) * V<T>::load(w + c) - a1 - V<T>::load(xp + c) * a2) * r);
          for (int64_t c = CV; c < C; ++c) gxi[c] = r * (gp[c] * w[c] - a1 - xp[c] * a2);
        }
      }
    }
  });
}

void check(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
           const c10::optional<torch::Tensor>& mask) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu() && b.device().is_cpu() && (!mask || mask->device().is_cpu()),
              "layer_norm_relu: CPU tensors only");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "layer_norm_relu: x must be [N, C] with contiguous rows");
  TORCH_CHECK(w.is_contiguous() && b.is_contiguous() && w.numel() == x.size(1) && b.numel() == x.size(1),
              "layer_norm_relu: weight and bias must be contiguous [C]");
  TORCH_CHECK(w.scalar_type() == x.scalar_type() && b.scalar_type() == x.scalar_type(),
              "layer_norm_relu: dtypes differ");
  if (mask) {
    TORCH_CHECK(mask->sizes() == x.sizes() && mask->stride(1) == 1 &&
                    (mask->scalar_type() == x.scalar_type() || mask->scalar_type() == at::kBool),
                "layer_norm_relu: mask must be shaped like x, typed like x or bool, with contiguous rows");
  }
}

std::vector<torch::Tensor> forward(torch::Tensor x, torch::Tensor w, torch::Tensor b, double eps,
                                   c10::optional<torch::Tensor> mask, double mask_scale) {
  check(x, w, b, mask);
  const int64_t N = x.size(0), C = x.size(1);
  auto out = torch::empty({N, C}, x.options());
  auto mean = torch::empty({N}, x.options());
  auto rstd = torch::empty({N}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "layer_norm_relu_forward", [&] {
    const auto s = static_cast<scalar_t>(mask_scale);
    if (mask && mask->scalar_type() == at::kBool) {
      forward_rows<scalar_t, true, bool>(x.data_ptr<scalar_t>(), x.stride(0), w.data_ptr<scalar_t>(),
                                         b.data_ptr<scalar_t>(), mask->data_ptr<bool>(), mask->stride(0), s,
                                         out.data_ptr<scalar_t>(), mean.data_ptr<scalar_t>(),
                                         rstd.data_ptr<scalar_t>(), N, C, eps);
      return;
    }
    auto run = mask ? forward_rows<scalar_t, true> : forward_rows<scalar_t, false>;
    run(x.data_ptr<scalar_t>(), x.stride(0), w.data_ptr<scalar_t>(),
                           b.data_ptr<scalar_t>(), mask ? mask->data_ptr<scalar_t>() : nullptr,
                           mask ? mask->stride(0) : 0, s, out.data_ptr<scalar_t>(),
                           mean.data_ptr<scalar_t>(), rstd.data_ptr<scalar_t>(), N, C, eps);
  });
  return {out, mean, rstd};
}

std::vector<torch::Tensor> backward(torch::Tensor grad_out, torch::Tensor x, torch::Tensor w,
                                    torch::Tensor b, torch::Tensor mean, torch::Tensor rstd,
                                    c10::optional<torch::Tensor> mask, double mask_scale, bool need_x,
                                    bool need_w, bool need_b, bool into_grad) {
  check(x, w, b, mask);
  TORCH_CHECK(grad_out.is_contiguous() && grad_out.sizes() == x.sizes(), "layer_norm_relu: bad grad");
  const int64_t N = x.size(0), C = x.size(1);
  const int64_t blocks = (N + ROWS - 1) / ROWS;
  // into_grad: grad_x overwrites grad_out (each row is read into g before its grad_x is written)
  auto gx = need_x ? (into_grad ? grad_out : torch::empty({N, C}, x.options())) : torch::Tensor();
  auto gw = need_w ? torch::empty({blocks, C}, x.options()) : torch::Tensor();
  auto gb = need_b ? torch::empty({blocks, C}, x.options()) : torch::Tensor();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "layer_norm_relu_backward", [&] {
    const auto s = static_cast<scalar_t>(mask_scale);
    if (mask && mask->scalar_type() == at::kBool) {
      backward_rows<scalar_t, true, bool>(grad_out.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), x.stride(0),
                                          w.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(), mask->data_ptr<bool>(),
                                          mask->stride(0), s, mean.data_ptr<scalar_t>(),
                                          rstd.data_ptr<scalar_t>(), need_x ? gx.data_ptr<scalar_t>() : nullptr,
                                          need_w ? gw.data_ptr<scalar_t>() : nullptr,
                                          need_b ? gb.data_ptr<scalar_t>() : nullptr, N, C);
      return;
    }
    auto run = mask ? backward_rows<scalar_t, true> : backward_rows<scalar_t, false>;
    run(grad_out.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), x.stride(0),
                            w.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(),
                            mask ? mask->data_ptr<scalar_t>() : nullptr, mask ? mask->stride(0) : 0, s,
                            mean.data_ptr<scalar_t>(), rstd.data_ptr<scalar_t>(),
                            need_x ? gx.data_ptr<scalar_t>() : nullptr,
                            need_w ? gw.data_ptr<scalar_t>() : nullptr,
                            need_b ? gb.data_ptr<scalar_t>() : nullptr, N, C);
  });
  return {gx, need_w ? gw.sum(0) : gw, need_b ? gb.sum(0) : gb};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "fused LayerNorm + ReLU (+ mask), forward");
  m.def("backward", &backward, "fused LayerNorm + ReLU (+ mask), backward");
}
