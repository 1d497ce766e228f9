#pragma once
// The int4 x int16 streaming kernel (stream_panels_int16), written once over the instruction
// that does the 16-bit dot product step: pmaddwd + add on AVX2 (stream_avx2.cpp), vpdpwssd with
// AVX-512 VNNI (stream_avx512vnni.cpp). Include it only from files compiled for AVX2 or more;
// as in int4_avx2.hpp, everything here has internal linkage.

#include <immintrin.h>

#include <cstring>
#include <utility>

#include "runner/cpu/int4_avx2.hpp"
#include "runner/cpu/stream.hpp"

namespace moekit::cpu {

// The kernel with vpdpwssd (stream_avx512vnni.cpp); stream_panels_int16 checks its arguments
// and the machine first.
void stream_panels_int16_vnni(const PanelMatrix& w, int64_t p_begin, int64_t p_end,
                              const Int16Rows& rows, float* y, int64_t ldy);

namespace {

inline __m256i broadcast_pair(const int16_t* q) {
  int32_t pair;
  std::memcpy(&pair, q, sizeof pair);
  return _mm256_set1_epi32(pair);
}

// A block's four code vectors (int4_pair<0> and <1>). With kHighTimes16, rows 8-15 come at 16
// times their codes: one shift and four masks, where the codes themselves take three shifts and
// four; the sums of those rows are exact multiples of 16, divided back by a shift per step.
template <bool kHighTimes16>
inline std::pair<Int4Pair, Int4Pair> int16_kernel_codes(__m256i v) {
  if constexpr (!kHighTimes16) {
    return {int4_pair<0>(v), int4_pair<1>(v)};
  } else {
    const __m256i low = _mm256_set1_epi16(0x0F), high = _mm256_set1_epi16(0xF0);
    const __m256i second = _mm256_srli_epi16(v, 8);
    return {{_mm256_and_si256(v, low), _mm256_and_si256(v, high)},
            {_mm256_and_si256(second, low), _mm256_and_si256(second, high)}};
  }
}

// int4 times int16 rows: per block, four 16-bit code vectors (8 rows x 2 k each) meet each
// row's two activation pairs in 16-bit dot products, summed exactly in int32 over the step;
// then per row and step: (sum - offset * sum of q) * weight scale * activation scale. One or two
// rows keep a second set of sums for every other block, so the chains of dot products that
// depend on each other are short enough to keep the units busy.
template <typename Dot, int M, bool kHighTimes16>
void int4_panel_int16(const PanelMatrix& w, int64_t p, const Int16Rows& rows, float* y,
                      int64_t ldy) {
  constexpr int kSets = M <= 2 ? 2 : 1;
  const uint8_t* panel = w.panel(p);
  __m256 out_lo[M], out_hi[M];
  for (int r = 0; r < M; ++r) out_lo[r] = out_hi[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < w.scale_steps(); ++g) {
    const int64_t k0 = g * w.group_k;
    const int64_t k1 = std::min(w.k, k0 + w.group_k);
    __m256i lo[kSets][M], hi[kSets][M];
#pragma GCC unroll 8
    for (int i = 0; i < kSets * M; ++i) {
      lo[i / M][i % M] = hi[i / M][i % M] = _mm256_setzero_si256();
    }
    // Pointers, not k / 4 * 32 from a signed k, keep the loop's scalar work small.
    const uint8_t* codes = panel + k0 / kInt4BlockK * kInt4BlockBytes;
    const auto block = [&](const uint8_t* at, int64_t k, int set) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
      const auto [first, second] = int16_kernel_codes<kHighTimes16>(v);
#pragma GCC unroll 4
      for (int r = 0; r < M; ++r) {
        const __m256i a0 = broadcast_pair(rows.q[r] + k);
        const __m256i a1 = broadcast_pair(rows.q[r] + k + 2);
        lo[set][r] = Dot::dot(Dot::dot(lo[set][r], first.low, a0), second.low, a1);
        hi[set][r] = Dot::dot(Dot::dot(hi[set][r], first.high, a0), second.high, a1);
      }
    };
    int64_t k = k0;
    if constexpr (kSets == 2) {
      for (; k + 2 * kInt4BlockK <= k1; k += 2 * kInt4BlockK, codes += 2 * kInt4BlockBytes) {
        _mm_prefetch(reinterpret_cast<const char*>(codes + kStreamPrefetchBytes), _MM_HINT_T0);
        block(codes, k, 0);
        block(codes + kInt4BlockBytes, k + kInt4BlockK, 1);
      }
    }
    // Three or four rows: one block per step, since two in flight need more than the 16 vector
    // registers (the compiler spills the sums).
    for (; k < k1; k += kInt4BlockK, codes += kInt4BlockBytes) {
      _mm_prefetch(reinterpret_cast<const char*>(codes + kStreamPrefetchBytes), _MM_HINT_T0);
      block(codes, k, 0);
    }
    const Int4StepScales scales = int4_step_scales(w, p, g);
#pragma GCC unroll 4
    for (int r = 0; r < M; ++r) {
      __m256i sum_lo = lo[0][r], sum_hi = hi[0][r];
      if constexpr (kSets == 2) {
        sum_lo = _mm256_add_epi32(sum_lo, lo[1][r]);
        sum_hi = _mm256_add_epi32(sum_hi, hi[1][r]);
      }
      if constexpr (kHighTimes16) sum_hi = _mm256_srai_epi32(sum_hi, 4);
      add_integer_step(scales, sum_lo, sum_hi, rows.sums[r] + g, rows.scale[r] + g, out_lo[r],
                       out_hi[r]);
    }
  }
  for (int r = 0; r < M; ++r) {
    _mm256_storeu_ps(y + r * ldy, out_lo[r]);
    _mm256_storeu_ps(y + r * ldy + kHalfPanel, out_hi[r]);
  }
}

// Dot::dot(acc, a, b) adds to each int32 lane of acc the dot product of the lane's two int16
// of a and b.
template <typename Dot>
void stream_int16(const PanelMatrix& w, int64_t p_begin, int64_t p_end, const Int16Rows& rows,
                  float* y, int64_t ldy) {
  const auto panels = [&]<int M, bool kHighTimes16>() {
    for (int64_t p = p_begin; p < p_end; ++p) {
      int4_panel_int16<Dot, M, kHighTimes16>(w, p, rows, y + (p - p_begin) * kPanelRows, ldy);
    }
  };
  for_row_count(rows.m, [&]<int M>() {
    if (w.group_k <= kInt16HighTimes16MaxStep) {
      panels.template operator()<M, true>();
    } else {
      panels.template operator()<M, false>();
    }
  });
}

}  // namespace
}  // namespace moekit::cpu
