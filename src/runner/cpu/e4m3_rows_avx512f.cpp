// quantize_e4m3_row's AVX-512F kernel: 16 values at a time (e4m3_rows.hpp says why the rounding
// is the scalar reference's). CMake compiles this file for AVX-512F (src/CMakeLists.txt). Some
// intrinsics are the maskz forms with every lane set: g++ 12's plain ones warn of an undefined
// source.

#include <immintrin.h>

#include <cstdint>

#include "moekit/dtype.hpp"
#include "quant/activation_quant.hpp"
#include "runner/cpu/e4m3_rows.hpp"

#define MOEKIT_E4M3_INLINE __attribute__((always_inline)) inline

namespace moekit::cpu::e4m3_rows {
namespace {

// No std templates here: an inline function instantiated in this file is compiled for
// AVX-512, and the linker may keep this copy for callers on any CPU.
constexpr int64_t min64(int64_t x, int64_t y) {
  return x < y ? x : y;
}

MOEKIT_E4M3_INLINE __mmask16 first(int64_t count) {
  return static_cast<__mmask16>(count >= 16 ? 0xFFFF : (1u << count) - 1);
}

// y rounded to the nearest e4m3 value (ties to even), saturated to +-448; NaN stays NaN, as the
// f32 that to_float gives an e4m3 NaN: the quiet NaN with y's sign.
MOEKIT_E4M3_INLINE __m512 round_e4m3(__m512 y) {
  const __m512i bits = _mm512_castps_si512(y);
  const __m512i sign = _mm512_and_si512(bits, _mm512_set1_epi32(INT32_MIN));
  const __m512i magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(INT32_MAX));
  // The step: 2^(e - 3) for an exponent e, 2^-9 at least (zero and subnormals included). Both it
  // and its inverse are normal powers of two, so |y| / step is exact and below 16 (or inf).
  const __m512i exponent = _mm512_and_si512(magnitude, _mm512_set1_epi32(0x7F800000));
  const __m512i step =
      _mm512_maskz_max_epi32(0xFFFF, _mm512_sub_epi32(exponent, _mm512_set1_epi32(3 << 23)),
                             _mm512_set1_epi32((127 - 9) << 23));
  const __m512i inverse = _mm512_sub_epi32(_mm512_set1_epi32(254 << 23), step);
  const __m512 steps = _mm512_maskz_roundscale_ps(
      0xFFFF, _mm512_mul_ps(_mm512_castsi512_ps(magnitude), _mm512_castsi512_ps(inverse)),
      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 rounded = _mm512_maskz_min_ps(0xFFFF, _mm512_mul_ps(steps, _mm512_castsi512_ps(step)),
                                       _mm512_set1_ps(kE4M3Max));
  const __mmask16 nan = _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);
  rounded = _mm512_mask_mov_ps(rounded, nan, _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(rounded), sign));
}

}  // namespace

void quantize_avx512(const Row& row) {
  for (int64_t k0 = 0; k0 < row.n; k0 += row.group) {
    const int64_t k1 = min64(row.n, k0 + row.group);
    float scale = row.static_scale;
    if (row.dynamic) {
      // max(|x|, amax) keeps amax against a NaN, as the reference's std::max does.
      __m512 amax = _mm512_setzero_ps();
      for (int64_t k = k0; k < k1; k += 16) {
        const __m512 x = _mm512_maskz_loadu_ps(first(k1 - k), row.x + k);
        amax = _mm512_maskz_max_ps(0xFFFF, _mm512_abs_ps(x), amax);
      }
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, amax);
      float most = 0.0f;
      for (const float lane : lanes) most = most < lane ? lane : most;
      scale = (most < kActivationAmaxFloor ? kActivationAmaxFloor : most) / kE4M3Max;
    }
    if (row.scales != nullptr) row.scales[k0 / row.group] = scale;
    const __m512 s = _mm512_set1_ps(scale);
    for (int64_t k = k0; k < k1; k += 16) {
      const __mmask16 lanes = first(k1 - k);
      const __m512 x = _mm512_maskz_loadu_ps(lanes, row.x + k);
      _mm512_mask_storeu_ps(row.out + k, lanes, _mm512_mul_ps(round_e4m3(_mm512_div_ps(x, s)), s));
    }
  }
}

}  // namespace moekit::cpu::e4m3_rows
