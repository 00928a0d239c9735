// Fused GAT attention over destination-sorted (CSC) edges, CPU: torch.ops.revgnn.gat_attention's
// C++ implementation (revgnn/nn/ops.py holds the PyTorch one, the formulas and the reference).
//
//   z[e, h] = a_src[j, h] + a_dst[i, h] + attr[e] . w[h] + b[h]       (e = j -> i, j != i)
//   z[i, h] = a_src[i, h] + a_dst[i, h] + loop[i, h]                  (node i's self loop)
//   s = LeakyReLU(z),  alpha = exp(s - M[i, h]) / D[i, h],  out[i, h] = sum_e kappa alpha xp[j, h]
//
// with the edges j -> j of the graph left out (PyG's GATConv removes them and adds one loop per
// node) and kappa the attention-dropout scale drawn from a counter-based hash of (seed, edge id,
// head): the same integer hash as revgnn.nn.ops.attention_keep, so both draw the identical mask.
// An edge's id is its position e in the destination order and node i's loop's is E + i, unless
// the caller passes edge_key [E] / loop_key [N] (SAR shards: the ids of the whole graph).
// Forward is an online softmax per destination and head (running maximum, denominator and
// weighted sum); it keeps only out, M, D (O(N C)). Backward recomputes every per-edge quantity:
//
//   dL/ds[e, h] = alpha (kappa <g[i, h], xp[j, h]> - <g[i, h], out[i, h]>),   dz = LeakyReLU'(z) ds
//   dL/dxp[j, h] += kappa alpha g[i, h]
//
// Threads: torch's intra-op pool (at::parallel_for) with torch's grain of work, as gen_max.cpp.
// Every result is bitwise the same on any number of threads: no sum is split by thread. Pass A
// is parallel over destinations (their a_dst, loop and per-edge attr gradients, and per-node
// partial sums of the w and b gradients, which are then summed over nodes in order, parallel over
// their entries); pass B is parallel over *sources*, visiting each source's out-edges through the
// source-sorted order (rowptr over sources, the destination and the destination-order edge id of
// each: PyG's cached EdgeIndex.get_csr()), so a_src and xp gradients are segment sums.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

// revgnn.nn.ops._mix32: the same constants, in uint32 arithmetic.
inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  x ^= x >> 16;
  x *= 0x297A2D39u;
  x ^= x >> 15;
  return x;
}

template <typename T>
struct Gat {
  const T* xp;     // [N, H, C]
  const T* a_src;  // [N, H]
  const T* a_dst;  // [N, H]
  const T* loop;   // [N, H]
  const int64_t* ptr;  // [N + 1]
  const int64_t* src;  // [E]
  const T* attr;    // [E, d] (nullptr if E = 0)
  const T* w;       // [H, d]
  const T* b;       // [H] or nullptr
  int64_t N, H, C, d, E;
  T slope;
  bool edges;  // an edge term (attr given; not attr's pointer, which is null for an empty tensor)
  bool dropout;
  const int64_t* edge_key;  // [E] the edges' dropout ids, or nullptr: their positions e
  const int64_t* loop_key;  // [N] the self loops' dropout ids, or nullptr: E + i
  uint32_t key;       // mix32(seed)
  uint32_t threshold; // 24-bit drop threshold
  T scale;            // 1 / (1 - p)

  inline int64_t grain() const {
    const int64_t per_row = std::max<int64_t>(1, E / std::max<int64_t>(1, N)) * H * C;
    return std::max<int64_t>(1, at::internal::GRAIN_SIZE / per_row);
  }

  inline T kappa(int64_t id, int64_t h) const {
    const uint32_t x = mix32(mix32(key ^ static_cast<uint32_t>(id)) ^ static_cast<uint32_t>(h));
    return (x >> 8) >= threshold ? scale : T(0);
  }

  // the dropout scale of edge e (destination order), head h
  inline T kappa_edge(int64_t e, int64_t h) const {
    if (!dropout) return T(1);
    return kappa(edge_key != nullptr ? edge_key[e] : e, h);
  }

  // the dropout scale of node i's self loop, head h
  inline T kappa_loop(int64_t i, int64_t h) const {
    if (!dropout) return T(1);
    return kappa(loop_key != nullptr ? loop_key[i] : E + i, h);
  }

