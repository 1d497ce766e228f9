#pragma once
// Small numeric pieces shared by the CPU-side cores: activation, activation-row reads, dot
// products. Weight rows are read through quant/dequantize.hpp.

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "moekit/spec.hpp"
#include "moekit/tensor.hpp"

namespace moekit::kernels {

// The gated activation of one (gate, up) pair, in the precision of T.
template <typename T>
T activate(const Activation& activation, T gate, T up) {
  switch (activation.kind) {
    case ActivationKind::silu_gated:
      return gate / (T(1) + std::exp(-gate)) * up;
    case ActivationKind::gelu_gated:
      return T(0.5) * gate * (T(1) + std::erf(gate / std::sqrt(T(2)))) * up;
    case ActivationKind::swiglu_oai: {
      const T limit = T(activation.limit);
      const T g = std::min(gate, limit);
      const T u = std::clamp(up, -limit, limit);
      return (u + T(1)) * g / (T(1) + std::exp(-T(activation.alpha) * g));
    }
  }
  return T(0);
}

// Row `row` of a [T, cols] contiguous float tensor, widened to f32.
void activation_row(const TensorView& rows, int64_t row, float* out);

float dot(const float* a, const float* b, int64_t n);

}  // namespace moekit::kernels
