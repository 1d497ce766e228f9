// gemm_panels_bf16's kernel: a register-blocked GEMM over panel16 bf16 weights on vdpbf16ps.
//
// vdpbf16ps adds, per 32-bit lane, the products of a pair of bf16 values (k, k + 1) of one
// output row with the same pair of an input row. panel16 stores per k the 16 rows of a panel
// next to each other, so two steps (k, k + 1) are one 64-byte load whose lanes hold the wrong
// pairs; one vpermw makes them the pairs of rows 0..15. Each panel K-block is repacked that way
// once per A block, into `work`, by the first row tile as it goes (so its loads from memory
// overlap that tile's arithmetic the way the AVX2 kernel's do); the other tiles read the copy.
// An A block is rounded to bf16 once, row by row: a row of bf16 in k order already is its
// row of pairs, so every step of the micro-kernel takes one 32-bit broadcast per row.
//
// Blocking: rows of `a` are taken kBlockM (256, the most a call of the runner gets) at a time
// and K kBlockK (256) at a time. A tile is up to kTileRows (8) rows times kGroupPanels (2)
// panels: 16 zmm sums, and per k-pair 2 loads of repacked weights, 8 broadcasts and 16
// vdpbf16ps. A group's repacked K-block (2 x 128 pairs x 64 bytes = 16 KB) and a tile's rows
// (8 x 576 bytes) stay in a 32 KB L1 (Zen 4's), which 4 panels or K-blocks of 512 would not.
// Measured single-threaded on a Sapphire Rapids VM (the only AVX-512 BF16 machine at hand; its
// vdpbf16ps starts one every other cycle, the rate of 256-bit f32 FMAs): 8x2 tiles reach ~90%
// of that peak with the weights in DRAM, and 4x4, 5x4, 6x4, 10x2, 12x2, 14x2 tiles and K-blocks
// of 512 and 2048 were no faster there (within the machine's noise of ~5%).

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "runner/cpu/gemm_bf16.hpp"

// CMake compiles this file for AVX-512 F, BW, VL, DQ and BF16 (see src/CMakeLists.txt).
#define MOEKIT_BF16_INLINE __attribute__((always_inline)) inline

namespace moekit::cpu::bf16_gemm {
namespace {

constexpr int kTileRows = 8;
constexpr int kP = static_cast<int>(kGroupPanels);
constexpr int64_t kStep = 16;  // bf16 values per panel step (one per row)
// The packing tile asks for each panel's weights this far ahead: measured (Sapphire Rapids,
// weights from DRAM) 5-10% faster than leaving it to the hardware prefetchers; 1-2 KB no better.
constexpr int64_t kPrefetchBytes = 512;

// This file avoids std templates (std::min and the like): an inline function instantiated here
// is compiled for AVX-512, and the linker may keep this copy for callers on any CPU.
constexpr int64_t min64(int64_t x, int64_t y) {
  return x < y ? x : y;
}

// Rounds 32 floats (lo: the first 16) to bf16, to nearest even. vcvtne2ps2bf16 flushes
// subnormals to zero, which changes nothing: vdpbf16ps would flush them anyway.
MOEKIT_BF16_INLINE __m512i round_to_bf16(__m512 lo, __m512 hi) {
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// Rounds rows [0, rows) of the A block (K-block of kc values) to bf16 into `packed`, row r at
// r * stride pairs; an odd kc leaves the last pair's second half zero.
void pack_a(const float* a, int64_t lda, int64_t rows, int64_t kc, uint8_t* packed,
            int64_t stride) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = a + r * lda;
    uint8_t* dst = packed + r * stride * 4;
    int64_t j = 0;
    for (; j + 32 <= kc; j += 32) {
      _mm512_storeu_si512(dst + j * 2,
                          round_to_bf16(_mm512_loadu_ps(src + j), _mm512_loadu_ps(src + j + 16)));
    }
    if (j < kc) {
      const int64_t left = kc - j;
      const auto mask = [](int64_t count) {
        return static_cast<__mmask16>(count >= 16 ? 0xFFFF : count <= 0 ? 0 : (1 << count) - 1);
      };
      const __m512 lo = _mm512_maskz_loadu_ps(mask(left), src + j);
      const __m512 hi = _mm512_maskz_loadu_ps(mask(left - 16), src + j + 16);
      _mm512_storeu_si512(dst + j * 2, round_to_bf16(lo, hi));
    }
  }
}

// Where one tile's sums go.
struct TileOut {
  float* c;  // row 0, column 0 of panel 0 of the tile
  int64_t ldc;
  int64_t last_cols;  // valid columns (1 to 16) of the tile's last panel; the others have 16
  bool accumulate;    // add to what earlier K-blocks wrote
};

struct TileIn {
  const uint8_t* a;         // the tile's first packed row
  int64_t a_stride;         // bytes between packed rows
  const uint16_t* raw[kP];  // packing tile: the K-block of each panel, as stored
  __m512i* packed;          // the repacked K-block: [pairs][P]
  int64_t kc;
};

MOEKIT_BF16_INLINE __m512 dot(__m512 acc, __m512i w, __m512i x) {
  return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x);
}

