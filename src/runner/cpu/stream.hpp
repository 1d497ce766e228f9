#pragma once
// The streaming kernel of the cpu core: a few input rows times a range of panels of a panel16
// matrix, for experts that received few rows (decode). Each weight step is loaded and widened
// to f32 in registers once and multiplied into every row, so the weights stream through once
// per call, at the rate memory delivers them. Needs AVX2, FMA and F16C (the caller checks).

#include <cstdint>

#include "runner/cpu/panels.hpp"

namespace moekit::cpu {

// The most rows one pass over the weights serves; callers split larger sets.
inline constexpr int kStreamRows = 4;

struct StreamRows {
  int m = 0;                              // rows, 1..kStreamRows
  const float* x[kStreamRows] = {};       // the input rows, K floats each
  const float* x_sums[kStreamRows] = {};  // int4 only: step_sums() of each row
};

// y[r * ldy + 16 * (p - p_begin) + j] = sum_k x[r][k] * w(16 p + j, k) for r < rows.m, panels
// p in [p_begin, p_end) and j < 16 (rows past w.n give 0).
void stream_panels(const PanelMatrix& w, int64_t p_begin, int64_t p_end, const StreamRows& rows,
                   float* y, int64_t ldy);

// sums[g] = the sum of x over scale step g of a K of k in steps of group_k: int4 panels
// subtract their offsets through these (sum (u - o) x s = s (sum u x - o sum x)), so the
// kernel's inner loop never touches the offsets.
void step_sums(const float* x, int64_t k, int64_t group_k, float* sums);

}  // namespace moekit::cpu
