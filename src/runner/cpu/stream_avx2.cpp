// Compiled with -mavx2 -mfma -mf16c (src/CMakeLists.txt); called only where the plan found them.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "moekit/error.hpp"
#include "quant/activation_quant.hpp"
#include "runner/cpu/int4_avx2.hpp"
#include "runner/cpu/stream.hpp"
#include "runner/cpu/stream_e4m3.hpp"
#include "runner/cpu/stream_int16.hpp"
#include "runner/cpu/stream_int8.hpp"

namespace moekit::cpu {
namespace {

// pmaddwd and an add: the AVX2 form of a 16-bit dot product step (stream_int16.hpp).
struct MaddDot {
  static __m256i dot(__m256i acc, __m256i a, __m256i b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
  }
};

// pmaddubsw: codes (unsigned, at most 15) times activations (at most 127 in magnitude), each
// pair of products summed into a 16-bit lane, two lanes per row (stream_int8.hpp). A run of 8
// blocks adds 16 such products per lane, at most 16 x 15 x 127 = 30480, inside int16; pmaddwd by
// ones then sums each row's two lanes into its int32.
struct MaddubsDot {
  static constexpr int64_t kRunK = 8 * kInt4BlockK;
  static __m256i zero() { return _mm256_setzero_si256(); }
  static __m256i dot(__m256i part, __m256i codes, __m256i x) {
    return _mm256_add_epi16(part, _mm256_maddubs_epi16(codes, x));
  }
  static __m256i add_to(__m256i sum, __m256i part) {
    return _mm256_add_epi32(sum, _mm256_madd_epi16(part, _mm256_set1_epi16(1)));
  }
};

// One panel step widened to f32: rows 0-7 in lo, rows 8-15 in hi.
template <DType D>
inline void widen(const uint8_t* step, __m256& lo, __m256& hi) {
  if constexpr (D == DType::f32) {
    lo = _mm256_loadu_ps(reinterpret_cast<const float*>(step));
    hi = _mm256_loadu_ps(reinterpret_cast<const float*>(step) + kHalfPanel);
  } else if constexpr (D == DType::bf16) {
    // A bf16 is the top half of the f32 of the same value.
    const __m256i a =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(step)));
    const __m256i b =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(step + 16)));
    lo = _mm256_castsi256_ps(_mm256_slli_epi32(a, 16));
    hi = _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));
  } else {
    static_assert(D == DType::f16, "e4m3 and int4 panels have kernels of their own");
    lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(step)));
    hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(step + 16)));
  }
}

constexpr int64_t kCacheLine = 64;

// One panel times M rows. U independent accumulator pairs per row keep enough FMA chains in
// flight when M is small.
template <DType D, int M, int U>
void panel_kernel(const PanelMatrix& w, int64_t p, const StreamRows& rows, float* y, int64_t ldy) {
  const int64_t K = w.k;
  const int64_t stride = w.step_bytes();
  const uint8_t* panel = w.panel(p);
  __m256 lo_acc[M][U], hi_acc[M][U];
#pragma GCC unroll 8
  for (int r = 0; r < M; ++r) {
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) lo_acc[r][u] = hi_acc[r][u] = _mm256_setzero_ps();
  }
  const StreamPrefetch ahead = M <= 2 ? rows.prefetch : StreamPrefetch{};
  int64_t k = 0;
  for (; k + U <= K; k += U) {
    for (int64_t line = 0; line < U * stride; line += kCacheLine) {
      prefetch_ahead(panel + k * stride + line, ahead);
    }
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      __m256 lo, hi;
      widen<D>(panel + (k + u) * stride, lo, hi);
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r) {
        const __m256 x = _mm256_broadcast_ss(rows.x[r] + k + u);
        lo_acc[r][u] = _mm256_fmadd_ps(lo, x, lo_acc[r][u]);
        hi_acc[r][u] = _mm256_fmadd_ps(hi, x, hi_acc[r][u]);
      }
    }
  }
  for (; k < K; ++k) {
    __m256 lo, hi;
    widen<D>(panel + k * stride, lo, hi);
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) {
      const __m256 x = _mm256_broadcast_ss(rows.x[r] + k);
      lo_acc[r][0] = _mm256_fmadd_ps(lo, x, lo_acc[r][0]);
      hi_acc[r][0] = _mm256_fmadd_ps(hi, x, hi_acc[r][0]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < M; ++r) {
    __m256 lo = lo_acc[r][0], hi = hi_acc[r][0];
#pragma GCC unroll 4
    for (int u = 1; u < U; ++u) {
      lo = _mm256_add_ps(lo, lo_acc[r][u]);
      hi = _mm256_add_ps(hi, hi_acc[r][u]);
    }
    _mm256_storeu_ps(y + r * ldy, lo);
    _mm256_storeu_ps(y + r * ldy + kHalfPanel, hi);
  }
}