MOEKIT_BF16_INLINE __m512i broadcast_pair(const uint8_t* at) {
  int32_t pair;
  std::memcpy(&pair, at, 4);
  return _mm512_set1_epi32(pair);
}

// Rows 0..R-1 of a tile times P panels over one K-block. kPack: read the panels as stored and
// write their repacked pairs for the tiles after this one.
template <int R, int P, bool kPack>
void tile(const TileIn& in, const TileOut& out) {
  // vdpbf16ps has a latency of about 6 cycles and starts about one per cycle (Zen 4; one every
  // other cycle measured on Sapphire Rapids), so fewer than 8 sums leave it idle; small tiles
  // keep a second set for odd pairs.
  constexpr int kSets = R * P < 8 ? 2 : 1;
  __m512 acc[kSets][R][P];
#pragma GCC unroll 32
  for (int i = 0; i < kSets * R * P; ++i) acc[i / (R * P)][i / P % R][i % P] = _mm512_setzero_ps();

  // Word 2j of a pair vector is row j at k, word 2j + 1 row j at k + 1; the load holds the 16
  // rows at k in words 0..15 and those at k + 1 in words 16..31.
  alignas(64) static constexpr uint16_t kPairs[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                      21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                      11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  __m512i order = _mm512_setzero_si512();
  if constexpr (kPack) order = _mm512_load_si512(kPairs);

  const auto step = [&](int64_t q, int set, bool last_odd) __attribute__((always_inline)) {
    __m512i w[P];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      if constexpr (kPack) {
        const uint16_t* src = in.raw[p] + q * 2 * kStep;
        if constexpr (kPrefetchBytes > 0) {
          _mm_prefetch(reinterpret_cast<const char*>(src) + kPrefetchBytes, _MM_HINT_T0);
        }
        // The second step of the last pair lies past the K-block (and perhaps the matrix):
        // it reads as zeros, as does the A block's padding.
        const __m512i raw =
            last_odd ? _mm512_maskz_loadu_epi16(0xFFFF, src) : _mm512_loadu_si512(src);
        w[p] = _mm512_permutexvar_epi16(order, raw);
        _mm512_store_si512(in.packed + q * P + p, w[p]);
      } else {
        w[p] = _mm512_load_si512(in.packed + q * P + p);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512i x = broadcast_pair(in.a + r * in.a_stride + q * 4);
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) acc[set][r][p] = dot(acc[set][r][p], w[p], x);
    }
  };

  const int64_t full = in.kc / 2;
  int64_t q = 0;
  for (; q + kSets <= full; q += kSets) {
#pragma GCC unroll 2
    for (int s = 0; s < kSets; ++s) step(q + s, s, false);
  }
  for (; q < full; ++q) step(q, 0, false);
  if (in.kc % 2 != 0) step(full, 0, true);

#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      __m512 sum = acc[0][r][p];
      if constexpr (kSets == 2) sum = _mm512_add_ps(sum, acc[1][r][p]);
      float* dst = out.c + r * out.ldc + p * kStep;
      if (p < P - 1 || out.last_cols == kStep) {
        if (out.accumulate) sum = _mm512_add_ps(sum, _mm512_loadu_ps(dst));
        _mm512_storeu_ps(dst, sum);
      } else {
        const auto cols = static_cast<__mmask16>((1u << out.last_cols) - 1);
        if (out.accumulate) sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(cols, dst));
        _mm512_mask_storeu_ps(dst, cols, sum);
      }
    }
  }
}

