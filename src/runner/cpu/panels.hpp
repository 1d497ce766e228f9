#pragma once
// The layout the tuned cpu kernels read expert weights in: "panel16". A matrix [N, K] (N output
// rows, K the reduction) is cut into panels of 16 consecutive output rows, and a panel stores,
// for each k in [0, K), the 16 rows' values at k next to each other. A kernel then loads one
// step of a panel as two 8-float vectors (rows 0-7 and 8-15 of the panel) and accumulates 16
// outputs with no horizontal sums, whether it serves one token (streaming) or many (GEMM).
// Rows past N in the last panel are zero and are never written out.
//
// Per step (k) a panel holds, by weight dtype:
//   f32   16 x 4 bytes, row j at element j
//   bf16  16 x 2 bytes, row j at element j
//   f16   16 x 2 bytes, row j at element j
//   e4m3  16 bytes, row j at byte j
//   int4  8 bytes; byte j holds row j in its low nibble and row j + 8 in its high nibble, each
//         as the unsigned code u = q + 8 (q the signed nibble in [-8, 7])
//
// Quantised panels carry one scale step every `group_k` values of k (group_k = K when the scale
// covers the whole row), each step 16 f32 values, one per row:
//   scale[g][j]   multiplies row j's values in [g * group_k, (g + 1) * group_k)
//   offset[g][j]  int4 only: the value subtracted from the unsigned code first
// so that  w[n][k] = (code(n, k) - offset[g][n % 16]) * scale[g][n % 16]  for int4 (offset =
// 8 + zero point) and  w[n][k] = e4m3(n, k) * scale[g][n % 16]  for e4m3. Scales are widened to
// f32 and expanded to one value per row when the panel is packed, so the kernels see one grid
// for per-tensor, per-channel, 128x128-block and per-group scaling alike.

#include <cstdint>

#include "moekit/dtype.hpp"

namespace moekit::cpu {

inline constexpr int kPanelRows = 16;

// One packed matrix [N, K] of one expert.
struct PanelMatrix {
  DType dtype = DType::bf16;      // f32, bf16, f16, f8e4m3 or i4
  const uint8_t* data = nullptr;  // panels one after another, 64-byte aligned
  int64_t n = 0;                  // output rows (the last panel may be partial)
  int64_t k = 0;
  int64_t group_k = 0;            // values of k per scale step; 0 for float dtypes
  const float* scale = nullptr;   // [panels][k / group_k rounded up][16]
  const float* offset = nullptr;  // int4 only, same shape as scale

  int64_t panels() const { return (n + kPanelRows - 1) / kPanelRows; }
  int64_t scale_steps() const { return group_k == 0 ? 0 : (k + group_k - 1) / group_k; }
  int64_t step_bytes() const { return dtype_storage_bytes(dtype, kPanelRows); }
  int64_t panel_bytes() const { return step_bytes() * k; }
  const uint8_t* panel(int64_t p) const { return data + p * panel_bytes(); }
  const float* panel_scale(int64_t p) const { return scale + p * scale_steps() * kPanelRows; }
  const float* panel_offset(int64_t p) const { return offset + p * scale_steps() * kPanelRows; }
};

}  // namespace moekit::cpu
