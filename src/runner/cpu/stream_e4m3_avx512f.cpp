// The e4m3 streaming kernel on AVX-512F (stream_panels of e4m3 panels). Only this kernel lives
// here: the file is compiled for AVX-512F, and the cpu runner streams e4m3 rows through
// stream_panels only where the plan chose this kernel (Platform::avx512f); elsewhere it takes
// AVX2's (stream_panels_e4m3).
//
// A panel step, the 16 rows' codes at one k, is one vector, widened in four instructions over
// the rows as they are. At one row the AVX2 kernel's widening, not memory, set its pace before
// session 16 of docs/PERFORMANCE.md (Qwen3-30B-A3B fp8 at T = 1 streamed at 24-50% of the read
// bandwidth on Xeon VMs, where bf16 streamed at ~88%).

#include <immintrin.h>

#include <algorithm>

#include "runner/cpu/int4_avx2.hpp"
#include "runner/cpu/stream_e4m3.hpp"

namespace moekit::cpu {
namespace {

// 16 e4m3 codes as f32. Sign-extended and shifted left by 20, a code's exponent and mantissa
// sit in f32 bits 20-26 and copies of its sign in bits 27-31, of which the mask keeps bit 31;
// the 2^120 multiply turns the exponent's bias of 7 into f32's 127 and e4m3 subnormals into
// the right normal f32, so the values need no factor in the scales.
// The zero-masked forms of the conversion and the shift over every lane: GCC 12's unmasked ones
// pass an undefined vector through, which -Wmaybe-uninitialized reports.
constexpr __mmask16 kAll = 0xFFFF;

inline __m512 widen_e4m3(const uint8_t* step) {
  const __m512i codes =
      _mm512_maskz_cvtepi8_epi32(kAll, _mm_loadu_si128(reinterpret_cast<const __m128i*>(step)));
  const __m512i bits = _mm512_and_si512(_mm512_maskz_slli_epi32(kAll, codes, 20),
                                        _mm512_set1_epi32(static_cast<int>(0x87F00000u)));
  return _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(0x1p120f));
}

constexpr int64_t kCacheLine = 64;

// One panel times M rows, U independent accumulators per row (8 FMA chains at one row cover
// the FMA latency at two FMAs a cycle); the step's scale is applied once per row per step.
template <int M, int U>
void e4m3_panel(const PanelMatrix& w, int64_t p, const StreamRows& rows, float* y, int64_t ldy) {
  const int64_t stride = w.step_bytes();
  const uint8_t* panel = w.panel(p);
  __m512 out[M];
  for (int r = 0; r < M; ++r) out[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < w.scale_steps(); ++g) {
    const int64_t k0 = g * w.group_k;
    const int64_t k1 = std::min(w.k, k0 + w.group_k);
    __m512 acc[M][U];
#pragma GCC unroll 32
    for (int i = 0; i < M * U; ++i) acc[i / U][i % U] = _mm512_setzero_ps();
    int64_t k = k0;
    for (; k + U <= k1; k += U) {
      for (int64_t line = 0; line < U * stride; line += kCacheLine) {
        _mm_prefetch(
            reinterpret_cast<const char*>(panel + k * stride + kStreamPrefetchBytes + line),
            _MM_HINT_T0);
      }
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) {
        const __m512 v = widen_e4m3(panel + (k + u) * stride);
#pragma GCC unroll 4
        for (int r = 0; r < M; ++r) {
          acc[r][u] = _mm512_fmadd_ps(v, _mm512_set1_ps(rows.x[r][k + u]), acc[r][u]);
        }
      }
    }
    for (; k < k1; ++k) {
      const __m512 v = widen_e4m3(panel + k * stride);
#pragma GCC unroll 4
      for (int r = 0; r < M; ++r) {
        acc[r][0] = _mm512_fmadd_ps(v, _mm512_set1_ps(rows.x[r][k]), acc[r][0]);
      }
    }
    const __m512 scale = _mm512_loadu_ps(w.panel_scale(p) + g * kPanelRows);
#pragma GCC unroll 4
    for (int r = 0; r < M; ++r) {
      __m512 sum = acc[r][0];
#pragma GCC unroll 8
      for (int u = 1; u < U; ++u) sum = _mm512_add_ps(sum, acc[r][u]);
      out[r] = _mm512_fmadd_ps(scale, sum, out[r]);
    }
  }
  for (int r = 0; r < M; ++r) _mm512_storeu_ps(y + r * ldy, out[r]);
}

}  // namespace

void stream_panels_e4m3_avx512(const PanelMatrix& w, int64_t p_begin, int64_t p_end,
                               const StreamRows& rows, float* y, int64_t ldy) {
  for_row_count(rows.m, [&]<int M>() {
    constexpr int kUnroll = M == 1 ? 8 : M == 2 ? 4 : 2;
    for (int64_t p = p_begin; p < p_end; ++p) {
      e4m3_panel<M, kUnroll>(w, p, rows, y + (p - p_begin) * kPanelRows, ldy);
    }
  });
}

}  // namespace moekit::cpu
