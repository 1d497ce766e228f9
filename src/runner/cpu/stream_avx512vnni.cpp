// The int4 x int16 and int4 x int8 streaming kernels with AVX-512 VNNI: vpdpwssd for pmaddwd +
// add, vpdpbusd for pmaddubsw + its 16-bit partial sums. Only these kernels live here: the file
// is compiled for AVX-512 F, VL and VNNI, and stream_panels_int16 and stream_panels_int8
// (stream_avx2.cpp) call them only where Platform::avx512_vnni is true.
//
// Both run on 512-bit vectors, two int4 blocks (8 k) per load: at one row the 256-bit int16
// kernel of stream_int16.hpp unpacks and multiplies at ~16 GB/s per core with the weights in
// cache (measured on a Zen 5 VM), about what one core's share of memory delivers, so the
// weights' stream waited on the arithmetic; these issue about half the instructions per byte
// (the int8 one since stop 29: one core of a Zen 4 VM, one expert's w13 in cache, 16-24% less
// time than the 256-bit int8 kernel at 1 and 4 rows). Lanes 0-7 of a vector hold rows 0-7 (or
// 8-15) at the first block's k, lanes 8-15 the same rows at the second block's, so each 256-bit
// half is the 256-bit kernel's vector of its block; the halves are added at the end of each
// scale step. 32-bit shifts (AVX-512 F) stand in for the 16-bit ones: the nibbles taken never
// cross a 16-bit lane (the int8 kernel masks each byte after its shift).

#include <immintrin.h>

#include <algorithm>

#include "runner/cpu/stream_int16.hpp"
#include "runner/cpu/stream_int8.hpp"

