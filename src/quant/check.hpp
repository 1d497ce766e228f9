#pragma once
// The block layer's checks of the expert weights it is given, against the plan's format.

#include <string_view>

#include "moekit/quant.hpp"

namespace moekit {

// Checks a stack [experts, parts * rows, cols]: float weights (then no scales), or weights in the
// plan's format with a scale grid of the right shape and dtype whose every value is finite and
// positive, zero points in [-8, 7] where the format has them, and the input scales of fp8
// static activations. Throws invalid_argument naming `name` ("weights.w13") and the element.
void check_matrices(const ExpertMatrices& m, std::string_view name, int64_t experts, int64_t rows,
                    int64_t cols, int parts, const QuantParams& params);

// Whether a stack comes as float weights (to be converted or quantised at load time).
bool is_float_weight(DType dtype);

// fp8 static activations: the largest input scale of a checked stack, 0 for an empty one.
float largest_input_scale(const ExpertMatrices& m);

}  // namespace moekit
