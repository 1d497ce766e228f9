#include "moekit/checkpoint.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "moekit/error.hpp"
#include "quant/quant_method.hpp"

namespace moekit {
namespace {

// The moekit dtype of a safetensors dtype name, for the dtypes an MoE layer's tensors come in.
std::optional<DType> dtype_of(std::string_view safetensors_name) {
  if (safetensors_name == "F32") return DType::f32;
  if (safetensors_name == "BF16") return DType::bf16;
  if (safetensors_name == "F16") return DType::f16;
  if (safetensors_name == "F8_E4M3") return DType::f8e4m3;
  return std::nullopt;
}

std::string list(std::initializer_list<DType> dtypes) {
  std::string text;
  for (DType d : dtypes) text += fmt::format("{}{}", text.empty() ? "" : ", ", dtype_name(d));
  return text;
}

// Tensor `name` checked against the dtypes it may have and the shape it must have (a scale
// grid of one element may also be stored as [] or [1]), then copied into `out`. Copying rather
// than viewing the mapped file also reads tensors that a writer left unaligned.
DType read_tensor(const CheckpointFiles& files, const std::string& name,
                  std::initializer_list<DType> allowed, Shape want, std::vector<uint8_t>& out) {
  if (!files.contains(name)) {
    fail(Errc::invalid_argument, "checkpoint {}: missing tensor '{}'", files.directory(), name);
  }
  const SafetensorsEntry& entry = files.entry(name);
  const std::optional<DType> dtype = dtype_of(entry.dtype_name);
  if (!dtype || std::find(allowed.begin(), allowed.end(), *dtype) == allowed.end()) {
    fail(Errc::invalid_argument, "{}: tensor '{}' has dtype {}, expected {}", files.file_of(name),
         name, entry.dtype_name, list(allowed));
  }
  const bool single = want.numel() == 1 && entry.shape.numel() == 1 && entry.shape.rank <= 1;
  if (!(entry.shape == want) && !single) {
    fail(Errc::invalid_argument, "{}: tensor '{}' has shape {}, expected {}", files.file_of(name),
         name, entry.shape.str(), want.str());
  }
  const std::span<const uint8_t> bytes = files.bytes(name);
  out.assign(bytes.begin(), bytes.end());
  return *dtype;
}

std::vector<float> read_f32(const CheckpointFiles& files, const std::string& name, Shape want) {
  std::vector<uint8_t> bytes;
  const DType dtype = read_tensor(files, name, {DType::f32, DType::bf16, DType::f16}, want, bytes);
  std::vector<float> values(static_cast<size_t>(want.numel()));
  convert_to_f32(bytes.data(), dtype, want.numel(), values.data());
  return values;
}

// One expert of a checkpoint as the layer takes it: gate and up copied one after the other
// into w13 [1, 2N, K], down into w2 [1, K, N], with their scale grids when quantised.
class CheckpointExperts final : public LayerWeightSource {
 public:
  CheckpointExperts(const CheckpointFiles& files, const HfModelConfig& config, int layer,
                    const QuantParams& stored)
      : files_(files),
        names_(config.tensor_names(layer)),
        spec_(config.spec),
        stored_(stored),
        scale_name_(stored.quantized() ? find_quant(stored.format)->names.scale : nullptr) {}

  ExpertWeights routed(int expert) override {
    return read_expert(names_.expert(expert), spec_.intermediate,
                       names_.expert_prefix + std::to_string(expert));
  }
  ExpertWeights shared(int index) override {
    if (!names_.shared || index != 0) {
      fail(Errc::internal, "the checkpoint's layer has no shared expert {}", index);
    }
    return read_expert(*names_.shared, spec_.shared_intermediate, "shared expert");
  }
  TensorView correction_bias() override {
    if (!names_.correction_bias) return {};
    bias_ = read_f32(files_, *names_.correction_bias, {spec_.n_experts});
    return TensorView::contiguous(bias_.data(), DType::f32, {spec_.n_experts});
  }
  TensorView shared_gate() override {
    if (!names_.shared_gate) return {};
    gate_ = read_f32(files_, *names_.shared_gate, {1, spec_.hidden});
    return TensorView::contiguous(gate_.data(), DType::f32, {1, spec_.hidden});
  }

 private:
  struct Matrix {
    std::vector<uint8_t> weight, scale;
    DType weight_dtype = DType::bf16, scale_dtype = DType::f32;
  };

