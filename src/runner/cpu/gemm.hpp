#pragma once
// The many-rows GEMM of the cpu core: activations [m, K] (f32, row-major) times a panel16 weight
// matrix [N, K]^T, for a range of panels. The caller splits panels across threads; one call is
// single-threaded. It needs AVX2, FMA and F16C (every AVX2 CPU has F16C): the caller checks the
// machine before choosing it, and a call on a CPU without them throws Errc::internal.

#include <cstdint>

#include "runner/cpu/panels.hpp"

namespace moekit::cpu {

// Floats of per-thread scratch gemm_panels needs for a K of k (a block of a, packed, and a
// widened panel block).
int64_t gemm_scratch_floats(int64_t k);

// c[r * ldc + n] = sum_k a[r * lda + k] * w(n, k), r in [0, m), n in [16 * p_begin,
// min(16 * p_end, w.n)). Overwrites those elements of c (n is the absolute row of w) and no
// others. All panel16 dtypes. `work` holds gemm_scratch_floats(w.k) floats (any alignment; about
// 512 KB for K >= 512) and is clobbered. Throws Errc::invalid_argument for a bad range, stride,
// dtype or scale grid.
void gemm_panels(const float* a, int64_t lda, int64_t m, const PanelMatrix& w, int64_t p_begin,
                 int64_t p_end, float* c, int64_t ldc, float* work);

}  // namespace moekit::cpu
