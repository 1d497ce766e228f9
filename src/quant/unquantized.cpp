// Unquantized weights: f32, f16 or bf16 stored as the format says; source weights of another
// float type are converted once, at load time (bf16 and f16 round to nearest even).

#include <fmt/format.h>

#include "moekit/error.hpp"
#include "quant/quant_method.hpp"

namespace moekit {

QuantParams QuantParams::Unquantized(WeightFormat format) {
  QuantParams params;
  params.format = format;
  switch (format) {
    case WeightFormat::f32:
      params.weight_dtype = DType::f32;
      break;
    case WeightFormat::f16:
      params.weight_dtype = DType::f16;
      break;
    case WeightFormat::bf16:
      params.weight_dtype = DType::bf16;
      break;
    default:
      fail(Errc::internal, "QuantParams::Unquantized takes f32, f16 or bf16, not {}",
           weight_format_name(format));
  }
  return params;
}

namespace {

std::vector<std::string> unquantized_problems(const QuantParams& params) {
  if (params == QuantParams::Unquantized(params.format)) return {};
  return {fmt::format("{} weights take no scales and no activation quantisation",
                      weight_format_name(params.format))};
}

std::string unquantized_describe(const QuantParams& params) {
  return fmt::format("{} weights, activations unquantized", dtype_name(params.weight_dtype));
}

Capability unquantized_supports_spec(const ModelSpec&, const QuantParams&) {
  return Capability::Yes("any shape");
}

}  // namespace

QuantEntry unquantized_entry(WeightFormat format) {
  return {format,
          unquantized_problems,
          unquantized_describe,
          unquantized_supports_spec,
          {"weight", nullptr, nullptr}};
}

}  // namespace moekit
