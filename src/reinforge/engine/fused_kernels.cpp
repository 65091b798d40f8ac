// Fused CPU kernels for the slot-cache runner's forward (reinforge.engine.fused loads them).
//
// Each replaces a run of small eager PyTorch calls whose cost at decode sizes (a few dozen rows) is
// the calls themselves, not their arithmetic: docs/engine.md, "Fused CPU kernels". The projections are
// panel_linear.cpp's (registered here, so both build as one library); attention's larger products stay
// with ATen. float32 only; the Python side falls back to its eager path for anything else.

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace reinforge {  // panel_linear.cpp: the projections, and its panels for cascade decode's prefix
int64_t panel_width();
at::Tensor panel_linear(const at::Tensor& x, const at::Tensor& panels, const c10::optional<at::Tensor>& bias);
void panel_rows(const float* a, int64_t rows, int64_t lda, const float* panels, int64_t K, int64_t p0, int64_t p1,
                float* c, int64_t ldc, bool accumulate);
}  // namespace reinforge

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

inline float hsum(const Vec& v) {
  return at::vec::vec_reduce_all<float>(std::plus<Vec>(), v);
}

// Scores of one query against `count` keys (rows of `d` floats, `stride` apart): out[j] = q . k_j.
// CHUNKS = d / Vec::size(), so the query stays in registers.
template <int CHUNKS>
void scores_vec(const float* q, const float* keys, int64_t stride, int64_t count, float* out) {
  Vec qv[CHUNKS];
  for (int c = 0; c < CHUNKS; ++c) qv[c] = Vec::loadu(q + c * Vec::size());
  for (int64_t j = 0; j < count; ++j) {
    const float* k = keys + j * stride;
    Vec acc = qv[0] * Vec::loadu(k);
    for (int c = 1; c < CHUNKS; ++c) acc = at::vec::fmadd(qv[c], Vec::loadu(k + c * Vec::size()), acc);
    out[j] = hsum(acc);
  }
}

// out = sum_j w[j] * v_j over `count` value rows.
template <int CHUNKS>
void weighted_sum_vec(const float* w, const float* values, int64_t stride, int64_t count, float* out) {
  Vec acc[CHUNKS];
  for (int c = 0; c < CHUNKS; ++c) acc[c] = Vec(0.f);
  for (int64_t j = 0; j < count; ++j) {
    const Vec wj(w[j]);
    const float* v = values + j * stride;
    for (int c = 0; c < CHUNKS; ++c) acc[c] = at::vec::fmadd(wj, Vec::loadu(v + c * Vec::size()), acc[c]);
  }
  for (int c = 0; c < CHUNKS; ++c) acc[c].store(out + c * Vec::size());
}

// Calls f(std::integral_constant<int, C>{}) with C = d / Vec::size(), for the head sizes the kernels
// unroll into registers; false (f not called) for any other.
template <typename F>
bool with_chunks(int64_t d, F&& f) {
  if (d % Vec::size() != 0) return false;
  switch (d / Vec::size()) {
    case 2: f(std::integral_constant<int, 2>{}); return true;
    case 4: f(std::integral_constant<int, 4>{}); return true;
    case 8: f(std::integral_constant<int, 8>{}); return true;
    case 16: f(std::integral_constant<int, 16>{}); return true;
    default: return false;
  }
}

void scores_any(const float* q, const float* keys, int64_t stride, int64_t count, int64_t d, float* out) {
  if (with_chunks(d, [&](auto c) { scores_vec<decltype(c)::value>(q, keys, stride, count, out); })) return;
  for (int64_t j = 0; j < count; ++j) out[j] = dot(q, keys + j * stride, d);
}

void weighted_sum_any(const float* w, const float* values, int64_t stride, int64_t count, int64_t d, float* out) {
  if (with_chunks(d, [&](auto c) { weighted_sum_vec<decltype(c)::value>(w, values, stride, count, out); })) return;
  std::fill(out, out + d, 0.f);
  for (int64_t j = 0; j < count; ++j) {
    const float* v = values + j * stride;
#pragma omp simd
    for (int64_t x = 0; x < d; ++x) out[x] += w[j] * v[x];
  }
}

