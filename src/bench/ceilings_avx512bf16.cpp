// The chains of measure_bf16_dot_peak, compiled for AVX-512 BF16 and called only where
// Platform::avx512_bf16 is true (ceilings.cpp checks).

#include <immintrin.h>

#include "bench/ceilings.hpp"

namespace moekit::bench {

float bf16_dot_chains(int64_t iterations) {
  // Small values, so the sums stay finite however long it runs; the compiler cannot fold the
  // dependent chains away.
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.001f), _mm512_set1_ps(0.002f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f));
  __m512 c[kDotChains];
  for (int j = 0; j < kDotChains; ++j) c[j] = _mm512_set1_ps(static_cast<float>(j) * 0.1f);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int j = 0; j < kDotChains; ++j) c[j] = _mm512_dpbf16_ps(c[j], a, b);
  }
  __m512 total = c[0];
  for (int j = 1; j < kDotChains; ++j) total = _mm512_add_ps(total, c[j]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, total);
  float sum = 0.0f;
  for (float v : lanes) sum += v;
  return sum;
}

}  // namespace moekit::bench
