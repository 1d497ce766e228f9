#pragma once
// The many-rows GEMM of the cpu core for bf16 weights on AVX-512 BF16 dot products (vdpbf16ps,
// two multiply-adds per f32 lane and instruction): activations [m, K] (f32, row-major), each
// rounded to bf16 (to nearest, ties to even, as a model's own bf16 matmuls round them), times a
// panel16 bf16 weight matrix [N, K]^T, summed in f32. The caller chooses it only where the
// layer's activations are bf16 anyway, splits panels across threads (one call is
// single-threaded), only where the plan's CpuKernels::bf16_gemm says the CPU has AVX-512 BF16.

#include <cstdint>

#include "runner/cpu/panels.hpp"

namespace moekit::cpu {

// Bytes of per-thread scratch gemm_panels_bf16 needs for a K of k (an A block as bf16 and a
// group of repacked panel K-blocks; about 160 KB for K >= 256).
int64_t gemm_bf16_scratch_bytes(int64_t k);

// c[r * ldc + n] = sum_k bf16(a[r * lda + k]) * w(n, k), r in [0, m), n in [16 * p_begin,
// min(16 * p_end, w.n)), where bf16(x) rounds to nearest even. Overwrites those elements of c
// (n is the absolute row of w) and no others. w.dtype must be bf16. `work` holds
// gemm_bf16_scratch_bytes(w.k) bytes (any alignment) and is clobbered. Throws
// Errc::invalid_argument for a bad range, stride or dtype.
void gemm_panels_bf16(const float* a, int64_t lda, int64_t m, const PanelMatrix& w, int64_t p_begin,
                      int64_t p_end, float* c, int64_t ldc, void* work);

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

// The kernel without the checks: the arguments are valid, m > 0, p_begin < p_end and the CPU
// has AVX-512 BF16. `panels` is w.data as bf16, n and k w's. Kept apart so that the checks,
// their messages and the CPU probe are compiled without AVX-512 (and so run on any CPU).
void gemm_unchecked(const float* a, int64_t lda, int64_t m, const uint16_t* panels, int64_t n,
                    int64_t k, int64_t p_begin, int64_t p_end, float* c, int64_t ldc, void* work);

}  // namespace bf16_gemm

}  // namespace moekit::cpu
