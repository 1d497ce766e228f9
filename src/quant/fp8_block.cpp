// fp8-block (DeepSeek-V3/R1, Qwen3-FP8): e4m3 weights with one f32 weight_scale_inv per
// block x block tile of each matrix, multiplied in; edge tiles are partial when a dimension is
// not a multiple of the block. Activations are quantised at run time per token per `block`
// columns, as those models' inference code does.

#include <fmt/format.h>

#include "quant/quant_method.hpp"

namespace moekit {

QuantParams QuantParams::Fp8Block(int64_t block) {
  QuantParams params;
  params.format = WeightFormat::fp8_block;
  params.weight_dtype = DType::f8e4m3;
  params.scale_dtype = DType::f32;
  params.block_rows = block;
  params.block_cols = block;
  params.activation = ActivationQuant::fp8_per_token_group;
  params.activation_group = block;
  return params;
}

namespace {

std::vector<std::string> fp8_block_problems(const QuantParams& params) {
  std::vector<std::string> found;
  if (params.weight_dtype != DType::f8e4m3 || params.scale_dtype != DType::f32 ||
      params.zero_points) {
    found.emplace_back("fp8-block stores e4m3 weights with f32 scales and no zero points");
  }
  if (params.block_rows <= 0 || params.block_cols <= 0) {
    found.push_back(fmt::format("fp8-block needs positive block sizes, got {} x {}",
                                params.block_rows, params.block_cols));
  }
  if (params.activation != ActivationQuant::fp8_per_token_group ||
      params.activation_group != params.block_cols) {
    found.emplace_back("fp8-block quantises activations per token per block_cols columns");
  }
  return found;
}

std::string fp8_block_describe(const QuantParams& params) {
  return fmt::format("e4m3 weights, f32 scale per {} x {} block, activations {} of {} columns",
                     params.block_rows, params.block_cols, activation_quant_name(params.activation),
                     params.activation_group);
}

Capability fp8_block_supports_spec(const ModelSpec&, const QuantParams&) {
  return Capability::Yes("any shape: edge blocks may be partial");
}

}  // namespace

QuantEntry fp8_block_entry() {
  return {WeightFormat::fp8_block,
          fp8_block_problems,
          fp8_block_describe,
          fp8_block_supports_spec,
          {"weight", "weight_scale_inv", nullptr}};
}

}  // namespace moekit
