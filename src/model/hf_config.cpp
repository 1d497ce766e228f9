#include "moekit/hf_config.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/names.hpp"
#include "model/config_reader.hpp"
#include "model/families/families.hpp"
#include "moekit/error.hpp"

namespace moekit {
namespace {

using nlohmann::json;

constexpr NameTable<ModelFamily, 8> kFamilies = {
    {ModelFamily::deepseek_v2, "deepseek_v2"}, {ModelFamily::deepseek_v3, "deepseek_v3"},
    {ModelFamily::qwen2_moe, "qwen2_moe"},     {ModelFamily::qwen3_moe, "qwen3_moe"},
    {ModelFamily::qwen3_next, "qwen3_next"},   {ModelFamily::mixtral, "mixtral"},
    {ModelFamily::glm4_moe, "glm4_moe"},       {ModelFamily::olmoe, "olmoe"}};

// model_type values as config.json files write them. Kimi-K2 ships DeepSeek-V3's architecture
// under its own name.
constexpr NameTable<ModelFamily, 9> kModelTypes = {{ModelFamily::deepseek_v2, "deepseek_v2"},
                                                   {ModelFamily::deepseek_v3, "deepseek_v3"},
                                                   {ModelFamily::deepseek_v3, "kimi_k2"},
                                                   {ModelFamily::qwen2_moe, "qwen2_moe"},
                                                   {ModelFamily::qwen3_moe, "qwen3_moe"},
                                                   {ModelFamily::qwen3_next, "qwen3_next"},
                                                   {ModelFamily::mixtral, "mixtral"},
                                                   {ModelFamily::glm4_moe, "glm4_moe"},
                                                   {ModelFamily::olmoe, "olmoe"}};

constexpr NameTable<DType, 3> kTorchDtypes = {
    {DType::bf16, "bfloat16"}, {DType::f16, "float16"}, {DType::f32, "float32"}};

void read_family(ConfigReader& reader, HfModelConfig& config) {
  switch (config.family) {
    case ModelFamily::deepseek_v2:
      return read_deepseek_v2(reader, config);
    case ModelFamily::deepseek_v3:
      return read_deepseek_v3(reader, config);
    case ModelFamily::qwen2_moe:
      return read_qwen2_moe(reader, config);
    case ModelFamily::qwen3_moe:
      return read_qwen3_moe(reader, config);
    case ModelFamily::qwen3_next:
      return read_qwen3_next(reader, config);
    case ModelFamily::mixtral:
      return read_mixtral(reader, config);
    case ModelFamily::glm4_moe:
      return read_glm4_moe(reader, config);
    case ModelFamily::olmoe:
      return read_olmoe(reader, config);
  }
  fail(Errc::internal, "no reader for model family {}", static_cast<int>(config.family));
}

Activation read_activation(ConfigReader& reader, std::string_view family) {
  const std::string act = reader.string("hidden_act", "silu");
  if (act != "silu") {
    reader.refuse("hidden_act '{}' is not supported; moekit runs {} experts with 'silu' (gated)",
                  act, family);
  }
  return Activation::SiluGated();
}

DType read_weight_dtype(ConfigReader& reader) {
  // transformers 4.56 and later write "dtype" where earlier versions wrote "torch_dtype".
  const char* key = reader.aliased("torch_dtype", "dtype");
  const std::string name = reader.string(key, "bfloat16");
  if (auto dtype = name_lookup(name, kTorchDtypes)) return *dtype;
  reader.refuse("{} '{}' is not supported (moekit reads {} checkpoints)", key, name,
                name_list(kTorchDtypes));
}

// Module names a checkpoint keeps unquantised. moekit holds all experts of a layer in one
// format, so a list that names experts is refused; anything else (lm_head, attention) is not
// the MoE layer's business.
void check_unquantized_modules(ConfigReader& quant, ConfigReader& reader, const char* key) {
  for (const std::string& module : quant.string_list(key)) {
    // Routers ("mlp.gate", "block_sparse_moe.gate") and Qwen2-MoE's shared_expert_gate are
    // float in every checkpoint and read as floats; expert projections are not.
    const bool shared_gate = module.ends_with("shared_expert_gate");
    if (module.find("experts") != std::string::npos ||
        (module.find("shared_expert") != std::string::npos && !shared_gate)) {
      reader.refuse(
          "quantization_config.{} keeps '{}' unquantised; moekit needs every expert of a "
          "layer in one format",
          key, module);
    }
  }
}

constexpr const char* kQuantFormats =
    "moekit reads fp8 e4m3 with 2-D block scales (weight_block_size) or one scale per matrix";

std::optional<QuantParams> read_quantization(ConfigReader& reader) {
  if (reader.object("compression_config") != nullptr) {
    reader.refuse("quantization 'compressed-tensors' is not supported ({})", kQuantFormats);
  }
  const json* object = reader.object("quantization_config");
  if (object == nullptr) return std::nullopt;
  ConfigReader quant(*object, reader.label() + ": quantization_config");
  if (!quant.has("quant_method")) quant.refuse("missing key 'quant_method'");
  const std::string method = quant.string("quant_method", std::nullopt);
  if (method != "fp8") {
    reader.refuse("quantization '{}' is not supported ({})", method, kQuantFormats);
  }
  const std::string format = quant.string("fmt", "e4m3");
  if (format != "e4m3") {
    reader.refuse("quantization fp8 with fmt '{}' is not supported (moekit reads e4m3)", format);
  }
  const std::string scheme = quant.string("activation_scheme", "dynamic");
  if (scheme != "dynamic" && scheme != "static") {
    quant.refuse("activation_scheme '{}' is not supported (moekit reads 'dynamic' or 'static')",
                 scheme);
  }
  check_unquantized_modules(quant, reader, "modules_to_not_convert");
  check_unquantized_modules(quant, reader, "ignored_layers");
  const std::vector<int> block = quant.integer_list("weight_block_size");
  for (const std::string& key : quant.unread()) {
    quant.refuse("key '{}' is not understood; moekit does not guess what it changes", key);
  }
  QuantParams params;
  if (!quant.has("weight_block_size") || object->at("weight_block_size").is_null()) {
    // Per-tensor fp8 (AutoFP8 / llm-compressor layout): one weight_scale per matrix, and an
    // input_scale per GEMM input when activations are static.
    params = QuantParams::Fp8Tensor(Fp8Scaling::per_tensor, scheme == "static"
                                                                ? Fp8Activations::static_
                                                                : Fp8Activations::dynamic);
  } else {
    if (block.size() != 2 || block[0] <= 0 || block[1] <= 0) {
      quant.refuse("weight_block_size must be two positive integers [rows, cols]");
    }
    if (scheme == "static") {
      quant.refuse(
          "fp8 blocks with activation_scheme 'static' are not supported (moekit quantises the "
          "activations of block-scaled weights per token per block, dynamically)");
    }
    params = QuantParams::Fp8Block(block[1]);
    params.block_rows = block[0];
  }
  if (const auto problems = params.problems(); !problems.empty()) {
    fail(Errc::internal, "{}: quantization_config read as inconsistent parameters: {}",
         reader.label(), problems.front());
  }
  return params;
}

std::string join(const std::vector<std::string>& items) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : "; ") + item;
  return text;
}