// The e4m3 kernels. An in-lane byte shuffle puts a code at the top of each 32-bit lane, and an
// arithmetic shift right by 4 and a mask leave the code's sign in f32 bit 31 and its exponent
// and mantissa in bits 20-26: the f32 of the code's value times 2^-120, subnormal codes on f32
// subnormals of the same mantissa. Three instructions per eight codes and no F16C: on Zen 2
// vcvtph2ps takes 1.5 cycles per eight values, which held the F16C route (seven instructions and
// two conversions per step) at 12 GB/s of codes per core in cache (docs/PERFORMANCE.md, session
// 17). The rows come expanded (E4m3Rows) and carry 2^s, so that the products are normal floats.
//
// The low 128-bit lane's four 32-bit lanes take bytes first_low..first_low + 3 of it, the high
// lane's bytes first_high..first_high + 3 of it.
inline __m256 e4m3_lanes(__m256i codes, int first_low, int first_high) {
  // Byte 3 of each 32-bit lane takes its code; bytes 0-2 (0x80) are zeroed.
  const auto lane = [](int byte) {
    return static_cast<int>((static_cast<uint32_t>(byte) << 24) | 0x808080u);
  };
  const __m256i order = _mm256_setr_epi32(
      lane(first_low), lane(first_low + 1), lane(first_low + 2), lane(first_low + 3),
      lane(first_high), lane(first_high + 1), lane(first_high + 2), lane(first_high + 3));
  const __m256i top = _mm256_shuffle_epi8(codes, order);
  return _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(top, 4),
                                              _mm256_set1_epi32(static_cast<int>(0x87F00000u))));
}

// One or two rows: one 32-byte load holds two panel steps, k in its low 128-bit lane and k + 1 in
// its high one, and each shuffle takes four rows of both (rows 4q..4q+3 into acc[r][q]); an
// expanded row gives the vector of x[k] (low lane) and x[k + 1] (high lane) in one load. In
// cache, one core of the Zen 2 VM: 17 GB/s of codes against the F16C route's 12.
template <int M>
inline void e4m3_pair(__m256i codes, const __m256 (&x)[M], __m256 (&acc)[M][4]) {
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    const __m256 v = e4m3_lanes(codes, 4 * q, 4 * q);
#pragma GCC unroll 2
    for (int r = 0; r < M; ++r) acc[r][q] = _mm256_fmadd_ps(v, x[r], acc[r][q]);
  }
}