  inline T logit(int64_t e, int64_t j, int64_t i, int64_t h) const {
    T z = a_src[j * H + h] + a_dst[i * H + h];
    if (edges) {
      T t = b != nullptr ? b[h] : T(0);
      const T* __restrict ar = attr + e * d;
      const T* __restrict wh = w + h * d;
      for (int64_t k = 0; k < d; ++k) t += ar[k] * wh[k];
      z += t;
    }
    return z;
  }

  inline T leaky(T z) const { return z > T(0) ? z : z * slope; }

  inline T dot(const T* __restrict a, const T* __restrict b2) const {
    T s = T(0);
    for (int64_t c = 0; c < C; ++c) s += a[c] * b2[c];
    return s;
  }
};

template <typename T>
void forward_impl(const Gat<T>& g, T* __restrict out, T* __restrict top, T* __restrict den) {
  const int64_t H = g.H, C = g.C;
  at::parallel_for(0, g.N, g.grain(), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      for (int64_t h = 0; h < H; ++h) {
        T* __restrict acc = out + (i * H + h) * C;
        const T* __restrict xi = g.xp + (i * H + h) * C;
        // the self loop starts the online softmax: every node has one, so D >= 1
        T m = g.leaky(g.a_src[i * H + h] + g.a_dst[i * H + h] + g.loop[i * H + h]);
        T dsum = T(1);
        const T k0 = g.kappa_loop(i, h);
        for (int64_t c = 0; c < C; ++c) acc[c] = k0 * xi[c];
        for (int64_t e = g.ptr[i]; e < g.ptr[i + 1]; ++e) {
          const int64_t j = g.src[e];
          if (j == i) continue;
          const T s = g.leaky(g.logit(e, j, i, h));
          const T k = g.kappa_edge(e, h);
          const T* __restrict xj = g.xp + (j * H + h) * C;
          if (s > m) {  // a new maximum: rescale what is summed so far
            const T r = std::exp(m - s);
            dsum = dsum * r + T(1);
            for (int64_t c = 0; c < C; ++c) acc[c] = acc[c] * r + k * xj[c];
            m = s;
          } else {
            const T wgt = std::exp(s - m);
            dsum += wgt;
            const T kw = k * wgt;
            for (int64_t c = 0; c < C; ++c) acc[c] += kw * xj[c];
          }
        }
        const T inv = T(1) / dsum;
        for (int64_t c = 0; c < C; ++c) acc[c] *= inv;
        top[i * H + h] = m;
        den[i * H + h] = dsum;
      }
    }
  });
}

// The optional dropout ids: a contiguous int64 [n], or nullptr where absent.
const int64_t* key_ptr(const c10::optional<torch::Tensor>& key, int64_t n, const char* what) {
  if (!key.has_value() || !key->defined()) return nullptr;
  TORCH_CHECK(key->scalar_type() == torch::kLong && key->is_contiguous() && key->dim() == 1 && key->numel() == n,
              "gat_attention: ", what, " must be a contiguous int64 vector");
  return key->data_ptr<int64_t>();
}

