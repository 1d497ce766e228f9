#pragma once
// The router's own weights as a caller hands them over (the correction bias, the shared experts'
// gate), checked the same way for every device's router stage.

#include <vector>

#include "moekit/tensor.hpp"

namespace moekit {

// The values of `t` as f32, or invalid_argument naming `name`: it must be contiguous, on the CPU,
// of `shape`, f32 (or, unless f32_only, bf16/f16), and every element finite.
std::vector<float> router_weight_values(const TensorView& t, const char* name, Shape shape,
                                        bool f32_only);

}  // namespace moekit
