// silu_gated_panels on AVX2 and FMA (CMake compiles this file for them, src/CMakeLists.txt).
// exp is the classic range reduction x = n ln 2 + r, |r| <= ln 2 / 2, with ln 2 split in two so
// that r is exact, and a degree-6 polynomial for exp(r) (the Cephes coefficients), times 2^n put
// into the exponent bits.

#include <immintrin.h>

#include <cstdint>

#include "runner/cpu/silu_panels.hpp"

#define MOEKIT_SILU_INLINE __attribute__((always_inline)) inline

namespace moekit::cpu {
namespace {

MOEKIT_SILU_INLINE __m256 exp_avx2(__m256 x) {
  // Past +-88.37 exp leaves f32's range: clamping gives ~2^127 or ~2^-127 there, which the
  // activation turns into its limits. min/max keep the bound for a NaN x; the caller's gate
  // carries the NaN through.
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // n is in [-127, 128]: 2^n as two halves, so that neither overflows the exponent field.
  const __m256i e = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(e, 1);
  const __m256 a =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  const __m256 b = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(e, half), _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, a), b);
}

MOEKIT_SILU_INLINE __m256 silu_gated(__m256 gate, __m256 up) {
  const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), gate));
  return _mm256_mul_ps(_mm256_div_ps(gate, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), up);
}

}  // namespace

void silu_gated_panels(const float* y, int64_t n, float* act) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8, y += 16) {
    _mm256_storeu_ps(act + i, silu_gated(_mm256_loadu_ps(y), _mm256_loadu_ps(y + 8)));
  }
  if (i < n) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - i)), lane);
    _mm256_maskstore_ps(act + i, lanes,
                        silu_gated(_mm256_maskload_ps(y, lanes), _mm256_maskload_ps(y + 8, lanes)));
  }
}

}  // namespace moekit::cpu