template <typename T>
Gat<T> make(const torch::Tensor& xp, const torch::Tensor& a_src, const torch::Tensor& a_dst,
            const torch::Tensor& loop, const torch::Tensor& ptr, const torch::Tensor& src,
            const c10::optional<torch::Tensor>& attr, const c10::optional<torch::Tensor>& edge_w,
            const c10::optional<torch::Tensor>& edge_b, double slope, double p, int64_t seed,
            const c10::optional<torch::Tensor>& edge_key, const c10::optional<torch::Tensor>& loop_key) {
  TORCH_CHECK(xp.dim() == 3 && xp.is_contiguous(), "gat_attention: xp must be a contiguous [N, H, C]");
  TORCH_CHECK(p >= 0.0 && p < 1.0, "gat_attention: attention dropout must be in [0, 1), got ", p);
  Gat<T> g;
  g.N = xp.size(0);
  g.H = xp.size(1);
  g.C = xp.size(2);
  g.E = src.numel();
  TORCH_CHECK(ptr.numel() == g.N + 1, "gat_attention: ptr must have N + 1 entries");
  for (const auto* t : {&a_src, &a_dst, &loop})
    TORCH_CHECK(t->is_contiguous() && t->numel() == g.N * g.H, "gat_attention: node terms must be [N, H]");
  TORCH_CHECK(ptr.scalar_type() == torch::kLong && src.scalar_type() == torch::kLong && ptr.is_contiguous() &&
                  src.is_contiguous(),
              "gat_attention: ptr and src must be contiguous int64");
  g.xp = xp.data_ptr<T>();
  g.a_src = a_src.data_ptr<T>();
  g.a_dst = a_dst.data_ptr<T>();
  g.loop = loop.data_ptr<T>();
  g.ptr = ptr.data_ptr<int64_t>();
  g.src = src.data_ptr<int64_t>();
  g.attr = nullptr;
  g.edges = false;
  g.w = nullptr;
  g.b = nullptr;
  g.d = 0;
  if (attr.has_value() && attr->defined()) {
    TORCH_CHECK(edge_w.has_value() && edge_w->defined(), "gat_attention: attr needs edge_w");
    TORCH_CHECK(attr->is_contiguous() && attr->dim() == 2 && attr->size(0) == g.E,
                "gat_attention: attr must be a contiguous [E, d]");
    g.d = attr->size(1);
    TORCH_CHECK(edge_w->is_contiguous() && edge_w->size(0) == g.H && edge_w->size(1) == g.d,
                "gat_attention: edge_w must be a contiguous [H, d]");
    g.attr = attr->data_ptr<T>();
    g.edges = true;
    g.w = edge_w->data_ptr<T>();
    if (edge_b.has_value() && edge_b->defined()) g.b = edge_b->data_ptr<T>();
  }
  g.edge_key = key_ptr(edge_key, g.E, "edge_key [E]");
  g.loop_key = key_ptr(loop_key, g.N, "loop_key [N]");
  g.slope = static_cast<T>(slope);
  g.dropout = p > 0.0;
  g.key = mix32(static_cast<uint32_t>(static_cast<uint64_t>(seed) & 0xFFFFFFFFull));
  g.threshold = static_cast<uint32_t>(std::llround(p * 16777216.0));  // ops.dropout_threshold
  g.scale = static_cast<T>(1.0 / (1.0 - p));
  return g;
}

// Node ids outside [0, n) would read and write out of bounds: refused, as PyG's index_select would.
void check_ids(const torch::Tensor& ids, int64_t n, const char* what) {
  if (ids.numel() == 0) return;
  const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
  TORCH_CHECK(lo >= 0 && hi < n, "gat_attention: ", what, " holds ids in [", lo, ", ", hi,
              "] but there are ", n, " nodes");
}

std::vector<torch::Tensor> forward(torch::Tensor xp, torch::Tensor a_src, torch::Tensor a_dst,
                                   torch::Tensor loop, torch::Tensor ptr, torch::Tensor src,
                                   c10::optional<torch::Tensor> attr, c10::optional<torch::Tensor> edge_w,
                                   c10::optional<torch::Tensor> edge_b, double slope, double p, int64_t seed,
                                   c10::optional<torch::Tensor> edge_key, c10::optional<torch::Tensor> loop_key) {
  check_ids(src, xp.size(0), "src");
  check_ids(ptr, src.numel() + 1, "ptr");
  TORCH_CHECK(ptr.numel() == xp.size(0) + 1 && (ptr.numel() == 0 || (ptr[0].item<int64_t>() == 0 &&
              ptr[-1].item<int64_t>() == src.numel())), "gat_attention: ptr must run from 0 to E");
  auto out = torch::empty_like(xp);
  auto top = torch::empty_like(a_src);
  auto den = torch::empty_like(a_src);
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "gat_attention_forward", [&] {
    auto g = make<scalar_t>(xp, a_src, a_dst, loop, ptr, src, attr, edge_w, edge_b, slope, p, seed, edge_key,
                            loop_key);
    forward_impl<scalar_t>(g, out.data_ptr<scalar_t>(), top.data_ptr<scalar_t>(), den.data_ptr<scalar_t>());
  });
  return {out, top, den};
}

