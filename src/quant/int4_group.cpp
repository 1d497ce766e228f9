// int4-group (W4A16, GPTQ/AWQ style): signed 4-bit weights packed two per byte along K (the
// element with the even index in the low nibble), one f16 or bf16 scale per `group` columns of
// each row, and optionally one i8 zero point per scale: w = (q - zero) * scale. Activations stay
// unquantised, or (Int4GroupA8) are quantised to int8 per token per group. docs/QUANTIZATION.md
// maps GPTQ's and AWQ's unsigned conventions onto this.

#include <fmt/format.h>

#include "quant/quant_method.hpp"

namespace moekit {

QuantParams QuantParams::Int4Group(int64_t group, DType scale_dtype, bool zero_points) {
  QuantParams params;
  params.format = WeightFormat::int4_group;
  params.weight_dtype = DType::i4;
  params.scale_dtype = scale_dtype;
  params.block_rows = 1;
  params.block_cols = group;
  params.zero_points = zero_points;
  params.activation = ActivationQuant::none;
  return params;
}

QuantParams QuantParams::Int4GroupA8(int64_t group, DType scale_dtype, bool zero_points) {
  QuantParams params = Int4Group(group, scale_dtype, zero_points);
  params.activation = ActivationQuant::int8_per_token_group;
  params.activation_group = group;
  return params;
}

namespace {

std::vector<std::string> int4_group_problems(const QuantParams& params) {
  std::vector<std::string> found;
  if (params.weight_dtype != DType::i4) found.emplace_back("int4-group stores i4 weights");
  if (params.scale_dtype != DType::f16 && params.scale_dtype != DType::bf16) {
    found.push_back(
        fmt::format("int4-group scales are f16 or bf16, not {}", dtype_name(params.scale_dtype)));
  }
  if (params.block_rows != 1 || params.block_cols < 2 || params.block_cols % 2 != 0) {
    found.push_back(
        fmt::format("int4-group needs an even group size of at least 2 along K (one scale per "
                    "row per group), got {} x {}",
                    params.block_rows, params.block_cols));
  }
  if (params.activation != ActivationQuant::none &&
      (params.activation != ActivationQuant::int8_per_token_group ||
       params.activation_group != params.block_cols)) {
    found.emplace_back(
        "int4-group leaves activations unquantised, or quantises them to int8 per token per "
        "weight group");
  }
  return found;
}

std::string int4_group_describe(const QuantParams& params) {
  std::string text = fmt::format(
      "int4 weights packed along K, one {} scale per group of {} columns{}, activations {}",
      dtype_name(params.scale_dtype), params.block_cols,
      params.zero_points ? " with zero points" : "", activation_quant_name(params.activation));
  if (params.activation == ActivationQuant::int8_per_token_group) {
    text += fmt::format(" of {} columns", params.activation_group);
  }
  return text;
}

Capability int4_group_supports_spec(const ModelSpec& spec, const QuantParams&) {
  const int64_t ks[] = {spec.hidden, spec.intermediate, spec.shared_intermediate};
  for (int64_t k : ks) {
    if (k % 2 != 0) {
      return Capability::No(fmt::format(
          "int4 packs two values per byte along K, and the layer has an odd K = {}", k));
    }
  }
  return Capability::Yes("every K (hidden, intermediate) is even, so rows pack into whole bytes");
}

}  // namespace

QuantEntry int4_group_entry() {
  return {WeightFormat::int4_group,
          int4_group_problems,
          int4_group_describe,
          int4_group_supports_spec,
          {"qweight", "scales", "qzeros"}};
}

}  // namespace moekit
