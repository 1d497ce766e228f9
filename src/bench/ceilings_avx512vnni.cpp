// The chains of measure_int8_dot_peak on AVX-512 VNNI, compiled for it and called only where
// Platform::avx512_vnni is true (ceilings.cpp checks).

#include <immintrin.h>

#include "bench/ceilings.hpp"

namespace moekit::bench {

int32_t int8_dot_chains_vnni(int64_t iterations) {
  // The int32 sums wrap after a while, which costs nothing and changes no timing; the compiler
  // cannot fold the dependent chains away.
  const __m512i a = _mm512_set1_epi8(3);
  const __m512i b = _mm512_set1_epi8(-5);
  __m512i c[kDotChains];
  for (int j = 0; j < kDotChains; ++j) c[j] = _mm512_set1_epi32(j);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int j = 0; j < kDotChains; ++j) c[j] = _mm512_dpbusd_epi32(c[j], a, b);
  }
  __m512i total = c[0];
  for (int j = 1; j < kDotChains; ++j) total = _mm512_add_epi32(total, c[j]);
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, total);
  int32_t sum = 0;
  for (const int32_t lane : lanes) sum ^= lane;
  return sum;
}

}  // namespace moekit::bench
