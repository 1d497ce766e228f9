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
//   int4  8 bytes per k, stored in blocks of 4 k (32 bytes), each value as the unsigned code
//         u = q + 8 (q the signed nibble in [-8, 7]). The block is 16 little-endian 16-bit
//         lanes; lane 2 (j % 8) + (k % 2) holds, in its nibbles from the lowest, row j of k
//         pair 0 (k % 4 < 2) for j < 8, then j >= 8, then pair 1 for j < 8, then j >= 8
//         (int4_location). So four shift-and-masks of one 32-byte load give four vectors of
//         16-bit codes, each 8 rows x 2 adjacent k: what a 16-bit integer dot product
//         (pmaddwd) multiplies by a pair of activations, and what a float kernel widens with
//         one more mask or shift. K is padded to a multiple of 4 with zero codes.
//
// Quantised panels carry one scale step every `group_k` values of k (group_k = K when the scale
// covers the whole row), each step 16 f32 values, one per row:
//   scale[g][j]   multiplies row j's values in [g * group_k, (g + 1) * group_k)
//   offset[g][j]  int4 with zero points only: the value subtracted from the unsigned code first
// so that  w[n][k] = (code(n, k) - offset[g][n % 16]) * scale[g][n % 16]  for int4 (offset =
// 8 + zero point; symmetric int4 stores no offsets, as every one would be 8, which saves their
// bytes on every decode pass over the weights) and  w[n][k] = e4m3(n, k) * scale[g][n % 16]  for
// e4m3. Scales are widened to f32 and expanded to one value per row when the panel is packed, so
// the kernels see one grid for per-tensor, per-channel, 128x128-block and per-group scaling alike.
//
// w13 (gate rows then up rows in the canonical layout) is packed "gate/up interleaved": panel p
// holds gate rows 8p..8p+7 as its rows 0-7 and the up rows of the same i as its rows 8-15, so a
// kernel has gate and up of one intermediate index in the same lane of its two accumulators and
// applies the activation straight from them. Such a matrix has n = 16 * ceil(I / 8) packed rows;
// where I % 8 != 0 the last panel's missing rows are zero.

#include <cstdint>

#include "contracts/weights.hpp"
#include "moekit/dtype.hpp"
#include "moekit/quant.hpp"
#include "moekit/tensor.hpp"

namespace moekit::cpu {

inline constexpr int kPanelRows = 16;
inline constexpr int kHalfPanel = kPanelRows / 2;
// The int4 offset of every row of a matrix without zero points (PanelMatrix::offset null).
inline constexpr float kSymmetricOffset = 8.0f;
// Values of k per int4 block: one 32-byte load of a panel.
inline constexpr int64_t kInt4BlockK = 4;
inline constexpr int64_t kInt4BlockBytes = kInt4BlockK * kPanelRows / 2;

// Where the int4 code of row j (< 16) of a panel at k sits: byte `byte` of the panel, bits
// [shift, shift + 4).
struct Int4Location {
  int64_t byte;
  int shift;
};
inline Int4Location int4_location(int64_t k, int j) {
  const int64_t block = k / kInt4BlockK;
  const int64_t pair = k % kInt4BlockK / 2;
  const int64_t lane = 2 * (j % kHalfPanel) + k % 2;
  return {block * kInt4BlockBytes + 2 * lane + pair, j < kHalfPanel ? 0 : 4};
}

// One packed matrix [N, K] of one expert.
struct PanelMatrix {
  DType dtype = DType::bf16;      // f32, bf16, f16, f8e4m3 or i4
  const uint8_t* data = nullptr;  // panels one after another, 64-byte aligned
  int64_t n = 0;                  // output rows (the last panel may be partial)
  int64_t k = 0;
  int64_t group_k = 0;            // values of k per scale step; 0 for float dtypes
  const float* scale = nullptr;   // [panels][k / group_k rounded up][16]
  const float* offset = nullptr;  // int4 with zero points only, same shape as scale; null: 8

