// QuantParams: the names of formats, their defaults, scale grids and validation. The named
// constructors live with their formats (unquantized.cpp, fp8_tensor.cpp, fp8_block.cpp,
// int4_group.cpp).

#include <fmt/format.h>

#include "core/names.hpp"
#include "moekit/error.hpp"
#include "moekit/quant.hpp"

namespace moekit {
namespace {

constexpr NameTable<WeightFormat, 6> kWeightFormats = {{WeightFormat::f32, "f32"},
                                                       {WeightFormat::f16, "f16"},
                                                       {WeightFormat::bf16, "bf16"},
                                                       {WeightFormat::fp8_tensor, "fp8-tensor"},
                                                       {WeightFormat::fp8_block, "fp8-block"},
                                                       {WeightFormat::int4_group, "int4-group"}};
constexpr NameTable<ActivationQuant, 5> kActivationQuants = {
    {ActivationQuant::none, "unquantized"},
    {ActivationQuant::fp8_per_token, "e4m3 per token (dynamic)"},
    {ActivationQuant::fp8_per_token_group, "e4m3 per token per group (dynamic)"},
    {ActivationQuant::fp8_static, "e4m3 with a static scale per GEMM input"},
    {ActivationQuant::int8_per_token_group, "int8 per token per group (dynamic)"}};

int64_t grid(int64_t extent, int64_t block) {
  return block == 0 ? 1 : (extent + block - 1) / block;
}

std::string block_text(int64_t block, const char* whole) {
  return block == 0 ? std::string(whole) : std::to_string(block);
}

}  // namespace

std::string_view weight_format_name(WeightFormat format) {
  return name_of(format, kWeightFormats);
}
std::optional<WeightFormat> parse_weight_format(std::string_view name) {
  return name_lookup(name, kWeightFormats);
}
std::string_view activation_quant_name(ActivationQuant quant) {
  return name_of(quant, kActivationQuants);
}

QuantParams::QuantParams(WeightFormat weight_format) {
  switch (weight_format) {
    case WeightFormat::f32:
    case WeightFormat::f16:
    case WeightFormat::bf16:
      *this = Unquantized(weight_format);
      return;
    case WeightFormat::fp8_tensor:
      *this = Fp8Tensor();
      return;
    case WeightFormat::fp8_block:
      *this = Fp8Block();
      return;
    case WeightFormat::int4_group:
      *this = Int4Group();
      return;
  }
  fail(Errc::internal, "QuantParams: unknown weight format {}", static_cast<int>(weight_format));
}

int64_t QuantParams::scale_rows(int64_t rows) const {
  return grid(rows, block_rows);
}

int64_t QuantParams::scale_cols(int64_t cols) const {
  return grid(cols, block_cols);
}

std::vector<std::string> QuantParams::problems() const {
  std::vector<std::string> found;
  const auto expect = [&](bool ok, std::string text) {
    if (!ok) found.push_back(std::move(text));
  };
  expect(block_rows >= 0 && block_cols >= 0,
         fmt::format("scale blocks must not be negative, got {} x {}", block_rows, block_cols));
  switch (format) {
    case WeightFormat::f32:
    case WeightFormat::f16:
    case WeightFormat::bf16:
      expect(*this == Unquantized(format),
             fmt::format("{} weights take no scales and no activation quantisation",
                         weight_format_name(format)));
      break;
    case WeightFormat::fp8_tensor:
      expect(weight_dtype == DType::f8e4m3 && scale_dtype == DType::f32 && !zero_points,
             "fp8-tensor stores e4m3 weights with f32 scales and no zero points");
      expect(block_cols == 0 && (block_rows == 0 || block_rows == 1),
             "fp8-tensor scales one whole matrix (blocks 0 x 0) or one output channel (1 x 0)");
      expect(
          activation == ActivationQuant::fp8_per_token || activation == ActivationQuant::fp8_static,
          "fp8-tensor quantises activations per token or with a static scale");
      break;
    case WeightFormat::fp8_block:
      expect(weight_dtype == DType::f8e4m3 && scale_dtype == DType::f32 && !zero_points,
             "fp8-block stores e4m3 weights with f32 scales and no zero points");
      expect(
          block_rows > 0 && block_cols > 0,
          fmt::format("fp8-block needs positive block sizes, got {} x {}", block_rows, block_cols));
      expect(activation == ActivationQuant::fp8_per_token_group && activation_group == block_cols,
             "fp8-block quantises activations per token per block_cols columns");
      break;
    case WeightFormat::int4_group:
      expect(weight_dtype == DType::i4, "int4-group stores i4 weights");
      expect(scale_dtype == DType::f16 || scale_dtype == DType::bf16,
             fmt::format("int4-group scales are f16 or bf16, not {}", dtype_name(scale_dtype)));
      expect(block_rows == 1 && block_cols >= 2 && block_cols % 2 == 0,
             fmt::format("int4-group needs an even group size of at least 2 along K (one scale "
                         "per row per group), got {} x {}",
                         block_rows, block_cols));
      expect(activation == ActivationQuant::none ||
                 (activation == ActivationQuant::int8_per_token_group &&
                  activation_group == block_cols),
             "int4-group leaves activations unquantised, or quantises them to int8 per token per "
             "weight group");
      break;
  }
  return found;
}

std::string QuantParams::describe() const {
  if (!quantized()) {
    return fmt::format("{} weights, activations unquantized", dtype_name(weight_dtype));
  }
  std::string text;
  if (weight_dtype == DType::i4) {
    text = fmt::format("int4 weights packed along K, one {} scale per group of {} columns{}",
                       dtype_name(scale_dtype), block_cols, zero_points ? " with zero points" : "");
  } else if (block_rows == 0 && block_cols == 0) {
    text = "e4m3 weights, one f32 scale per matrix";
  } else if (block_rows == 1 && block_cols == 0) {
    text = "e4m3 weights, one f32 scale per output channel";
  } else {
    text = fmt::format("e4m3 weights, f32 scale per {} x {} block", block_text(block_rows, "all"),
                       block_text(block_cols, "all"));
  }
  text += fmt::format(", activations {}", activation_quant_name(activation));
  if (activation == ActivationQuant::fp8_per_token_group ||
      activation == ActivationQuant::int8_per_token_group) {
    text += fmt::format(" of {} columns", activation_group);
  }
  return text;
}

std::string QuantParams::name() const {
  std::string text(weight_format_name(format));
  if (activation == ActivationQuant::int8_per_token_group) text += "-a8";
  return text;
}

}  // namespace moekit