  ExpertWeights read_expert(const ExpertTensorNames& names, int64_t inner, std::string origin) {
    const int64_t H = spec_.hidden;
    read_matrix(names.gate, inner, H, gate_m_);
    read_matrix(names.up, inner, H, up_m_);
    read_matrix(names.down, H, inner, down_m_);
    if (gate_m_.weight_dtype != up_m_.weight_dtype) {
      fail(Errc::invalid_argument, "{}: gate ({}) and up ({}) weights differ in dtype", origin,
           dtype_name(gate_m_.weight_dtype), dtype_name(up_m_.weight_dtype));
    }
    ExpertWeights out;
    out.origin = std::move(origin);
    out.w13 = stack(gate_m_, &up_m_, inner, H, w13_weight_, w13_scale_);
    out.w2 = stack(down_m_, nullptr, H, inner, w2_weight_, w2_scale_);
    return out;
  }

  void read_matrix(const std::string& prefix, int64_t rows, int64_t cols, Matrix& m) {
    if (stored_.quantized()) {
      m.weight_dtype =
          read_tensor(files_, prefix + ".weight", {stored_.weight_dtype}, {rows, cols}, m.weight);
      const Shape grid{stored_.scale_rows(rows), stored_.scale_cols(cols)};
      const std::string scale = prefix + "." + scale_name_;
      const DType dtype = read_tensor(files_, scale, {DType::f32, DType::bf16}, grid, m.scale);
      if (dtype != DType::f32) {
        std::vector<float> widened(static_cast<size_t>(grid.numel()));
        convert_to_f32(m.scale.data(), dtype, grid.numel(), widened.data());
        m.scale.resize(widened.size() * sizeof(float));
        std::memcpy(m.scale.data(), widened.data(), m.scale.size());
      }
      m.scale_dtype = DType::f32;
    } else {
      m.weight_dtype = read_tensor(files_, prefix + ".weight",
                                   {DType::bf16, DType::f16, DType::f32}, {rows, cols}, m.weight);
    }
  }

  // The matrices `first` and, when given, `second` ([rows, cols] each) as one [1, parts * rows,
  // cols] stack in `weight`, with their scale grids stacked the same way in `scale`.
  ExpertMatrices stack(const Matrix& first, const Matrix* second, int64_t rows, int64_t cols,
                       std::vector<uint8_t>& weight, std::vector<uint8_t>& scale) const {
    const int64_t parts = second ? 2 : 1;
    weight = first.weight;
    if (second) weight.insert(weight.end(), second->weight.begin(), second->weight.end());
    ExpertMatrices m;
    m.weight = TensorView::contiguous(weight.data(), first.weight_dtype, {1, parts * rows, cols});
    if (stored_.quantized()) {
      scale = first.scale;
      if (second) scale.insert(scale.end(), second->scale.begin(), second->scale.end());
      m.scale =
          TensorView::contiguous(scale.data(), DType::f32,
                                 {1, parts * stored_.scale_rows(rows), stored_.scale_cols(cols)});
    }
    return m;
  }

