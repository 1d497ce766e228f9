// QuantParams: the names of formats, their defaults and scale grids. Everything else of a format
// (named constructor, validity rule, description, tensor names, the layers it can hold) lives
// in its own file (unquantized.cpp, fp8_tensor.cpp, fp8_block.cpp, int4_group.cpp), reached
// through the quant table.

#include <fmt/format.h>

#include "core/names.hpp"
#include "moekit/error.hpp"
#include "moekit/quant.hpp"
#include "quant/quant_method.hpp"

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
  if (block_rows < 0 || block_cols < 0) {
    found.push_back(
        fmt::format("scale blocks must not be negative, got {} x {}", block_rows, block_cols));
  }
  const QuantEntry* entry = find_quant(format);
  if (entry == nullptr) {
    found.push_back(
        fmt::format("no quant method for weight format {} is built", weight_format_name(format)));
    return found;
  }
  for (std::string& problem : entry->problems(*this)) found.push_back(std::move(problem));
  return found;
}

std::string QuantParams::describe() const {
  const QuantEntry* entry = find_quant(format);
  return entry == nullptr ? std::string(weight_format_name(format)) : entry->describe(*this);
}

std::string QuantParams::name() const {
  std::string text(weight_format_name(format));
  if (activation == ActivationQuant::int8_per_token_group) text += "-a8";
  return text;
}

}  // namespace moekit
