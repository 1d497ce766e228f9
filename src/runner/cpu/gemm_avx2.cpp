// gemm_panels: a register-blocked AVX2+FMA GEMM over panel16 weights.
//
// Blocking (for Zen 4: 32 KB L1d, 1 MB L2 per core). Rows of `a` are taken kBlockM at a time and
// K kBlockK at a time; the A block (kBlockM x kBlockK floats, 480 KB) is packed into `work` tile
// by tile and stays in L2 while every panel of the range passes over it. A panel's K-block
// (16 x kBlockK weights: 16 KB as bf16, 32 KB as f32) stays in L1 while the micro-kernel walks down
// the rows, up to 6 at a time: 6 rows x 16 columns are 12 ymm accumulators, and each k costs one
// step of weights (two 8-float vectors), 6 broadcasts of a and 12 FMAs. The block sizes were
// measured: K-blocks of 512 beat 256 and 128 (each K-block re-reads and re-writes the tile of c).
//
// f32 panels are read in place; bf16 and f16 are widened in registers as they are read (a shift
// and a mask for bf16, F16C for f16), which costs less than the FMAs they feed. e4m3 and int4
// K-blocks are first widened with their scales into `work` as f32, once per panel and A block,
// so their cost is shared by all the rows of the block.

#include "runner/cpu/gemm.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "moekit/error.hpp"
#include "runner/cpu/int4_avx2.hpp"

#define MOEKIT_AVX2 __attribute__((target("avx2,fma,f16c")))
#define MOEKIT_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline

namespace moekit::cpu {
namespace {

constexpr int64_t kBlockK = 512;
constexpr int64_t kBlockM = 240;
constexpr int kTileRows = 6;

// How each weight dtype yields one step (16 weights) of a panel as two 8-float vectors. `lo`
// and `hi` hold rows 0-7 and 8-15, except for bf16 (kEvenOdd), where they hold the even and
// the odd rows: one mask and one shift widen 16 values that way, and tile() puts the 16 sums
// back in row order once per tile.
struct F32Weights {
  using Elem = float;
  static constexpr bool kEvenOdd = false;
  MOEKIT_AVX2_INLINE static void load(const float* step, __m256& lo, __m256& hi) {
    lo = _mm256_loadu_ps(step);
    hi = _mm256_loadu_ps(step + 8);
  }
};

struct Bf16Weights {
  using Elem = uint16_t;
  static constexpr bool kEvenOdd = true;
  MOEKIT_AVX2_INLINE static void load(const uint16_t* step, __m256& even, __m256& odd) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(step));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    odd =
        _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
};

struct F16Weights {
  using Elem = uint16_t;
  static constexpr bool kEvenOdd = false;
  MOEKIT_AVX2_INLINE static void load(const uint16_t* step, __m256& lo, __m256& hi) {
    lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(step)));
    hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(step + 8)));
  }
};

// Where one tile's sums go: rows of c, `cols` (1 to 16) valid columns, and whether this K-block
// adds to what earlier K-blocks wrote.
struct TileOut {
  float* c;
  int64_t ldc;
  int64_t cols;
  bool accumulate;
};

MOEKIT_AVX2_INLINE void store_row(__m256 lo, __m256 hi, float* c, const TileOut& out) {
  if (out.cols == kPanelRows) {
    if (out.accumulate) {
      lo = _mm256_add_ps(lo, _mm256_loadu_ps(c));
      hi = _mm256_add_ps(hi, _mm256_loadu_ps(c + 8));
    }
    _mm256_storeu_ps(c, lo);
    _mm256_storeu_ps(c + 8, hi);
    return;
  }
  alignas(32) float row[kPanelRows];
  _mm256_store_ps(row, lo);
  _mm256_store_ps(row + 8, hi);
  for (int64_t j = 0; j < out.cols; ++j) c[j] = out.accumulate ? c[j] + row[j] : row[j];
}

// How an A block is cut into tiles: at most 6 rows each, sizes differing by at most one (31 rows
// run as 6+5+5+5+5+5, not 6+6+6+6+6+1, so no tile is left with too few rows to hide the cost of
// reading weights).
struct Tiling {
  int64_t count;
  int64_t base;
  int64_t longer;

