#pragma once
// Quantisation parameters: one value type, built by named constructors, handed by the quant
// method to whichever runner core computes. GPU cores read the same type.

#include <string>

#include "moekit/dtype.hpp"
#include "moekit/options.hpp"

namespace moekit {

struct QuantParams {
  WeightFormat format = WeightFormat::bf16;
  DType weight_dtype = DType::bf16;  // element type of w13 and w2 as stored

  // Weights stored as they are, in f32, f16 or bf16; activations are not quantised.
  static QuantParams Unquantized(WeightFormat format);
  std::string describe() const;
};

}  // namespace moekit
