#pragma once
// The many-rows GEMM of the cpu core on AVX-512 BF16 dot products (vdpbf16ps, two
// multiply-adds per f32 lane and instruction): activations [m, K] (f32, row-major), each rounded
// to bf16 (to nearest, ties to even, as a model's own bf16 matmuls round them), times a panel16
// weight matrix [N, K]^T, summed in f32. The weights are bf16, or e4m3 or symmetric int4, whose
// values (e4m3 codes, int4 codes less 8) are exact in bf16: they are widened to bf16 once per
// K-block and their scales multiply the f32 sums of each scale group, so the weights mean
// exactly what their format says. The caller chooses it only where the layer's activations are
// bf16 anyway, splits panels across threads (one call is single-threaded), only where the plan's
// CpuKernels::bf16_gemm says the CPU has AVX-512 BF16 and the format suits it.

#include <cstdint>

#include "runner/cpu/panels.hpp"

namespace moekit::cpu {

// Bytes of per-thread scratch gemm_panels_bf16 needs for a K of k (an A block as bf16 and a
// group of repacked panel K-blocks; about 160 KB for K >= 256).
int64_t gemm_bf16_scratch_bytes(int64_t k);

// Whether gemm_panels_bf16 reads weights of this dtype, with or without zero points (int4), in
// scale groups of group_k values of a K of k: bf16; e4m3 and symmetric int4 where a group is
// even or spans the whole row (so that no pair of k straddles two groups); int4 needs an even K.
bool gemm_bf16_reads(DType dtype, bool zero_points, int64_t group_k, int64_t k);

// The scales of GEMM inputs that a format quantises (fp8: e4m3 codes times a scale per row and
// group of columns): row r's values in group g, columns [g * group, (g + 1) * group), are codes
// times scale[r * ld + g]. The GEMM divides them out before rounding to bf16, which leaves the
// e4m3 codes exactly, and multiplies each group's f32 sums by them, so such inputs lose nothing
// to bf16. The groups must be the weights' scale groups (group == w.group_k).
struct InputScales {
  const float* scale = nullptr;  // null: inputs taken as they are
  int64_t ld = 0;
  int64_t group = 0;
};

// c[r * ldc + n] = sum_k bf16(a[r * lda + k]) * w(n, k), r in [0, m), n in [16 * p_begin,
// min(16 * p_end, w.n)), where bf16(x) rounds to nearest even and w(n, k) is the weight as
// panels.hpp defines it. Overwrites those elements of c (n is the absolute row of w) and no
// others. w must be one gemm_bf16_reads accepts. `work` holds gemm_bf16_scratch_bytes(w.k) bytes
// (any alignment) and is clobbered. Throws Errc::invalid_argument for a bad range, stride, dtype
// or scale grid.
// With input scales, bf16(a) is bf16(a / scale) * scale (InputScales).
void gemm_panels_bf16(const float* a, int64_t lda, int64_t m, const PanelMatrix& w, int64_t p_begin,
                      int64_t p_end, float* c, int64_t ldc, void* work,
                      const InputScales& input_scales = {});

// GEMM inputs rounded to bf16 beforehand (round_rows_bf16): row r's K values at data + r * ld,
// then a zero where K is odd. A caller that meets the same rows with many calls (the runner:
// one per chunk of panels) rounds them once instead of once per call.
struct Bf16Rows {
  const bf16_t* data = nullptr;
  int64_t ld = 0;  // values between rows: bf16_rows_ld(K) or more, even
};

// The row stride round_rows_bf16 needs for a K of k: whole 64-byte chunks past K (the rounding
// stores 32 values at a time), plus 32 values so that the rows a tile reads in step do not all
// fall into the same cache sets.
constexpr int64_t bf16_rows_ld(int64_t k) {
  return (k + 1 + 31) / 32 * 32 + 32;
}

// out[r * ld + j] = bf16(a[r * lda + j]) for r in [0, m), j in [0, k), rounded as
// gemm_panels_bf16 rounds its f32 inputs (with input scales the same way too), and
// out[r * ld + k] = 0 where k is odd; values of a row past that may be set to zero. ld >=
// bf16_rows_ld(k). Throws Errc::invalid_argument for a bad count, stride or scale grid.
void round_rows_bf16(const float* a, int64_t lda, int64_t m, int64_t k, bf16_t* out, int64_t ld,
                     const InputScales& input_scales = {});

// gemm_panels_bf16 on rows rounded beforehand: the same products and the same writes. The input
// scales (fp8) are those the rows were rounded with: the sums are multiplied by them.
void gemm_panels_bf16(const Bf16Rows& a, int64_t m, const PanelMatrix& w, int64_t p_begin,
                      int64_t p_end, float* c, int64_t ldc, void* work,
                      const InputScales& input_scales = {});

namespace bf16_gemm {

// Blocking shared by the scratch size and the kernel (gemm_avx512bf16.cpp says why these).
inline constexpr int64_t kBlockM = 256;
inline constexpr int64_t kBlockK = 256;  // even, so only the last K-block has an odd length
inline constexpr int64_t kGroupPanels = 2;

// uint32 (bf16 pairs) between the rows of a packed A block whose K-block has kc values.
constexpr int64_t a_stride_pairs(int64_t kc) {
  // Whole 64-byte chunks, which the packer stores, plus one more so that the rows of a tile,
  // read in step, do not all fall into the same cache sets.
  return ((kc + 1) / 2 + 15) / 16 * 16 + 16;
}

// The values of k of the K-block that starts at k0: at most kBlockK, and for weights with
// scales (group_k > 0) either whole groups or a part of one group, so that the scales of a
// K-block change only where a group ends.
constexpr int64_t block_k(int64_t k, int64_t group_k, int64_t k0) {
  const int64_t left = k - k0;
  int64_t kc = kBlockK;
  if (group_k > 0 && group_k <= kBlockK) kc = kBlockK / group_k * group_k;
  if (group_k > kBlockK && (k0 / group_k + 1) * group_k - k0 < kc) {
    kc = (k0 / group_k + 1) * group_k - k0;
  }
  return left < kc ? left : kc;
}

// How the kernel widens a panel's stored values to bf16.
enum class Widen : uint8_t { bf16, e4m3, int4 };

// A panel16 matrix as the kernel reads it: plain fields, so that the AVX-512 file calls no
// inline function of panels.hpp (the linker could keep its AVX-512 copy for other callers).
struct Weights {
  Widen widen = Widen::bf16;
  const uint8_t* data = nullptr;  // panel p at data + p * panel_bytes
  int64_t n = 0;
  int64_t k = 0;
  int64_t panel_bytes = 0;
  int64_t group_k = 0;           // values of k per scale step; 0 for bf16 (no scales)
  int64_t scale_steps = 0;       // per panel
  const float* scale = nullptr;  // [panels][scale_steps][16]
};

// The GEMM's inputs: f32 rows that the kernel rounds K-block by K-block (a, lda), or, where
// `rounded` is set, rows rounded beforehand (Bf16Rows) that it reads as they are.
struct Source {
  const float* a = nullptr;
  int64_t lda = 0;
  const bf16_t* rounded = nullptr;
  int64_t rounded_ld = 0;
};

// The kernels without the checks: the arguments are valid, m > 0, p_begin < p_end and the CPU
// has AVX-512 BF16. Kept apart so that the checks, their messages and the CPU probe are compiled
// without AVX-512 (and so run on any CPU).
void gemm_unchecked(const Source& a, int64_t m, const Weights& w, int64_t p_begin, int64_t p_end,
                    float* c, int64_t ldc, void* work, const InputScales& input);
void round_unchecked(const float* a, int64_t lda, int64_t m, int64_t k, bf16_t* out, int64_t ld,
                     const InputScales& input);

}  // namespace bf16_gemm

}  // namespace moekit::cpu