  static Tiling of(int64_t rows) {
    const int64_t count = (rows + kTileRows - 1) / kTileRows;
    return {count, rows / count, rows % count};
  }
  int64_t rows(int64_t t) const { return base + (t < longer ? 1 : 0); }
  int64_t first_row(int64_t t) const { return t * base + std::min(t, longer); }
};

// Copies A block [rows, kc] (row stride lda) into `packed` tile by tile, each tile as [kc][R], so
// the micro-kernel reads one sequential stream. Read in place, rows K floats apart fall into
// the same few cache sets (K = 2048 puts every row 8 KB apart) and evict each other.
void pack_a(const float* a, int64_t lda, const Tiling& tiling, int64_t kc, float* packed) {
  for (int64_t t = 0; t < tiling.count; ++t) {
    const int64_t rows = tiling.rows(t);
    const float* src = a + tiling.first_row(t) * lda;
    float* dst = packed + tiling.first_row(t) * kc;
    for (int64_t k = 0; k < kc; ++k) {
      for (int64_t r = 0; r < rows; ++r) dst[k * rows + r] = src[r * lda + k];
    }
  }
}

// Sums of the R rows of a packed tile ([kc][R]) times kc steps of one panel, written to out.
template <int R, typename W>
MOEKIT_AVX2 void tile(const float* a, const typename W::Elem* w, int64_t kc, const TileOut& out) {
  // An FMA's result is ready 4 cycles after it starts and 2 start per cycle, so 8 independent
  // sums keep the FMA units busy. Tiles of fewer than 4 rows have fewer, so they keep a second
  // set for odd k and add the two at the end. The unrolled loops over r keep the accumulators
  // in registers rather than in a stack array.
  constexpr int kSets = R < 4 ? 2 : 1;
  __m256 acc[kSets][R][2];
#pragma GCC unroll 12
  for (int s = 0; s < kSets * R; ++s)
    acc[s / R][s % R][0] = acc[s / R][s % R][1] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + kSets <= kc; k += kSets) {
#pragma GCC unroll 2
    for (int s = 0; s < kSets; ++s) {
      __m256 w0;
      __m256 w1;
      W::load(w + (k + s) * kPanelRows, w0, w1);
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        const __m256 x = _mm256_broadcast_ss(a + (k + s) * R + r);
        acc[s][r][0] = _mm256_fmadd_ps(x, w0, acc[s][r][0]);
        acc[s][r][1] = _mm256_fmadd_ps(x, w1, acc[s][r][1]);
      }
    }
  }
  if (k < kc) {
    __m256 w0;
    __m256 w1;
    W::load(w + k * kPanelRows, w0, w1);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_broadcast_ss(a + k * R + r);
      acc[0][r][0] = _mm256_fmadd_ps(x, w0, acc[0][r][0]);
      acc[0][r][1] = _mm256_fmadd_ps(x, w1, acc[0][r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    __m256 lo = acc[0][r][0];
    __m256 hi = acc[0][r][1];
    if constexpr (kSets == 2) {
      lo = _mm256_add_ps(lo, acc[kSets - 1][r][0]);
      hi = _mm256_add_ps(hi, acc[kSets - 1][r][1]);
    }
    if constexpr (W::kEvenOdd) {
      // Interleaving even and odd gives rows 0-3 | 8-11 and 4-7 | 12-15 per 128-bit lane.
      const __m256 a03 = _mm256_unpacklo_ps(lo, hi);
      const __m256 a47 = _mm256_unpackhi_ps(lo, hi);
      lo = _mm256_permute2f128_ps(a03, a47, 0x20);
      hi = _mm256_permute2f128_ps(a03, a47, 0x31);
    }
    store_row(lo, hi, out.c + r * out.ldc, out);
  }
}

// Every tile of a packed A block against one panel K-block.
template <typename W>
MOEKIT_AVX2 void panel_block(const float* packed, const Tiling& tiling, const typename W::Elem* w,
                             int64_t kc, TileOut out) {
  float* const c = out.c;
  for (int64_t t = 0; t < tiling.count; ++t) {
    const float* a = packed + tiling.first_row(t) * kc;
    out.c = c + tiling.first_row(t) * out.ldc;
    switch (tiling.rows(t)) {
      case 1:
        tile<1, W>(a, w, kc, out);
        break;
      case 2:
        tile<2, W>(a, w, kc, out);
        break;
      case 3:
        tile<3, W>(a, w, kc, out);
        break;
      case 4:
        tile<4, W>(a, w, kc, out);
        break;
      case 5:
        tile<5, W>(a, w, kc, out);
        break;
      default:
        tile<6, W>(a, w, kc, out);
        break;
    }
  }
}

// Widens steps [k0, k0 + kc) of panel p of an e4m3 matrix, times its scales, into out[kc][16].
// A code's exponent and mantissa bits, moved into an f16's, read as the code's value times 2^-8,
// subnormals included, and F16C widens them exactly; the f32 route would meet f32 subnormals,
// which cost a microcode assist each. The NaN codes (S.1111.111) become an f16 NaN.
MOEKIT_AVX2 void widen_e4m3(const PanelMatrix& w, int64_t p, int64_t k0, int64_t kc, float* out) {
  const uint8_t* codes = w.panel(p) + k0 * kPanelRows;
  const float* scales = w.panel_scale(p);
  const __m256i keep = _mm256_set1_epi16(static_cast<int16_t>(0xBF80));
  const __m256i magnitude = _mm256_set1_epi16(0x3F80);
  const __m256 unbias = _mm256_set1_ps(256.0f);
  for (int64_t k = 0; k < kc;) {
    const int64_t g = (k0 + k) / w.group_k;
    const int64_t end = std::min(kc, (g + 1) * w.group_k - k0);
    const __m256 s_lo = _mm256_loadu_ps(scales + g * kPanelRows);
    const __m256 s_hi = _mm256_loadu_ps(scales + g * kPanelRows + 8);
    for (; k < end; ++k) {
      const __m256i code = _mm256_cvtepi8_epi16(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + k * kPanelRows)));
      __m256i half = _mm256_and_si256(_mm256_slli_epi16(code, 7), keep);
      half =
          _mm256_or_si256(half, _mm256_cmpeq_epi16(_mm256_and_si256(half, magnitude), magnitude));
      const __m256 lo = _mm256_cvtph_ps(_mm256_castsi256_si128(half));
      const __m256 hi = _mm256_cvtph_ps(_mm256_extracti128_si256(half, 1));
      _mm256_storeu_ps(out + k * kPanelRows, _mm256_mul_ps(_mm256_mul_ps(lo, unbias), s_lo));
      _mm256_storeu_ps(out + k * kPanelRows + 8, _mm256_mul_ps(_mm256_mul_ps(hi, unbias), s_hi));
    }
  }
}

