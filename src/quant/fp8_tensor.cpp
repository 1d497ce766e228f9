// fp8-tensor (W8A8): e4m3 weights with one f32 scale per expert matrix (gate, up and down each
// have their own, as checkpoints ship them) or per output channel, multiplied in. Activations
// are quantised to e4m3 at run time per token, or with one static scale per GEMM input.

#include <fmt/format.h>

#include "quant/quant_method.hpp"

namespace moekit {

QuantParams QuantParams::Fp8Tensor(Fp8Scaling scaling, Fp8Activations activations) {
  QuantParams params;
  params.format = WeightFormat::fp8_tensor;
  params.weight_dtype = DType::f8e4m3;
  params.scale_dtype = DType::f32;
  params.block_rows = scaling == Fp8Scaling::per_channel ? 1 : 0;
  params.block_cols = 0;
  params.activation = activations == Fp8Activations::static_ ? ActivationQuant::fp8_static
                                                             : ActivationQuant::fp8_per_token;
  return params;
}

namespace {

std::vector<std::string> fp8_tensor_problems(const QuantParams& params) {
  std::vector<std::string> found;
  if (params.weight_dtype != DType::f8e4m3 || params.scale_dtype != DType::f32 ||
      params.zero_points) {
    found.emplace_back("fp8-tensor stores e4m3 weights with f32 scales and no zero points");
  }
  if (params.block_cols != 0 || (params.block_rows != 0 && params.block_rows != 1)) {
    found.emplace_back(
        "fp8-tensor scales one whole matrix (blocks 0 x 0) or one output channel (1 x 0)");
  }
  if (params.activation != ActivationQuant::fp8_per_token &&
      params.activation != ActivationQuant::fp8_static) {
    found.emplace_back("fp8-tensor quantises activations per token or with a static scale");
  }
  return found;
}

std::string fp8_tensor_describe(const QuantParams& params) {
  return fmt::format("e4m3 weights, one f32 scale per {}, activations {}",
                     params.block_rows == 1 ? "output channel" : "matrix",
                     activation_quant_name(params.activation));
}

Capability fp8_tensor_supports_spec(const ModelSpec&, const QuantParams&) {
  return Capability::Yes("any shape");
}

}  // namespace

QuantEntry fp8_tensor_entry() {
  return {WeightFormat::fp8_tensor,
          fp8_tensor_problems,
          fp8_tensor_describe,
          fp8_tensor_supports_spec,
          {"weight", "weight_scale", nullptr}};
}

}  // namespace moekit