template <typename T>
void backward_impl(const Gat<T>& g, const T* __restrict grad, const T* __restrict out, const T* __restrict top,
                   const T* __restrict den, const int64_t* __restrict rowptr, const int64_t* __restrict col,
                   const int64_t* __restrict perm, T* __restrict g_xp, T* __restrict g_src, T* __restrict g_dst,
                   T* __restrict g_loop, T* __restrict g_attr, T* __restrict g_w, T* __restrict g_b) {
  const int64_t N = g.N, H = g.H, C = g.C, d = g.d;
  std::vector<T> go(N * H);  // <g_ih, out_ih>
  const bool edges = g.edges;
  std::vector<T> pw(edges ? N * H * d : 0), pb(edges ? N * H : 0);  // per-node partial w, b gradients

  // dL/dz of an edge j -> i of dropout scale k, head h, and the coefficient kappa alpha (recomputed).
  auto edge_grad = [&](T k, int64_t j, int64_t i, int64_t h, T z, T& ka) -> T {
    const T alpha = std::exp(g.leaky(z) - top[i * H + h]) / den[i * H + h];
    ka = k * alpha;
    const T q = k * g.dot(grad + (i * H + h) * C, g.xp + (j * H + h) * C);
    const T ds = alpha * (q - go[i * H + h]);
    return z > T(0) ? ds : ds * g.slope;
  };

  // pass A: per destination
  at::parallel_for(0, N, g.grain(), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      for (int64_t h = 0; h < H; ++h) go[i * H + h] = g.dot(grad + (i * H + h) * C, out + (i * H + h) * C);
      if (g_attr != nullptr)  // per edge, summed over the heads below: dz . w
        for (int64_t e = g.ptr[i] * d; e < g.ptr[i + 1] * d; ++e) g_attr[e] = T(0);
      for (int64_t h = 0; h < H; ++h) {
        T ka;
        const T z0 = g.a_src[i * H + h] + g.a_dst[i * H + h] + g.loop[i * H + h];
        const T dz0 = edge_grad(g.kappa_loop(i, h), i, i, h, z0, ka);
        g_loop[i * H + h] = dz0;
        g_src[i * H + h] = dz0;  // pass B adds the out-edges
        T acc = dz0;
        T* __restrict pwi = edges ? pw.data() + (i * H + h) * d : nullptr;
        T pbi = T(0);
        if (edges)
          for (int64_t k = 0; k < d; ++k) pwi[k] = T(0);
        for (int64_t e = g.ptr[i]; e < g.ptr[i + 1]; ++e) {
          const int64_t j = g.src[e];
          if (j == i) continue;
          const T dz = edge_grad(g.kappa_edge(e, h), j, i, h, g.logit(e, j, i, h), ka);
          acc += dz;
          if (edges) {
            const T* __restrict ar = g.attr + e * d;
            for (int64_t k = 0; k < d; ++k) pwi[k] += dz * ar[k];
            pbi += dz;
            if (g_attr != nullptr) {
              T* __restrict ga = g_attr + e * d;
              const T* __restrict wh = g.w + h * d;
              for (int64_t k = 0; k < d; ++k) ga[k] += dz * wh[k];
            }
          }
        }
        g_dst[i * H + h] = acc;
        if (edges) pb[i * H + h] = pbi;
      }
    }
  });
  if (edges) {  // sums over nodes in order, parallel over the entries
    at::parallel_for(0, H * d, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        T s = T(0);
        for (int64_t i = 0; i < N; ++i) s += pw[i * H * d + r];
        g_w[r] = s;
      }
    });
    if (g_b != nullptr)
      for (int64_t h = 0; h < H; ++h) {
        T s = T(0);
        for (int64_t i = 0; i < N; ++i) s += pb[i * H + h];
        g_b[h] = s;
      }
  }
  // pass B: per source, over its out-edges in source order
  at::parallel_for(0, N, g.grain(), [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      for (int64_t h = 0; h < H; ++h) {
        T* __restrict gx = g_xp + (j * H + h) * C;
        T ka;
        const T z0 = g.a_src[j * H + h] + g.a_dst[j * H + h] + g.loop[j * H + h];
        edge_grad(g.kappa_loop(j, h), j, j, h, z0, ka);
        const T* __restrict gj = grad + (j * H + h) * C;
        for (int64_t c = 0; c < C; ++c) gx[c] = ka * gj[c];
        T acc = g_src[j * H + h];
        for (int64_t k = rowptr[j]; k < rowptr[j + 1]; ++k) {
          const int64_t i = col[k];
          if (i == j) continue;
          const int64_t e = perm[k];
          acc += edge_grad(g.kappa_edge(e, h), j, i, h, g.logit(e, j, i, h), ka);
          const T* __restrict gi = grad + (i * H + h) * C;
          for (int64_t c = 0; c < C; ++c) gx[c] += ka * gi[c];
        }
        g_src[j * H + h] = acc;
      }
    }
  });
}

