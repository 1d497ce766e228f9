// The int4 x int16 streaming kernel with AVX-512 VNNI's vpdpwssd on 256-bit vectors: one
// instruction for pmaddwd + add. Only this kernel lives here: the file is compiled for AVX-512,
// and stream_panels_int16 (stream_avx2.cpp) calls it only where Platform::avx512_vnni is true.

#include <immintrin.h>

#include "runner/cpu/stream_int16.hpp"

namespace moekit::cpu {
namespace {

struct VnniDot {
  static __m256i dot(__m256i acc, __m256i a, __m256i b) { return _mm256_dpwssd_epi32(acc, a, b); }
};

}  // namespace

void stream_panels_int16_vnni(const PanelMatrix& w, int64_t p_begin, int64_t p_end,
                              const Int16Rows& rows, float* y, int64_t ldy) {
  stream_int16<VnniDot>(w, p_begin, p_end, rows, y, ldy);
}

}  // namespace moekit::cpu
