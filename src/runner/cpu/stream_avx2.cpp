// Compiled with -mavx2 -mfma -mf16c (src/CMakeLists.txt); called only where the plan found them.

#include <immintrin.h>

#include <algorithm>

#include "moekit/error.hpp"
#include "runner/cpu/stream.hpp"

namespace moekit::cpu {
namespace {

// One panel step widened to f32: rows 0-7 in lo, rows 8-15 in hi.
template <DType D>
inline void widen(const uint8_t* step, __m256& lo, __m256& hi) {
  if constexpr (D == DType::f32) {
    lo = _mm256_loadu_ps(reinterpret_cast<const float*>(step));
    hi = _mm256_loadu_ps(reinterpret_cast<const float*>(step) + kHalfPanel);
  } else if constexpr (D == DType::bf16) {
    // A bf16 is the top half of the f32 of the same value.
    const __m256i a =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(step)));
    const __m256i b =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(step + 16)));
    lo = _mm256_castsi256_ps(_mm256_slli_epi32(a, 16));
    hi = _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));
  } else if constexpr (D == DType::f16) {
    lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(step)));
    hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(step + 16)));
  } else if constexpr (D == DType::f8e4m3) {
    // Exponent and mantissa move to the f32 fields (bits 20-26 to 23-30 after the 2^120 bias
    // multiply, which also turns e4m3 subnormals into the right normal f32); the sign to bit 31.
    const auto one = [](__m256i v) {
      const __m256i mag = _mm256_and_si256(_mm256_slli_epi32(v, 20), _mm256_set1_epi32(0x07F00000));
      const __m256i sign = _mm256_and_si256(_mm256_slli_epi32(v, 24),
                                            _mm256_set1_epi32(static_cast<int>(0x80000000u)));
      return _mm256_mul_ps(_mm256_castsi256_ps(_mm256_or_si256(mag, sign)),
                           _mm256_set1_ps(0x1p120f));
    };
    lo = one(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(step))));
    hi = one(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(step + 8))));
  } else {
    static_assert(D == DType::i4);
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(step)));
    lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(0xF)));
    hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
  }
}

// The hardware prefetcher alone leaves the stream waiting on memory, so the kernel asks for
// every line it will read this far ahead itself (past the panel's end is the next panel of the
// range, or a harmless prefetch).
constexpr int64_t kPrefetchBytes = 2048;
constexpr int64_t kCacheLine = 64;

// One panel times M rows. U independent accumulator pairs per row keep enough FMA chains in
// flight when M is small. Quantised dtypes accumulate the raw codes over one scale step and
// apply the step's scale (and offset, through the row's step sum) once per row per step.
template <DType D, int M, int U>
void panel_kernel(const PanelMatrix& w, int64_t p, const StreamRows& rows, float* y, int64_t ldy) {
  constexpr bool kQuantized = D == DType::f8e4m3 || D == DType::i4;
  const int64_t K = w.k;
  const int64_t stride = w.step_bytes();
  const uint8_t* panel = w.panel(p);
  const int64_t group = kQuantized ? w.group_k : K;
  const int64_t steps = kQuantized ? w.scale_steps() : 1;
  __m256 out_lo[M], out_hi[M];
  for (int r = 0; r < M; ++r) out_lo[r] = out_hi[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < steps; ++g) {
    const int64_t k0 = g * group;
    const int64_t k1 = std::min(K, k0 + group);
    __m256 lo_acc[M][U], hi_acc[M][U];
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) {
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) lo_acc[r][u] = hi_acc[r][u] = _mm256_setzero_ps();
    }
    int64_t k = k0;
    for (; k + U <= k1; k += U) {
      for (int64_t line = 0; line < U * stride; line += kCacheLine) {
        _mm_prefetch(reinterpret_cast<const char*>(panel + k * stride + kPrefetchBytes + line),
                     _MM_HINT_T0);
      }
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) {
        __m256 lo, hi;
        widen<D>(panel + (k + u) * stride, lo, hi);
#pragma GCC unroll 8
        for (int r = 0; r < M; ++r) {
          const __m256 x = _mm256_broadcast_ss(rows.x[r] + k + u);
          lo_acc[r][u] = _mm256_fmadd_ps(lo, x, lo_acc[r][u]);
          hi_acc[r][u] = _mm256_fmadd_ps(hi, x, hi_acc[r][u]);
        }
      }
    }
    for (; k < k1; ++k) {
      __m256 lo, hi;
      widen<D>(panel + k * stride, lo, hi);
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r) {
        const __m256 x = _mm256_broadcast_ss(rows.x[r] + k);
        lo_acc[r][0] = _mm256_fmadd_ps(lo, x, lo_acc[r][0]);
        hi_acc[r][0] = _mm256_fmadd_ps(hi, x, hi_acc[r][0]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) {
      __m256 lo = lo_acc[r][0], hi = hi_acc[r][0];
#pragma GCC unroll 4
      for (int u = 1; u < U; ++u) {
        lo = _mm256_add_ps(lo, lo_acc[r][u]);
        hi = _mm256_add_ps(hi, hi_acc[r][u]);
      }
      if constexpr (kQuantized) {
        const float* scale = w.panel_scale(p) + g * kPanelRows;
        if constexpr (D == DType::i4) {
          const __m256 sum = _mm256_broadcast_ss(rows.x_sums[r] + g);
          __m256 offset_lo = _mm256_set1_ps(kSymmetricOffset);
          __m256 offset_hi = offset_lo;
          if (w.offset != nullptr) {
            const float* offset = w.panel_offset(p) + g * kPanelRows;
            offset_lo = _mm256_loadu_ps(offset);
            offset_hi = _mm256_loadu_ps(offset + kHalfPanel);
          }
          lo = _mm256_fnmadd_ps(offset_lo, sum, lo);
          hi = _mm256_fnmadd_ps(offset_hi, sum, hi);
        }
        out_lo[r] = _mm256_fmadd_ps(_mm256_loadu_ps(scale), lo, out_lo[r]);
        out_hi[r] = _mm256_fmadd_ps(_mm256_loadu_ps(scale + kHalfPanel), hi, out_hi[r]);
      } else {
        out_lo[r] = lo;
        out_hi[r] = hi;
      }
    }
  }
  for (int r = 0; r < M; ++r) {
    _mm256_storeu_ps(y + r * ldy, out_lo[r]);
    _mm256_storeu_ps(y + r * ldy + kHalfPanel, out_hi[r]);
  }
}