// Widens steps [k0, k0 + kc) of panel p of an int4 matrix into out[kc][16] as
// (code - offset) * scale; code - offset is a small integer, exact in f32, so each weight is
// rounded once, as the format defines it. K, k0 and the groups are even, so the range is whole
// k pairs and a pair never straddles two groups.
MOEKIT_AVX2 void widen_int4(const PanelMatrix& w, int64_t p, int64_t k0, int64_t kc, float* out) {
  const uint8_t* panel = w.panel(p);
  const float* scales = w.panel_scale(p);
  for (int64_t k = 0; k < kc; k += 2) {
    const int64_t at = k0 + k;
    const int64_t g = at / w.group_k;
    const __m256 s_lo = _mm256_loadu_ps(scales + g * kPanelRows);
    const __m256 s_hi = _mm256_loadu_ps(scales + g * kPanelRows + 8);
    const Int4Offsets offset = int4_offsets(w, p, g);
    const __m256i block = load_int4_block(panel, at);
    const Int4PairF32 v =
        widen_int4_pair(at % kInt4BlockK == 0 ? int4_pair<0>(block) : int4_pair<1>(block));
    float* step = out + k * kPanelRows;
    _mm256_storeu_ps(step, _mm256_mul_ps(_mm256_sub_ps(v.low0, offset.low), s_lo));
    _mm256_storeu_ps(step + 8, _mm256_mul_ps(_mm256_sub_ps(v.high0, offset.high), s_hi));
    _mm256_storeu_ps(step + 16, _mm256_mul_ps(_mm256_sub_ps(v.low1, offset.low), s_lo));
    _mm256_storeu_ps(step + 24, _mm256_mul_ps(_mm256_sub_ps(v.high1, offset.high), s_hi));
  }
}