// M rows (1 or 2: their sixteen accumulators fill AVX2's registers) times one panel. One row
// keeps a second set of accumulators for every other pair, so that eight FMA chains are in
// flight.
template <int M>
void e4m3_panel(const PanelMatrix& w, int64_t p, const E4m3Rows& rows, float* y, int64_t ldy) {
  constexpr int kSets = M == 1 ? 2 : 1;
  constexpr int64_t kStep = kPanelRows;  // bytes per panel step
  const uint8_t* panel = w.panel(p);
  const float* x[M];
  for (int r = 0; r < M; ++r) x[r] = rows.x[r];
  const auto pair_at = [&](int64_t k) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + k * kStep));
  };
  const auto rows_at = [&](int64_t k, __m256(&v)[M]) {
    for (int r = 0; r < M; ++r) v[r] = _mm256_loadu_ps(x[r] + 4 * k);
  };
  __m256 out_lo[M], out_hi[M];
  for (int r = 0; r < M; ++r) out_lo[r] = out_hi[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < w.scale_steps(); ++g) {
    const int64_t k0 = g * w.group_k;
    const int64_t k1 = std::min(w.k, k0 + w.group_k);
    __m256 acc[kSets][M][4];
#pragma GCC unroll 16
    for (int i = 0; i < kSets * M * 4; ++i)
      acc[i / (4 * M)][i / 4 % M][i % 4] = _mm256_setzero_ps();
    int64_t k = k0;
    __m256 v[M];
    if (k % 2 != 0) {
      // A step that starts at an odd k: its pair's low lane belongs to the step before.
      rows_at(k - 1, v);
      for (int r = 0; r < M; ++r) v[r] = _mm256_blend_ps(v[r], _mm256_setzero_ps(), 0x0F);
      e4m3_pair<M>(pair_at(k - 1), v, acc[0]);
      ++k;
    }
    for (; k + 4 <= k1; k += 4) {
      _mm_prefetch(reinterpret_cast<const char*>(panel + k * kStep + kStreamPrefetchBytes),
                   _MM_HINT_T0);
      rows_at(k, v);
      e4m3_pair<M>(pair_at(k), v, acc[0]);
      rows_at(k + 2, v);
      e4m3_pair<M>(pair_at(k + 2), v, acc[kSets - 1]);
    }
    for (; k + 2 <= k1; k += 2) {
      rows_at(k, v);
      e4m3_pair<M>(pair_at(k), v, acc[0]);
    }
    if (k < k1) {
      // The last step alone: its high lane's x is zero, and its codes are not read past it.
      rows_at(k, v);
      for (int r = 0; r < M; ++r) v[r] = _mm256_blend_ps(v[r], _mm256_setzero_ps(), 0xF0);
      const __m256i codes = _mm256_zextsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(panel + k * kStep)));
      e4m3_pair<M>(codes, v, acc[0]);
    }
    // The step's scales, with each row's unit.
    const float* scale = w.panel_scale(p) + g * kPanelRows;
    const __m256 scale_lo = _mm256_loadu_ps(scale), scale_hi = _mm256_loadu_ps(scale + kHalfPanel);
#pragma GCC unroll 2
    for (int r = 0; r < M; ++r) {
      __m256 a[4];
      for (int q = 0; q < 4; ++q) {
        a[q] = kSets == 2 ? _mm256_add_ps(acc[0][r][q], acc[kSets - 1][r][q]) : acc[0][r][q];
      }
      // Each accumulator holds four rows of step k in its low lane and of k + 1 in its high:
      // rows 0-7 are the low lanes of a[0] and a[1] plus their high lanes.
      const __m256 lo = _mm256_add_ps(_mm256_permute2f128_ps(a[0], a[1], 0x20),
                                      _mm256_permute2f128_ps(a[0], a[1], 0x31));
      const __m256 hi = _mm256_add_ps(_mm256_permute2f128_ps(a[2], a[3], 0x20),
                                      _mm256_permute2f128_ps(a[2], a[3], 0x31));
      const __m256 unit = _mm256_set1_ps(rows.unit[r]);
      out_lo[r] = _mm256_fmadd_ps(_mm256_mul_ps(scale_lo, unit), lo, out_lo[r]);
      out_hi[r] = _mm256_fmadd_ps(_mm256_mul_ps(scale_hi, unit), hi, out_hi[r]);
    }
  }
  for (int r = 0; r < M; ++r) {
    _mm256_storeu_ps(y + r * ldy, out_lo[r]);
    _mm256_storeu_ps(y + r * ldy + kHalfPanel, out_hi[r]);
  }
}

