// fp8-tensor (W8A8): e4m3 weights with one f32 scale per expert matrix (gate, up and down each
// have their own, as checkpoints ship them) or per output channel, multiplied in. Activations
// are quantised to e4m3 at run time per token, or with one static scale per GEMM input.

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

Capability fp8_tensor_supports_runner(RunnerKind runner, const QuantParams& params) {
  return read_by_cpu_cores(
      runner, params.format,
      "reads e4m3 rows times their scale, widened to f32; activations quantised per token or "
      "statically before each GEMM");
}

Capability fp8_tensor_supports_spec(const ModelSpec&, const QuantParams&) {
  return Capability::Yes("any shape");
}

}  // namespace moekit
