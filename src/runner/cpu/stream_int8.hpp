#pragma once
// The int4 x int8 streaming kernel (stream_panels_int8), for int4-group weights whose format
// quantises activations to int8 (QuantParams::Int4GroupA8). Written over the instruction that
// multiplies unsigned codes by signed activations four bytes at a time: pmaddubsw into 16-bit
// partial sums on AVX2 (stream_avx2.cpp); with AVX-512 VNNI the 512-bit form of
// stream_avx512vnni.cpp (vpdpbusd straight into int32, two blocks per load) runs instead.
// Include it only from files compiled for AVX2 or more; as in int4_avx2.hpp, everything here
// has internal linkage.
//
// Why the int4 blocks suit it: byte 2 l + b of a block holds, in its low nibble, row l / 2 at
// k = 2 b + l % 2, and in its high nibble row l / 2 + 8 at the same k (panels.hpp). So one mask
// gives rows 0-7 and one shift and mask rows 8-15, each 32-bit lane one row's four codes in the
// order k0, k2, k1, k3; an activation block stored in that order (quantize_int8) and broadcast to
// every lane meets them in one four-byte dot product per lane.

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "runner/cpu/int4_avx2.hpp"
#include "runner/cpu/stream.hpp"

namespace moekit::cpu {

// The kernel with vpdpbusd (stream_avx512vnni.cpp); stream_panels_int8 checks its arguments and
// the machine first.
void stream_panels_int8_vnni(const PanelMatrix& w, int64_t p_begin, int64_t p_end,
                             const Int8Rows& rows, float* y, int64_t ldy);

namespace {

inline __m256i broadcast_block(const int8_t* q) {
  int32_t block;
  std::memcpy(&block, q, sizeof block);
  return _mm256_set1_epi32(block);
}

// Per scale step: the blocks' dot products go into partial sums for runs of Dot::kRunK values of
// k per set, then into exact int32 sums; at the step's end, per row,
// (sum - offset * sum of q) * weight scale * activation scale. One or two rows keep a second set
// of partial sums for every other block, so that chains of dependent dot products stay short.
template <typename Dot, int M>
void int4_panel_int8(const PanelMatrix& w, int64_t p, const Int8Rows& rows, float* y, int64_t ldy) {
  constexpr int kSets = M <= 2 ? 2 : 1;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const uint8_t* panel = w.panel(p);
  __m256 out_lo[M], out_hi[M];
  for (int r = 0; r < M; ++r) out_lo[r] = out_hi[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < w.scale_steps(); ++g) {
    const int64_t k0 = g * w.group_k;
    const int64_t k1 = std::min(w.k, k0 + w.group_k);
    __m256i sum_lo[M], sum_hi[M];
    for (int r = 0; r < M; ++r) sum_lo[r] = sum_hi[r] = _mm256_setzero_si256();
    const uint8_t* codes = panel + k0 / kInt4BlockK * kInt4BlockBytes;
    for (int64_t k = k0; k < k1;) {
      // Each set takes every other block, so two sets double the run.
      const int64_t run_end = std::min(k1, k + kSets * Dot::kRunK);
      __m256i lo[kSets][M], hi[kSets][M];
#pragma GCC unroll 8
      for (int i = 0; i < kSets * M; ++i) lo[i / M][i % M] = hi[i / M][i % M] = Dot::zero();
      const auto block = [&](const uint8_t* at, int64_t kb, int set) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
        const __m256i rows_lo = _mm256_and_si256(v, nibble);
        const __m256i rows_hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
#pragma GCC unroll 4
        for (int r = 0; r < M; ++r) {
          const __m256i x = broadcast_block(rows.q[r] + kb);
          lo[set][r] = Dot::dot(lo[set][r], rows_lo, x);
          hi[set][r] = Dot::dot(hi[set][r], rows_hi, x);
        }
      };
      if constexpr (kSets == 2) {
        for (; k + 2 * kInt4BlockK <= run_end; k += 2 * kInt4BlockK, codes += 2 * kInt4BlockBytes) {
          prefetch_ahead(codes, rows.prefetch);
          block(codes, k, 0);
          block(codes + kInt4BlockBytes, k + kInt4BlockK, 1);
        }
      }
      for (; k < run_end; k += kInt4BlockK, codes += kInt4BlockBytes) {
        _mm_prefetch(reinterpret_cast<const char*>(codes + kStreamPrefetchBytes), _MM_HINT_T0);
        block(codes, k, 0);
      }
#pragma GCC unroll 4
      for (int r = 0; r < M; ++r) {
        for (int set = 0; set < kSets; ++set) {
          sum_lo[r] = Dot::add_to(sum_lo[r], lo[set][r]);
          sum_hi[r] = Dot::add_to(sum_hi[r], hi[set][r]);
        }
      }
    }
    const Int4StepScales scales = int4_step_scales(w, p, g);
#pragma GCC unroll 4
    for (int r = 0; r < M; ++r) {
      add_integer_step(scales, sum_lo[r], sum_hi[r], rows.sums[r] + g, rows.scale[r] + g, out_lo[r],
                       out_hi[r]);
    }
  }
  for (int r = 0; r < M; ++r) {
    _mm256_storeu_ps(y + r * ldy, out_lo[r]);
    _mm256_storeu_ps(y + r * ldy + kHalfPanel, out_hi[r]);
  }
}

template <typename Dot>
void stream_int8(const PanelMatrix& w, int64_t p_begin, int64_t p_end, const Int8Rows& rows,
                 float* y, int64_t ldy) {
  for_row_count(rows.m, [&]<int M>() {
    for (int64_t p = p_begin; p < p_end; ++p) {
      int4_panel_int8<Dot, M>(w, p, rows, y + (p - p_begin) * kPanelRows, ldy);
    }
  });
}

}  // namespace
}  // namespace moekit::cpu
