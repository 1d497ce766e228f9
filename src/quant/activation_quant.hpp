#pragma once
// Run-time quantisation of the GEMM inputs, as the formats' inference code does it: e4m3 values
// with one scale per token row, per token per group of columns, or one static scale; or int8
// values per token per group. Both steps are defined in f32 (the scale amax / 448 or amax / 127,
// the value x / scale, rounded to nearest even and saturated to +-448 or +-127); a core then
// sees q * scale, computed in its own precision T.

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "moekit/dtype.hpp"
#include "moekit/quant.hpp"

namespace moekit {

// Below this amax a group is all but zero; the floor keeps its scale finite and its values 0
// (the same floor as SGLang's per-token-group quantisation).
inline constexpr float kActivationAmaxFloor = 1e-10f;

inline constexpr float kInt8Max = 127.0f;

inline int64_t activation_group(const QuantParams& q, int64_t n) {
  return q.activation == ActivationQuant::fp8_per_token_group ||
                 q.activation == ActivationQuant::int8_per_token_group
             ? q.activation_group
             : n;
}

// x / scale as int8: rounded to nearest even (the default rounding mode), saturated to +-127.
inline float int8_code(float x, float scale) {
  return std::clamp(std::nearbyint(x / scale), -kInt8Max, kInt8Max);
}

// The scale of group [k0, k1) of GEMM input x: its amax (floored) over 448 or 127, or the static
// scale.
inline float activation_group_scale(const QuantParams& q, float static_scale, const float* x,
                                    int64_t k0, int64_t k1) {
  if (q.activation == ActivationQuant::fp8_static) return static_scale;
  float amax = 0.0f;
  for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(x[k]));
  const bool int8 = q.activation == ActivationQuant::int8_per_token_group;
  return std::max(amax, kActivationAmaxFloor) / (int8 ? kInt8Max : kE4M3Max);
}

// out[k] = the value GEMM input x[k] has after quantisation; x and out may be the same array.
// static_scale is used by fp8_static only. Formats that keep activations leave the values.
// `scales`, where given, gets the scale of each group (activation_group) of the row, for a core
// that multiplies codes and applies the scales to its sums.
template <typename T>
void quantize_activation_row(const QuantParams& q, float static_scale, const float* x, int64_t n,
                             T* out, float* scales = nullptr) {
  if (!q.quantizes_activations()) {
    for (int64_t k = 0; k < n; ++k) out[k] = static_cast<T>(x[k]);
    return;
  }
  const int64_t group = activation_group(q, n);
  const bool int8 = q.activation == ActivationQuant::int8_per_token_group;
  for (int64_t k0 = 0; k0 < n; k0 += group) {
    const int64_t k1 = std::min(n, k0 + group);
    const float scale = activation_group_scale(q, static_scale, x, k0, k1);
    if (scales != nullptr) scales[k0 / group] = scale;
    if (int8) {
      for (int64_t k = k0; k < k1; ++k) {
        out[k] = static_cast<T>(int8_code(x[k], scale)) * static_cast<T>(scale);
      }
      continue;
    }
    for (int64_t k = k0; k < k1; ++k) {
      out[k] = static_cast<T>(to_float(to_e4m3(x[k] / scale))) * static_cast<T>(scale);
    }
  }
}

}  // namespace moekit
