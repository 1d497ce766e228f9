// gemm_panels_int8's kernel where the CPU has no AVX-512 VNNI: a register-blocked GEMM of int8
// rows and panel16 int4 weights on AVX2's pmaddubsw.
//
// The int4 blocks meet the rows as in gemm_avx512vnni.cpp: a block masked gives in 32-bit lane j
// row j's four codes (k0, k2, k1, k3), shifted right by 4 and masked rows 8..15's, the order
// quantize_int8 stores a row's codes in. Each panel K-block is widened that way once per call
// into `work` (two ymm per block, 4 KB per K-block); every row tile reads the copy. pmaddubsw
// multiplies the unsigned codes (at most 15) by the signed activations (at most 127 in
// magnitude) and sums each pair into a 16-bit lane: a run of 8 blocks adds 16 such products,
// at most 30480, inside int16 (as the int8 streaming kernel's MaddubsDot), and one pmaddwd by
// ones then sums each row's two lanes into its int32. A tile is up to 4 rows of one panel: 8
// ymm of 16-bit partial sums, 8 of int32 sums (touched once a run). Each group is finished as
// the VNNI kernel finishes it, with the same fused operations, so the two give the same floats:
// (sum - offset * sum of the row's codes) * weight scale * row scale.

#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "runner/cpu/gemm_int8.hpp"

// CMake compiles this file for AVX2, FMA and F16C (see src/CMakeLists.txt).
#define MOEKIT_AVX2_INLINE __attribute__((always_inline)) inline

namespace moekit::cpu::int8_gemm {
namespace {

constexpr int kTileRows = 4;
constexpr int64_t kStep = 16;        // rows per panel
constexpr int64_t kRunBlocks = 8;    // int4 blocks per run of 16-bit partial sums
constexpr int64_t kBlockBytes = 32;  // one int4 block (4 k x 16 rows)

// This file avoids std templates: an inline function instantiated here is compiled for AVX2,
// and the linker may keep this copy for callers on any CPU.
constexpr int64_t min64(int64_t x, int64_t y) {
  return x < y ? x : y;
}

struct TileIn {
  const int8_t* a;       // the tile's row 0 at the K-block's first k
  int64_t lda;           // bytes between rows
  const float* a_scale;  // row 0's scale of the K-block's first group; rows `steps` apart
  const float* a_sums;   // and its sum of codes
  int64_t steps;
  const __m256i* packed;  // the widened K-block: [blocks][2], rows 0-7 then rows 8-15
  int64_t blocks;         // int4 blocks (4 k) in the K-block
  int64_t group_blocks;   // and per scale group
  const float* scale;     // the panel's weight scales of the K-block's first group
  const float* offset;    // and offsets; null: 8
};

struct TileOut {
  float* c;  // row 0, column 0 of the panel
  int64_t ldc;
  int64_t cols;     // valid columns of the panel (1 to 16)
  bool accumulate;  // add to what earlier K-blocks wrote
};

MOEKIT_AVX2_INLINE __m256i lanes_below(int64_t count) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), lane);
}

// Adds (or writes) v at columns [0, count) of dst, count in [0, 8].
MOEKIT_AVX2_INLINE void finish_half(float* dst, int64_t count, __m256 exact, __m256 scale,
                                    bool add) {
  if (count <= 0) return;
  if (count >= 8) {
    const __m256 before = add ? _mm256_loadu_ps(dst) : _mm256_setzero_ps();
    _mm256_storeu_ps(dst, _mm256_fmadd_ps(exact, scale, before));
    return;
  }
  const __m256i lanes = lanes_below(count);
  const __m256 before = add ? _mm256_maskload_ps(dst, lanes) : _mm256_setzero_ps();
  _mm256_maskstore_ps(dst, lanes, _mm256_fmadd_ps(exact, scale, before));
}