HfModelConfig parse_object(const json& object, std::string_view label) {
  ConfigReader reader(object, std::string(label));
  HfModelConfig config;
  if (!reader.has("model_type")) reader.refuse("missing key 'model_type'");
  config.model_type = reader.string("model_type", std::nullopt);
  const auto family = name_lookup(config.model_type, kModelTypes);
  if (!family) {
    reader.refuse("unknown model family '{}' (known: {})", config.model_type,
                  name_list(kModelTypes));
  }
  config.family = *family;
  reader.set_family(config.model_type);
  read_family(reader, config);
  config.spec.name = std::string(family_name(config.family));
  config.spec.activation = read_activation(reader, config.model_type);
  config.weight_dtype = read_weight_dtype(reader);
  config.quant = read_quantization(reader);
  config.ignored = reader.unread();

  if (const auto problems = config.spec.problems(); !problems.empty()) {
    reader.refuse("the MoE layer it describes is impossible: {}", join(problems));
  }
  if (config.moe_layers().empty()) {
    reader.refuse("none of its num_hidden_layers = {} layers is MoE{}", config.num_layers,
                  config.num_layers > 0 ? fmt::format(" (layer {}: {})", config.num_layers - 1,
                                                      config.dense_reason(config.num_layers - 1))
                                        : std::string());
  }
  return config;
}

}  // namespace

