// The fast path's projections on the CPU: `x @ W.T + b` with W stored in panels of output columns
// (reinforge.engine.linear packs them; fused_kernels.cpp registers these functions).
//
// A decode step multiplies a few dozen rows by every weight of the model, so its projections are one
// pass over all the weights. oneDNN's packed calls reach about 60% of the square matmul's rate on those
// 32-row shapes; this kernel keeps a register tile of up to MR rows x one panel for the whole inner
// dimension, reads the panel once per tile from cache, and prefetches the next panel spread evenly over
// all the tiles of the current one (docs/engine.md, "Panel projections", has the figures). Large row
// counts (a prefill) go through the same tiles in blocks of rows that stay in L2.
//
// Panels: W `[N, K]` as `[N / NR, K, NR]`, NR = two vector registers of floats, so one panel row is one
// or two cache lines and a tile's inner step is two loads, MR broadcasts and 2 x MR FMAs. Built for the
// AVX2 and AVX-512 tiers only; `panel_width()` is 0 elsewhere and the Python side keeps oneDNN.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#define REINFORGE_PANELS 1
#endif

namespace reinforge {

#ifdef REINFORGE_PANELS
namespace {

#if defined(CPU_CAPABILITY_AVX512)
#define REINFORGE_VEC(op) _mm512_##op
using vf = __m512;
constexpr int64_t V = 16;
constexpr int MR = 12;  // 24 accumulators + 2 panel registers + 1 broadcast of 32
#else
#define REINFORGE_VEC(op) _mm256_##op
using vf = __m256;
constexpr int64_t V = 8;
constexpr int MR = 6;  // 12 accumulators + 2 panel registers + 1 broadcast of 16
#endif
inline vf vload(const float* p) { return REINFORGE_VEC(loadu_ps)(p); }
inline void vstore(float* p, vf v) { REINFORGE_VEC(storeu_ps)(p, v); }
inline vf vset1(float x) { return REINFORGE_VEC(set1_ps)(x); }
inline vf vfma(vf a, vf b, vf c) { return REINFORGE_VEC(fmadd_ps)(a, b, c); }
inline vf vadd(vf a, vf b) { return REINFORGE_VEC(add_ps)(a, b); }
inline vf vzero() { return REINFORGE_VEC(setzero_ps)(); }
#undef REINFORGE_VEC

constexpr int64_t NR = 2 * V;
// Rows a thread runs through all of its panels before the next block: a block of a prefill's rows
// stays in L2 while the panels stream past it.
constexpr int64_t ROW_BLOCK = 6 * MR;

// C[R, NR] = A[R, K] . panel[K, NR] (+ bias), or C += A . panel with ACC. The accumulators are named
// registers (an array the compiler fully unrolls): ATen's Vectorized wrapper made GCC keep them on the
// stack. `next` (or null): `share` rows of the next panel to prefetch, one every `every` inner steps,
// so that the tiles of one panel together fetch the next one evenly over the whole panel's work.
template <int R, bool PREFETCH, bool ACC>
__attribute__((always_inline)) inline void tile(const float* __restrict a, int64_t lda,
                                                const float* __restrict panel, int64_t K, float* __restrict c,
                                                int64_t ldc, const float* bias, const float* next, int64_t share,
                                                int64_t every) {
  int64_t fetched = 0, count = 0;
  vf lo[R], hi[R];
  const float* rows[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    lo[r] = ACC ? vload(c + r * ldc) : vzero();
    hi[r] = ACC ? vload(c + r * ldc + V) : vzero();
    rows[r] = a + r * lda;
  }
  for (int64_t k = 0; k < K; ++k) {
    const float* p = panel + k * NR;
    const vf b0 = vload(p), b1 = vload(p + V);
    if constexpr (PREFETCH) {
      if (count == 0 && fetched < share) {
        __builtin_prefetch(next + fetched * NR, 0, 2);
        if constexpr (NR * sizeof(float) > 64) __builtin_prefetch(next + fetched * NR + 16, 0, 2);
        ++fetched;
      }
      if (++count == every) count = 0;
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const vf x = vset1(rows[r][k]);
      lo[r] = vfma(x, b0, lo[r]);
      hi[r] = vfma(x, b1, hi[r]);
    }
  }
  const vf bias0 = bias ? vload(bias) : vzero();
  const vf bias1 = bias ? vload(bias + V) : vzero();
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    vstore(c + r * ldc, vadd(lo[r], bias0));
    vstore(c + r * ldc + V, vadd(hi[r], bias1));
  }
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, const float*, const float*,
                        int64_t, int64_t);

template <int R>
void tile_entry(const float* a, int64_t lda, const float* panel, int64_t K, float* c, int64_t ldc, const float* bias,
                const float* next, int64_t share, int64_t every) {
  if (next != nullptr) {
    tile<R, true, false>(a, lda, panel, K, c, ldc, bias, next, share, every);
  } else {
    tile<R, false, false>(a, lda, panel, K, c, ldc, bias, nullptr, 0, 1);
  }
}

template <int R>
void tile_accumulate(const float* a, int64_t lda, const float* panel, int64_t K, float* c, int64_t ldc, const float*,
                     const float*, int64_t, int64_t) {
  tile<R, false, true>(a, lda, panel, K, c, ldc, nullptr, nullptr, 0, 1);
}

template <int... Rs>
constexpr std::array<TileFn, sizeof...(Rs) + 1> tile_table(std::integer_sequence<int, Rs...>) {
  return {nullptr, &tile_entry<Rs + 1>...};
}

template <int... Rs>
constexpr std::array<TileFn, sizeof...(Rs) + 1> accumulate_table(std::integer_sequence<int, Rs...>) {
  return {nullptr, &tile_accumulate<Rs + 1>...};
}

// TILES[r]: the tile of r rows (1 <= r <= MR), for a block's last rows; ACCUMULATING[r] adds to C.
constexpr auto TILES = tile_table(std::make_integer_sequence<int, MR>{});
constexpr auto ACCUMULATING = accumulate_table(std::make_integer_sequence<int, MR>{});

}  // namespace
#endif

