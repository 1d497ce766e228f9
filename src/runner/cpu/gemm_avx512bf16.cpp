// gemm_panels_bf16's kernel: a register-blocked GEMM over panel16 weights on vdpbf16ps.
//
// vdpbf16ps adds, per 32-bit lane, the products of a pair of bf16 values (k, k + 1) of one
// output row with the same pair of an input row. panel16 stores per k the 16 rows of a panel
// next to each other, so the lanes of what is stored hold the wrong pairs (and e4m3 and int4 are
// not bf16 at all). Each panel K-block is widened to bf16 pairs of rows 0..15 once per A block,
// into `work`, by the first row tile as it goes (so that its loads from memory and its widening
// overlap that tile's arithmetic); the other tiles read the copy:
//   bf16  one vpermw per pair of k;
//   e4m3  the codes sign-extended to 16 bits, put in pair order by one vpermw, and the bf16 of
//         each magnitude (the low 7 bits: subnormals and NaN included, every one exact in bf16)
//         looked up in a table of 128 by two vpermi2w and a blend, the sign put back by one
//         vpternlog: five vector operations per pair, where an f16 route (F16C widening to f32,
//         then rounding to bf16) took about fifteen and made the packing tile of e4m3 weights
//         2.4 times a tile that reads its pairs (perf on a Zen 4 VM, Qwen3-30B-A3B T = 512);
//   int4  two shifts and a mask of one block (panels.hpp) give the codes of a pair of k in pair
//         order, and one vpermw looks up code - 8 as bf16.
// The scales of e4m3 and int4 (one per row and scale group, panels.hpp) multiply the f32 sums of
// each group as the tile finishes it, adding them to the output tile, so no weight is rounded
// on its way to the dot products. An A block is rounded to bf16 once, row by row (or the caller
// rounded all its rows beforehand, round_rows_bf16, and the kernel reads them as they are: the
// runner meets the same rows with one call per chunk of panels, and rounding them in every call
// took 3-4 points of the dot-product peak at Qwen3-30B-A3B's GEMM1 shapes): a row of bf16 in k
// order already is its row of pairs, and each dot product reads its row's pair itself (an
// embedded broadcast), which keeps vpbroadcastd off the vector pipes the dot products need.
//
// Blocking: rows of `a` are taken kBlockM (256, the most a call of the runner gets) at a time
// and K kBlockK (256, or whole scale groups: block_k) at a time. A tile is up to kTileRows (8)
// rows times kGroupPanels (2) panels: 16 zmm sums, and per k-pair 2 loads of repacked weights and
// 16 vdpbf16ps. A group's repacked K-block (2 x 128 pairs x 64 bytes = 16 KB) and a tile's rows
// (8 x 576 bytes) stay in a 32 KB L1 (Zen 4's). While the packing tile of one group runs, it asks
// for the next group's K-block (into L2), a whole group of tiles ahead of its use: measured on
// one core of a Zen 4 VM, m = 32, K = 2048, weights from DRAM, that and the embedded broadcasts
// took the kernel from 60% to 80% of the dot products' peak (86-88% with the weights in L2); 12x2
// tiles and K-blocks of 128 were no faster, prefetching into L1 or L3 slower.

#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "runner/cpu/gemm_bf16.hpp"

// CMake compiles this file for AVX-512 F, BW, VL, DQ and BF16 (see src/CMakeLists.txt).
#define MOEKIT_BF16_INLINE __attribute__((always_inline)) inline