using TileFn = void (*)(const TileIn&, const TileOut&);

// tile<R, P, kPack> for every R in [1, kTileRows] and P in [1, kP].
struct TileTable {
  TileFn fn[2][kTileRows][kP];
};

template <bool kPack, int P, int... Rm1>
constexpr void fill_rows(TileTable& t, std::integer_sequence<int, Rm1...>) {
  ((t.fn[kPack][Rm1][P - 1] = &tile<Rm1 + 1, P, kPack>), ...);
}

template <int... Pm1>
constexpr TileTable make_table(std::integer_sequence<int, Pm1...>) {
  TileTable t{};
  (fill_rows<false, Pm1 + 1>(t, std::make_integer_sequence<int, kTileRows>{}), ...);
  (fill_rows<true, Pm1 + 1>(t, std::make_integer_sequence<int, kTileRows>{}), ...);
  return t;
}

constexpr TileTable kTiles = make_table(std::make_integer_sequence<int, kP>{});

}  // namespace

void gemm_unchecked(const float* a, int64_t lda, int64_t m, const uint16_t* panels, int64_t n,
                    int64_t k, int64_t p_begin, int64_t p_end, float* c, int64_t ldc, void* work) {
  auto* const base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(work) + 63) &
                                                ~static_cast<uintptr_t>(63));
  const int64_t kc_max = min64(k, kBlockK);
  const int64_t stride = a_stride_pairs(kc_max);
  uint8_t* const a_block = base;
  auto* const group = reinterpret_cast<__m512i*>(a_block + kBlockM * stride * 4);
  const int64_t panel_values = k * kStep;

  for (int64_t m0 = 0; m0 < m; m0 += kBlockM) {
    const int64_t rows = min64(kBlockM, m - m0);
    // Tiles of at most kTileRows rows whose sizes differ by at most one (20 rows run as 7+7+6,
    // not 8+8+4), so that no tile has too few rows to hide the cost of reading its weights.
    const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
    const int64_t base_rows = rows / tiles;
    const int64_t longer = rows % tiles;
    for (int64_t k0 = 0; k0 < k; k0 += kBlockK) {
      const int64_t kc = min64(kBlockK, k - k0);
      pack_a(a + m0 * lda + k0, lda, rows, kc, a_block, stride);
      for (int64_t g = p_begin; g < p_end; g += kP) {
        const int np = static_cast<int>(min64(kP, p_end - g));
        TileIn in{};
        in.a_stride = stride * 4;
        in.packed = group;
        in.kc = kc;
        for (int p = 0; p < np; ++p) in.raw[p] = panels + (g + p) * panel_values + k0 * kStep;
        TileOut out{};
        out.ldc = ldc;
        out.last_cols = min64(kStep, n - (g + np - 1) * kStep);
        out.accumulate = k0 > 0;
        int64_t row = 0;
        for (int64_t t = 0; t < tiles; ++t) {
          const int64_t r = base_rows + (t < longer ? 1 : 0);
          in.a = a_block + row * stride * 4;
          out.c = c + (m0 + row) * ldc + g * kStep;
          kTiles.fn[t == 0][r - 1][np - 1](in, out);
          row += r;
        }
      }
    }
  }
}

}  // namespace moekit::cpu::bf16_gemm
