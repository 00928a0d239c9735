// Plain max aggregation over destination-sorted (CSC) edges, CPU: SAGEConv's aggr='max' without an
// E x C message tensor.
//
//   out[i, c]   = max_{e = (j -> i)} x[j, c]            (0 for nodes without in-edges; NaN wins)
//   count[i, c] = #{e = (j -> i) : x[j, c] == out[i, c]}
//
// Backward splits each (node, channel)'s gradient evenly among the edges reaching its maximum, as
// torch's scatter_reduce "amax" backward does in PyG's max aggregation (include_self=False into
// zeros), whose divisor also counts the untouched zero where the maximum equals 0:
//
//   dL/dx[j, c] = sum_{e = (j -> i)} [x[j, c] == out[i, c]] g[i, c] / (count[i, c] + [out[i, c] == 0])
//
// over the *source*-sorted edges (CSR: sptr and each edge's destination sdst). Each output row is
// written by exactly one task, its terms added in the edges' order: no atomics, bitwise the same on
// any number of threads (torch's intra-op pool, as gen_max.cpp).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

int64_t grain(int64_t rows, int64_t E, int64_t C) {
  const int64_t per_row = std::max<int64_t>(1, E / std::max<int64_t>(1, rows)) * std::max<int64_t>(1, C);
  return std::max<int64_t>(1, at::internal::GRAIN_SIZE / per_row);
}

void check_index(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kLong && t.dim() == 1 && t.is_contiguous(),
              "segment_max: ", name, " must be a contiguous CPU int64 vector");
}

}  // namespace

std::vector<at::Tensor> forward(const at::Tensor& x, const at::Tensor& ptr, const at::Tensor& src) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous(), "segment_max: x must be a contiguous CPU [N, C] tensor");
  check_index(ptr, "ptr");
  check_index(src, "src");
  TORCH_CHECK(ptr.numel() == x.size(0) + 1, "segment_max: ptr must have N + 1 entries");
  const int64_t N = x.size(0), C = x.size(1), E = src.numel();
  auto out = at::empty({N, C}, x.options());
  auto count = at::empty({N, C}, x.options().dtype(at::kInt));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "segment_max_forward", [&] {
    using T = scalar_t;
    const T* X = x.data_ptr<T>();
    const int64_t* P = ptr.data_ptr<int64_t>();
    const int64_t* S = src.data_ptr<int64_t>();
    T* O = out.data_ptr<T>();
    int32_t* K = count.data_ptr<int32_t>();
    at::parallel_for(0, N, grain(N, E, C), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        T* __restrict o = O + i * C;
        int32_t* __restrict k = K + i * C;
        std::fill(k, k + C, 0);
        if (P[i] == P[i + 1]) {
          std::fill(o, o + C, T(0));
          continue;
        }
        std::fill(o, o + C, -std::numeric_limits<T>::infinity());
        for (int64_t e = P[i]; e < P[i + 1]; ++e) {
          const T* __restrict xj = X + S[e] * C;
          for (int64_t c = 0; c < C; ++c) o[c] = (xj[c] > o[c] || std::isnan(xj[c])) && !std::isnan(o[c]) ? xj[c] : o[c];
        }
        for (int64_t e = P[i]; e < P[i + 1]; ++e) {
          const T* __restrict xj = X + S[e] * C;
          for (int64_t c = 0; c < C; ++c) k[c] += xj[c] == o[c];
        }
      }
    });
  });
  return {out, count};
}

at::Tensor backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& out, const at::Tensor& count,
                    const at::Tensor& sptr, const at::Tensor& sdst) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous(), "segment_max: x must be a contiguous CPU [N, C] tensor");
  TORCH_CHECK(grad.sizes() == x.sizes() && grad.is_contiguous() && grad.scalar_type() == x.scalar_type() &&
              out.sizes() == x.sizes() && out.is_contiguous() && out.scalar_type() == x.scalar_type(),
              "segment_max: grad and out must be contiguous and shaped like x");
  TORCH_CHECK(count.sizes() == x.sizes() && count.is_contiguous() && count.scalar_type() == at::kInt,
              "segment_max: count must be a contiguous int32 tensor shaped like x");
  check_index(sptr, "sptr");
  check_index(sdst, "sdst");
  TORCH_CHECK(sptr.numel() == x.size(0) + 1, "segment_max: sptr must have N + 1 entries");
  const int64_t N = x.size(0), C = x.size(1), E = sdst.numel();
  auto gx = at::empty({N, C}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "segment_max_backward", [&] {
    using T = scalar_t;
    const T* G = grad.data_ptr<T>();
    const T* X = x.data_ptr<T>();
    const T* O = out.data_ptr<T>();
    const int32_t* K = count.data_ptr<int32_t>();
    const int64_t* SP = sptr.data_ptr<int64_t>();
    const int64_t* SD = sdst.data_ptr<int64_t>();
    T* GX = gx.data_ptr<T>();
    at::parallel_for(0, N, grain(N, E, C), [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        const T* __restrict xj = X + j * C;
        T* __restrict o = GX + j * C;
        std::fill(o, o + C, T(0));
        for (int64_t e = SP[j]; e < SP[j + 1]; ++e) {
          const int64_t i = SD[e];
          const T* __restrict oi = O + i * C;
          const T* __restrict gi = G + i * C;
          const int32_t* __restrict ki = K + i * C;
          for (int64_t c = 0; c < C; ++c) {
            if (xj[c] == oi[c]) o[c] += gi[c] / static_cast<T>(ki[c] + (oi[c] == T(0)));
          }
        }
      }
    });
  });
  return gx;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "max aggregation over destination-sorted edges: max and tie counts");
  m.def("backward", &backward, "max aggregation, backward over source-sorted edges");
}
