// fp8-block (DeepSeek-V3/R1, Qwen3-FP8): e4m3 weights with one f32 weight_scale_inv per
// block x block tile of each matrix, multiplied in; edge tiles are partial when a dimension is
// not a multiple of the block. Activations are quantised at run time per token per `block`
// columns, as those models' inference code does.

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

Capability fp8_block_supports_runner(RunnerKind runner, const QuantParams& params) {
  return read_by_cpu_cores(
      runner, params.format,
      "reads e4m3 rows times their block scales, widened to f32; activations quantised per "
      "token per block of columns before each GEMM");
}

Capability fp8_block_supports_spec(const ModelSpec&, const QuantParams&) {
  return Capability::Yes("any shape: edge blocks may be partial");
}

}  // namespace moekit