  int64_t panels() const { return (n + kPanelRows - 1) / kPanelRows; }
  int64_t scale_steps() const { return group_k == 0 ? 0 : (k + group_k - 1) / group_k; }
  int64_t step_bytes() const { return dtype_storage_bytes(dtype, kPanelRows); }
  // Steps stored per panel: K, rounded up to whole int4 blocks.
  int64_t stored_k() const {
    return dtype == DType::i4 ? (k + kInt4BlockK - 1) / kInt4BlockK * kInt4BlockK : k;
  }
  int64_t panel_bytes() const { return step_bytes() * stored_k(); }
  const uint8_t* panel(int64_t p) const { return data + p * panel_bytes(); }
  const float* panel_scale(int64_t p) const { return scale + p * scale_steps() * kPanelRows; }
  const float* panel_offset(int64_t p) const { return offset + p * scale_steps() * kPanelRows; }
};

// How the rows of a canonical matrix map to packed rows.
enum class PanelOrder {
  rows,                 // packed row n is canonical row n
  gate_up_interleaved,  // canonical rows are gate [0, N/2) then up [N/2, N); see above
};

// The same-shaped packed matrices of every slot, one after another: w13 or w2 of a layer.
struct PanelStack {
  PanelMatrix first;  // slot 0
  int slots = 0;

  bool empty() const { return slots == 0; }
  int64_t data_bytes() const { return first.panels() * first.panel_bytes(); }
  int64_t scale_floats() const { return first.panels() * first.scale_steps() * kPanelRows; }
  PanelMatrix slot(int64_t s) const {
    PanelMatrix m = first;
    m.data = first.data + s * data_bytes();
    if (m.scale != nullptr) m.scale = first.scale + s * scale_floats();
    if (m.offset != nullptr) m.offset = first.offset + s * scale_floats();
    return m;
  }
};

// Owns the storage of a PanelStack: the packed weights of `slots` matrices of `rows` canonical
// rows (gate and up together for interleaved w13) and k columns, in the format of q.
class PanelBuffer {
 public:
  PanelBuffer() = default;
  PanelBuffer(const QuantParams& q, PanelOrder order, int slots, int64_t rows, int64_t k);

  const PanelStack& stack() const { return stack_; }
  PanelOrder order() const { return order_; }
  // Packs slot `slot` of the canonical matrices m (the quant method's layout, see
  // quant/dequantize.hpp) into slot `into` of this buffer.
  void pack(const QuantParams& q, const StoredMatrices& m, int64_t slot, int into);

 private:
  PanelStack stack_;
  PanelOrder order_ = PanelOrder::rows;
  Buffer data_;
  Buffer scales_;  // the scale array, then the offset array where there is one
};

// The cpu runner's own layout of a layer's experts (CoreWeights::packed): w13 gate/up
// interleaved, w2 in rows.
struct PanelWeights final : PackedWeights {
  PanelStack w13;
  PanelStack w2;
};

// The cpu runner's WeightPacker: packs each expert into panel16 as the quant method loads it.
class PanelPacker final : public WeightPacker {
 public:
  PanelPacker(const QuantParams& q, int slots, int64_t hidden, int64_t intermediate);
  void pack(int slot, const StoredMatrices& w13, const StoredMatrices& w2) override;
  const PackedWeights& packed() const override { return weights_; }

 private:
  QuantParams q_;
  PanelBuffer w13_;
  PanelBuffer w2_;
  PanelWeights weights_;
};

// The panels of weights a PanelPacker filled.
const PanelWeights& panel_weights(const CoreWeights& weights);

// The canonical row that packed row n holds, or -1 for a zero row past the matrix.
int64_t canonical_row(PanelOrder order, int64_t canonical_rows, int64_t n);

// w(n, k) as the packed matrix defines it (the formula above), for checks and tests.
float panel_value(const PanelMatrix& w, int64_t n, int64_t k);

}  // namespace moekit::cpu