  const CheckpointFiles& files_;
  MoeTensorNames names_;
  ModelSpec spec_;
  QuantParams stored_;
  const char* scale_name_;
  Matrix gate_m_, up_m_, down_m_;
  std::vector<uint8_t> w13_weight_, w13_scale_, w2_weight_, w2_scale_;
  std::vector<float> bias_, gate_;
};

}  // namespace

RouterGate::RouterGate(const TensorView& weight, int64_t experts, int64_t hidden,
                       const std::string& name)
    : weight_(static_cast<size_t>(experts * hidden)), experts_(experts), hidden_(hidden) {
  if (!(weight.shape == Shape{experts, hidden})) {
    fail(Errc::invalid_argument, "router weight '{}': expected shape [{}, {}], got {}", name,
         experts, hidden, weight.shape.str());
  }
  convert_to_f32(weight.data, weight.dtype, experts * hidden, weight_.data());
  for (size_t i = 0; i < weight_.size(); ++i) {
    if (!std::isfinite(weight_[i])) {
      fail(Errc::invalid_argument, "router weight '{}': element [{}, {}] is {}", name,
           static_cast<int64_t>(i) / hidden, static_cast<int64_t>(i) % hidden, weight_[i]);
    }
  }
}

void RouterGate::logits(const TensorView& hidden, const TensorView& out) const {
  const int64_t T = hidden.dim(0);
  if (hidden.rank() != 2 || hidden.dim(1) != hidden_ || !hidden.is_contiguous()) {
    fail(Errc::invalid_argument, "hidden_states: expected contiguous [T, {}], got {}", hidden_,
         hidden.describe());
  }
  if (!(out.shape == Shape{T, experts_}) || out.dtype != DType::f32 || !out.is_contiguous()) {
    fail(Errc::internal, "router logits: expected f32[{}, {}], got {}", T, experts_,
         out.describe());
  }
  std::vector<float> row(static_cast<size_t>(hidden_));
  auto* logits = out.as<float>();
  const auto* base = static_cast<const char*>(hidden.data);
  for (int64_t t = 0; t < T; ++t) {
    convert_to_f32(base + dtype_storage_bytes(hidden.dtype, t * hidden_), hidden.dtype, hidden_,
                   row.data());
    for (int64_t e = 0; e < experts_; ++e) {
      const float* w = weight_.data() + e * hidden_;
      double sum = 0.0;
      for (int64_t h = 0; h < hidden_; ++h) sum += double{row[h]} * w[h];
      logits[t * experts_ + e] = static_cast<float>(sum);
    }
  }
}

Checkpoint Checkpoint::open(const std::string& directory) {
  HfModelConfig config = HfModelConfig::from_directory(directory);
  return Checkpoint(std::move(config), CheckpointFiles::open(directory));
}

ModelSpec Checkpoint::spec(int layer) const {
  config_.tensor_names(layer);  // refuses dense and out-of-range layers, naming why
  ModelSpec spec = config_.spec;
  spec.name = fmt::format("{} layer {}", config_.spec.name, layer);
  return spec;
}

QuantParams Checkpoint::stored_format(int layer) const {
  if (config_.quant) return *config_.quant;
  const std::string name = config_.tensor_names(layer).expert(0).gate + ".weight";
  if (!files_.contains(name)) {
    fail(Errc::invalid_argument, "checkpoint {}: missing tensor '{}'", directory(), name);
  }
  const std::string& stored = files_.entry(name).dtype_name;
  const std::optional<DType> dtype = dtype_of(stored);
  if (!dtype || *dtype == DType::f8e4m3) {
    fail(Errc::invalid_argument,
         "{}: tensor '{}' has dtype {}, but config.json declares no quantization; float expert "
         "weights are F32, BF16 or F16",
         files_.file_of(name), name, stored);
  }
  switch (*dtype) {
    case DType::f32:
      return WeightFormat::f32;
    case DType::f16:
      return WeightFormat::f16;
    default:
      return WeightFormat::bf16;
  }
}

QuantParams Checkpoint::format_for(int layer, const std::optional<QuantParams>& requested) const {
  const QuantParams stored = stored_format(layer);
  if (!requested) return stored;
  if (stored.quantized() && requested->describe() != stored.describe()) {
    fail(Errc::config_refused,
         "the checkpoint stores {} expert weights; moekit quantises float weights only, so it "
         "cannot load them as {}",
         stored.describe(), requested->describe());
  }
  return *requested;
}

std::vector<std::string> Checkpoint::required_tensors(int layer, const QuantParams& stored) const {
  const MoeTensorNames names = config_.tensor_names(layer);
  std::vector<std::string> required{names.router};
  if (names.correction_bias) required.push_back(*names.correction_bias);
  if (names.shared_gate) required.push_back(*names.shared_gate);
  const auto add = [&](const ExpertTensorNames& expert) {
    for (const std::string* prefix : {&expert.gate, &expert.up, &expert.down}) {
      required.push_back(*prefix + ".weight");
      if (stored.quantized()) {
        required.push_back(*prefix + "." + find_quant(stored.format)->names.scale);
      }
    }
  };
  for (int e = 0; e < config_.spec.n_experts; ++e) add(names.expert(e));
  if (names.shared) add(*names.shared);
  return required;
}

MoeLayer Checkpoint::load(int layer, const Plan& plan) const {
  const QuantParams stored = stored_format(layer);
  for (const std::string& name : required_tensors(layer, stored)) {
    if (!files_.contains(name)) {
      fail(Errc::invalid_argument, "checkpoint {}: missing tensor '{}' of layer {}", directory(),
           name, layer);
    }
  }
  CheckpointExperts source(files_, config_, layer, stored);
  return MoeLayer(plan, source);
}

RouterGate Checkpoint::router(int layer) const {
  const std::string name = config_.tensor_names(layer).router;
  const std::vector<float> weight =
      read_f32(files_, name, {config_.spec.n_experts, config_.spec.hidden});
  return RouterGate(TensorView::contiguous(const_cast<float*>(weight.data()), DType::f32,
                                           {config_.spec.n_experts, config_.spec.hidden}),
                    config_.spec.n_experts, config_.spec.hidden, name);
}

}  // namespace moekit