template <DType D, int M>
void panels_m(const PanelMatrix& w, int64_t p_begin, int64_t p_end, const StreamRows& rows,
              float* y, int64_t ldy) {
  // Enough independent FMA chains (2 * M * U >= 8) to cover the FMA latency.
  constexpr int kUnroll = M == 1 ? 4 : M == 2 ? 2 : 1;
  for (int64_t p = p_begin; p < p_end; ++p) {
    panel_kernel<D, M, kUnroll>(w, p, rows, y + (p - p_begin) * kPanelRows, ldy);
  }
}

template <DType D>
void panels_dtype(const PanelMatrix& w, int64_t p_begin, int64_t p_end, const StreamRows& rows,
                  float* y, int64_t ldy) {
  switch (rows.m) {
    case 1:
      return panels_m<D, 1>(w, p_begin, p_end, rows, y, ldy);
    case 2:
      return panels_m<D, 2>(w, p_begin, p_end, rows, y, ldy);
    case 3:
      return panels_m<D, 3>(w, p_begin, p_end, rows, y, ldy);
    case 4:
      return panels_m<D, 4>(w, p_begin, p_end, rows, y, ldy);
    default:
      fail(Errc::internal, "stream_panels serves 1 to {} rows, got {}", kStreamRows, rows.m);
  }
}

}  // namespace

void stream_panels(const PanelMatrix& w, int64_t p_begin, int64_t p_end, const StreamRows& rows,
                   float* y, int64_t ldy) {
  switch (w.dtype) {
    case DType::f32:
      return panels_dtype<DType::f32>(w, p_begin, p_end, rows, y, ldy);
    case DType::bf16:
      return panels_dtype<DType::bf16>(w, p_begin, p_end, rows, y, ldy);
    case DType::f16:
      return panels_dtype<DType::f16>(w, p_begin, p_end, rows, y, ldy);
    case DType::f8e4m3:
      return panels_dtype<DType::f8e4m3>(w, p_begin, p_end, rows, y, ldy);
    case DType::i4:
      return panels_dtype<DType::i4>(w, p_begin, p_end, rows, y, ldy);
    default:
      fail(Errc::internal, "panel16 holds no {} weights", dtype_name(w.dtype));
  }
}

void step_sums(const float* x, int64_t k, int64_t group_k, float* sums) {
  for (int64_t g = 0, k0 = 0; k0 < k; ++g, k0 += group_k) {
    const int64_t k1 = std::min(k, k0 + group_k);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = k0;
    for (; i + 8 <= k1; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + i));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc);
    float sum = 0.0f;
    for (float lane : lanes) sum += lane;
    for (; i < k1; ++i) sum += x[i];
    sums[g] = sum;
  }
}

}  // namespace moekit::cpu