// Three or four rows, where the pairs' two accumulators per row and four rows of a panel would
// take more than AVX2's sixteen registers: a panel step's 16 codes loaded into both 128-bit lanes,
// rows 0-7 and 8-15 each in one shuffle of them, one step at a time against x[k] of each row
// (element 4k of its expanded form). A single pass over the panel, where two passes of the pair
// kernel widened every code twice: four rows of a Mixtral-8x7B-shaped layer (fp8-block, T = 16)
// took 0.83x of that time (docs/PERFORMANCE.md, session 17).
template <int M>
void e4m3_step_panel(const PanelMatrix& w, int64_t p, const E4m3Rows& rows, float* y, int64_t ldy) {
  constexpr int64_t kStep = kPanelRows;  // bytes per panel step
  const uint8_t* panel = w.panel(p);
  __m256 out_lo[M], out_hi[M];
  for (int r = 0; r < M; ++r) out_lo[r] = out_hi[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < w.scale_steps(); ++g) {
    const int64_t k0 = g * w.group_k;
    const int64_t k1 = std::min(w.k, k0 + w.group_k);
    __m256 lo_acc[M], hi_acc[M];
    for (int r = 0; r < M; ++r) lo_acc[r] = hi_acc[r] = _mm256_setzero_ps();
    for (int64_t k = k0; k < k1; ++k) {
      if (k % 4 == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(panel + k * kStep + kStreamPrefetchBytes),
                     _MM_HINT_T0);
      }
      const __m256i step = _mm256_broadcastsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(panel + k * kStep)));
      const __m256 lo = e4m3_lanes(step, 0, 4);
      const __m256 hi = e4m3_lanes(step, kHalfPanel, kHalfPanel + 4);
#pragma GCC unroll 4
      for (int r = 0; r < M; ++r) {
        const __m256 x = _mm256_broadcast_ss(rows.x[r] + 4 * k);
        lo_acc[r] = _mm256_fmadd_ps(lo, x, lo_acc[r]);
        hi_acc[r] = _mm256_fmadd_ps(hi, x, hi_acc[r]);
      }
    }
    const float* scale = w.panel_scale(p) + g * kPanelRows;
    const __m256 scale_lo = _mm256_loadu_ps(scale), scale_hi = _mm256_loadu_ps(scale + kHalfPanel);
#pragma GCC unroll 4
    for (int r = 0; r < M; ++r) {
      const __m256 unit = _mm256_set1_ps(rows.unit[r]);
      out_lo[r] = _mm256_fmadd_ps(_mm256_mul_ps(scale_lo, unit), lo_acc[r], out_lo[r]);
      out_hi[r] = _mm256_fmadd_ps(_mm256_mul_ps(scale_hi, unit), hi_acc[r], out_hi[r]);
    }
  }
  for (int r = 0; r < M; ++r) {
    _mm256_storeu_ps(y + r * ldy, out_lo[r]);
    _mm256_storeu_ps(y + r * ldy + kHalfPanel, out_hi[r]);
  }
}

// The int4 kernels run over whole k pairs (K and the groups are even) and, where they can,
// whole blocks of 4 k (one 32-byte load, int4_avx2.hpp).
template <typename Pair>
inline void for_int4_pairs(const uint8_t* panel, int64_t k0, int64_t k1, Pair pair) {
  int64_t k = k0;
  if (k % kInt4BlockK != 0 && k < k1) {
    pair(int4_pair<1>(load_int4_block(panel, k)), k);
    k += 2;
  }
  for (; k + kInt4BlockK <= k1; k += kInt4BlockK) {
    _mm_prefetch(reinterpret_cast<const char*>(panel + k / kInt4BlockK * kInt4BlockBytes +
                                               kStreamPrefetchBytes),
                 _MM_HINT_T0);
    const __m256i block = load_int4_block(panel, k);
    pair(int4_pair<0>(block), k);
    pair(int4_pair<1>(block), k + 2);
  }
  if (k < k1) pair(int4_pair<0>(load_int4_block(panel, k)), k);
}