template <int R>
void tile(const TileIn& in, const TileOut& out) {
  const __m256i ones = _mm256_set1_epi16(1);
  int64_t b = 0;
  for (int64_t group = 0; b < in.blocks; ++group) {
    __m256i sum[R][2];
#pragma GCC unroll 8
    for (int i = 0; i < 2 * R; ++i) sum[i / 2][i % 2] = _mm256_setzero_si256();
    const int64_t end = min64(in.blocks, b + in.group_blocks);
    while (b < end) {
      const int64_t run_end = min64(end, b + kRunBlocks);
      __m256i part[R][2];
#pragma GCC unroll 8
      for (int i = 0; i < 2 * R; ++i) part[i / 2][i % 2] = _mm256_setzero_si256();
      for (; b < run_end; ++b) {
        const __m256i lo = _mm256_load_si256(in.packed + 2 * b);
        const __m256i hi = _mm256_load_si256(in.packed + 2 * b + 1);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          int32_t four;
          __builtin_memcpy(&four, in.a + r * in.lda + b * 4, sizeof four);
          const __m256i x = _mm256_set1_epi32(four);
          part[r][0] = _mm256_add_epi16(part[r][0], _mm256_maddubs_epi16(lo, x));
          part[r][1] = _mm256_add_epi16(part[r][1], _mm256_maddubs_epi16(hi, x));
        }
      }
#pragma GCC unroll 8
      for (int i = 0; i < 2 * R; ++i) {
        sum[i / 2][i % 2] =
            _mm256_add_epi32(sum[i / 2][i % 2], _mm256_madd_epi16(part[i / 2][i % 2], ones));
      }
    }
    const bool add = out.accumulate || group > 0;
    const float* scale = in.scale + group * kStep;
    const float* offset = in.offset == nullptr ? nullptr : in.offset + group * kStep;
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256 weight_scale = _mm256_loadu_ps(scale + 8 * h);
      const __m256 weight_offset =
          offset == nullptr ? _mm256_set1_ps(kSymmetricOffset) : _mm256_loadu_ps(offset + 8 * h);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256 row_scale = _mm256_set1_ps(in.a_scale[r * in.steps + group]);
        const __m256 row_sum = _mm256_set1_ps(in.a_sums[r * in.steps + group]);
        // Both terms are integers below 2^24, so the difference is exact in f32.
        const __m256 exact =
            _mm256_fnmadd_ps(weight_offset, row_sum, _mm256_cvtepi32_ps(sum[r][h]));
        finish_half(out.c + r * out.ldc + 8 * h, out.cols - 8 * h, exact,
                    _mm256_mul_ps(weight_scale, row_scale), add);
      }
    }
  }
}

using TileFn = void (*)(const TileIn&, const TileOut&);

template <int... Rm1>
constexpr auto make_tiles(std::integer_sequence<int, Rm1...>) {
  struct Table {
    TileFn fn[kTileRows];
  } t{{&tile<Rm1 + 1>...}};
  return t;
}

constexpr auto kTiles = make_tiles(std::make_integer_sequence<int, kTileRows>{});

}  // namespace

void gemm_unchecked_maddubs(const Int8Matrix& a, int64_t m, const Weights& w, int64_t p_begin,
                            int64_t p_end, float* c, int64_t ldc, void* work) {
  auto* const packed = reinterpret_cast<__m256i*>((reinterpret_cast<uintptr_t>(work) + 63) &
                                                  ~static_cast<uintptr_t>(63));
  const __m256i nibbles = _mm256_set1_epi8(0x0F);
  // K-blocks of whole groups (at most kBlockK values; gemm_int8_reads).
  const int64_t block_k = kBlockK / w.group_k * w.group_k;
  const int64_t tiles = (m + kTileRows - 1) / kTileRows;
  const int64_t base_rows = m / tiles;
  const int64_t longer = m % tiles;
  for (int64_t k0 = 0; k0 < w.k; k0 += block_k) {
    const int64_t kc = min64(block_k, w.k - k0);
    const int64_t g0 = k0 / w.group_k;
    for (int64_t p = p_begin; p < p_end; ++p) {
      TileIn in{};
      in.lda = a.ldq;
      in.steps = a.steps;
      in.packed = packed;
      in.blocks = kc / kInt4BlockK;
      in.group_blocks = w.group_k / kInt4BlockK;
      const uint8_t* raw = w.data + p * w.panel_bytes + k0 / kInt4BlockK * kBlockBytes;
      for (int64_t b = 0; b < in.blocks; ++b) {
        const __m256i v =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(raw + b * kBlockBytes));
        _mm256_store_si256(packed + 2 * b, _mm256_and_si256(v, nibbles));
        _mm256_store_si256(packed + 2 * b + 1, _mm256_and_si256(_mm256_srli_epi16(v, 4), nibbles));
      }
      const int64_t at = (p * w.scale_steps + g0) * kStep;
      in.scale = w.scale + at;
      in.offset = w.offset == nullptr ? nullptr : w.offset + at;
      TileOut out{};
      out.ldc = ldc;
      out.cols = min64(kStep, w.n - p * kStep);
      out.accumulate = k0 > 0;
      int64_t row = 0;
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t r = base_rows + (t < longer ? 1 : 0);
        in.a = a.q + row * a.ldq + k0;
        in.a_scale = a.scale + row * a.steps + g0;
        in.a_sums = a.sums + row * a.steps + g0;
        out.c = c + row * ldc + p * kStep;
        kTiles.fn[r - 1](in, out);
        row += r;
      }
    }
  }
}

}  // namespace moekit::cpu::int8_gemm
