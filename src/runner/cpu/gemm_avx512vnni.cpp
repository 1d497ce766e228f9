// gemm_panels_int8's kernel: a register-blocked GEMM of int8 rows and panel16 int4 weights on
// vpdpbusd.
//
// Byte 2 l + b of an int4 block holds row l / 2 at k = 2 b + l % 2 in its low nibble and row
// l / 2 + 8 in its high one (panels.hpp, stream_int8.hpp), so a block broadcast to both halves
// of a zmm, shifted right by 0 in the low half and 4 in the high one and masked, has in 32-bit
// lane j row j's four codes in the order k0, k2, k1, k3: the order quantize_int8 stores a row's
// codes in. Each panel K-block is widened that way once per call, into `work`, by the first row
// tile as it goes (as in gemm_avx512bf16.cpp); the other tiles read the copy. Each vpdpbusd reads
// its row's four codes itself (an embedded broadcast). A tile is up to 8 rows times 2 panels: 16
// zmm int32 sums over one scale group (at most 256 values of k, 64 steps: no sum can wrap),
// finished per group in f32 as the int8 streaming kernel does:
// (sum - offset * sum of the row's codes) * weight scale * row scale.

#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "runner/cpu/gemm_int8.hpp"

// CMake compiles this file for AVX-512 F, VL and VNNI (see src/CMakeLists.txt). Some intrinsics
// are the maskz forms with every lane set: g++ 12's plain ones warn of an undefined source.
#define MOEKIT_VNNI_INLINE __attribute__((always_inline)) inline

namespace moekit::cpu::int8_gemm {
namespace {

constexpr int kTileRows = 8;
constexpr int kP = static_cast<int>(kGroupPanels);
constexpr int64_t kStep = 16;  // rows per panel

// This file avoids std templates: an inline function instantiated here is compiled for
// AVX-512, and the linker may keep this copy for callers on any CPU.
constexpr int64_t min64(int64_t x, int64_t y) {
  return x < y ? x : y;
}

struct TileOut {
  float* c;  // row 0, column 0 of panel 0 of the tile
  int64_t ldc;
  int64_t last_cols;  // valid columns (1 to 16) of the tile's last panel; the others have 16
  bool accumulate;    // add to what earlier K-blocks wrote
};

struct TileIn {
  const int8_t* a;       // the tile's row 0 at the K-block's first k
  int64_t lda;           // bytes between rows
  const float* a_scale;  // row 0's scale of the K-block's first group; rows `steps` apart
  const float* a_sums;   // and its sum of codes
  int64_t steps;
  const uint8_t* raw[kP];   // packing tile: each panel's first int4 block of the K-block
  const char* ahead[kP];    // packing tile: the blocks the next group packs
  __m512i* packed;          // the widened K-block: [steps][P]
  int64_t blocks;           // int4 blocks (4 k) in the K-block
  int64_t group_blocks;     // and per scale group
  const float* scale[kP];   // weight scales of the K-block's first group, per panel
  const float* offset[kP];  // and offsets; null: 8
};

// acc + the four-byte dot products of w's unsigned codes with the four signed bytes at `at`, in
// every lane (embedded broadcast).
MOEKIT_VNNI_INLINE __m512i dot_broadcast(__m512i acc, __m512i w, const int8_t* at) {
  __asm__("vpdpbusd %[x]%{1to16%}, %[w], %[acc]"
          : [acc] "+v"(acc)
          : [w] "v"(w), [x] "m"(*reinterpret_cast<const int32_t*>(at)));
  return acc;
}

template <int R, int P, bool kPack>
void tile(const TileIn& in, const TileOut& out) {
  // vpdpbusd has a latency of about 5 cycles; fewer than 8 sums keep a second set.
  constexpr int kSets = R * P < 8 ? 2 : 1;
  __m512i acc[kSets][R][P];
  __m512i shift = _mm512_setzero_si512();
  __m512i nibbles = _mm512_setzero_si512();
  if constexpr (kPack) {
    shift = _mm512_mask_set1_epi32(_mm512_setzero_si512(), 0xFF00, 4);
    nibbles = _mm512_set1_epi32(0x0F0F0F0F);
  }

  const auto step = [&](int64_t b, int set) __attribute__((always_inline)) {
    __m512i w[P];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      if constexpr (kPack) {
        _mm_prefetch(in.ahead[p] + b * kInt4BlockBytes, _MM_HINT_T1);
        const __m256i block =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in.raw[p] + b * kInt4BlockBytes));
        const __m512i both = _mm512_maskz_broadcast_i64x4(0xFF, block);
        w[p] = _mm512_and_si512(_mm512_maskz_srlv_epi32(0xFFFF, both, shift), nibbles);
        _mm512_store_si512(in.packed + b * P + p, w[p]);
      } else {
        w[p] = _mm512_load_si512(in.packed + b * P + p);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const int8_t* x = in.a + r * in.lda + b * kInt4BlockK;
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) acc[set][r][p] = dot_broadcast(acc[set][r][p], w[p], x);
    }
  };

  const auto finish = [&](int64_t group, bool add) __attribute__((always_inline)) {
    __m512 scale[P];
    __m512 offset[P];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      scale[p] = _mm512_loadu_ps(in.scale[p] + group * kStep);
      offset[p] = in.offset[p] == nullptr ? _mm512_set1_ps(kSymmetricOffset)
                                          : _mm512_loadu_ps(in.offset[p] + group * kStep);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 row_scale = _mm512_set1_ps(in.a_scale[r * in.steps + group]);
      const __m512 row_sum = _mm512_set1_ps(in.a_sums[r * in.steps + group]);
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) {
        __m512i sum = acc[0][r][p];
        if constexpr (kSets == 2) sum = _mm512_add_epi32(sum, acc[1][r][p]);
        // Both terms are integers below 2^24, so the difference is exact in f32.
        const __m512 exact =
            _mm512_fnmadd_ps(offset[p], row_sum, _mm512_maskz_cvtepi32_ps(0xFFFF, sum));
        float* dst = out.c + r * out.ldc + p * kStep;
        const bool whole = p < P - 1 || out.last_cols == kStep;
        const auto cols = static_cast<__mmask16>(whole ? 0xFFFF : (1u << out.last_cols) - 1);
        const __m512 before = add ? _mm512_maskz_loadu_ps(cols, dst) : _mm512_setzero_ps();
        const __m512 v = _mm512_fmadd_ps(exact, _mm512_mul_ps(scale[p], row_scale), before);
        if (whole) {
          _mm512_storeu_ps(dst, v);
        } else {
          _mm512_mask_storeu_ps(dst, cols, v);
        }
      }
    }
  };

  int64_t b = 0;
  for (int64_t group = 0; b < in.blocks; ++group) {
#pragma GCC unroll 32
    for (int i = 0; i < kSets * R * P; ++i) {
      acc[i / (R * P)][i / P % R][i % P] = _mm512_setzero_si512();
    }
    const int64_t end = min64(in.blocks, b + in.group_blocks);
    for (; b + kSets <= end; b += kSets) {
#pragma GCC unroll 2
      for (int s = 0; s < kSets; ++s) step(b + s, s);
    }
    for (; b < end; ++b) step(b, 0);
    finish(group, out.accumulate || group > 0);
  }
}

