#pragma once
// Writing one expert matrix into stored matrices: quantised from floats (online quantisation),
// or copied when it already comes in the format. quantize_matrices() and the quant method both
// use these, so a layer quantised online holds exactly what quantize_matrices() returns.

#include <string_view>

#include "quant/quant_method.hpp"

namespace moekit {

// Quantises the float matrix src [N, K] into part `part` of slot `slot` of dst. `name` names
// the source in errors (non-finite weights, scales out of the scale dtype's range).
void quantize_into(const QuantParams& params, const TensorView& src, const StoredMatrices& dst,
                   int64_t slot, int part, std::string_view name);

// Copies a matrix already in the format (weights, scale grid, zero points) into part `part` of
// slot `slot` of dst. The caller has checked it (quant/check.hpp).
void copy_into(const QuantParams& params, const MatrixSource& src, const StoredMatrices& dst,
               int64_t slot, int part);

}  // namespace moekit