// int4 times f32 rows: each pair's codes are widened to f32 and multiplied into every row; the
// step's offset (through the row's step sum) and scale are applied once per row per step. One
// row keeps the pair's two k in separate sums, for enough FMA chains in flight.
template <int M>
void int4_panel(const PanelMatrix& w, int64_t p, const StreamRows& rows, float* y, int64_t ldy) {
  constexpr int kSets = M == 1 ? 2 : 1;
  const uint8_t* panel = w.panel(p);
  __m256 out_lo[M], out_hi[M];
  for (int r = 0; r < M; ++r) out_lo[r] = out_hi[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < w.scale_steps(); ++g) {
    const int64_t k0 = g * w.group_k;
    const int64_t k1 = std::min(w.k, k0 + w.group_k);
    __m256 lo[kSets][M], hi[kSets][M];
#pragma GCC unroll 8
    for (int i = 0; i < kSets * M; ++i) {
      lo[i / M][i % M] = hi[i / M][i % M] = _mm256_setzero_ps();
    }
    for_int4_pairs(panel, k0, k1, [&](const Int4Pair& codes, int64_t k) {
      const Int4PairF32 v = widen_int4_pair(codes);
#pragma GCC unroll 4
      for (int r = 0; r < M; ++r) {
        const __m256 x0 = _mm256_broadcast_ss(rows.x[r] + k);
        const __m256 x1 = _mm256_broadcast_ss(rows.x[r] + k + 1);
        lo[0][r] = _mm256_fmadd_ps(v.low0, x0, lo[0][r]);
        hi[0][r] = _mm256_fmadd_ps(v.high0, x0, hi[0][r]);
        lo[kSets - 1][r] = _mm256_fmadd_ps(v.low1, x1, lo[kSets - 1][r]);
        hi[kSets - 1][r] = _mm256_fmadd_ps(v.high1, x1, hi[kSets - 1][r]);
      }
    });
    const float* scale = w.panel_scale(p) + g * kPanelRows;
    const Int4Offsets offset = int4_offsets(w, p, g);
#pragma GCC unroll 4
    for (int r = 0; r < M; ++r) {
      __m256 l = lo[0][r], h = hi[0][r];
      if constexpr (kSets == 2) {
        l = _mm256_add_ps(l, lo[1][r]);
        h = _mm256_add_ps(h, hi[1][r]);
      }
      const __m256 sum = _mm256_broadcast_ss(rows.x_sums[r] + g);
      l = _mm256_fnmadd_ps(offset.low, sum, l);
      h = _mm256_fnmadd_ps(offset.high, sum, h);
      out_lo[r] = _mm256_fmadd_ps(_mm256_loadu_ps(scale), l, out_lo[r]);
      out_hi[r] = _mm256_fmadd_ps(_mm256_loadu_ps(scale + kHalfPanel), h, out_hi[r]);
    }
  }
  for (int r = 0; r < M; ++r) {
    _mm256_storeu_ps(y + r * ldy, out_lo[r]);
    _mm256_storeu_ps(y + r * ldy + kHalfPanel, out_hi[r]);
  }
}

template <DType D, int M>
void panels_m(const PanelMatrix& w, int64_t p_begin, int64_t p_end, const StreamRows& rows,
              float* y, int64_t ldy) {
  // Enough independent FMA chains (2 * M * U >= 8) to cover the FMA latency.
  constexpr int kUnroll = M == 1 ? 4 : M == 2 ? 2 : 1;
  for (int64_t p = p_begin; p < p_end; ++p) {
    panel_kernel<D, M, kUnroll>(w, p, rows, y + (p - p_begin) * kPanelRows, ldy);
  }
}

template <DType D>
void panels_dtype(const PanelMatrix& w, int64_t p_begin, int64_t p_end, const StreamRows& rows,
                  float* y, int64_t ldy) {
  for_row_count(rows.m, [&]<int M>() {
    if constexpr (D == DType::i4) {
      for (int64_t p = p_begin; p < p_end; ++p) {
        int4_panel<M>(w, p, rows, y + (p - p_begin) * kPanelRows, ldy);
      }
    } else {
      panels_m<D, M>(w, p_begin, p_end, rows, y, ldy);
    }
  });
}

}  // namespace

