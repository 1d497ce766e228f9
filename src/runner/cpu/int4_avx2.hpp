#pragma once
// Reading panel16 int4 blocks (panels.hpp) in AVX2 registers, for the kernels of files compiled
// for AVX2 or more. Everything here has internal linkage: files compiled for different
// instruction sets each get their own copy, so the linker never hands an AVX-512 build of a
// function to code that runs on a machine without AVX-512.

#include <immintrin.h>

#include "runner/cpu/panels.hpp"

namespace moekit::cpu {
namespace {

// Calls kernel.template operator()<M>() with M = rows; rows is 1..4, the streaming kernels'
// kStreamRows (the caller checks).
template <typename Kernel>
void for_row_count(int rows, Kernel kernel) {
  switch (rows) {
    case 1:
      return kernel.template operator()<1>();
    case 2:
      return kernel.template operator()<2>();
    case 3:
      return kernel.template operator()<3>();
    default:
      return kernel.template operator()<4>();
  }
}

// The int4 block of a panel that holds k.
inline __m256i load_int4_block(const uint8_t* panel, int64_t k) {
  return _mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(panel + k / kInt4BlockK * kInt4BlockBytes));
}

// The codes of one k pair (0: k % 4 < 2, 1: the others) of a block as 16-bit integers: 32-bit
// lane r of `low` holds row r's codes at the pair's first k (low half) and second k (high
// half), `high` the same for row r + 8.
struct Int4Pair {
  __m256i low;
  __m256i high;
};
template <int kPair>
inline Int4Pair int4_pair(__m256i block) {
  const __m256i nibble = _mm256_set1_epi16(0xF);
  return {_mm256_and_si256(_mm256_srli_epi16(block, 8 * kPair), nibble),
          _mm256_and_si256(_mm256_srli_epi16(block, 8 * kPair + 4), nibble)};
}

// The int4 offsets of scale step g of panel p, rows 0-7 and 8-15: the zero points' offsets, or
// kSymmetricOffset for a matrix without them.
struct Int4Offsets {
  __m256 low;
  __m256 high;
};
inline Int4Offsets int4_offsets(const PanelMatrix& w, int64_t p, int64_t g) {
  if (w.offset == nullptr) {
    return {_mm256_set1_ps(kSymmetricOffset), _mm256_set1_ps(kSymmetricOffset)};
  }
  const float* offset = w.panel_offset(p) + g * kPanelRows;
  return {_mm256_loadu_ps(offset), _mm256_loadu_ps(offset + kHalfPanel)};
}

// The weight scales and offsets of scale step g of panel p, rows 0-7 and 8-15.
struct Int4StepScales {
  __m256 low;
  __m256 high;
  Int4Offsets offset;
};
inline Int4StepScales int4_step_scales(const PanelMatrix& w, int64_t p, int64_t g) {
  const float* scale = w.panel_scale(p) + g * kPanelRows;
  return {_mm256_loadu_ps(scale), _mm256_loadu_ps(scale + kHalfPanel), int4_offsets(w, p, g)};
}

// For the integer streaming kernels (stream_int16.hpp, stream_int8.hpp): adds one row's scale
// step to its outputs, (sum - offset * q_sum) * weight scale * q_scale, where sum holds the
// step's exact int32 sums of code x q (rows 0-7 in sum_low, 8-15 in sum_high) and q_sum and
// q_scale are the sum and the scale of the row's codes over the step.
inline void add_integer_step(const Int4StepScales& s, __m256i sum_low, __m256i sum_high,
                             const float* q_sum, const float* q_scale, __m256& out_low,
                             __m256& out_high) {
  const __m256 sum = _mm256_broadcast_ss(q_sum);
  const __m256 scale = _mm256_broadcast_ss(q_scale);
  const __m256 l = _mm256_fnmadd_ps(s.offset.low, sum, _mm256_cvtepi32_ps(sum_low));
  const __m256 h = _mm256_fnmadd_ps(s.offset.high, sum, _mm256_cvtepi32_ps(sum_high));
  out_low = _mm256_fmadd_ps(_mm256_mul_ps(s.low, scale), l, out_low);
  out_high = _mm256_fmadd_ps(_mm256_mul_ps(s.high, scale), h, out_high);
}

// A pair's codes as f32: rows 0-7 and 8-15 at its first k, then at its second k.
struct Int4PairF32 {
  __m256 low0, high0, low1, high1;
};
inline Int4PairF32 widen_int4_pair(const Int4Pair& pair) {
  const __m256i first = _mm256_set1_epi32(0xFFFF);
  return {_mm256_cvtepi32_ps(_mm256_and_si256(pair.low, first)),
          _mm256_cvtepi32_ps(_mm256_and_si256(pair.high, first)),
          _mm256_cvtepi32_ps(_mm256_srli_epi32(pair.low, 16)),
          _mm256_cvtepi32_ps(_mm256_srli_epi32(pair.high, 16))};
}

}  // namespace
}  // namespace moekit::cpu