using TileFn = void (*)(const TileIn&, const TileOut&);

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

// The first int4 block that the packing tile of the group after (g, k0) reads: as in
// gemm_avx512bf16.cpp, the next group of the range, else the range's first in the next K-block,
// else the panels after the range at k = 0.
const char* next_group(const Weights& w, int64_t g, int64_t k0, int64_t kc, int64_t p_begin,
                       int64_t p_end, int p) {
  const int64_t panels = (w.n + kStep - 1) / kStep;
  int64_t panel = p_end < panels ? p_end : p_begin;
  int64_t k = 0;
  if (g + kP < p_end) {
    panel = g + kP;
    k = k0;
  } else if (k0 + kc < w.k) {
    panel = p_begin;
    k = k0 + kc;
  }
  return reinterpret_cast<const char*>(w.data + min64(panel + p, panels - 1) * w.panel_bytes +
                                       k / kInt4BlockK * kInt4BlockBytes);
}

}  // namespace

void gemm_unchecked(const Int8Matrix& a, int64_t m, const Weights& w, int64_t p_begin,
                    int64_t p_end, float* c, int64_t ldc, void* work) {
  auto* const group = reinterpret_cast<__m512i*>((reinterpret_cast<uintptr_t>(work) + 63) &
                                                 ~static_cast<uintptr_t>(63));
  // K-blocks of whole groups (at most kBlockK values; gemm_int8_reads).
  const int64_t block_k = kBlockK / w.group_k * w.group_k;
  const int64_t tiles = (m + kTileRows - 1) / kTileRows;
  const int64_t base_rows = m / tiles;
  const int64_t longer = m % tiles;
  for (int64_t k0 = 0; k0 < w.k; k0 += block_k) {
    const int64_t kc = min64(block_k, w.k - k0);
    const int64_t g0 = k0 / w.group_k;
    for (int64_t g = p_begin; g < p_end; g += kP) {
      const int np = static_cast<int>(min64(kP, p_end - g));
      TileIn in{};
      in.lda = a.ldq;
      in.steps = a.steps;
      in.packed = group;
      in.blocks = kc / kInt4BlockK;
      in.group_blocks = w.group_k / kInt4BlockK;
      for (int p = 0; p < kP; ++p) {
        in.ahead[p] = next_group(w, g, k0, kc, p_begin, p_end, p);
        if (p >= np) continue;
        in.raw[p] = w.data + (g + p) * w.panel_bytes + k0 / kInt4BlockK * kInt4BlockBytes;
        const int64_t at = ((g + p) * w.scale_steps + g0) * kStep;
        in.scale[p] = w.scale + at;
        in.offset[p] = w.offset == nullptr ? nullptr : w.offset + at;
      }
      TileOut out{};
      out.ldc = ldc;
      out.last_cols = min64(kStep, w.n - (g + np - 1) * kStep);
      out.accumulate = k0 > 0;
      int64_t row = 0;
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t r = base_rows + (t < longer ? 1 : 0);
        in.a = a.q + row * a.ldq + k0;
        in.a_scale = a.scale + row * a.steps + g0;
        in.a_sums = a.sums + row * a.steps + g0;
        out.c = c + row * ldc + g * kStep;
        kTiles.fn[t == 0][r - 1][np - 1](in, out);
        row += r;
      }
    }
  }
}

}  // namespace moekit::cpu::int8_gemm