void stream_panels(const PanelMatrix& w, int64_t p_begin, int64_t p_end, const StreamRows& rows,
                   float* y, int64_t ldy) {
  switch (w.dtype) {
    case DType::f32:
      return panels_dtype<DType::f32>(w, p_begin, p_end, rows, y, ldy);
    case DType::bf16:
      return panels_dtype<DType::bf16>(w, p_begin, p_end, rows, y, ldy);
    case DType::f16:
      return panels_dtype<DType::f16>(w, p_begin, p_end, rows, y, ldy);
    case DType::f8e4m3:
      return stream_panels_e4m3_avx512(w, p_begin, p_end, rows, y, ldy);
    case DType::i4:
      return panels_dtype<DType::i4>(w, p_begin, p_end, rows, y, ldy);
    default:
      fail(Errc::internal, "panel16 holds no {} weights", dtype_name(w.dtype));
  }
}

void stream_panels_e4m3(const PanelMatrix& w, int64_t p_begin, int64_t p_end, const E4m3Rows& rows,
                        float* y, int64_t ldy) {
  if (w.dtype != DType::f8e4m3 || w.group_k < 1 || w.scale == nullptr) {
    fail(Errc::internal, "the e4m3 streaming kernel needs e4m3 panels with scales, got {}",
         dtype_name(w.dtype));
  }
  if (rows.m < 1 || rows.m > kStreamRows) {
    fail(Errc::internal, "the streaming kernels serve 1 to {} rows, got {}", kStreamRows, rows.m);
  }
  for (int64_t p = p_begin; p < p_end; ++p) {
    float* panel_y = y + (p - p_begin) * kPanelRows;
    switch (rows.m) {
      case 1:
        e4m3_panel<1>(w, p, rows, panel_y, ldy);
        break;
      case 2:
        e4m3_panel<2>(w, p, rows, panel_y, ldy);
        break;
      case 3:
        e4m3_step_panel<3>(w, p, rows, panel_y, ldy);
        break;
      default:
        e4m3_step_panel<4>(w, p, rows, panel_y, ldy);
        break;
    }
  }
}

void step_sums(const float* x, int64_t k, int64_t group_k, float* sums) {
  for (int64_t g = 0, k0 = 0; k0 < k; ++g, k0 += group_k) {
    const int64_t k1 = std::min(k, k0 + group_k);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = k0;
    for (; i + 8 <= k1; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + i));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc);
    float sum = 0.0f;
    for (float lane : lanes) sum += lane;
    for (; i < k1; ++i) sum += x[i];
    sums[g] = sum;
  }
}

namespace {

// The integer streaming kernels' arguments: int4 weights in whole blocks per scale step of at
// most `longest`, 1 to kStreamRows rows. Whether the CPU has the instructions is the plan's
// (CpuKernels); MoeLayer refuses a plan made for a CPU with more than this one.
void check_integer_stream(const char* kernel, const PanelMatrix& w, int rows, int64_t longest) {
  if (w.dtype != DType::i4 || w.k % kInt4BlockK != 0 || w.group_k % kInt4BlockK != 0 ||
      w.group_k > longest) {
    fail(Errc::internal,
         "{} needs int4 weights in whole blocks per step of at most {} (got {} with K {}, group "
         "{})",
         kernel, longest, dtype_name(w.dtype), w.k, w.group_k);
  }
  if (rows < 1 || rows > kStreamRows) {
    fail(Errc::internal, "the streaming kernels serve 1 to {} rows, got {}", kStreamRows, rows);
  }
}

// The largest magnitude of x [k0, k1), and whether all of it is finite.
struct GroupRange {
  float amax;
  bool finite;
};
GroupRange group_range(const float* x, int64_t k0, int64_t k1) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 top = _mm256_setzero_ps();
  __m256 nonfinite = _mm256_setzero_ps();  // x * 0 summed: NaN where any x is NaN or infinite
  int64_t i = k0;
  for (; i + 8 <= k1; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    top = _mm256_max_ps(top, _mm256_andnot_ps(sign, v));
    nonfinite = _mm256_add_ps(nonfinite, _mm256_mul_ps(v, _mm256_setzero_ps()));
  }
  alignas(32) float lanes[8], checks[8];
  _mm256_store_ps(lanes, top);
  _mm256_store_ps(checks, nonfinite);
  GroupRange range{0.0f, true};
  for (int j = 0; j < 8; ++j) {
    range.amax = std::max(range.amax, lanes[j]);
    range.finite = range.finite && checks[j] == 0.0f;
  }
  for (; i < k1; ++i) {
    range.amax = std::max(range.amax, std::fabs(x[i]));
    range.finite = range.finite && std::isfinite(x[i]);
  }
  return range;
}

}  // namespace

