// Linear aggregation over destination-sorted (CSC) edges, CPU: the sum, mean and edge-weighted sum
// of SAGEConv, GINConv and GCNConv without an E x C message tensor.
//
//   out[i, c] = s_i * sum_{e = (j -> i)} w[e] x[j, c]      s_i = 1 / max(deg_i, 1) if mean, else 1
//
// (w = 1 where no weights are given; nodes without in-edges get 0). Backward, with g = dL/dout and
// gs[i, c] = g[i, c] * s_i (formed per edge, not stored):
//
//   dL/dx[j, c] = sum_{e = (j -> i)} w[e] gs[i, c]         over the *source*-sorted edges (CSR:
//                                                         sptr, each edge's destination sdst and
//                                                         its id in destination order sperm)
//   dL/dw[e]    = sum_c gs[i, c] x[j, c]                  over the destination-sorted edges
//
// Each output row (a destination in forward, a source for dL/dx, an edge for dL/dw) is written by
// exactly one task, its terms added in the edges' order: no atomics, and every result is bitwise
// the same on any number of threads. Threads: torch's intra-op pool (at::parallel_for), at least
// torch's grain of work (at::internal::GRAIN_SIZE edges x channels) per task, as gen_max.cpp.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

// Rows per parallel task: torch's grain of work at the mean edges per row.
int64_t grain(int64_t rows, int64_t E, int64_t C) {
  const int64_t per_row = std::max<int64_t>(1, E / std::max<int64_t>(1, rows)) * std::max<int64_t>(1, C);
  return std::max<int64_t>(1, at::internal::GRAIN_SIZE / per_row);
}

void check_index(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kLong && t.dim() == 1 && t.is_contiguous(),
              "aggregate: ", name, " must be a contiguous CPU int64 vector");
}

void check(const at::Tensor& x, const at::Tensor& ptr, const at::Tensor& src, const c10::optional<at::Tensor>& w) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous(), "aggregate: x must be a contiguous CPU [N, C] tensor");
  check_index(ptr, "ptr");
  check_index(src, "src");
  TORCH_CHECK(ptr.numel() == x.size(0) + 1, "aggregate: ptr must have N + 1 entries");
  if (w.has_value()) {
    TORCH_CHECK(w->scalar_type() == x.scalar_type() && w->is_contiguous() && w->dim() == 1 && w->numel() == src.numel(),
                "aggregate: weight must be a contiguous [E] tensor of x's dtype");
  }
}

}  // namespace

at::Tensor forward(const at::Tensor& x, const at::Tensor& ptr, const at::Tensor& src,
                   const c10::optional<at::Tensor>& weight, bool mean) {
  check(x, ptr, src, weight);
  const int64_t N = x.size(0), C = x.size(1), E = src.numel();
  auto out = at::zeros({N, C}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "aggregate_forward", [&] {
    const scalar_t* X = x.data_ptr<scalar_t>();
    const scalar_t* W = weight.has_value() ? weight->data_ptr<scalar_t>() : nullptr;
    const int64_t* P = ptr.data_ptr<int64_t>();
    const int64_t* S = src.data_ptr<int64_t>();
    scalar_t* O = out.data_ptr<scalar_t>();
    at::parallel_for(0, N, grain(N, E, C), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        scalar_t* __restrict o = O + i * C;
        for (int64_t e = P[i]; e < P[i + 1]; ++e) {
          const scalar_t* __restrict xj = X + S[e] * C;
          if (W) {
            const scalar_t we = W[e];
            for (int64_t c = 0; c < C; ++c) o[c] += xj[c] * we;
          } else {
            for (int64_t c = 0; c < C; ++c) o[c] += xj[c];
          }
        }
        if (mean) {  // PyG divides the sum by the clamped count
          const scalar_t deg = static_cast<scalar_t>(std::max<int64_t>(1, P[i + 1] - P[i]));
          for (int64_t c = 0; c < C; ++c) o[c] /= deg;
        }
      }
    });
  });
  return out;
}

// Returns grad_x [N, C] and grad_w [E] (each empty where not needed).
std::vector<at::Tensor> backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& ptr,
                                 const at::Tensor& src, const c10::optional<at::Tensor>& weight, bool mean,
                                 const at::Tensor& sptr, const at::Tensor& sdst, const at::Tensor& sperm,
                                 bool need_x, bool need_w) {
  check(x, ptr, src, weight);
  check_index(sptr, "sptr");
  check_index(sdst, "sdst");
  check_index(sperm, "sperm");
  TORCH_CHECK(grad.sizes() == x.sizes() && grad.is_contiguous() && grad.scalar_type() == x.scalar_type(),
              "aggregate: grad must be contiguous and shaped like x");
  TORCH_CHECK(sptr.numel() == ptr.numel() && sdst.numel() == src.numel() && sperm.numel() == src.numel(),
              "aggregate: the source order must hold the same nodes and edges");
  const int64_t N = x.size(0), C = x.size(1), E = src.numel();
  need_w = need_w && weight.has_value();
  at::Tensor gx = need_x ? at::empty({N, C}, x.options()) : at::Tensor();
  at::Tensor gw = need_w ? at::empty({E}, x.options()) : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "aggregate_backward", [&] {
    using T = scalar_t;
    const T* G = grad.data_ptr<T>();
    const T* X = x.data_ptr<T>();
    const T* W = weight.has_value() ? weight->data_ptr<T>() : nullptr;
    const int64_t* P = ptr.data_ptr<int64_t>();
    const int64_t* S = src.data_ptr<int64_t>();
    if (need_x) {
      const int64_t* SP = sptr.data_ptr<int64_t>();
      const int64_t* SD = sdst.data_ptr<int64_t>();
      const int64_t* SE = sperm.data_ptr<int64_t>();
      T* GX = gx.data_ptr<T>();
      at::parallel_for(0, N, grain(N, E, C), [&](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) {
          T* __restrict o = GX + j * C;
          std::fill(o, o + C, T(0));
          for (int64_t k = SP[j]; k < SP[j + 1]; ++k) {
            const int64_t i = SD[k];
            const T* __restrict gi = G + i * C;
            const T we = W ? W[SE[k]] : T(1);
            if (mean) {  // (g / deg) * w, in the order the PyTorch implementation rounds it
              const T deg = static_cast<T>(std::max<int64_t>(1, P[i + 1] - P[i]));
              for (int64_t c = 0; c < C; ++c) o[c] += (gi[c] / deg) * we;
            } else {
              for (int64_t c = 0; c < C; ++c) o[c] += gi[c] * we;
            }
          }
        }
      });
    }
    if (need_w) {
      T* GW = gw.data_ptr<T>();
      at::parallel_for(0, N, grain(N, E, C), [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const T* __restrict gi = G + i * C;
          const T deg = static_cast<T>(std::max<int64_t>(1, P[i + 1] - P[i]));
          for (int64_t e = P[i]; e < P[i + 1]; ++e) {
            const T* __restrict xj = X + S[e] * C;
            T acc = 0;
            if (mean) {
              for (int64_t c = 0; c < C; ++c) acc += (gi[c] / deg) * xj[c];
            } else {
              for (int64_t c = 0; c < C; ++c) acc += gi[c] * xj[c];
            }
            GW[e] = acc;
          }
        }
      });
    }
  });
  return {gx, gw};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "linear aggregation (sum, mean, edge weights) over destination-sorted edges");
  m.def("backward", &backward, "linear aggregation, backward: to x over source-sorted edges, to the edge weights");
}