// x[j] = exp(x[j] - m) over [0, count), returning their sum.
float exp_shifted(float* x, int64_t count, float m) {
  const Vec mv(m);
  Vec acc(0.f);
  int64_t j = 0;
  for (; j + Vec::size() <= count; j += Vec::size()) {
    const Vec e = (Vec::loadu(x + j) - mv).exp();
    e.store(x + j);
    acc = acc + e;
  }
  float sum = hsum(acc);
  for (; j < count; ++j) {
    x[j] = std::exp(x[j] - m);
    sum += x[j];
  }
  return sum;
}

// The largest of x[0, count) and `start` (vectorised: a scalar max loop is a serial chain of compares).
float max_of(const float* x, int64_t count, float start) {
  Vec acc(start);
  int64_t j = 0;
  for (; j + Vec::size() <= count; j += Vec::size()) acc = at::vec::maximum(acc, Vec::loadu(x + j));
  float m = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, acc);
  for (; j < count; ++j) m = std::max(m, x[j]);
  return m;
}

void scale_by(float* x, int64_t count, float s) {
#pragma omp simd
  for (int64_t j = 0; j < count; ++j) x[j] *= s;
}

// One query at position p (keys and values of its slot from `keys`/`values`, a row per position), after
// its scores against the `shared` prefix positions are in `srow`: its own positions' scores (those
// after the prefix it sees, causal and within `window` if > 0, into the scratch `own`), one softmax
// over the visible prefix and its own positions, the prefix's scores turned into probabilities in
// place (zeros where it does not see), and the own positions' share of the output in `orow`; the
// prefix's share is the caller's one matrix product.
void attend_row(const float* q, float* srow, int64_t shared, int64_t p, int64_t window, const float* keys,
                const float* values, int64_t d, float* own, float* orow) {
  const int64_t lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
  const int64_t pre_lo = std::min(lo, shared), pre_hi = std::min(p + 1, shared);
  const int64_t own_lo = std::max(lo, shared), own_n = p + 1 - own_lo;
  if (own_n > 0) scores_any(q, keys + own_lo * d, d, own_n, d, own);
  const float m = max_of(own, std::max<int64_t>(own_n, 0),
                         max_of(srow + pre_lo, pre_hi - pre_lo, -std::numeric_limits<float>::infinity()));
  float sum = exp_shifted(srow + pre_lo, pre_hi - pre_lo, m);
  if (own_n > 0) sum += exp_shifted(own, own_n, m);
  const float inv = 1.f / sum;
  std::fill(srow, srow + pre_lo, 0.f);
  std::fill(srow + pre_hi, srow + shared, 0.f);
  scale_by(srow + pre_lo, pre_hi - pre_lo, inv);
  if (own_n > 0) {
    scale_by(own, own_n, inv);
    weighted_sum_any(own, values + own_lo * d, d, own_n, d, orow);
  } else {
    std::fill(orow, orow + d, 0.f);
  }
}

// Rows t0..t1 of q ([rows, heads, d]) for KV head h, scaled, as one matrix [(t1 - t0) * group, d]:
// the queries that read that head's keys, in the order the scores and outputs keep them.
void gather_head(const float* q, int64_t heads, int64_t group, int64_t d, int64_t h, int64_t t0, int64_t t1,
                 float scale, float* dst) {
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t g = 0; g < group; ++g) {
      const float* a = q + (t * heads + h * group + g) * d;
      float* b = dst + ((t - t0) * group + g) * d;
#pragma omp simd
      for (int64_t x = 0; x < d; ++x) b[x] = a[x] * scale;
    }
}