float expand_e4m3_row(const float* x, int64_t k, float* expanded) {
  // 2^112 unless the row's largest value would pass 2^126 with it: then as much as keeps it
  // under, and the products of the largest values stay normal floats either way.
  constexpr int kShift = 112;
  const GroupRange range = group_range(x, 0, k);
  const int s = range.finite && range.amax >= 0x1p14f ? 125 - std::ilogb(range.amax) : kShift;
  const __m256 factor = _mm256_set1_ps(std::ldexp(1.0f, s));
  // Value i to floats 4i..4i+3.
  const __m256i first_two = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  const __m256i two = _mm256_set1_epi32(2);
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), factor);
    __m256i pick = first_two;
    for (int q = 0; q < 4; ++q, pick = _mm256_add_epi32(pick, two)) {
      _mm256_storeu_ps(expanded + 4 * (i + 2 * q), _mm256_permutevar8x32_ps(v, pick));
    }
  }
  for (; i < k; ++i) _mm_storeu_ps(expanded + 4 * i, _mm_set1_ps(x[i] * std::ldexp(1.0f, s)));
  if (k % 2 != 0) _mm_storeu_ps(expanded + 4 * k, _mm_setzero_ps());
  return std::ldexp(1.0f, 120 - s);
}

namespace {

// x / scale rounded to nearest even and saturated to +-127, as int8_code (activation_quant.hpp).
// Divided, not multiplied by an inverse, to round exactly as the format does.
inline __m256 int8_codes(__m256 x, __m256 scale) {
  const __m256 limit = _mm256_set1_ps(kInt8Max);
  const __m256 rounded =
      _mm256_round_ps(_mm256_div_ps(x, scale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm256_max_ps(_mm256_min_ps(rounded, limit), _mm256_sub_ps(_mm256_setzero_ps(), limit));
}

inline float int8_scale(float amax) {
  return std::max(amax, kActivationAmaxFloor) / kInt8Max;
}

}  // namespace

void stream_panels_int16(const PanelMatrix& w, int64_t p_begin, int64_t p_end,
                         const Int16Rows& rows, float* y, int64_t ldy, Int16Dot dot) {
  check_integer_stream("stream_panels_int16", w, rows.m, kInt16MaxStep);
  if (dot == Int16Dot::pmaddwd) return stream_int16<MaddDot>(w, p_begin, p_end, rows, y, ldy);
  stream_panels_int16_vnni(w, p_begin, p_end, rows, y, ldy);
}

void stream_panels_int8(const PanelMatrix& w, int64_t p_begin, int64_t p_end, const Int8Rows& rows,
                        float* y, int64_t ldy, Int8Dot dot) {
  check_integer_stream("stream_panels_int8", w, rows.m, kInt8MaxStep);
  if (dot == Int8Dot::maddubs) return stream_int8<MaddubsDot>(w, p_begin, p_end, rows, y, ldy);
  stream_panels_int8_vnni(w, p_begin, p_end, rows, y, ldy);
}

void round_to_int8(float* x, int64_t k, int64_t group_k) {
  for (int64_t k0 = 0; k0 < k; k0 += group_k) {
    const int64_t k1 = std::min(k, k0 + group_k);
    const auto [amax, finite] = group_range(x, k0, k1);
    if (!finite) {
      // As from the int8 kernel (quantize_int8), every output the group reaches is NaN.
      std::fill(x + k0, x + k1, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    const float scale = int8_scale(amax);
    const __m256 divisor = _mm256_set1_ps(scale);
    int64_t i = k0;
    for (; i + 8 <= k1; i += 8) {
      _mm256_storeu_ps(x + i, _mm256_mul_ps(int8_codes(_mm256_loadu_ps(x + i), divisor), divisor));
    }
    for (; i < k1; ++i) {
      x[i] = std::clamp(std::nearbyint(x[i] / scale), -kInt8Max, kInt8Max) * scale;
    }
  }
}

void quantize_int8(const float* x, int64_t k, int64_t group_k, int8_t* q, float* scales,
                   float* sums) {
  if (k % kInt4BlockK != 0 || group_k % kInt4BlockK != 0) {
    fail(Errc::internal, "quantize_int8 needs K ({}) and the group ({}) in whole blocks of {}", k,
         group_k, kInt4BlockK);
  }
  // Within each block of 4: k0, k2, k1, k3 (Int8Rows).
  const __m128i order = _mm_setr_epi8(0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15);
  for (int64_t g = 0, k0 = 0; k0 < k; ++g, k0 += group_k) {
    const int64_t k1 = std::min(k, k0 + group_k);
    const auto [amax, finite] = group_range(x, k0, k1);
    if (!finite) {
      scales[g] = std::numeric_limits<float>::quiet_NaN();
      sums[g] = 0.0f;
      std::fill(q + k0, q + k1, int8_t{0});
      continue;
    }
    const float scale = int8_scale(amax);
    const __m256 divisor = _mm256_set1_ps(scale);
    __m256i total = _mm256_setzero_si256();
    int64_t i = k0;
    for (; i + 8 <= k1; i += 8) {
      const __m256i codes = _mm256_cvtps_epi32(int8_codes(_mm256_loadu_ps(x + i), divisor));
      total = _mm256_add_epi32(total, codes);
      const __m128i words =
          _mm_packs_epi32(_mm256_castsi256_si128(codes), _mm256_extracti128_si256(codes, 1));
      const __m128i bytes = _mm_shuffle_epi8(_mm_packs_epi16(words, words), order);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), bytes);
    }
    alignas(32) int32_t parts[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(parts), total);
    int64_t sum = 0;
    for (int32_t part : parts) sum += part;
    // A group of 8 n + 4 ends with one block of 4.
    constexpr int kOrder[kInt4BlockK] = {0, 2, 1, 3};
    for (; i < k1; ++i) {
      const float code = std::clamp(std::nearbyint(x[i] / scale), -kInt8Max, kInt8Max);
      q[i - i % kInt4BlockK + kOrder[i % kInt4BlockK]] = static_cast<int8_t>(code);
      sum += static_cast<int64_t>(code);
    }
    scales[g] = scale;
    sums[g] = static_cast<float>(sum);
  }
}

void quantize_int16(const float* x, int64_t k, int64_t group_k, int16_t* q, float* scales,
                    float* sums) {
  for (int64_t g = 0, k0 = 0; k0 < k; ++g, k0 += group_k) {
    const int64_t k1 = std::min(k, k0 + group_k);
    const auto [amax, finite] = group_range(x, k0, k1);
    if (!finite || amax == 0.0f) {
      // A NaN scale makes every output the row reaches NaN, as f32 arithmetic would.
      scales[g] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
      sums[g] = 0.0f;
      std::fill(q + k0, q + k1, int16_t{0});
      continue;
    }
    const float inverse = kInt16Max / amax;
    const __m256 times = _mm256_set1_ps(inverse);
    __m256i total = _mm256_setzero_si256();
    int64_t i = k0;
    for (; i + 16 <= k1; i += 16) {
      const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), times));
      const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), times));
      total = _mm256_add_epi32(total, _mm256_add_epi32(a, b));
      // packs works within 128-bit lanes; the permute puts a's 8 values before b's.
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), packed);
    }
    alignas(32) int32_t parts[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(parts), total);
    int64_t sum = 0;
    for (int32_t part : parts) sum += part;
    for (; i < k1; ++i) {
      const auto value = static_cast<int16_t>(std::nearbyint(x[i] * inverse));
      q[i] = value;
      sum += value;
    }
    scales[g] = amax / kInt16Max;
    sums[g] = static_cast<float>(sum);
  }
}

}  // namespace moekit::cpu
