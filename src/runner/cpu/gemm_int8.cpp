// gemm_panels_int8's checks and scratch size. The kernel itself is in gemm_avx512vnni.cpp, which
// is compiled for AVX-512: what runs before the CPU is known to have it lives here.

#include "runner/cpu/gemm_int8.hpp"

#include <algorithm>
#include <cstdint>

#include "moekit/error.hpp"

namespace moekit::cpu {

bool gemm_int8_reads(int64_t group_k, int64_t k) {
  return k % kInt4BlockK == 0 && group_k % kInt4BlockK == 0 && group_k > 0 &&
         group_k <= int8_gemm::kBlockK;
}

int64_t gemm_int8_scratch_bytes() {
  // A K-block of 64 steps of 4 k, 64 bytes per step and panel (the VNNI kernel widens two
  // panels, the AVX2 one one); 64: room to align.
  return int8_gemm::kGroupPanels * (int8_gemm::kBlockK / kInt4BlockK) * 64 + 64;
}

void gemm_panels_int8(const Int8Matrix& a, int64_t m, const PanelMatrix& w, int64_t p_begin,
                      int64_t p_end, float* c, int64_t ldc, void* work, Int8Dot dot) {
  require(w.dtype == DType::i4, "gemm_panels_int8: weight dtype {} is not int4",
          dtype_name(w.dtype));
  require(w.n > 0 && w.k > 0 && w.data != nullptr && w.scale != nullptr,
          "gemm_panels_int8: weights [{}, {}] must be a non-empty matrix with data and scales", w.n,
          w.k);
  require(gemm_int8_reads(w.group_k, w.k),
          "gemm_panels_int8: groups of {} along a K of {} are not whole int4 blocks of at most {}",
          w.group_k, w.k, int8_gemm::kBlockK);
  require(0 <= p_begin && p_begin <= p_end && p_end <= w.panels(),
          "gemm_panels_int8: panel range [{}, {}) is outside the {} panels of the weights", p_begin,
          p_end, w.panels());
  require(m >= 0, "gemm_panels_int8: row count {} is negative", m);
  if (m == 0 || p_begin == p_end) return;
  require(
      a.q != nullptr && a.scale != nullptr && a.sums != nullptr && c != nullptr && work != nullptr,
      "gemm_panels_int8: the rows, their scales and sums, c and the scratch must not be null");
  require(a.ldq >= w.k && a.steps >= w.scale_steps(),
          "gemm_panels_int8: rows of {} codes and {} steps cannot hold K = {} in {} steps", a.ldq,
          a.steps, w.k, w.scale_steps());
  const int64_t last_col = std::min(p_end * kPanelRows, w.n);
  require(m == 1 || ldc >= last_col, "gemm_panels_int8: ldc {} is less than the {} columns written",
          ldc, last_col);
  const int8_gemm::Weights weights{.data = w.data,
                                   .n = w.n,
                                   .k = w.k,
                                   .panel_bytes = w.panel_bytes(),
                                   .group_k = w.group_k,
                                   .scale_steps = w.scale_steps(),
                                   .scale = w.scale,
                                   .offset = w.offset};
  if (dot == Int8Dot::maddubs) {
    int8_gemm::gemm_unchecked_maddubs(a, m, weights, p_begin, p_end, c, ldc, work);
  } else {
    int8_gemm::gemm_unchecked(a, m, weights, p_begin, p_end, c, ldc, work);
  }
}

}  // namespace moekit::cpu
