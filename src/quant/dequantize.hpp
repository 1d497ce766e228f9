#pragma once
// Reading stored weights back as numbers: the one definition of each format's values that the
// CPU-side cores share. A core dequantises a row into T (float for the compute cores, double for
// the reference, where q * scale is exact).

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include "contracts/weights.hpp"
#include "moekit/dtype.hpp"

namespace moekit {

// Element `index` of a tensor of f32, f16 or bf16 values (scales are stored in these).
inline float read_float(const TensorView& t, int64_t index) {
  switch (t.dtype) {
    case DType::f16:
      return to_float(static_cast<const f16_t*>(t.data)[index]);
    case DType::bf16:
      return to_float(static_cast<const bf16_t*>(t.data)[index]);
    default:
      return static_cast<const float*>(t.data)[index];
  }
}

// Every e4m3 code's value, so that a row is widened by table lookups rather than bit surgery.
inline const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> values{};
    for (int code = 0; code < 256; ++code) {
      values[static_cast<size_t>(code)] = to_float(e4m3_t{static_cast<uint8_t>(code)});
    }
    return values;
  }();
  return table;
}

// Where the scale of row `row` (of parts * N) of slot `slot` starts in the scale tensor; the
// row's scale for column k is at that index plus k / block_cols.
inline int64_t scale_row_index(const QuantParams& q, const StoredMatrices& m, int64_t slot,
                               int64_t row) {
  const int64_t n = m.weight.dim(1) / m.parts;
  const int64_t per_part = q.scale_rows(n);
  const int64_t scale_row = row / n * per_part + (q.block_rows == 0 ? 0 : row % n / q.block_rows);
  return (slot * m.parts * per_part + scale_row) * q.scale_cols(m.weight.dim(2));
}

// Row `row` of slot `slot` of m, as the format defines its values: float weights as stored,
// e4m3 * scale, or (q - zero) * scale for int4.
template <typename T>
void dequantize_row(const QuantParams& q, const StoredMatrices& m, int64_t slot, int64_t row,
                    T* out) {
  const int64_t K = m.weight.dim(2);
  const int64_t first = (slot * m.weight.dim(1) + row) * K;
  const auto* bytes = static_cast<const uint8_t*>(m.weight.data);
  if (!q.quantized()) {
    if constexpr (std::is_same_v<T, float>) {
      convert_to_f32(bytes + dtype_storage_bytes(m.weight.dtype, first), m.weight.dtype, K, out);
    } else {
      for (int64_t k = 0; k < K; ++k) out[k] = read_float(m.weight, first + k);
    }
    return;
  }
  const int64_t block = q.block_cols == 0 ? K : q.block_cols;
  int64_t scale_index = scale_row_index(q, m, slot, row);
  for (int64_t k0 = 0; k0 < K; k0 += block, ++scale_index) {
    const T scale = static_cast<T>(read_float(m.scale, scale_index));
    const int64_t k1 = std::min(K, k0 + block);
    if (q.weight_dtype == DType::f8e4m3) {
      const std::array<float, 256>& values = e4m3_values();
      for (int64_t k = k0; k < k1; ++k) out[k] = static_cast<T>(values[bytes[first + k]]) * scale;
    } else {
      const T zero = q.zero_points
                         ? static_cast<T>(static_cast<const int8_t*>(m.zero.data)[scale_index])
                         : T(0);
      // Rows and groups start on whole bytes (K and the group size are even), so a byte holds
      // elements k (low nibble) and k + 1 (high nibble); (n ^ 8) - 8 sign-extends a nibble.
      const uint8_t* pair = bytes + (first + k0) / 2;
      for (int64_t k = k0; k < k1; k += 2, ++pair) {
        out[k] = (static_cast<T>(((*pair & 0xF) ^ 8) - 8) - zero) * scale;
        if (k + 1 < k1) out[k + 1] = (static_cast<T>(((*pair >> 4) ^ 8) - 8) - zero) * scale;
      }
    }
  }
}

}  // namespace moekit
