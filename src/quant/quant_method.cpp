#include "quant/quant_method.hpp"

#include "moekit/error.hpp"
#include "quant/check.hpp"
#include "quant/quantize.hpp"

namespace moekit {

const std::vector<QuantEntry>& quant_table() {
  static const std::vector<QuantEntry> table = {
      {WeightFormat::f32,
       unquantized_supports_runner,
       unquantized_supports_spec,
       {"weight", nullptr, nullptr}},
      {WeightFormat::f16,
       unquantized_supports_runner,
       unquantized_supports_spec,
       {"weight", nullptr, nullptr}},
      {WeightFormat::bf16,
       unquantized_supports_runner,
       unquantized_supports_spec,
       {"weight", nullptr, nullptr}},
      {WeightFormat::fp8_tensor,
       fp8_tensor_supports_runner,
       fp8_tensor_supports_spec,
       {"weight", "weight_scale", nullptr}},
      {WeightFormat::fp8_block,
       fp8_block_supports_runner,
       fp8_block_supports_spec,
       {"weight", "weight_scale_inv", nullptr}},
      {WeightFormat::int4_group,
       int4_group_supports_runner,
       int4_group_supports_spec,
       {"qweight", "scales", "qzeros"}},
  };
  return table;
}

const QuantEntry* find_quant(WeightFormat format) {
  for (const QuantEntry& entry : quant_table()) {
    if (entry.format == format) return &entry;
  }
  return nullptr;
}

QuantMethod::QuantMethod(const QuantParams& params)
    : params_(params), entry_(find_quant(params.format)) {
  if (entry_ == nullptr) {
    fail(Errc::internal, "no quant method for weight format {}", weight_format_name(params.format));
  }
}

void QuantMethod::create_weights(int slots, int64_t hidden, int64_t intermediate) {
  const auto allocate = [&](Tensor(&t)[3], int parts, int64_t rows, int64_t cols) {
    t[0] = Tensor::empty(params_.weight_dtype, {slots, parts * rows, cols});
    const Shape grid{slots, parts * params_.scale_rows(rows), params_.scale_cols(cols)};
    if (params_.quantized()) t[1] = Tensor::empty(params_.scale_dtype, grid);
    if (params_.zero_points) t[2] = Tensor::empty(DType::i8, grid);
    return StoredMatrices{t[0].view(), t[1].view(), t[2].view(), parts};
  };
  weights_.w13 = allocate(w13_, 2, intermediate, hidden);
  weights_.w2 = allocate(w2_, 1, hidden, intermediate);
  weights_.quant = params_;
}

void QuantMethod::load_expert(int slot, const MatrixSource& gate, const MatrixSource& up,
                              const MatrixSource& down) {
  const auto load = [&](const MatrixSource& src, const StoredMatrices& dst, int part,
                        const char* name) {
    if (is_float_weight(src.weight.dtype)) {
      quantize_into(params_, src.weight, dst, slot, part, fmt::format("slot {} {}", slot, name));
    } else {
      copy_into(params_, src, dst, slot, part);
    }
  };
  load(gate, weights_.w13, 0, "gate");
  load(up, weights_.w13, 1, "up");
  load(down, weights_.w2, 0, "down");
}

void QuantMethod::set_input_scales(float w13, float w2) {
  weights_.w13_input_scale = w13;
  weights_.w2_input_scale = w2;
}

CoreWeights QuantMethod::apply() const {
  return weights_;
}

std::vector<std::pair<std::string, TensorView>> QuantMethod::tensors() const {
  std::vector<std::pair<std::string, TensorView>> named;
  const auto add = [&](const char* stack, const Tensor(&t)[3]) {
    const char* names[3] = {entry_->names.weight, entry_->names.scale, entry_->names.zero};
    for (int i = 0; i < 3; ++i) {
      if (names[i] != nullptr && t[i].view().data != nullptr) {
        named.emplace_back(fmt::format("{}_{}", stack, names[i]), t[i].view());
      }
    }
  };
  add("w13", w13_);
  add("w2", w2_);
  return named;
}

}  // namespace moekit