std::vector<torch::Tensor> backward(torch::Tensor grad, torch::Tensor out, torch::Tensor top, torch::Tensor den,
                                    torch::Tensor xp, torch::Tensor a_src, torch::Tensor a_dst, torch::Tensor loop,
                                    torch::Tensor ptr, torch::Tensor src, c10::optional<torch::Tensor> attr,
                                    c10::optional<torch::Tensor> edge_w, c10::optional<torch::Tensor> edge_b,
                                    double slope, double p, int64_t seed, torch::Tensor rowptr, torch::Tensor col,
                                    torch::Tensor perm, bool need_attr, c10::optional<torch::Tensor> edge_key,
                                    c10::optional<torch::Tensor> loop_key) {
  TORCH_CHECK(grad.is_contiguous() && grad.sizes() == xp.sizes(), "gat_attention: grad must be like xp");
  TORCH_CHECK(out.is_contiguous() && top.is_contiguous() && den.is_contiguous(), "gat_attention: saved outputs");
  TORCH_CHECK(rowptr.numel() == xp.size(0) + 1 && col.numel() == src.numel() && perm.numel() == src.numel(),
              "gat_attention: the source order must be rowptr [N + 1], col [E], perm [E]");
  TORCH_CHECK(rowptr.scalar_type() == torch::kLong && col.scalar_type() == torch::kLong &&
                  perm.scalar_type() == torch::kLong && rowptr.is_contiguous() && col.is_contiguous() &&
                  perm.is_contiguous(),
              "gat_attention: the source order must be contiguous int64");
  check_ids(src, xp.size(0), "src");
  check_ids(col, xp.size(0), "col");
  check_ids(perm, src.numel(), "perm");
  auto g_xp = torch::empty_like(xp);
  auto g_src = torch::empty_like(a_src);
  auto g_dst = torch::empty_like(a_dst);
  auto g_loop = torch::empty_like(loop);
  const bool edges = attr.has_value() && attr->defined();
  auto g_attr = edges && need_attr ? torch::empty_like(*attr) : xp.new_empty({0});
  auto g_w = edges ? torch::empty_like(*edge_w) : xp.new_empty({0});
  const bool has_b = edges && edge_b.has_value() && edge_b->defined();
  auto g_b = has_b ? torch::empty_like(*edge_b) : xp.new_empty({0});
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "gat_attention_backward", [&] {
    auto g = make<scalar_t>(xp, a_src, a_dst, loop, ptr, src, attr, edge_w, edge_b, slope, p, seed, edge_key,
                            loop_key);
    backward_impl<scalar_t>(g, grad.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), top.data_ptr<scalar_t>(),
                            den.data_ptr<scalar_t>(), rowptr.data_ptr<int64_t>(), col.data_ptr<int64_t>(),
                            perm.data_ptr<int64_t>(), g_xp.data_ptr<scalar_t>(), g_src.data_ptr<scalar_t>(),
                            g_dst.data_ptr<scalar_t>(), g_loop.data_ptr<scalar_t>(),
                            edges && need_attr ? g_attr.data_ptr<scalar_t>() : nullptr,
                            edges ? g_w.data_ptr<scalar_t>() : nullptr, has_b ? g_b.data_ptr<scalar_t>() : nullptr);
  });
  return {g_xp, g_src, g_dst, g_loop, g_attr, g_w, g_b};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "fused GAT attention, forward: out, max, denominator");
  m.def("backward", &backward, "fused GAT attention, backward");
}
