// Fused CPU kernels for the slot-cache runner's forward (reinforge.engine.fused loads them).
//
// Each replaces a run of small eager PyTorch calls whose cost at decode sizes (a few dozen rows) is
// the calls themselves, not their arithmetic: docs/engine.md, "Fused CPU kernels". The matrix products
// stay with ATen (MKL / oneDNN); only the glue between them is here. float32 only; the Python side
// falls back to its eager path for anything else.

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;

void check_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void check_index(const at::Tensor& t, int64_t rows, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kLong && t.is_contiguous(), name,
              " must be a contiguous int64 CPU tensor");
  TORCH_CHECK(t.dim() == 1 && t.size(0) == rows, name, " must hold one entry per row (", rows, ")");
}

inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

inline float mean_square(const float* x, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += x[i] * x[i];
  return acc / static_cast<float>(n);
}

// out = x * rsqrt(mean(x^2) + eps) * w (w may be null: no weight).
inline void rms_norm_row(const float* x, const float* w, float eps, float* out, int64_t n) {
  const float inv = 1.f / std::sqrt(mean_square(x, n) + eps);
  if (w == nullptr) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv;
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
  }
}

}  // namespace

// Cascade decode attention for rows 0..n-1 (row i is cache slot i at position positions[i]), whose
// first `shared` cached positions hold the same keys and values in every slot and are read from slot
// 0 only. q: [n, heads, d]; k, v: one layer's cache [slots, kv_heads, capacity, d]; window: a sliding
// window's width (0: none). Returns [n, heads, d].
//
// The shared part is two batched matrix products over all rows at once (ATen); each row's own
// positions, the masks and the joining softmax are one pass here instead of per-row products and
// concatenations.
at::Tensor cascade_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t shared,
                          const at::Tensor& positions, int64_t window, double scale) {
  check_float(q, "q");
  check_float(k, "k");
  check_float(v, "v");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 4 && v.sizes() == k.sizes(), "q must be [n, heads, d], k and v [slots, kv, cap, d]");
  const int64_t n = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t kv = k.size(1), cap = k.size(2);
  TORCH_CHECK(k.size(3) == d && heads % kv == 0 && n <= k.size(0), "q does not match the cache's shape");
  check_index(positions, n, "positions");
  const int64_t group = heads / kv, rows = n * group;
  const int64_t* pos = positions.data_ptr<int64_t>();
  int64_t span = 0;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(pos[i] >= 0 && pos[i] < cap, "position ", pos[i], " is outside the cache");
    span = std::max(span, pos[i] + 1);
  }
  TORCH_CHECK(shared >= 0 && shared <= span, "shared prefix longer than the span");

  // The queries of one KV head as one matrix, scaled: [kv, n * group, d].
  at::Tensor qs = at::empty({kv, rows, d}, q.options());
  {
    const float* src = q.data_ptr<float>();
    float* dst = qs.data_ptr<float>();
    const float s = static_cast<float>(scale);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < kv; ++h)
        for (int64_t g = 0; g < group; ++g) {
          const float* a = src + (i * heads + h * group + g) * d;
          float* b = dst + ((h * n + i) * group + g) * d;
#pragma omp simd
          for (int64_t x = 0; x < d; ++x) b[x] = a[x] * s;
        }
  }
  at::Tensor scores = at::empty({kv, rows, span}, q.options());
  if (shared > 0) {
    at::Tensor prefix = scores.narrow(2, 0, shared);
    at::bmm_out(prefix, qs, k.select(0, 0).narrow(1, 0, shared).transpose(1, 2));
  }
  const float* K = k.data_ptr<float>();
  const float* V = v.data_ptr<float>();
  const float* Q = qs.data_ptr<float>();
  float* S = scores.data_ptr<float>();
  const float minus_inf = -std::numeric_limits<float>::infinity();
  // Own positions' scores, and every position a row does not see masked.
  at::parallel_for(0, kv * n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t h = u / n, i = u % n, p = pos[i];
      const int64_t lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
      const float* keys = K + (i * kv + h) * cap * d;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t r = i * group + g;
        const float* qr = Q + (h * rows + r) * d;
        float* srow = S + (h * rows + r) * span;
        for (int64_t j = 0; j < std::min(lo, shared); ++j) srow[j] = minus_inf;
        for (int64_t j = std::min(p + 1, shared); j < shared; ++j) srow[j] = minus_inf;
        for (int64_t j = shared; j < span; ++j)
          srow[j] = (j <= p && j >= lo) ? dot(qr, keys + j * d, d) : minus_inf;
      }
    }
  });
  at::Tensor probs = at::_softmax(scores, 2, false);
  const float* P = probs.data_ptr<float>();
  at::Tensor out = at::empty({kv, rows, d}, q.options());
  float* O = out.data_ptr<float>();
  // Own positions' values; the shared part is added below as one product.
  at::parallel_for(0, kv * n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t h = u / n, i = u % n, p = pos[i];
      const int64_t lo = std::max(shared, window > 0 ? p - window + 1 : int64_t{0});
      const float* values = V + (i * kv + h) * cap * d;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t r = i * group + g;
        const float* prow = P + (h * rows + r) * span;
        float* orow = O + (h * rows + r) * d;
        std::fill(orow, orow + d, 0.f);
        for (int64_t j = lo; j <= p; ++j) {
          const float w = prow[j];
          const float* vr = values + j * d;
#pragma omp simd
          for (int64_t x = 0; x < d; ++x) orow[x] += w * vr[x];
        }
      }
    }
  });
  if (shared > 0) out.baddbmm_(probs.narrow(2, 0, shared), v.select(0, 0).narrow(1, 0, shared));
  return out.view({kv, n, group, d}).permute({1, 0, 2, 3}).reshape({n, heads, d});
}