std::string_view family_name(ModelFamily family) {
  return name_of(family, kFamilies);
}

ExpertTensorNames MoeTensorNames::expert(int e) const {
  if (e < 0 || e >= n_experts) {
    fail(Errc::invalid_argument, "expert {} is outside the {} experts of '{}'", e, n_experts,
         expert_prefix);
  }
  const std::string module = expert_prefix + std::to_string(e) + ".";
  return {module + expert_leaf.gate, module + expert_leaf.up, module + expert_leaf.down};
}

std::string HfModelConfig::dense_reason(int layer) const {
  if (layer < 0 || layer >= num_layers) {
    return fmt::format("layer {} is outside num_hidden_layers = {}", layer, num_layers);
  }
  if (layer < layers.first_k_dense_replace) {
    return fmt::format("first_k_dense_replace = {}", layers.first_k_dense_replace);
  }
  if (layer % layers.moe_layer_freq != 0) {
    return fmt::format("moe_layer_freq = {}", layers.moe_layer_freq);
  }
  if ((layer + 1) % layers.decoder_sparse_step != 0) {
    return fmt::format("decoder_sparse_step = {}", layers.decoder_sparse_step);
  }
  const auto& dense = layers.mlp_only_layers;
  if (std::find(dense.begin(), dense.end(), layer) != dense.end()) {
    return fmt::format("mlp_only_layers holds {}", layer);
  }
  return "";
}

bool HfModelConfig::is_moe_layer(int layer) const {
  return dense_reason(layer).empty();
}

std::vector<int> HfModelConfig::moe_layers() const {
  std::vector<int> found;
  for (int layer = 0; layer < num_layers; ++layer) {
    if (is_moe_layer(layer)) found.push_back(layer);
  }
  return found;
}

MoeTensorNames HfModelConfig::tensor_names(int layer) const {
  if (const std::string reason = dense_reason(layer); !reason.empty()) {
    fail(Errc::invalid_argument, "layer {} of this {} model has no MoE weights: {}", layer,
         model_type, reason);
  }
  MoeTensorNames names;
  const std::string block = family == ModelFamily::mixtral
                                ? fmt::format("model.layers.{}.block_sparse_moe.", layer)
                                : fmt::format("model.layers.{}.mlp.", layer);
  names.router = block + "gate.weight";
  if (spec.routing.correction_bias) names.correction_bias = block + "gate.e_score_correction_bias";
  if (spec.n_shared > 0) {
    const std::string shared = block + (spec.shared_gate ? "shared_expert." : "shared_experts.");
    names.shared =
        ExpertTensorNames{shared + "gate_proj", shared + "up_proj", shared + "down_proj"};
  }
  if (spec.shared_gate) names.shared_gate = block + "shared_expert_gate.weight";
  names.expert_prefix = block + "experts.";
  names.expert_leaf = family == ModelFamily::mixtral
                          ? ExpertTensorNames{"w1", "w3", "w2"}
                          : ExpertTensorNames{"gate_proj", "up_proj", "down_proj"};
  names.n_experts = spec.n_experts;
  return names;
}

HfModelConfig HfModelConfig::parse(std::string_view json_text, std::string_view label) {
  json object;
  try {
    object = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    fail(Errc::invalid_argument, "{}: not valid JSON: {}", label, e.what());
  }
  if (!object.is_object())
    fail(Errc::invalid_argument, "{}: the top level must be an object", label);
  return parse_object(object, label);
}

HfModelConfig HfModelConfig::from_directory(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream file(path, std::ios::binary);
  if (!file) fail(Errc::io, "cannot open '{}'", path);
  std::stringstream text;
  text << file.rdbuf();
  if (file.bad()) fail(Errc::io, "cannot read '{}'", path);
  return parse(text.str(), path);
}

}  // namespace moekit
