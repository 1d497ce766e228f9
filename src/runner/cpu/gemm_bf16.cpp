// gemm_panels_bf16's checks and scratch size. The kernel itself is in gemm_avx512bf16.cpp,
// which is compiled for AVX-512: what runs before the CPU is known to have it lives here.

#include "runner/cpu/gemm_bf16.hpp"

#include <algorithm>
#include <cstdint>

#include "moekit/error.hpp"

namespace moekit::cpu {
namespace {

void check_arguments(const float* a, int64_t lda, int64_t m, const PanelMatrix& w, int64_t p_begin,
                     int64_t p_end, const float* c, int64_t ldc, const void* work) {
  require(w.dtype == DType::bf16, "gemm_panels_bf16: weight dtype {} is not bf16",
          dtype_name(w.dtype));
  require(w.n > 0 && w.k > 0 && w.data != nullptr,
          "gemm_panels_bf16: weights [{}, {}] must be a non-empty matrix with data", w.n, w.k);
  require(0 <= p_begin && p_begin <= p_end && p_end <= w.panels(),
          "gemm_panels_bf16: panel range [{}, {}) is outside the {} panels of the weights", p_begin,
          p_end, w.panels());
  require(m >= 0, "gemm_panels_bf16: row count {} is negative", m);
  if (m == 0 || p_begin == p_end) return;
  require(a != nullptr && c != nullptr && work != nullptr,
          "gemm_panels_bf16: a, c and the scratch must not be null");
  require(lda >= w.k, "gemm_panels_bf16: lda {} is less than K = {}", lda, w.k);
  const int64_t last_col = std::min(p_end * kPanelRows, w.n);
  require(m == 1 || ldc >= last_col, "gemm_panels_bf16: ldc {} is less than the {} columns written",
          ldc, last_col);
}

}  // namespace

int64_t gemm_bf16_scratch_bytes(int64_t k) {
  const int64_t kc = std::clamp<int64_t>(k, 0, bf16_gemm::kBlockK);
  const int64_t a_block = bf16_gemm::kBlockM * bf16_gemm::a_stride_pairs(kc) * 4;
  const int64_t panel_group = bf16_gemm::kGroupPanels * ((kc + 1) / 2) * 64;
  return a_block + panel_group + 64;  // 64: room to align `work` to a cache line
}

void gemm_panels_bf16(const float* a, int64_t lda, int64_t m, const PanelMatrix& w, int64_t p_begin,
                      int64_t p_end, float* c, int64_t ldc, void* work) {
  check_arguments(a, lda, m, w, p_begin, p_end, c, ldc, work);
  if (m == 0 || p_begin == p_end) return;
  bf16_gemm::gemm_unchecked(a, lda, m, reinterpret_cast<const uint16_t*>(w.data), w.n, w.k, p_begin,
                            p_end, c, ldc, work);
}

}  // namespace moekit::cpu