// One layer's fused q/k/v output ([rows, (heads + 2 kv) * d]) after the projection: queries and keys
// normalised per head where the family does (qk_norm [heads + kv, d]), rotated with the RoPE tables
// (cos, sin: [positions, d], sin carrying rotate_half's sign), keys and values written to the cache
// ([slots, kv, cap, d]) at (slots[r], positions[r]). Returns the rotated queries [rows, heads, d].
at::Tensor rope_store(const at::Tensor& qkv, int64_t heads, const at::Tensor& cos, const at::Tensor& sin,
                      const at::Tensor& slots, const at::Tensor& positions, at::Tensor k_cache,
                      at::Tensor v_cache, const c10::optional<at::Tensor>& qk_norm, double qk_eps) {
  check_float(qkv, "qkv");
  check_float(cos, "cos");
  check_float(sin, "sin");
  check_float(k_cache, "k_cache");
  check_float(v_cache, "v_cache");
  const int64_t rows = qkv.size(0), kv = k_cache.size(1), cap = k_cache.size(2), d = k_cache.size(3);
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(1) == (heads + 2 * kv) * d, "qkv does not match heads and the cache");
  TORCH_CHECK(cos.dim() == 2 && cos.size(1) == d && sin.sizes() == cos.sizes(), "RoPE tables must be [positions, d]");
  TORCH_CHECK(d % 2 == 0 && d <= 1024, "head_dim must be even and at most 1024");
  check_index(slots, rows, "slots");
  check_index(positions, rows, "positions");
  const float* norm = nullptr;
  if (qk_norm.has_value()) {
    check_float(*qk_norm, "qk_norm");
    TORCH_CHECK(qk_norm->numel() == (heads + kv) * d, "qk_norm must be [heads + kv_heads, d]");
    norm = qk_norm->data_ptr<float>();
  }
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(slot[r] >= 0 && slot[r] < k_cache.size(0) && pos[r] >= 0 && pos[r] < cap && pos[r] < cos.size(0),
                "row ", r, ": slot ", slot[r], " position ", pos[r], " is outside the cache");
  }
  at::Tensor q = at::empty({rows, heads, d}, qkv.options());
  const float* X = qkv.data_ptr<float>();
  const float* C = cos.data_ptr<float>();
  const float* Sn = sin.data_ptr<float>();
  float* Qo = q.data_ptr<float>();
  float* Kc = k_cache.data_ptr<float>();
  float* Vc = v_cache.data_ptr<float>();
  const int64_t width = qkv.size(1), half = d / 2;
  const float eps = static_cast<float>(qk_eps);
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    float buf[1024];
    for (int64_t r = begin; r < end; ++r) {
      const float* c = C + pos[r] * d;
      const float* s = Sn + pos[r] * d;
      const float* row = X + r * width;
      for (int64_t hh = 0; hh < heads + kv; ++hh) {
        const float* x = row + hh * d;
        if (norm != nullptr) {
          rms_norm_row(x, nullptr, eps, buf, d);
          const float* w = norm + hh * d;
#pragma omp simd
          for (int64_t j = 0; j < d; ++j) buf[j] *= w[j];
          x = buf;
        }
        float* dst = hh < heads ? Qo + (r * heads + hh) * d : Kc + ((slot[r] * kv + (hh - heads)) * cap + pos[r]) * d;
#pragma omp simd
        for (int64_t j = 0; j < half; ++j) dst[j] = x[j] * c[j] + x[j + half] * s[j];
#pragma omp simd
        for (int64_t j = half; j < d; ++j) dst[j] = x[j] * c[j] + x[j - half] * s[j];
      }
      for (int64_t h = 0; h < kv; ++h)
        std::copy_n(row + (heads + kv + h) * d, d, Vc + ((slot[r] * kv + h) * cap + pos[r]) * d);
    }
  });
  return q;
}

