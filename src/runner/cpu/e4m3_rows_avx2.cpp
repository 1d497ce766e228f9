// quantize_e4m3_row's AVX2 kernel: 8 values at a time (e4m3_rows.hpp says why the rounding is
// the scalar reference's). CMake compiles this file for AVX2, FMA and F16C (src/CMakeLists.txt).

#include <immintrin.h>

#include <cstdint>

#include "moekit/dtype.hpp"
#include "quant/activation_quant.hpp"
#include "runner/cpu/e4m3_rows.hpp"

#define MOEKIT_E4M3_INLINE __attribute__((always_inline)) inline

namespace moekit::cpu::e4m3_rows {
namespace {

// No std templates here: an inline function instantiated in this file is compiled for AVX2,
// and the linker may keep this copy for callers on any CPU.
constexpr int64_t min64(int64_t x, int64_t y) {
  return x < y ? x : y;
}

// The lanes [0, count) of a masked load or store.
MOEKIT_E4M3_INLINE __m256i first(int64_t count) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(min64(count, 8))), lane);
}

// As round_e4m3 in e4m3_rows_avx512f.cpp, 8 lanes.
MOEKIT_E4M3_INLINE __m256 round_e4m3(__m256 y) {
  const __m256i bits = _mm256_castps_si256(y);
  const __m256i sign = _mm256_and_si256(bits, _mm256_set1_epi32(INT32_MIN));
  const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(INT32_MAX));
  const __m256i exponent = _mm256_and_si256(magnitude, _mm256_set1_epi32(0x7F800000));
  const __m256i step = _mm256_max_epi32(_mm256_sub_epi32(exponent, _mm256_set1_epi32(3 << 23)),
                                        _mm256_set1_epi32((127 - 9) << 23));
  const __m256i inverse = _mm256_sub_epi32(_mm256_set1_epi32(254 << 23), step);
  const __m256 steps =
      _mm256_round_ps(_mm256_mul_ps(_mm256_castsi256_ps(magnitude), _mm256_castsi256_ps(inverse)),
                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 rounded =
      _mm256_min_ps(_mm256_mul_ps(steps, _mm256_castsi256_ps(step)), _mm256_set1_ps(kE4M3Max));
  const __m256 nan = _mm256_cmp_ps(y, y, _CMP_UNORD_Q);
  rounded = _mm256_blendv_ps(rounded, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), nan);
  return _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(rounded), sign));
}

MOEKIT_E4M3_INLINE __m256 load(const float* x, int64_t left) {
  if (left >= 8) return _mm256_loadu_ps(x);
  return _mm256_maskload_ps(x, first(left));
}

}  // namespace

void quantize_avx2(const Row& row) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MAX));
  for (int64_t k0 = 0; k0 < row.n; k0 += row.group) {
    const int64_t k1 = min64(row.n, k0 + row.group);
    float scale = row.static_scale;
    if (row.dynamic) {
      // max(|x|, amax) keeps amax against a NaN, as the reference's std::max does.
      __m256 amax = _mm256_setzero_ps();
      for (int64_t k = k0; k < k1; k += 8) {
        amax = _mm256_max_ps(_mm256_and_ps(load(row.x + k, k1 - k), magnitude), amax);
      }
      __m128 half = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
      half = _mm_max_ps(half, _mm_movehl_ps(half, half));
      half = _mm_max_ss(half, _mm_shuffle_ps(half, half, 1));
      const float most = _mm_cvtss_f32(half);
      scale = (most < kActivationAmaxFloor ? kActivationAmaxFloor : most) / kE4M3Max;
    }
    if (row.scales != nullptr) row.scales[k0 / row.group] = scale;
    const __m256 s = _mm256_set1_ps(scale);
    for (int64_t k = k0; k < k1; k += 8) {
      const __m256 v = _mm256_mul_ps(round_e4m3(_mm256_div_ps(load(row.x + k, k1 - k), s)), s);
      if (k1 - k >= 8) {
        _mm256_storeu_ps(row.out + k, v);
      } else {
        _mm256_maskstore_ps(row.out + k, first(k1 - k), v);
      }
    }
  }
}

}  // namespace moekit::cpu::e4m3_rows