namespace moekit::cpu::bf16_gemm {
namespace {

constexpr int kTileRows = 8;
constexpr int kP = static_cast<int>(kGroupPanels);
constexpr int64_t kStep = 16;  // values per panel step (one per row)

// This file avoids std templates (std::min and the like): an inline function instantiated here
// is compiled for AVX-512, and the linker may keep this copy for callers on any CPU.
constexpr int64_t min64(int64_t x, int64_t y) {
  return x < y ? x : y;
}

// Bytes of one pair of k of a panel, as stored.
constexpr int64_t pair_bytes(Widen widen) {
  return widen == Widen::bf16 ? 64 : widen == Widen::e4m3 ? 32 : 16;
}

// Rounds 32 floats (lo: the first 16) to bf16, to nearest even. vcvtne2ps2bf16 flushes
// subnormals to zero, which changes nothing: vdpbf16ps would flush them anyway.
MOEKIT_BF16_INLINE __m512i round_to_bf16(__m512 lo, __m512 hi) {
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// Rounds rows [0, rows) of the A block (K-block [k0, k0 + kc)) to bf16 into `packed`, row r at
// r * stride pairs; an odd kc leaves the last pair's second half zero. With input scales (`in`
// at the block's row 0), each value is first multiplied by the inverse of its group's scale: an
// e4m3 code times a scale, so times the inverse it is the code within a few f32 ulps, which the
// rounding to bf16 takes back to the code exactly.
void pack_a(const float* a, int64_t lda, int64_t rows, int64_t k0, int64_t kc, uint8_t* packed,
            int64_t stride, const InputScales& in) {
  const auto mask16 = [](int64_t count) {
    return static_cast<__mmask16>(count >= 16 ? 0xFFFF : count <= 0 ? 0 : (1 << count) - 1);
  };
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = a + r * lda;
    uint8_t* dst = packed + r * stride * 4;
    if (in.scale == nullptr) {
      int64_t j = 0;
      for (; j + 32 <= kc; j += 32) {
        _mm512_storeu_si512(dst + j * 2,
                            round_to_bf16(_mm512_loadu_ps(src + j), _mm512_loadu_ps(src + j + 16)));
      }
      if (j < kc) {
        const int64_t left = kc - j;
        const __m512 lo = _mm512_maskz_loadu_ps(mask16(left), src + j);
        const __m512 hi = _mm512_maskz_loadu_ps(mask16(left - 16), src + j + 16);
        _mm512_storeu_si512(dst + j * 2, round_to_bf16(lo, hi));
      }
      continue;
    }
    for (int64_t j = 0; j < kc;) {
      const int64_t g = (k0 + j) / in.group;
      const int64_t end = min64(kc, (g + 1) * in.group - k0);
      const __m512 inverse = _mm512_set1_ps(1.0f / in.scale[r * in.ld + g]);
      for (; j < end; j += 32) {
        const int64_t left = end - j;
        const __m512 lo = _mm512_maskz_loadu_ps(mask16(left), src + j);
        const __m512 hi = _mm512_maskz_loadu_ps(mask16(left - 16), src + j + 16);
        const __mmask32 words =
            left >= 32 ? 0xFFFFFFFFu : static_cast<__mmask32>((uint64_t{1} << left) - 1);
        _mm512_mask_storeu_epi16(
            dst + j * 2, words,
            round_to_bf16(_mm512_mul_ps(lo, inverse), _mm512_mul_ps(hi, inverse)));
      }
      j = end;
    }
    if (kc % 2 != 0) {
      const uint16_t zero = 0;
      __builtin_memcpy(dst + kc * 2, &zero, 2);
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
  const uint8_t* a;        // the tile's first packed row
  int64_t a_stride;        // bytes between packed rows
  const uint8_t* raw[kP];  // packing tile: each panel as stored (its step 0)
  const char* ahead[kP];   // packing tile: each panel's K-block that the next group packs
  __m512i* packed;         // the widened K-block: [pairs][P]
  int64_t k0;              // the K-block's first k
  int64_t kc;
  int64_t group_pairs;     // pairs of k per scale group (the whole block without scales)
  const float* scale[kP];  // e4m3 and int4: the K-block's first group's scales, per panel
  const float* a_scale;    // input scales of row 0 for the K-block's first group, or null
  int64_t a_scale_ld;
};

// acc + w . (the pair at `at`, in every lane), the pair read by the dot product itself
// (embedded broadcast): a separate vpbroadcastd would take a vector pipe the dot products need.
MOEKIT_BF16_INLINE __m512 dot_broadcast(__m512 acc, __m512i w, const uint8_t* at) {
  __asm__("vdpbf16ps %[x]%{1to16%}, %[w], %[acc]"
          : [acc] "+v"(acc)
          : [w] "v"(w), [x] "m"(*reinterpret_cast<const int32_t*>(at)));
  return acc;
}

// Word 2j of a pair vector is row j at k, word 2j + 1 row j at k + 1; 16 rows at k followed by
// the 16 at k + 1 (bf16 and e4m3 as stored) go there through one vpermw with this order.
alignas(64) constexpr uint16_t kPairOrder[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                 21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

// The bf16 of each e4m3 magnitude (code & 0x7F), every one exact: 1 + 3 mantissa bits times
// 2^-6 .. 2^8 for exponents 1 .. 15, m * 2^-9 for the subnormals (exponent 0), NaN for 0x7F.
struct E4m3Magnitudes {
  alignas(64) uint16_t bits[128];
};
constexpr E4m3Magnitudes make_e4m3_magnitudes() {
  E4m3Magnitudes t{};
  for (int magnitude = 0; magnitude < 128; ++magnitude) {
    const int e = magnitude >> 3, m = magnitude & 7;
    int bits = 0;
    if (magnitude == 0x7F) {
      bits = 0x7FC0;
    } else if (e > 0) {
      bits = (e + 120) << 7 | m << 4;  // bf16's exponent bias is 127, e4m3's 7
    } else if (m > 0) {
      const int top = m >= 4 ? 2 : m >= 2 ? 1 : 0;  // m * 2^-9 = (m / 2^top) * 2^(top - 9)
      bits = (118 + top) << 7 | ((m - (1 << top)) << (7 - top));
    }
    t.bits[magnitude] = static_cast<uint16_t>(bits);
  }
  return t;
}
constexpr E4m3Magnitudes kE4m3Magnitudes = make_e4m3_magnitudes();

// What the packing tile keeps in registers to widen one dtype.
struct WidenConstants {
  __m512i order;          // bf16 and e4m3: kPairOrder
  __m512i bits;           // int4: the bf16 of code - 8, by code; e4m3: 0x8000 per word (the sign)
  __m512i low;            // int4: 0xF per word; e4m3: 0x40 per word (magnitudes 64 and up)
  __m512i shift[2];       // int4: per word, where its code sits in the block, for each pair of k
  __m512i magnitudes[4];  // e4m3: kE4m3Magnitudes, 32 per vector
};

template <Widen kWiden>
MOEKIT_BF16_INLINE WidenConstants widen_constants() {
  WidenConstants c{};
  if constexpr (kWiden == Widen::int4) {
    alignas(64) static constexpr uint16_t kCodes[32] = {
        0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000, 0xBF80,  // -8 .. -1
        0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0,  // 0 .. 7
        0,      0,      0,      0,      0,      0,      0,      0,      0, 0, 0, 0, 0, 0, 0, 0};
    c.bits = _mm512_load_si512(kCodes);
    c.low = _mm512_set1_epi16(0xF);
    const __m512i upper = _mm512_mask_set1_epi16(_mm512_setzero_si512(), 0xFFFF0000u, 4);
    c.shift[0] = upper;
    c.shift[1] = _mm512_add_epi16(upper, _mm512_set1_epi16(8));
  } else {
    c.order = _mm512_load_si512(kPairOrder);
    if constexpr (kWiden == Widen::e4m3) {
      c.bits = _mm512_set1_epi16(static_cast<int16_t>(0x8000));
      c.low = _mm512_set1_epi16(0x40);
      for (int v = 0; v < 4; ++v)
        c.magnitudes[v] = _mm512_load_si512(kE4m3Magnitudes.bits + 32 * v);
    }
  }
  return c;
}

// The pair vector of steps (k, k + 1) of a panel whose step k is at `step`; k is absolute. The
// second step of an odd K-block's last pair lies past the K-block (and perhaps the matrix):
// `last_odd` reads it as zeros, as the A block's padding is.
template <Widen kWiden>
MOEKIT_BF16_INLINE __m512i widen_pair(const uint8_t* panel, int64_t k, bool last_odd,
                                      const WidenConstants& c) {
  if constexpr (kWiden == Widen::bf16) {
    const uint8_t* src = panel + k * 2 * kStep;
    const __m512i raw = last_odd ? _mm512_maskz_loadu_epi16(0xFFFF, src) : _mm512_loadu_si512(src);
    return _mm512_permutexvar_epi16(c.order, raw);
  } else if constexpr (kWiden == Widen::e4m3) {
    const uint8_t* src = panel + k * kStep;
    const __m256i raw = last_odd ? _mm256_maskz_loadu_epi8(0xFFFF, src)
                                 : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    // Sign-extended, so that bit 15 is the sign; vpermi2w reads the low 6 bits of each index.
    const __m512i code = _mm512_permutexvar_epi16(c.order, _mm512_cvtepi8_epi16(raw));
    const __m512i below_64 = _mm512_permutex2var_epi16(c.magnitudes[0], code, c.magnitudes[1]);
    const __m512i from_64 = _mm512_permutex2var_epi16(c.magnitudes[2], code, c.magnitudes[3]);
    const __m512i magnitude =
        _mm512_mask_blend_epi16(_mm512_test_epi16_mask(code, c.low), below_64, from_64);
    return _mm512_ternarylogic_epi32(magnitude, code, c.bits, 0xF8);  // magnitude | code & sign
  } else {
    // Lane 2 (j % 8) + k % 2 of the block holds row j's codes: words 0..15 of the pair vector
    // (rows 0-7) are its nibble for rows 0-7, words 16..31 (rows 8-15) the next nibble up; the
    // block's second pair of k sits 8 bits higher. So the block in both halves, each word
    // shifted by its own count.
    const __m512i block = _mm512_maskz_broadcast_i64x4(
        0xFF, _mm256_loadu_si256(
                  reinterpret_cast<const __m256i*>(panel + k / kInt4BlockK * kInt4BlockBytes)));
    const __m512i codes = _mm512_srlv_epi16(block, c.shift[k % kInt4BlockK < 2 ? 0 : 1]);
    return _mm512_permutexvar_epi16(_mm512_and_si512(codes, c.low), c.bits);
  }
}

// Rows 0..R-1 of a tile times P panels over one K-block. kPack: widen the panels as stored and
// write their pairs for the tiles after this one; otherwise read those pairs.
template <int R, int P, bool kPack, Widen kWiden>
void tile(const TileIn& in, const TileOut& out) {
  // vdpbf16ps has a latency of about 6 cycles and starts about one per cycle (Zen 4; one every
  // other cycle measured on Sapphire Rapids), so fewer than 8 sums leave it idle; small tiles
  // keep a second set for odd pairs.
  constexpr int kSets = R * P < 8 ? 2 : 1;
  // bf16 has no scales; e4m3 and int4 always have them (panels.hpp).
  constexpr bool kScaled = kWiden != Widen::bf16;
  __m512 acc[kSets][R][P];
  WidenConstants constants{};
  if constexpr (kPack) constants = widen_constants<kWiden>();

  const auto step = [&](int64_t q, int set, bool last_odd) __attribute__((always_inline)) {
    __m512i w[P];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      if constexpr (kPack) {
        _mm_prefetch(in.ahead[p] + q * pair_bytes(kWiden), _MM_HINT_T1);
        w[p] = widen_pair<kWiden>(in.raw[p], in.k0 + 2 * q, last_odd, constants);
        _mm512_store_si512(in.packed + q * P + p, w[p]);
      } else {
        w[p] = _mm512_load_si512(in.packed + q * P + p);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const uint8_t* x = in.a + r * in.a_stride + q * 4;
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) acc[set][r][p] = dot_broadcast(acc[set][r][p], w[p], x);
    }
  };

  // The sums of one scale group, times its scales, into the output tile.
  const auto finish = [&](int64_t group, bool add) __attribute__((always_inline)) {
    __m512 scale[P];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      if constexpr (kScaled) scale[p] = _mm512_loadu_ps(in.scale[p] + group * kStep);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) {
        __m512 sum = acc[0][r][p];
        if constexpr (kSets == 2) sum = _mm512_add_ps(sum, acc[1][r][p]);
        if (in.a_scale != nullptr) {
          sum = _mm512_mul_ps(sum, _mm512_set1_ps(in.a_scale[r * in.a_scale_ld + group]));
        }
        float* dst = out.c + r * out.ldc + p * kStep;
        const bool whole = p < P - 1 || out.last_cols == kStep;
        const auto cols = static_cast<__mmask16>(whole ? 0xFFFF : (1u << out.last_cols) - 1);
        const __m512 before = add ? _mm512_maskz_loadu_ps(cols, dst) : _mm512_setzero_ps();
        if constexpr (kScaled) {
          sum = _mm512_fmadd_ps(sum, scale[p], before);
        } else {
          sum = _mm512_add_ps(sum, before);  // bf16: no scales (scale[] is never set)
        }
        if (whole) {
          _mm512_storeu_ps(dst, sum);
        } else {
          _mm512_mask_storeu_ps(dst, cols, sum);
        }
      }
    }
  };

  const int64_t full = in.kc / 2;
  int64_t q = 0;
  for (int64_t group = 0; q < full || (group == 0 && in.kc % 2 != 0); ++group) {
#pragma GCC unroll 32
    for (int i = 0; i < kSets * R * P; ++i) {
      acc[i / (R * P)][i / P % R][i % P] = _mm512_setzero_ps();
    }
    const int64_t end = min64(full, q + in.group_pairs);
    for (; q + kSets <= end; q += kSets) {
#pragma GCC unroll 2
      for (int s = 0; s < kSets; ++s) step(q + s, s, false);
    }
    for (; q < end; ++q) step(q, 0, false);
    // Only the last K-block can have an odd length, and its last group ends with it.
    if (q == full && in.kc % 2 != 0) step(full, 0, true);
    finish(group, out.accumulate || group > 0);
  }
}

using TileFn = void (*)(const TileIn&, const TileOut&);

// tile<R, P, kPack, W> for every R in [1, kTileRows], P in [1, kP], and W.
struct TileTable {
  TileFn fn[3][2][kTileRows][kP];
};

template <Widen kWiden, bool kPack, int P, int... Rm1>
constexpr void fill_rows(TileTable& t, std::integer_sequence<int, Rm1...>) {
  ((t.fn[static_cast<int>(kWiden)][kPack][Rm1][P - 1] = &tile<Rm1 + 1, P, kPack, kWiden>), ...);
}

template <Widen kWiden, int... Pm1>
constexpr void fill_widen(TileTable& t, std::integer_sequence<int, Pm1...>) {
  (fill_rows<kWiden, false, Pm1 + 1>(t, std::make_integer_sequence<int, kTileRows>{}), ...);
  (fill_rows<kWiden, true, Pm1 + 1>(t, std::make_integer_sequence<int, kTileRows>{}), ...);
}

constexpr TileTable make_table() {
  TileTable t{};
  fill_widen<Widen::bf16>(t, std::make_integer_sequence<int, kP>{});
  fill_widen<Widen::e4m3>(t, std::make_integer_sequence<int, kP>{});
  fill_widen<Widen::int4>(t, std::make_integer_sequence<int, kP>{});
  return t;
}

constexpr TileTable kTiles = make_table();

// Where the packing tile of the group after (g, k0) finds its weights: the next group of the
// range in the same K-block, else the range's first group in the next K-block, else the panels
// after the range (the next call's, as the runner makes them) at k = 0.
struct Ahead {
  int64_t panel;
  int64_t k0;
};
Ahead next_group(const Weights& w, int64_t g, int64_t k0, int64_t kc, int64_t p_begin,
                 int64_t p_end) {
  if (g + kP < p_end) return {g + kP, k0};
  if (k0 + kc < w.k) return {p_begin, k0 + kc};
  const int64_t panels = (w.n + kStep - 1) / kStep;
  return {p_end < panels ? p_end : p_begin, 0};
}

const char* raw_at(const Weights& w, int64_t panel, int64_t k0) {
  const int64_t panels = (w.n + kStep - 1) / kStep;
  return reinterpret_cast<const char*>(w.data + min64(panel, panels - 1) * w.panel_bytes +
                                       k0 * pair_bytes(w.widen) / 2);
}

}  // namespace

void round_unchecked(const float* a, int64_t lda, int64_t m, int64_t k, bf16_t* out, int64_t ld,
                     const InputScales& input) {
  pack_a(a, lda, m, 0, k, reinterpret_cast<uint8_t*>(out), ld / 2, input);
}

void gemm_unchecked(const Source& src, int64_t m, const Weights& w, int64_t p_begin, int64_t p_end,
                    float* c, int64_t ldc, void* work, const InputScales& input) {
  auto* const base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(work) + 63) &
                                                ~static_cast<uintptr_t>(63));
  uint8_t* const a_block = base;
  const int64_t block_stride = a_stride_pairs(min64(w.k, kBlockK));
  auto* const group = reinterpret_cast<__m512i*>(a_block + kBlockM * block_stride * 4);
  // Pairs between the rows the tiles read.
  const int64_t stride = src.rounded != nullptr ? src.rounded_ld / 2 : block_stride;
  const int widen = static_cast<int>(w.widen);

  for (int64_t m0 = 0; m0 < m; m0 += kBlockM) {
    const int64_t rows = min64(kBlockM, m - m0);
    // Tiles of at most kTileRows rows whose sizes differ by at most one (20 rows run as 7+7+6,
    // not 8+8+4), so that no tile has too few rows to hide the cost of reading its weights.
    const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
    const int64_t base_rows = rows / tiles;
    const int64_t longer = rows % tiles;
    for (int64_t k0 = 0; k0 < w.k;) {
      const int64_t kc = block_k(w.k, w.group_k, k0);
      InputScales block_scales = input;
      if (input.scale != nullptr) block_scales.scale = input.scale + m0 * input.ld;
      // Row m0's pairs of the K-block.
      const uint8_t* a_rows = a_block;
      if (src.rounded != nullptr) {
        a_rows = reinterpret_cast<const uint8_t*>(src.rounded + m0 * src.rounded_ld + k0);
      } else {
        pack_a(src.a + m0 * src.lda + k0, src.lda, rows, k0, kc, a_block, stride, block_scales);
      }
      for (int64_t g = p_begin; g < p_end; g += kP) {
        const int np = static_cast<int>(min64(kP, p_end - g));
        TileIn in{};
        in.a_stride = stride * 4;
        in.packed = group;
        in.k0 = k0;
        in.kc = kc;
        in.group_pairs = w.group_k > 0 && w.group_k < kc ? w.group_k / 2 : (kc + 1) / 2;
        const Ahead next = next_group(w, g, k0, kc, p_begin, p_end);
        for (int p = 0; p < kP; ++p) {
          in.ahead[p] = raw_at(w, next.panel + p, next.k0);
          if (p >= np) continue;
          in.raw[p] = w.data + (g + p) * w.panel_bytes;
          if (w.group_k > 0) {
            in.scale[p] = w.scale + ((g + p) * w.scale_steps + k0 / w.group_k) * kStep;
          }
        }
        TileOut out{};
        out.ldc = ldc;
        out.last_cols = min64(kStep, w.n - (g + np - 1) * kStep);
        out.accumulate = k0 > 0;
        int64_t row = 0;
        for (int64_t t = 0; t < tiles; ++t) {
          const int64_t r = base_rows + (t < longer ? 1 : 0);
          in.a = a_rows + row * stride * 4;
          if (input.scale != nullptr) {
            in.a_scale = block_scales.scale + row * input.ld + k0 / w.group_k;
            in.a_scale_ld = input.ld;
          }
          out.c = c + (m0 + row) * ldc + g * kStep;
          kTiles.fn[widen][t == 0][r - 1][np - 1](in, out);
          row += r;
        }
      }
      k0 += kc;
    }
  }
}

}  // namespace moekit::cpu::bf16_gemm