// The residual stream after a sublayer: x + (post_w ? rms_norm(y) * post_w : y), and that sum's
// rms_norm * w (what reads it next). x, y: [rows, hidden]. Returns (sum, normalised).
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& y, const at::Tensor& w,
                                                double eps, const c10::optional<at::Tensor>& post_w,
                                                double post_eps) {
  check_float(x, "x");
  check_float(y, "y");
  check_float(w, "w");
  TORCH_CHECK(x.dim() == 2 && x.sizes() == y.sizes() && w.numel() == x.size(1), "x, y must be [rows, hidden], w [hidden]");
  const float* post = nullptr;
  if (post_w.has_value()) {
    check_float(*post_w, "post_w");
    TORCH_CHECK(post_w->numel() == x.size(1), "post_w must be [hidden]");
    post = post_w->data_ptr<float>();
  }
  const int64_t rows = x.size(0), hidden = x.size(1);
  TORCH_CHECK(hidden <= 65536, "hidden size above 65536");
  at::Tensor sum = at::empty_like(x);
  at::Tensor normed = at::empty_like(x);
  const float* X = x.data_ptr<float>();
  const float* Y = y.data_ptr<float>();
  const float* W = w.data_ptr<float>();
  float* Su = sum.data_ptr<float>();
  float* Nm = normed.data_ptr<float>();
  const float e = static_cast<float>(eps), post_e = static_cast<float>(post_eps);
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> buf(post != nullptr ? hidden : 0);
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = X + r * hidden;
      const float* yr = Y + r * hidden;
      if (post != nullptr) {
        rms_norm_row(yr, post, post_e, buf.data(), hidden);
        yr = buf.data();
      }
      float* sr = Su + r * hidden;
#pragma omp simd
      for (int64_t j = 0; j < hidden; ++j) sr[j] = xr[j] + yr[j];
      rms_norm_row(sr, W, e, Nm + r * hidden, hidden);
    }
  });
  return {sum, normed};
}

// SwiGLU's middle: silu(gate) * up, from the fused gate/up output [rows, 2 * inter].
at::Tensor silu_mul(const at::Tensor& gate_up) {
  check_float(gate_up, "gate_up");
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0, "gate_up must be [rows, 2 * inter]");
  const int64_t rows = gate_up.size(0), inter = gate_up.size(1) / 2;
  at::Tensor out = at::empty({rows, inter}, gate_up.options());
  const float* G = gate_up.data_ptr<float>();
  float* O = out.data_ptr<float>();
  const int64_t step = Vec::size();
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    const Vec one(1.f);
    for (int64_t r = begin; r < end; ++r) {
      const float* g = G + r * 2 * inter;
      const float* u = g + inter;
      float* o = O + r * inter;
      int64_t j = 0;
      for (; j + step <= inter; j += step) {
        const Vec x = Vec::loadu(g + j);
        (x / (one + x.neg().exp()) * Vec::loadu(u + j)).store(o + j);
      }
      for (; j < inter; ++j) o[j] = g[j] / (1.f + std::exp(-g[j])) * u[j];
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("cascade_decode", &cascade_decode, "Cascade decode attention over a shared prefix");
  m.def("rope_store", &rope_store, "RoPE (and per-head norms) on q/k, k/v written to the cache");
  m.def("add_rms_norm", &add_rms_norm, "Residual add, then RMSNorm");
  m.def("silu_mul", &silu_mul, "silu(gate) * up");
}
