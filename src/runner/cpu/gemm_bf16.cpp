// gemm_panels_bf16's checks and scratch size. The kernel itself is in gemm_avx512bf16.cpp,
// which is compiled for AVX-512: what runs before the CPU is known to have it lives here.

#include "runner/cpu/gemm_bf16.hpp"

#include <algorithm>
#include <cstdint>

#include "moekit/error.hpp"

namespace moekit::cpu {
namespace {

// a_present: the inputs are not null; lda_least: the least row stride they may have (lda).
void check_arguments(bool a_present, int64_t lda, int64_t lda_least, int64_t m,
                     const PanelMatrix& w, int64_t p_begin, int64_t p_end, const float* c,
                     int64_t ldc, const void* work) {
  require(w.dtype == DType::bf16 || w.dtype == DType::f8e4m3 || w.dtype == DType::i4,
          "gemm_panels_bf16: weight dtype {} is not bf16, e4m3 or int4", dtype_name(w.dtype));
  require(w.n > 0 && w.k > 0 && w.data != nullptr,
          "gemm_panels_bf16: weights [{}, {}] must be a non-empty matrix with data", w.n, w.k);
  require(0 <= p_begin && p_begin <= p_end && p_end <= w.panels(),
          "gemm_panels_bf16: panel range [{}, {}) is outside the {} panels of the weights", p_begin,
          p_end, w.panels());
  require(m >= 0, "gemm_panels_bf16: row count {} is negative", m);
  if (m == 0 || p_begin == p_end) return;
  require(a_present && c != nullptr && work != nullptr,
          "gemm_panels_bf16: a, c and the scratch must not be null");
  require(lda >= lda_least, "gemm_panels_bf16: lda {} is less than {} (K = {})", lda, lda_least,
          w.k);
  const int64_t last_col = std::min(p_end * kPanelRows, w.n);
  require(m == 1 || ldc >= last_col, "gemm_panels_bf16: ldc {} is less than the {} columns written",
          ldc, last_col);
  if (w.dtype == DType::bf16) return;
  require(w.group_k > 0 && w.scale != nullptr,
          "gemm_panels_bf16: {} weights need a scale grid (group_k {})", dtype_name(w.dtype),
          w.group_k);
  require(w.offset == nullptr, "gemm_panels_bf16: int4 weights with zero points are not read here");
  require(gemm_bf16_reads(w.dtype, false, w.group_k, w.k),
          "gemm_panels_bf16: {} weights in groups of {} along a K of {} would split a pair of k "
          "between two groups (odd group or K)",
          dtype_name(w.dtype), w.group_k, w.k);
}

bf16_gemm::Widen widen_of(DType dtype) {
  if (dtype == DType::f8e4m3) return bf16_gemm::Widen::e4m3;
  return dtype == DType::i4 ? bf16_gemm::Widen::int4 : bf16_gemm::Widen::bf16;
}

}  // namespace

bool gemm_bf16_reads(DType dtype, bool zero_points, int64_t group_k, int64_t k) {
  if (dtype == DType::bf16) return true;
  const bool pairs_in_groups = group_k % 2 == 0 || group_k >= k;
  if (dtype == DType::f8e4m3) return pairs_in_groups;
  return dtype == DType::i4 && !zero_points && k % 2 == 0 && pairs_in_groups;
}

int64_t gemm_bf16_scratch_bytes(int64_t k) {
  const int64_t kc = std::clamp<int64_t>(k, 0, bf16_gemm::kBlockK);
  const int64_t a_block = bf16_gemm::kBlockM * bf16_gemm::a_stride_pairs(kc) * 4;
  const int64_t panel_group = bf16_gemm::kGroupPanels * ((kc + 1) / 2) * 64;
  return a_block + panel_group + 64;  // 64: room to align `work` to a cache line
}

namespace {

void check_input_scales(const InputScales& input_scales, const PanelMatrix& w) {
  if (input_scales.scale == nullptr) return;
  require(w.dtype != DType::bf16 && input_scales.group == w.group_k,
          "gemm_panels_bf16: input scales in groups of {} need weights with scale groups of the "
          "same size (got {} weights, group {})",
          input_scales.group, dtype_name(w.dtype), w.group_k);
  require(input_scales.ld >= w.scale_steps(),
          "gemm_panels_bf16: input scale stride {} is less than the {} groups of a row",
          input_scales.ld, w.scale_steps());
}

void run(const bf16_gemm::Source& a, int64_t m, const PanelMatrix& w, int64_t p_begin,
         int64_t p_end, float* c, int64_t ldc, void* work, const InputScales& input_scales) {
  check_input_scales(input_scales, w);
  const bf16_gemm::Weights weights{.widen = widen_of(w.dtype),
                                   .data = w.data,
                                   .n = w.n,
                                   .k = w.k,
                                   .panel_bytes = w.panel_bytes(),
                                   .group_k = w.dtype == DType::bf16 ? 0 : w.group_k,
                                   .scale_steps = w.scale_steps(),
                                   .scale = w.scale};
  bf16_gemm::gemm_unchecked(a, m, weights, p_begin, p_end, c, ldc, work, input_scales);
}

}  // namespace

void gemm_panels_bf16(const float* a, int64_t lda, int64_t m, const PanelMatrix& w, int64_t p_begin,
                      int64_t p_end, float* c, int64_t ldc, void* work,
                      const InputScales& input_scales) {
  check_arguments(a != nullptr, lda, w.k, m, w, p_begin, p_end, c, ldc, work);
  if (m == 0 || p_begin == p_end) return;
  run({.a = a, .lda = lda}, m, w, p_begin, p_end, c, ldc, work, input_scales);
}

void gemm_panels_bf16(const Bf16Rows& a, int64_t m, const PanelMatrix& w, int64_t p_begin,
                      int64_t p_end, float* c, int64_t ldc, void* work,
                      const InputScales& input_scales) {
  // The kernel reads pairs of k, so a row holds K rounded up to even values and starts on a pair.
  check_arguments(a.data != nullptr, a.ld, w.k + w.k % 2, m, w, p_begin, p_end, c, ldc, work);
  require(a.ld % 2 == 0, "gemm_panels_bf16: the stride {} of rounded rows is odd", a.ld);
  if (m == 0 || p_begin == p_end) return;
  run({.rounded = a.data, .rounded_ld = a.ld}, m, w, p_begin, p_end, c, ldc, work, input_scales);
}

void round_rows_bf16(const float* a, int64_t lda, int64_t m, int64_t k, bf16_t* out, int64_t ld,
                     const InputScales& input_scales) {
  require(m >= 0 && k > 0, "round_rows_bf16: {} rows of {} values", m, k);
  if (m == 0) return;
  require(a != nullptr && out != nullptr, "round_rows_bf16: a and out must not be null");
  require(lda >= k && ld >= bf16_rows_ld(k) && ld % 2 == 0,
          "round_rows_bf16: strides {} (in) and {} (out) for rows of {} values (out needs an even "
          "stride of at least {})",
          lda, ld, k, bf16_rows_ld(k));
  if (input_scales.scale != nullptr) {
    require(input_scales.group > 0 &&
                input_scales.ld >= (k + input_scales.group - 1) / input_scales.group,
            "round_rows_bf16: input scales in groups of {} with stride {} for rows of {} values",
            input_scales.group, input_scales.ld, k);
  }
  bf16_gemm::round_unchecked(a, lda, m, k, out, ld, input_scales);
}

}  // namespace moekit::cpu