// For every KV head h: C_h = A_h . W_h (or C_h += with `accumulate`), A_h [rows, K] at a + h * a_head
// (rows lda apart), W_h `panels` panels [panels, K, NR] at w + h * panels * K * NR, C_h [rows, panels *
// NR] at c + h * c_head (rows ldc apart). One task of the thread pool per head and panel.
void per_head_panels(const float* a, int64_t a_head, int64_t lda, const float* w, int64_t panels, int64_t K, float* c,
                     int64_t c_head, int64_t ldc, int64_t rows, int64_t heads, bool accumulate) {
  const int64_t nr = reinforge::panel_width();
  at::parallel_for(0, heads * panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t h = u / panels, p = u % panels;
      reinforge::panel_rows(a + h * a_head, rows, lda, w + h * panels * K * nr, K, p, p + 1, c + h * c_head, ldc,
                            accumulate);
    }
  });
}

// q [rows, heads, d] against one layer's cache [slots, kv_heads, capacity, d] (k and v alike).
void check_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  check_float(q, "q");
  check_float(k, "k");
  check_float(v, "v");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 4 && v.sizes() == k.sizes(), "q must be [rows, heads, d], k and v [slots, kv, cap, d]");
  TORCH_CHECK(k.size(3) == q.size(2) && q.size(1) % k.size(1) == 0, "q does not match the cache's shape");
}

}  // namespace

// Cascade decode attention for rows 0..n-1 (row i is cache slot i at position positions[i]), whose
// first `shared` cached positions hold the same keys and values for every row and are read from slot
// `prefix_slot` only (the rows' own slots need not hold them: the runner defers those copies). q:
// [n, heads, d]; k, v: one layer's cache [slots, kv_heads, capacity, d]; window: a sliding window's
// width (0: none). Returns [n, heads, d].
//
// The shared part is two batched matrix products over all rows at once (ATen); each row's own
// positions, the masks and the joint softmax are one pass here, per row and KV head.
at::Tensor cascade_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t shared,
                          const at::Tensor& positions, int64_t window, double scale, int64_t prefix_slot,
                          const c10::optional<at::Tensor>& prefix_k, const c10::optional<at::Tensor>& prefix_v) {
  check_attention(q, k, v);
  const int64_t n = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t kv = k.size(1), cap = k.size(2);
  TORCH_CHECK(n <= k.size(0), "more rows than the cache has slots");
  check_index(positions, n, "positions");
  const int64_t group = heads / kv, rows = n * group;
  const int64_t* pos = positions.data_ptr<int64_t>();
  int64_t span = 0;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(pos[i] >= 0 && pos[i] < cap, "position ", pos[i], " is outside the cache");
    span = std::max(span, pos[i] + 1);
  }
  TORCH_CHECK(shared >= 0 && shared <= span, "shared prefix longer than the span");
  TORCH_CHECK(prefix_slot >= 0 && prefix_slot < k.size(0), "prefix slot ", prefix_slot, " is outside the cache");
  const int64_t nr = reinforge::panel_width();
  const bool panels = prefix_k.has_value() && shared > 0;
  TORCH_CHECK(prefix_k.has_value() == prefix_v.has_value(), "prefix_k and prefix_v go together");
  if (panels) {
    const int64_t padded = (shared + nr - 1) / std::max<int64_t>(nr, 1) * nr;
    TORCH_CHECK(nr > 0 && d % nr == 0, "prefix panels need the panel kernel and a head size it divides");
    TORCH_CHECK(prefix_k->scalar_type() == at::kFloat && prefix_k->is_contiguous() &&
                    prefix_k->sizes() == at::IntArrayRef({kv, padded / nr, d, nr}),
                "prefix_k must be contiguous float32 [kv, ", padded / nr, ", ", d, ", ", nr, "]");
    TORCH_CHECK(prefix_v->scalar_type() == at::kFloat && prefix_v->is_contiguous() &&
                    prefix_v->sizes() == at::IntArrayRef({kv, d / nr, shared, nr}),
                "prefix_v must be contiguous float32 [kv, ", d / nr, ", ", shared, ", ", nr, "]");
  }
  // The prefix's scores [kv, rows, stride] (stride: `shared`, or with panels the padded width the
  // panels write), each row's own in a scratch of its thread.
  const int64_t stride = panels ? prefix_k->size(1) * nr : shared;

  // The queries of one KV head as one matrix, scaled: [kv, n * group, d].
  at::Tensor qs = at::empty({kv, rows, d}, q.options());
  for (int64_t h = 0; h < kv; ++h)
    gather_head(q.data_ptr<float>(), heads, group, d, h, 0, n, static_cast<float>(scale), qs.data_ptr<float>() + h * rows * d);
  at::Tensor scores = at::empty({kv, rows, stride}, q.options());
  const float* Q = qs.data_ptr<float>();
  float* S = scores.data_ptr<float>();
  if (panels) {  // each panel of prefix positions: rows x d against a d x NR panel that sits in L1
    per_head_panels(Q, rows * d, d, prefix_k->data_ptr<float>(), prefix_k->size(1), d, S, rows * stride, stride,
                    rows, kv, false);
  } else if (shared > 0) {
    at::bmm_out(scores, qs, k.select(0, prefix_slot).narrow(1, 0, shared).transpose(1, 2));
  }
  at::Tensor out = at::empty({kv, rows, d}, q.options());
  const float* K = k.data_ptr<float>();
  const float* V = v.data_ptr<float>();
  float* O = out.data_ptr<float>();
  // Per row and KV head (`attend_row` for each of its queries); the prefix's share of the output is
  // added below as one product.
  at::parallel_for(0, kv * n, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> own(std::max<int64_t>(span - shared, 1));
    for (int64_t u = begin; u < end; ++u) {
      const int64_t h = u / n, i = u % n;
      const float* keys = K + (i * kv + h) * cap * d;
      const float* values = V + (i * kv + h) * cap * d;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t r = (h * n + i) * group + g;
        attend_row(Q + r * d, S + r * stride, shared, pos[i], window, keys, values, d, own.data(), O + r * d);
      }
    }
  });
  if (panels) {  // out += probs . V_prefix, each panel of head columns for all rows
    per_head_panels(S, rows * stride, stride, prefix_v->data_ptr<float>(), d / nr, shared, O, rows * d, d, rows, kv,
                    true);
  } else if (shared > 0) {
    out.baddbmm_(scores, v.select(0, prefix_slot).narrow(1, 0, shared));
  }
  return out.view({kv, n, group, d}).permute({1, 0, 2, 3}).reshape({n, heads, d});
}

