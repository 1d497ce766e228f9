#include "runner/cpu/panels.hpp"

#include <cstring>

#include "moekit/error.hpp"
#include "quant/dequantize.hpp"

namespace moekit::cpu {
namespace {

int64_t packed_rows(PanelOrder order, int64_t rows) {
  if (order == PanelOrder::rows) return rows;
  return (rows / 2 + kHalfPanel - 1) / kHalfPanel * kPanelRows;
}

// Canonical row `row` of slot `slot` of m, stored as row j of a panel whose steps are `stride`
// bytes apart.
void copy_row(const StoredMatrices& m, int64_t slot, int64_t row, uint8_t* panel, int64_t stride,
              int j) {
  const int64_t K = m.weight.dim(2);
  const int64_t first = (slot * m.weight.dim(1) + row) * K;
  const auto* src = static_cast<const uint8_t*>(m.weight.data);
  if (m.weight.dtype == DType::i4) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t index = first + k;
      const uint8_t byte = src[index / 2];
      // The signed nibble q becomes the code q + 8, which flips its top bit.
      const int code = ((index % 2 == 0 ? byte : byte >> 4) & 0xF) ^ 8;
      const Int4Location at = int4_location(k, j);
      panel[at.byte] = static_cast<uint8_t>(panel[at.byte] | code << at.shift);
    }
    return;
  }
  // One fixed-size copy per element: the element size as a constant keeps each a plain move.
  const auto copy = [&]<size_t kBytes>() {
    const uint8_t* in = src + first * static_cast<int64_t>(kBytes);
    uint8_t* out = panel + j * static_cast<int64_t>(kBytes);
    for (int64_t k = 0; k < K; ++k, in += kBytes, out += stride) std::memcpy(out, in, kBytes);
  };
  switch (dtype_storage_bytes(m.weight.dtype, 1)) {
    case 1:
      return copy.template operator()<1>();
    case 2:
      return copy.template operator()<2>();
    default:
      return copy.template operator()<4>();
  }
}

}  // namespace

int64_t canonical_row(PanelOrder order, int64_t canonical_rows, int64_t n) {
  if (order == PanelOrder::rows) return n < canonical_rows ? n : -1;
  const int64_t half = canonical_rows / 2;
  const int64_t j = n % kPanelRows;
  const int64_t i = n / kPanelRows * kHalfPanel + j % kHalfPanel;
  if (i >= half) return -1;
  return j < kHalfPanel ? i : half + i;
}

PanelBuffer::PanelBuffer(const QuantParams& q, PanelOrder order, int slots, int64_t rows, int64_t k)
    : order_(order) {
  if (order == PanelOrder::gate_up_interleaved && rows % 2 != 0) {
    fail(Errc::internal, "gate/up interleaved packing of {} rows: gate and up must match", rows);
  }
  PanelMatrix& m = stack_.first;
  m.dtype = q.weight_dtype;
  m.n = packed_rows(order, rows);
  m.k = k;
  m.group_k = q.quantized() ? (q.block_cols == 0 ? k : q.block_cols) : 0;
  stack_.slots = slots;
  data_ = Buffer::allocate(Device::cpu(), slots * stack_.data_bytes());
  m.data = static_cast<const uint8_t*>(data_.data());
  if (q.quantized()) {
    const int arrays = q.weight_dtype == DType::i4 && q.zero_points ? 2 : 1;
    const int64_t floats = slots * stack_.scale_floats();
    scales_ =
        Buffer::allocate(Device::cpu(), arrays * floats * static_cast<int64_t>(sizeof(float)));
    m.scale = static_cast<const float*>(scales_.data());
    if (arrays == 2) m.offset = m.scale + floats;
  }
}

void PanelBuffer::pack(const QuantParams& q, const StoredMatrices& m, int64_t slot, int into) {
  const PanelMatrix dst = stack_.slot(into);
  const int64_t rows = m.weight.dim(1);
  auto* data = const_cast<uint8_t*>(dst.data);
  std::memset(data, 0, static_cast<size_t>(stack_.data_bytes()));
  const int64_t steps = dst.scale_steps();
  auto* scale = const_cast<float*>(dst.scale);
  auto* offset = const_cast<float*>(dst.offset);
  for (int64_t n = 0; n < dst.panels() * kPanelRows; ++n) {
    const int64_t p = n / kPanelRows;
    const int j = static_cast<int>(n % kPanelRows);
    const int64_t row = canonical_row(order_, rows, n);
    const int64_t scale_first = (p * steps) * kPanelRows + j;
    if (row < 0) {
      for (int64_t g = 0; g < steps; ++g) {
        scale[scale_first + g * kPanelRows] = 0.0f;
        if (offset != nullptr) offset[scale_first + g * kPanelRows] = 0.0f;
      }
      continue;
    }
    uint8_t* panel = data + p * dst.panel_bytes();
    copy_row(m, slot, row, panel, dst.step_bytes(), j);
    if (steps == 0) continue;
    const int64_t first = scale_row_index(q, m, slot, row);
    for (int64_t g = 0; g < steps; ++g) {
      scale[scale_first + g * kPanelRows] = read_float(m.scale, first + g);
      if (offset != nullptr) {
        const float zero = static_cast<const int8_t*>(m.zero.data)[first + g];
        offset[scale_first + g * kPanelRows] = 8.0f + zero;
      }
    }
  }
}

float panel_value(const PanelMatrix& w, int64_t n, int64_t k) {
  const int64_t p = n / kPanelRows;
  const int j = static_cast<int>(n % kPanelRows);
  const uint8_t* step = w.panel(p) + k * w.step_bytes();
  const int64_t scale_at = (k / (w.group_k == 0 ? 1 : w.group_k)) * kPanelRows + j;
  switch (w.dtype) {
    case DType::f32: {
      float v;
      std::memcpy(&v, step + 4 * j, sizeof v);
      return v;
    }
    case DType::bf16: {
      bf16_t v;
      std::memcpy(&v, step + 2 * j, sizeof v);
      return to_float(v);
    }
    case DType::f16: {
      f16_t v;
      std::memcpy(&v, step + 2 * j, sizeof v);
      return to_float(v);
    }
    case DType::f8e4m3:
      return e4m3_values()[step[j]] * w.panel_scale(p)[scale_at];
    case DType::i4: {
      const Int4Location at = int4_location(k, j);
      const int code = w.panel(p)[at.byte] >> at.shift & 0xF;
      const float offset = w.offset == nullptr ? kSymmetricOffset : w.panel_offset(p)[scale_at];
      return (static_cast<float>(code) - offset) * w.panel_scale(p)[scale_at];
    }
    default:
      fail(Errc::internal, "panel16 holds no {} weights", dtype_name(w.dtype));
  }
}

PanelPacker::PanelPacker(const QuantParams& q, int slots, int64_t hidden, int64_t intermediate)
    : q_(q),
      w13_(q, PanelOrder::gate_up_interleaved, slots, 2 * intermediate, hidden),
      w2_(q, PanelOrder::rows, slots, hidden, intermediate) {
  weights_.w13 = w13_.stack();
  weights_.w2 = w2_.stack();
}

void PanelPacker::pack(int slot, const StoredMatrices& w13, const StoredMatrices& w2) {
  w13_.pack(q_, w13, 0, slot);
  w2_.pack(q_, w2, 0, slot);
}

const PanelWeights& panel_weights(const CoreWeights& weights) {
  const auto* panels = dynamic_cast<const PanelWeights*>(weights.packed);
  if (panels == nullptr) fail(Errc::internal, "the cpu panel kernels got no panel16 weights");
  return *panels;
}

}  // namespace moekit::cpu