void panel_rows(const float* a, int64_t rows, int64_t lda, const float* panels, int64_t K, int64_t p0, int64_t p1,
                float* c, int64_t ldc, bool accumulate) {
#ifdef REINFORGE_PANELS
  const auto& tiles = accumulate ? ACCUMULATING : TILES;
  for (int64_t m0 = 0; m0 < rows; m0 += ROW_BLOCK) {
    const int64_t m1 = std::min(rows, m0 + ROW_BLOCK);
    for (int64_t p = p0; p < p1; ++p) {
      const float* panel = panels + p * K * NR;
      for (int64_t m = m0; m < m1; m += MR) {
        const int64_t r = std::min<int64_t>(MR, m1 - m);
        tiles[r](a + m * lda, lda, panel, K, c + m * ldc + p * NR, ldc, nullptr, nullptr, 0, 1);
      }
    }
  }
#else
  TORCH_CHECK(false, "panel_rows is built for AVX2 and AVX-512 only (panel_width() is 0 here)");
#endif
}

int64_t panel_width() {
#ifdef REINFORGE_PANELS
  return NR;
#else
  return 0;
#endif
}

at::Tensor panel_linear(const at::Tensor& x, const at::Tensor& panels, const c10::optional<at::Tensor>& bias) {
#ifdef REINFORGE_PANELS
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2,
              "x must be a float32 CPU matrix [rows, in]");
  TORCH_CHECK(panels.device().is_cpu() && panels.scalar_type() == at::kFloat && panels.is_contiguous() &&
                  panels.dim() == 3 && panels.size(2) == NR,
              "panels must be contiguous float32 [out / ", NR, ", in, ", NR, "]");
  const int64_t M = x.size(0), K = x.size(1), P = panels.size(0), N = P * NR;
  TORCH_CHECK(panels.size(1) == K, "x has ", K, " columns, the weight ", panels.size(1));
  if (bias) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == N,
                "bias must be contiguous float32 with ", N, " entries");
  }
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty({M, N}, x.options());
  const float* A = xc.data_ptr<float>();
  const float* W = panels.data_ptr<float>();
  const float* B = bias ? bias->data_ptr<float>() : nullptr;
  float* C = y.data_ptr<float>();
  const int64_t block = M <= ROW_BLOCK ? std::max<int64_t>(M, 1) : ROW_BLOCK;
  // Threads split the panels (the weight's columns), so each streams its own part of the weight once
  // per block of rows.
  at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t m0 = 0; m0 < M; m0 += block) {
      const int64_t m1 = std::min(M, m0 + block);
      for (int64_t p = p0; p < p1; ++p) {
        const float* panel = W + p * K * NR;
        const float* next = p + 1 < p1 ? panel + K * NR : nullptr;
        // The block's tiles share the next panel's prefetch: tile t fetches its rows [t K / T, (t+1) K / T).
        const int64_t tiles = (m1 - m0 + MR - 1) / MR;
        for (int64_t m = m0; m < m1; m += MR) {
          const int64_t r = std::min<int64_t>(MR, m1 - m), t = (m - m0) / MR;
          const int64_t first = t * K / tiles, last = (t + 1) * K / tiles;
          TILES[r](A + m * K, K, panel, K, C + m * N + p * NR, N, B ? B + p * NR : nullptr,
                   next ? next + first * NR : nullptr, last - first, tiles);
        }
      }
    }
  });
  return y;
#else
  TORCH_CHECK(false, "panel_linear is built for AVX2 and AVX-512 only (panel_width() is 0 here)");
  return x;
#endif
}

}  // namespace reinforge