// Prefill attention for prompts that share a cached prefix (prefix reuse gave it to each of them):
// prompt i's lens[i] new tokens sit at positions starts[i].. in slot first_slot + i, already written
// to the cache, and the first `shared` positions (shared <= every start) are the same for all these
// prompts, read from slot prefix_slot only. q: [tokens, heads, d] packed prompt after prompt.
// Returns [tokens, heads, d].
//
// SDPA would read the shared keys once per prompt and pad the prompts to one length; here blocks of
// queries of one KV head are multiplied against the shared keys (small matrix products, one block per
// task of the thread pool, so its scores stay in cache), and each query's own positions (the
// prompt's tokens after the prefix, causal) are joined to them in one softmax.
at::Tensor cascade_prefill(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t first_slot,
                           const at::Tensor& starts, const at::Tensor& lens, int64_t shared, int64_t window,
                           double scale, int64_t prefix_slot) {
  check_attention(q, k, v);
  const int64_t tokens = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t kv = k.size(1), cap = k.size(2);
  const int64_t m = starts.numel();
  check_index(starts, m, "starts");
  check_index(lens, m, "lens");
  TORCH_CHECK(first_slot >= 0 && first_slot + m <= k.size(0), "the prompts' slots are outside the cache");
  TORCH_CHECK(prefix_slot >= 0 && prefix_slot < k.size(0), "prefix slot ", prefix_slot, " is outside the cache");
  const int64_t* st = starts.data_ptr<int64_t>();
  const int64_t* ln = lens.data_ptr<int64_t>();
  // Each token's prompt and position.
  std::vector<int64_t> prompt_of(tokens), position(tokens);
  int64_t t = 0, longest_own = 0;
  for (int64_t i = 0; i < m; ++i) {
    TORCH_CHECK(ln[i] >= 0 && st[i] >= shared && st[i] + ln[i] <= cap, "prompt ", i, ": positions outside the cache or a shared prefix past its start");
    for (int64_t j = 0; j < ln[i]; ++j, ++t) {
      TORCH_CHECK(t < tokens, "lens add up to more than q's tokens");
      prompt_of[t] = i;
      position[t] = st[i] + j;
    }
    longest_own = std::max(longest_own, st[i] + ln[i] - shared);
  }
  TORCH_CHECK(t == tokens, "lens add up to ", t, " tokens, q has ", tokens);
  const int64_t group = heads / kv;
  constexpr int64_t kBlockTokens = 32;
  const int64_t blocks = (tokens + kBlockTokens - 1) / kBlockTokens;
  at::Tensor out = at::empty({tokens, heads, d}, q.options());
  const float* Qp = q.data_ptr<float>();
  const float* K = k.data_ptr<float>();
  const float* V = v.data_ptr<float>();
  float* O = out.data_ptr<float>();
  const float s = static_cast<float>(scale);
  at::Tensor k0 = k.select(0, prefix_slot).narrow(1, 0, shared);  // [kv, shared, d]
  at::Tensor v0 = v.select(0, prefix_slot).narrow(1, 0, shared);
  at::parallel_for(0, kv * blocks, 1, [&](int64_t begin, int64_t end) {
    const int64_t rows_max = kBlockTokens * group;
    at::Tensor qb = at::empty({rows_max, d}, q.options());
    at::Tensor sb = at::empty({rows_max, shared}, q.options());
    at::Tensor ob = at::empty({rows_max, d}, q.options());
    std::vector<float> own(std::max<int64_t>(longest_own, 1));
    for (int64_t u = begin; u < end; ++u) {
      const int64_t h = u / blocks, b = u % blocks;
      const int64_t t0 = b * kBlockTokens, t1 = std::min(tokens, t0 + kBlockTokens), rows = (t1 - t0) * group;
      float* Qb = qb.data_ptr<float>();
      gather_head(Qp, heads, group, d, h, t0, t1, s, Qb);
      at::Tensor qv = qb.narrow(0, 0, rows), sv = sb.narrow(0, 0, rows), ov = ob.narrow(0, 0, rows);
      if (shared > 0) at::mm_out(sv, qv, k0.select(0, h).t());
      float* Sb = sb.data_ptr<float>();
      float* Ob = ob.data_ptr<float>();
      for (int64_t tt = t0; tt < t1; ++tt) {
        const int64_t slot = first_slot + prompt_of[tt];
        const float* keys = K + (slot * kv + h) * cap * d;
        const float* values = V + (slot * kv + h) * cap * d;
        for (int64_t g = 0; g < group; ++g) {
          const int64_t r = (tt - t0) * group + g;
          attend_row(Qb + r * d, Sb + r * shared, shared, position[tt], window, keys, values, d, own.data(), Ob + r * d);
        }
      }
      if (shared > 0) ov.addmm_(sv, v0.select(0, h));
      for (int64_t tt = t0; tt < t1; ++tt)
        std::copy_n(Ob + (tt - t0) * group * d, group * d, O + (tt * heads + h * group) * d);
    }
  });
  return out;
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
  m.def("cascade_decode", &cascade_decode, "Cascade decode attention over a shared prefix", py::arg("q"),
        py::arg("k"), py::arg("v"), py::arg("shared"), py::arg("positions"), py::arg("window"), py::arg("scale"),
        py::arg("prefix_slot") = 0, py::arg("prefix_k") = py::none(), py::arg("prefix_v") = py::none());
  m.def("cascade_prefill", &cascade_prefill, "Prefill attention over a prefix the prompts share");
  m.def("rope_store", &rope_store, "RoPE (and per-head norms) on q/k, k/v written to the cache");
  m.def("add_rms_norm", &add_rms_norm, "Residual add, then RMSNorm");
  m.def("silu_mul", &silu_mul, "silu(gate) * up");
  m.def("panel_width", &reinforge::panel_width, "Output columns per weight panel (0: no panel kernel here)");
  m.def("panel_linear", &reinforge::panel_linear, "x @ W.T + b with W packed in panels");
}