namespace moekit::cpu {
namespace {

// Every lane. The zero-masked forms of the shifts, permutes and extracts: GCC 12's unmasked
// ones pass an undefined vector through, which -Wmaybe-uninitialized reports.
constexpr __mmask16 kAll = 0xFFFF;

// Each row's int16 pairs of two blocks' k, spread to the lanes that meet them: lanes 0-7 take
// pair `first` of the 8 k (q[k + 2 first], q[k + 2 first + 1]), lanes 8-15 pair `first` + 2.
template <int kFirst>
__m512i pairs_for_blocks(__m512i q) {
  const __m512i index = _mm512_set_epi32(kFirst + 2, kFirst + 2, kFirst + 2, kFirst + 2, kFirst + 2,
                                         kFirst + 2, kFirst + 2, kFirst + 2, kFirst, kFirst, kFirst,
                                         kFirst, kFirst, kFirst, kFirst, kFirst);
  return _mm512_maskz_permutexvar_epi32(kAll, index, q);
}

// The codes of a load of two blocks as four vectors of int16 pairs (see int4_pair): rows 0-7
// and 8-15 at the blocks' first pair of k, then at their second.
struct Int4Blocks {
  __m512i first_low, first_high, second_low, second_high;
};
Int4Blocks int4_blocks(__m512i v) {
  const __m512i nibble = _mm512_set1_epi32(0x000F000F);
  return {_mm512_and_si512(v, nibble),
          _mm512_and_si512(_mm512_maskz_srli_epi32(kAll, v, 4), nibble),
          _mm512_and_si512(_mm512_maskz_srli_epi32(kAll, v, 8), nibble),
          _mm512_and_si512(_mm512_maskz_srli_epi32(kAll, v, 12), nibble)};
}

__m256i add_halves(__m512i v) {
  return _mm256_add_epi32(_mm512_maskz_extracti64x4_epi64(0xF, v, 0),
                          _mm512_maskz_extracti64x4_epi64(0xF, v, 1));
}

// int4_panel_int16 (stream_int16.hpp) on 512-bit vectors: the same sums, exact in int32, and
// the same scale step arithmetic. Each of a row's four sums (first and second pair of k, rows
// 0-7 and 8-15) is its own chain of dot products.
template <int M>
void int4_panel_int16_512(const PanelMatrix& w, int64_t p, const Int16Rows& rows, float* y,
                          int64_t ldy) {
  const uint8_t* panel = w.panel(p);
  __m256 out_lo[M], out_hi[M];
  for (int r = 0; r < M; ++r) out_lo[r] = out_hi[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < w.scale_steps(); ++g) {
    const int64_t k0 = g * w.group_k;
    const int64_t k1 = std::min(w.k, k0 + w.group_k);
    __m512i lo0[M], hi0[M], lo1[M], hi1[M];
#pragma GCC unroll 4
    for (int r = 0; r < M; ++r) {
      lo0[r] = hi0[r] = lo1[r] = hi1[r] = _mm512_setzero_si512();
    }
    const uint8_t* codes = panel + k0 / kInt4BlockK * kInt4BlockBytes;
    const auto blocks = [&](__m512i v, int64_t k, bool one) {
      const Int4Blocks c = int4_blocks(v);
#pragma GCC unroll 4
      for (int r = 0; r < M; ++r) {
        // One block: only its 4 values of q are read (the other lanes' codes are zero).
        const __m512i q = _mm512_maskz_loadu_epi32(one ? 0x3 : 0xF, rows.q[r] + k);
        const __m512i a0 = pairs_for_blocks<0>(q), a1 = pairs_for_blocks<1>(q);
        lo0[r] = _mm512_dpwssd_epi32(lo0[r], c.first_low, a0);
        hi0[r] = _mm512_dpwssd_epi32(hi0[r], c.first_high, a0);
        lo1[r] = _mm512_dpwssd_epi32(lo1[r], c.second_low, a1);
        hi1[r] = _mm512_dpwssd_epi32(hi1[r], c.second_high, a1);
      }
    };
    int64_t k = k0;
    for (; k + 2 * kInt4BlockK <= k1; k += 2 * kInt4BlockK, codes += 2 * kInt4BlockBytes) {
      _mm_prefetch(reinterpret_cast<const char*>(codes + kStreamPrefetchBytes), _MM_HINT_T0);
      blocks(_mm512_loadu_si512(codes), k, false);
    }
    if (k < k1) {
      blocks(_mm512_maskz_loadu_epi32(0x00FF, codes), k, true);
    }
    const Int4StepScales scales = int4_step_scales(w, p, g);
#pragma GCC unroll 4
    for (int r = 0; r < M; ++r) {
      add_integer_step(scales, add_halves(_mm512_add_epi32(lo0[r], lo1[r])),
                       add_halves(_mm512_add_epi32(hi0[r], hi1[r])), rows.sums[r] + g,
                       rows.scale[r] + g, out_lo[r], out_hi[r]);
    }
  }
  for (int r = 0; r < M; ++r) {
    _mm256_storeu_ps(y + r * ldy, out_lo[r]);
    _mm256_storeu_ps(y + r * ldy + kHalfPanel, out_hi[r]);
  }
}

// int4_panel_int8 (stream_int8.hpp) on 512-bit vectors: the same exact int32 sums (at most
// 4 x 15 x 127 per block, so a whole step of at most kInt8MaxStep values sums without a wrap)
// and the same scale step arithmetic. Each row's two 4-byte activation blocks go to the halves
// of a vector by one vpermd; one or two rows keep a second set of sums for every other load, so
// that chains of dependent dot products stay short.
template <int M>
void int4_panel_int8_512(const PanelMatrix& w, int64_t p, const Int8Rows& rows, float* y,
                         int64_t ldy) {
  constexpr int kSets = M <= 2 ? 2 : 1;
  const __m512i nibble = _mm512_set1_epi32(0x0F0F0F0F);
  const __m512i halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const uint8_t* panel = w.panel(p);
  __m256 out_lo[M], out_hi[M];
  for (int r = 0; r < M; ++r) out_lo[r] = out_hi[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < w.scale_steps(); ++g) {
    const int64_t k0 = g * w.group_k;
    const int64_t k1 = std::min(w.k, k0 + w.group_k);
    __m512i lo[kSets][M], hi[kSets][M];
#pragma GCC unroll 8
    for (int i = 0; i < kSets * M; ++i) {
      lo[i / M][i % M] = hi[i / M][i % M] = _mm512_setzero_si512();
    }
    const uint8_t* codes = panel + k0 / kInt4BlockK * kInt4BlockBytes;
    // Two blocks at k (one: the second's codes and activations are zeros).
    const auto blocks = [&](__m512i v, int64_t k, int set, bool one) {
      const __m512i rows_lo = _mm512_and_si512(v, nibble);
      const __m512i rows_hi = _mm512_and_si512(_mm512_maskz_srli_epi32(kAll, v, 4), nibble);
#pragma GCC unroll 4
      for (int r = 0; r < M; ++r) {
        const __m128i pair = one ? _mm_loadu_si32(rows.q[r] + k)
                                 : _mm_loadl_epi64(reinterpret_cast<const __m128i*>(rows.q[r] + k));
        const __m512i x =
            _mm512_maskz_permutexvar_epi32(kAll, halves, _mm512_zextsi128_si512(pair));
        lo[set][r] = _mm512_dpbusd_epi32(lo[set][r], rows_lo, x);
        hi[set][r] = _mm512_dpbusd_epi32(hi[set][r], rows_hi, x);
      }
    };
    constexpr int64_t kLoadK = 2 * kInt4BlockK, kLoadBytes = 2 * kInt4BlockBytes;
    int64_t k = k0;
    if constexpr (kSets == 2) {
      for (; k + 2 * kLoadK <= k1; k += 2 * kLoadK, codes += 2 * kLoadBytes) {
        _mm_prefetch(reinterpret_cast<const char*>(codes + kStreamPrefetchBytes), _MM_HINT_T0);
        blocks(_mm512_loadu_si512(codes), k, 0, false);
        _mm_prefetch(reinterpret_cast<const char*>(codes + kLoadBytes + kStreamPrefetchBytes),
                     _MM_HINT_T0);
        blocks(_mm512_loadu_si512(codes + kLoadBytes), k + kLoadK, 1, false);
      }
    }
    for (; k + kLoadK <= k1; k += kLoadK, codes += kLoadBytes) {
      _mm_prefetch(reinterpret_cast<const char*>(codes + kStreamPrefetchBytes), _MM_HINT_T0);
      blocks(_mm512_loadu_si512(codes), k, 0, false);
    }
    if (k < k1) blocks(_mm512_maskz_loadu_epi32(0x00FF, codes), k, 0, true);
    const Int4StepScales scales = int4_step_scales(w, p, g);
#pragma GCC unroll 4
    for (int r = 0; r < M; ++r) {
      __m512i sum_lo = lo[0][r], sum_hi = hi[0][r];
      if constexpr (kSets == 2) {
        sum_lo = _mm512_add_epi32(sum_lo, lo[1][r]);
        sum_hi = _mm512_add_epi32(sum_hi, hi[1][r]);
      }
      add_integer_step(scales, add_halves(sum_lo), add_halves(sum_hi), rows.sums[r] + g,
                       rows.scale[r] + g, out_lo[r], out_hi[r]);
    }
  }
  for (int r = 0; r < M; ++r) {
    _mm256_storeu_ps(y + r * ldy, out_lo[r]);
    _mm256_storeu_ps(y + r * ldy + kHalfPanel, out_hi[r]);
  }
}

}  // namespace

void stream_panels_int16_vnni(const PanelMatrix& w, int64_t p_begin, int64_t p_end,
                              const Int16Rows& rows, float* y, int64_t ldy) {
  for_row_count(rows.m, [&]<int M>() {
    for (int64_t p = p_begin; p < p_end; ++p) {
      int4_panel_int16_512<M>(w, p, rows, y + (p - p_begin) * kPanelRows, ldy);
    }
  });
}

void stream_panels_int8_vnni(const PanelMatrix& w, int64_t p_begin, int64_t p_end,
                             const Int8Rows& rows, float* y, int64_t ldy) {
  for_row_count(rows.m, [&]<int M>() {
    for (int64_t p = p_begin; p < p_end; ++p) {
      int4_panel_int8_512<M>(w, p, rows, y + (p - p_begin) * kPanelRows, ldy);
    }
  });
}

}  // namespace moekit::cpu