void check_arguments(const float* a, int64_t lda, int64_t m, const PanelMatrix& w, int64_t p_begin,
                     int64_t p_end, const float* c, int64_t ldc, const float* work) {
  const DType d = w.dtype;
  require(d == DType::f32 || d == DType::bf16 || d == DType::f16 || d == DType::f8e4m3 ||
              d == DType::i4,
          "gemm_panels: weight dtype {} has no panel16 form", dtype_name(d));
  require(w.n > 0 && w.k > 0 && w.data != nullptr,
          "gemm_panels: weights [{}, {}] must be a non-empty matrix with data", w.n, w.k);
  require(0 <= p_begin && p_begin <= p_end && p_end <= w.panels(),
          "gemm_panels: panel range [{}, {}) is outside the {} panels of the weights", p_begin,
          p_end, w.panels());
  require(m >= 0, "gemm_panels: row count {} is negative", m);
  if (m == 0 || p_begin == p_end) return;
  require(a != nullptr && c != nullptr && work != nullptr,
          "gemm_panels: a, c and the scratch must not be null");
  require(lda >= w.k, "gemm_panels: lda {} is less than K = {}", lda, w.k);
  const int64_t last_col = std::min(p_end * kPanelRows, w.n);
  require(m == 1 || ldc >= last_col, "gemm_panels: ldc {} is less than the {} columns written", ldc,
          last_col);
  if (d == DType::f8e4m3 || d == DType::i4) {
    require(w.group_k > 0 && w.scale != nullptr,
            "gemm_panels: {} weights need a scale grid (group_k {})", dtype_name(d), w.group_k);
  }
  if (d == DType::i4) {
    require(w.k % 2 == 0 && w.group_k % 2 == 0,
            "gemm_panels: int4 weights need an even K and group (got K {}, group {})", w.k,
            w.group_k);
  }
}

}  // namespace

int64_t gemm_scratch_floats(int64_t k) {
  return (kBlockM + kPanelRows) * std::clamp<int64_t>(k, 0, kBlockK);
}

MOEKIT_AVX2 void gemm_panels(const float* a, int64_t lda, int64_t m, const PanelMatrix& w,
                             int64_t p_begin, int64_t p_end, float* c, int64_t ldc, float* work) {
  check_arguments(a, lda, m, w, p_begin, p_end, c, ldc, work);
  if (m == 0 || p_begin == p_end) return;
  float* const packed = work;
  float* const widened = work + kBlockM * std::min(kBlockK, w.k);
  for (int64_t m0 = 0; m0 < m; m0 += kBlockM) {
    const Tiling tiling = Tiling::of(std::min(kBlockM, m - m0));
    for (int64_t k0 = 0; k0 < w.k; k0 += kBlockK) {
      const int64_t kc = std::min(kBlockK, w.k - k0);
      pack_a(a + m0 * lda + k0, lda, tiling, kc, packed);
      for (int64_t p = p_begin; p < p_end; ++p) {
        const TileOut out{c + m0 * ldc + p * kPanelRows, ldc,
                          std::min<int64_t>(kPanelRows, w.n - p * kPanelRows), k0 > 0};
        const uint8_t* panel = w.panel(p);
        switch (w.dtype) {
          case DType::f32:
            panel_block<F32Weights>(
                packed, tiling, reinterpret_cast<const float*>(panel) + k0 * kPanelRows, kc, out);
            break;
          case DType::bf16:
            panel_block<Bf16Weights>(packed, tiling,
                                     reinterpret_cast<const uint16_t*>(panel) + k0 * kPanelRows, kc,
                                     out);
            break;
          case DType::f16:
            panel_block<F16Weights>(packed, tiling,
                                    reinterpret_cast<const uint16_t*>(panel) + k0 * kPanelRows, kc,
                                    out);
            break;
          case DType::f8e4m3:
            widen_e4m3(w, p, k0, kc, widened);
            panel_block<F32Weights>(packed, tiling, widened, kc, out);
            break;
          default:
            widen_int4(w, p, k0, kc, widened);
            panel_block<F32Weights>(packed, tiling, widened, kc, out);
            break;
        }
      }
    }
  }
}

}  // namespace moekit::cpu
