#include "quant/quant_method.hpp"

#include "moekit/error.hpp"
#include "quant/check.hpp"
#include "quant/quantize.hpp"

namespace moekit {

const std::vector<QuantEntry>& quant_table() {
  static const std::vector<QuantEntry> table = {
      unquantized_entry(WeightFormat::f32),
      unquantized_entry(WeightFormat::f16),
      unquantized_entry(WeightFormat::bf16),
      fp8_tensor_entry(),
      fp8_block_entry(),
      int4_group_entry(),
  };
  return table;
}

const QuantEntry* find_quant(WeightFormat format) {
  for (const QuantEntry& entry : quant_table()) {
    if (entry.format == format) return &entry;
  }
  return nullptr;
}

std::vector<TensorSpec> weight_tensors(const QuantParams& params, int slots, int64_t hidden,
                                       int64_t intermediate) {
  const QuantEntry* entry = find_quant(params.format);
  if (entry == nullptr) {
    fail(Errc::internal, "no quant method for weight format {}", weight_format_name(params.format));
  }
  std::vector<TensorSpec> specs;
  const auto add = [&](const char* stack, int parts, int64_t rows, int64_t cols) {
    specs.push_back({fmt::format("{}_{}", stack, entry->names.weight), params.weight_dtype,
                     Shape{slots, parts * rows, cols}});
    const Shape grid{slots, parts * params.scale_rows(rows), params.scale_cols(cols)};
    if (params.quantized()) {
      specs.push_back({fmt::format("{}_{}", stack, entry->names.scale), params.scale_dtype, grid});
    }
    if (params.zero_points) {
      specs.push_back({fmt::format("{}_{}", stack, entry->names.zero), DType::i8, grid});
    }
  };
  add("w13", 2, intermediate, hidden);
  add("w2", 1, hidden, intermediate);
  return specs;
}

int64_t weight_bytes(const QuantParams& params, int slots, int64_t hidden, int64_t intermediate) {
  int64_t bytes = 0;
  for (const TensorSpec& t : weight_tensors(params, slots, hidden, intermediate)) {
    bytes += dtype_storage_bytes(t.dtype, t.shape.numel());
  }
  return bytes;
}

QuantMethod::QuantMethod(const QuantParams& params, Device device,
                         std::unique_ptr<WeightPacker> packer)
    : params_(params), device_(device), packer_(std::move(packer)) {}

QuantMethod::Canonical QuantMethod::create_canonical(int slots, Device device) const {
  Canonical c;
  for (const TensorSpec& spec : weight_tensors(params_, slots, hidden_, intermediate_)) {
    c.tensors.push_back(Tensor::empty(spec.dtype, spec.shape, device));
  }
  // weight_tensors() lists each stack as weight, then scale and zero where the format has them.
  const int per_stack = 1 + (params_.quantized() ? 1 : 0) + (params_.zero_points ? 1 : 0);
  const auto stack = [&](int first, int parts) {
    StoredMatrices m;
    m.weight = c.tensors[first].view();
    if (params_.quantized()) m.scale = c.tensors[first + 1].view();
    if (params_.zero_points) m.zero = c.tensors[first + 2].view();
    m.parts = parts;
    return m;
  };
  c.w13 = stack(0, 2);
  c.w2 = stack(per_stack, 1);
  return c;
}

void QuantMethod::create_weights(int slots, int64_t hidden, int64_t intermediate) {
  hidden_ = hidden;
  intermediate_ = intermediate;
  weights_ = CoreWeights{};
  weights_.quant = params_;
  if (packer_) {
    weights_.packed = &packer_->packed();
    return;
  }
  canonical_ = create_canonical(slots, device_);
  weights_.w13 = canonical_.w13;
  weights_.w2 = canonical_.w2;
}

void QuantMethod::load_expert(int slot, const MatrixSource& gate, const MatrixSource& up,
                              const MatrixSource& down) {
  // Quantising and copying write host memory; a packer packs from a one-slot host copy.
  const bool staged = packer_ != nullptr || device_.kind != DeviceKind::cpu;
  Canonical one = staged ? create_canonical(1, Device::cpu()) : Canonical{};
  const StoredMatrices& w13 = staged ? one.w13 : weights_.w13;
  const StoredMatrices& w2 = staged ? one.w2 : weights_.w2;
  const int into = staged ? 0 : slot;
  const auto load = [&](const MatrixSource& src, const StoredMatrices& dst, int part,
                        const char* name) {
    if (is_float_weight(src.weight.dtype)) {
      quantize_into(params_, src.weight, dst, into, part, fmt::format("slot {} {}", slot, name));
    } else {
      copy_into(params_, src, dst, into, part);
    }
  };
  load(gate, w13, 0, "gate");
  load(up, w13, 1, "up");
  load(down, w2, 0, "down");
  if (packer_) {
    packer_->pack(slot, w13, w2);
  } else if (staged) {
    for (size_t t = 0; t < one.tensors.size(); ++t) {
      copy(canonical_.tensors[t].view().narrow(0, slot, 1), one.tensors[t].view());
    }
  }
}

void QuantMethod::set_input_scales(float w13, float w2) {
  weights_.w13_input_scale = w13;
  weights_.w2_input_scale = w2;
  if (device_.kind != DeviceKind::cpu) {
    float scales[2] = {w13, w2};
    device_input_scales_ = Tensor::empty(DType::f32, {2}, device_);
    copy(device_input_scales_, TensorView::contiguous(scales, DType::f32, {2}));
    weights_.device_input_scales = device_input_scales_.data<float>();
  }
}

CoreWeights QuantMethod::apply() const {
  return weights_;
}

}  // namespace moekit
