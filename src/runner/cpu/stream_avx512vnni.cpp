// The int4 x int16 and int4 x int8 streaming kernels with AVX-512 VNNI on 256-bit vectors:
// vpdpwssd for pmaddwd + add, vpdpbusd for pmaddubsw + its 16-bit partial sums. Only these
// kernels live here: the file is compiled for AVX-512, and stream_panels_int16 and
// stream_panels_int8 (stream_avx2.cpp) call them only where Platform::avx512_vnni is true.

#include <immintrin.h>

#include "runner/cpu/stream_int16.hpp"
#include "runner/cpu/stream_int8.hpp"

namespace moekit::cpu {
namespace {

struct VnniDot {
  static __m256i dot(__m256i acc, __m256i a, __m256i b) { return _mm256_dpwssd_epi32(acc, a, b); }
};

// Sums go straight to int32 (at most 4 x 15 x 127 per block), so a run is a whole step.
struct VnniByteDot {
  static constexpr int64_t kRunK = kInt8MaxStep;
  static __m256i zero() { return _mm256_setzero_si256(); }
  static __m256i dot(__m256i part, __m256i codes, __m256i x) {
    return _mm256_dpbusd_epi32(part, codes, x);
  }
  static __m256i add_to(__m256i sum, __m256i part) { return _mm256_add_epi32(sum, part); }
};

}  // namespace

void stream_panels_int16_vnni(const PanelMatrix& w, int64_t p_begin, int64_t p_end,
                              const Int16Rows& rows, float* y, int64_t ldy) {
  stream_int16<VnniDot>(w, p_begin, p_end, rows, y, ldy);
}

void stream_panels_int8_vnni(const PanelMatrix& w, int64_t p_begin, int64_t p_end,
                             const Int8Rows& rows, float* y, int64_t ldy) {
  stream_int8<VnniByteDot>(w, p_begin, p_end, rows, y, ldy);
}

}  // namespace moekit::cpu
