#pragma once
// Tiny Hugging Face checkpoints of each MoE family in the hub's layout, for tests that run the
// `moekit` command on them: config.json spelled as the family's published config.json spells it,
// and safetensors files holding the MoE layers' tensors under the hub's names, in bf16 or in FP8
// with 128 x 128 block scales (weight_scale_inv), in one file or in shards listed by
// model.safetensors.index.json.
//
// The tensor names are written here from the hub's layout, apart from the library's own naming,
// and every stored tensor keeps the values it means (fp8 weights times their block scales), so a
// test computes its reference from what was written without reading the files back.

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "moekit/dtype.hpp"
#include "moekit/hf_config.hpp"
#include "moekit/quant.hpp"
#include "moekit/safetensors.hpp"
#include "moekit/tensor.hpp"
#include "support/run_moekit.hpp"

namespace moekit::test {

inline constexpr int64_t kFp8Block = 128;

// One tensor as a safetensors file stores it: dtype, shape and little-endian bytes.
struct StoredTensor {
  DType dtype = DType::bf16;
  Shape shape;
  std::vector<uint8_t> bytes;

  // `values` rounded to `dtype` (any float type, or i32 by value).
  static StoredTensor of(const std::vector<float>& values, DType dtype, Shape shape) {
    StoredTensor t{
        dtype, shape,
        std::vector<uint8_t>(static_cast<size_t>(dtype_storage_bytes(dtype, shape.numel())))};
    if (dtype == DType::i32) {
      std::vector<int32_t> ints(values.begin(), values.end());
      std::memcpy(t.bytes.data(), ints.data(), t.bytes.size());
    } else {
      convert_from_f32(values.data(), shape.numel(), t.bytes.data(), dtype);
    }
    return t;
  }

  TensorView view() const {
    return TensorView::contiguous(const_cast<uint8_t*>(bytes.data()), dtype, shape);
  }
  std::vector<double> values() const {
    std::vector<float> f(static_cast<size_t>(shape.numel()));
    convert_to_f32(bytes.data(), dtype, shape.numel(), f.data());
    return {f.begin(), f.end()};
  }
};

using TensorMap = std::map<std::string, StoredTensor>;

inline void write_tensor_file(const std::filesystem::path& path, const TensorMap& tensors) {
  std::vector<std::pair<std::string, TensorView>> views;
  for (const auto& [name, tensor] : tensors) views.emplace_back(name, tensor.view());
  write_safetensors(path.string(), views, {{"format", "pt"}});
}

enum class HfWeights { bf16, fp8_block };

// The hub's names of one MoE layer's tensors: module paths without ".weight".
struct HubNames {
  std::string block;  // "model.layers.1.mlp." or "model.layers.1.block_sparse_moe."
  std::string gate_leaf, up_leaf, down_leaf;
  std::optional<std::string> shared;  // "...mlp.shared_experts." / "...mlp.shared_expert."

  std::string router() const { return block + "gate"; }
  std::string correction_bias() const { return block + "gate.e_score_correction_bias"; }
  std::string shared_gate() const { return block + "shared_expert_gate"; }
  std::string expert(int e) const { return fmt::format("{}experts.{}.", block, e); }
};

// A tiny model of one family: its sizes and routing, as its config.json states them.
struct TinyHfModel {
  std::string label;
  ModelFamily family = ModelFamily::deepseek_v3;
  int64_t hidden = 160;
  int64_t intermediate = 96;  // each routed expert's
  int experts = 16;
  int top_k = 4;
  int n_group = 1;
  int topk_group = 1;
  std::string topk_method;  // deepseek_v2: "greedy" or "group_limited_greedy"
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  int n_shared_experts = 0;              // DeepSeek/GLM: one MLP this many routed widths wide
  int64_t qwen_shared_intermediate = 0;  // Qwen2-MoE's and Qwen3-Next's gated shared expert
  int num_layers = 3;
  int first_k_dense_replace = 0;  // layers below it are dense MLPs
  HfWeights weights = HfWeights::bf16;
  int shards = 1;

  // DeepSeek-V2 as the 236B model routes: group_limited_greedy, scaled, not renormalised.
  static TinyHfModel deepseek_v2_grouped() {
    TinyHfModel m;
    m.label = "deepseek_v2_grouped";
    m.family = ModelFamily::deepseek_v2;
    m.n_group = 4;
    m.topk_group = 2;
    m.topk_method = "group_limited_greedy";
    m.norm_topk_prob = false;
    m.routed_scaling_factor = 16.0;
    m.n_shared_experts = 2;
    m.first_k_dense_replace = 1;
    return m;
  }
  // DeepSeek-V2 greedy and renormalised: the scaling factor it states must then not apply.
  static TinyHfModel deepseek_v2_greedy() {
    TinyHfModel m;
    m.label = "deepseek_v2_greedy";
    m.family = ModelFamily::deepseek_v2;
    m.experts = 8;
    m.top_k = 3;
    m.topk_method = "greedy";
    m.norm_topk_prob = true;
    m.routed_scaling_factor = 2.0;
    m.n_shared_experts = 1;
    m.first_k_dense_replace = 1;
    return m;
  }
  static TinyHfModel deepseek_v3() {
    TinyHfModel m;
    m.label = "deepseek_v3";
    m.family = ModelFamily::deepseek_v3;
    m.n_group = 4;
    m.topk_group = 2;
    m.routed_scaling_factor = 2.5;
    m.n_shared_experts = 1;
    m.first_k_dense_replace = 1;
    return m;
  }
  static TinyHfModel qwen2_moe() {
    TinyHfModel m;
    m.label = "qwen2_moe";
    m.family = ModelFamily::qwen2_moe;
    m.experts = 8;
    m.top_k = 2;
    m.norm_topk_prob = false;
    m.qwen_shared_intermediate = 192;
    return m;
  }
  static TinyHfModel qwen3_moe() {
    TinyHfModel m;
    m.label = "qwen3_moe";
    m.family = ModelFamily::qwen3_moe;
    return m;
  }
  static TinyHfModel qwen3_next() {
    TinyHfModel m;
    m.label = "qwen3_next";
    m.family = ModelFamily::qwen3_next;
    m.experts = 24;
    m.top_k = 5;
    m.qwen_shared_intermediate = 64;
    return m;
  }
  // OLMoE as published: not renormalised.
  static TinyHfModel olmoe() {
    TinyHfModel m;
    m.label = "olmoe";
    m.family = ModelFamily::olmoe;
    m.norm_topk_prob = false;
    return m;
  }
  static TinyHfModel mixtral() {
    TinyHfModel m;
    m.label = "mixtral";
    m.family = ModelFamily::mixtral;
    m.experts = 8;
    m.top_k = 2;
    return m;
  }
  static TinyHfModel glm4_moe() {
    TinyHfModel m;
    m.label = "glm4_moe";
    m.family = ModelFamily::glm4_moe;
    m.top_k = 3;
    m.n_group = 4;
    m.topk_group = 2;
    m.routed_scaling_factor = 2.5;
    m.n_shared_experts = 1;
    m.first_k_dense_replace = 1;
    return m;
  }

  TinyHfModel fp8() const {
    TinyHfModel m = *this;
    m.weights = HfWeights::fp8_block;
    m.label += "_fp8";
    return m;
  }
  TinyHfModel sharded(int files) const {
    TinyHfModel m = *this;
    m.shards = files;
    m.label += fmt::format("_{}_shards", files);
    return m;
  }

  bool is_fp8() const { return weights == HfWeights::fp8_block; }
  bool has_shared() const { return n_shared_experts > 0 || qwen_shared_intermediate > 0; }
  int64_t shared_intermediate() const {
    return qwen_shared_intermediate > 0 ? qwen_shared_intermediate
                                        : intermediate * n_shared_experts;
  }
  bool has_correction_bias() const {
    return family == ModelFamily::deepseek_v3 || family == ModelFamily::glm4_moe;
  }

  HubNames names(int layer) const {
    const bool mixtral_layout = family == ModelFamily::mixtral;
    HubNames n;
    n.block =
        fmt::format("model.layers.{}.{}.", layer, mixtral_layout ? "block_sparse_moe" : "mlp");
    n.gate_leaf = mixtral_layout ? "w1" : "gate_proj";
    n.up_leaf = mixtral_layout ? "w3" : "up_proj";
    n.down_leaf = mixtral_layout ? "w2" : "down_proj";
    if (n_shared_experts > 0) n.shared = n.block + "shared_experts.";
    if (qwen_shared_intermediate > 0) n.shared = n.block + "shared_expert.";
    return n;
  }

  // config.json with the keys and spellings of the family's published config.json, attention
  // and vocabulary keys included (the reader must set them aside).
  nlohmann::json config() const {
    using nlohmann::json;
    json c = {{"hidden_act", "silu"},
              {"hidden_size", hidden},
              {"num_hidden_layers", num_layers},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 4},
              {"max_position_embeddings", 4096},
              {"rms_norm_eps", 1e-6},
              {"rope_theta", 10000},
              {"tie_word_embeddings", false},
              {"torch_dtype", "bfloat16"},
              {"transformers_version", "4.46.0"},
              {"use_cache", true},
              {"vocab_size", 1024},
              {"num_experts_per_tok", top_k}};
    switch (family) {
      case ModelFamily::deepseek_v2:
      case ModelFamily::deepseek_v3:
      case ModelFamily::glm4_moe: {
        const bool v2 = family == ModelFamily::deepseek_v2;
        const bool glm = family == ModelFamily::glm4_moe;
        c["model_type"] = std::string(family_name(family));
        c["architectures"] = {v2    ? "DeepseekV2ForCausalLM"
                              : glm ? "Glm4MoeForCausalLM"
                                    : "DeepseekV3ForCausalLM"};
        c["intermediate_size"] = 2 * intermediate;
        c["moe_intermediate_size"] = intermediate;
        c["n_routed_experts"] = experts;
        c["n_shared_experts"] = n_shared_experts;
        c["n_group"] = n_group;
        c["topk_group"] = topk_group;
        c["norm_topk_prob"] = norm_topk_prob;
        c["routed_scaling_factor"] = routed_scaling_factor;
        c["first_k_dense_replace"] = first_k_dense_replace;
        if (glm) {
          c["head_dim"] = 40;
          c["partial_rotary_factor"] = 0.5;
          c["use_qk_norm"] = false;
          c["attention_bias"] = true;
        } else {
          c["moe_layer_freq"] = 1;
          c["scoring_func"] = v2 ? "softmax" : "sigmoid";
          c["topk_method"] = v2 ? topk_method : "noaux_tc";
          c["aux_loss_alpha"] = 0.001;
          c["seq_aux"] = true;
          c["kv_lora_rank"] = 32;
          c["q_lora_rank"] = nullptr;
          c["qk_nope_head_dim"] = 16;
          c["qk_rope_head_dim"] = 8;
          c["v_head_dim"] = 16;
        }
        break;
      }
      case ModelFamily::qwen2_moe:
      case ModelFamily::qwen3_moe:
      case ModelFamily::qwen3_next: {
        const bool qwen2 = family == ModelFamily::qwen2_moe;
        const bool next = family == ModelFamily::qwen3_next;
        c["model_type"] = std::string(family_name(family));
        c["architectures"] = {qwen2  ? "Qwen2MoeForCausalLM"
                              : next ? "Qwen3NextForCausalLM"
                                     : "Qwen3MoeForCausalLM"};
        c["intermediate_size"] = 2 * intermediate;
        c["moe_intermediate_size"] = intermediate;
        c["num_experts"] = experts;
        c["norm_topk_prob"] = norm_topk_prob;
        c["decoder_sparse_step"] = 1;
        c["mlp_only_layers"] = json::array();
        c["output_router_logits"] = false;
        c["router_aux_loss_coef"] = 0.001;
        if (qwen2 || next) {
          c["shared_expert_intermediate_size"] = qwen_shared_intermediate;
          c["use_sliding_window"] = false;
        }
        if (next) {
          c["full_attention_interval"] = 4;
          c["linear_num_value_heads"] = 8;
          c["partial_rotary_factor"] = 0.25;
        } else if (!qwen2) {
          c["head_dim"] = 40;
          c["attention_bias"] = false;
        }
        break;
      }
      case ModelFamily::olmoe:
        c["model_type"] = "olmoe";
        c["architectures"] = {"OlmoeForCausalLM"};
        c["intermediate_size"] = intermediate;
        c["num_experts"] = experts;
        c["norm_topk_prob"] = norm_topk_prob;
        c["clip_qkv"] = nullptr;
        c["router_aux_loss_coef"] = 0.01;
        break;
      case ModelFamily::mixtral:
        c["model_type"] = "mixtral";
        c["architectures"] = {"MixtralForCausalLM"};
        c["intermediate_size"] = intermediate;
        c["num_local_experts"] = experts;
        c["router_aux_loss_coef"] = 0.02;
        c["sliding_window"] = nullptr;
        break;
    }
    if (is_fp8()) {
      c["quantization_config"] = {{"quant_method", "fp8"},
                                  {"activation_scheme", "dynamic"},
                                  {"fmt", "e4m3"},
                                  {"weight_block_size", {kFp8Block, kFp8Block}}};
    }
    return c;
  }
};

// A written-or-about-to-be-written checkpoint: config.json, every tensor by hub name, and how
// many shard files to spread them over. Tests of bad checkpoints edit these before writing.
class HfCheckpoint {
 public:
  nlohmann::json config;
  TensorMap tensors;
  int shards = 1;

  // Random weights of the scale of a trained layer (outputs and logits of order one), for every
  // MoE layer, plus the dense layers' MLP and each layer's norm, as a model file holds them.
  static HfCheckpoint random(const TinyHfModel& model, uint64_t seed) {
    HfCheckpoint c;
    c.config = model.config();
    c.shards = model.shards;
    std::mt19937_64 rng(seed);
    const int64_t H = model.hidden;
    for (int layer = 0; layer < model.num_layers; ++layer) {
      c.tensors[fmt::format("model.layers.{}.input_layernorm.weight", layer)] =
          StoredTensor::of(std::vector<float>(static_cast<size_t>(H), 1.0f), DType::bf16, {H});
      if (layer < model.first_k_dense_replace) {
        c.add_mlp(model, fmt::format("model.layers.{}.mlp.", layer), "gate_proj", "up_proj",
                  "down_proj", 2 * model.intermediate, rng);
        continue;
      }
      const HubNames n = model.names(layer);
      c.tensors[n.router() + ".weight"] =
          StoredTensor::of(normal({model.experts, H}, 1.0 / std::sqrt(double(H)), rng), DType::bf16,
                           {model.experts, H});
      if (model.has_correction_bias()) {
        c.tensors[n.correction_bias()] =
            StoredTensor::of(normal({model.experts}, 0.05, rng), DType::f32, {model.experts});
      }
      for (int e = 0; e < model.experts; ++e) {
        c.add_mlp(model, n.expert(e), n.gate_leaf, n.up_leaf, n.down_leaf, model.intermediate, rng);
      }
      if (n.shared) {
        c.add_mlp(model, *n.shared, "gate_proj", "up_proj", "down_proj",
                  model.shared_intermediate(), rng);
      }
      if (model.qwen_shared_intermediate > 0) {
        c.tensors[n.shared_gate() + ".weight"] =
            StoredTensor::of(normal({1, H}, 1.0 / std::sqrt(double(H)), rng), DType::bf16, {1, H});
      }
    }
    return c;
  }

  // The float64 values of matrix `module` ("...experts.3.gate_proj"): its weight, times its
  // block scales when it has weight_scale_inv.
  std::vector<double> matrix(const std::string& module) const {
    const StoredTensor& weight = tensors.at(module + ".weight");
    std::vector<double> values = weight.values();
    const auto scale = tensors.find(module + ".weight_scale_inv");
    if (scale == tensors.end()) return values;
    const std::vector<double> s = scale->second.values();
    const int64_t rows = weight.shape[0], cols = weight.shape[1];
    const int64_t scale_cols = (cols + kFp8Block - 1) / kFp8Block;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < cols; ++k) {
        values[static_cast<size_t>(r * cols + k)] *=
            s[static_cast<size_t>(r / kFp8Block * scale_cols + k / kFp8Block)];
      }
    }
    return values;
  }

  // Shard file i of n, as the hub names them.
  static std::string shard_name(int i, int n) {
    return fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
  }

  // config.json and model.safetensors, or `shards` files of consecutive tensor names with
  // model.safetensors.index.json.
  void write(const std::filesystem::path& dir) const {
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "config.json") << config.dump(2);
    if (shards <= 1) {
      write_tensor_file(dir / "model.safetensors", tensors);
      return;
    }
    std::vector<TensorMap> files(static_cast<size_t>(shards));
    nlohmann::json weight_map = nlohmann::json::object();
    int64_t total = 0;
    size_t i = 0;
    for (const auto& [name, tensor] : tensors) {
      const int shard = static_cast<int>(i++ * static_cast<size_t>(shards) / tensors.size());
      files[static_cast<size_t>(shard)][name] = tensor;
      weight_map[name] = shard_name(shard, shards);
      total += static_cast<int64_t>(tensor.bytes.size());
    }
    for (int s = 0; s < shards; ++s) {
      write_tensor_file(dir / shard_name(s, shards), files[static_cast<size_t>(s)]);
    }
    const nlohmann::json index = {{"metadata", {{"total_size", total}}},
                                  {"weight_map", weight_map}};
    std::ofstream(dir / "model.safetensors.index.json") << index.dump(2);
  }

 private:
  static std::vector<float> normal(Shape shape, double stddev, std::mt19937_64& rng) {
    std::normal_distribution<float> dist(0.0f, static_cast<float>(stddev));
    std::vector<float> v(static_cast<size_t>(shape.numel()));
    for (float& x : v) x = dist(rng);
    return v;
  }

  // A gated MLP of width `inner`: gate and up [inner, H], down [H, inner], in the model's
  // weight format.
  void add_mlp(const TinyHfModel& model, const std::string& prefix, const std::string& gate,
               const std::string& up, const std::string& down, int64_t inner,
               std::mt19937_64& rng) {
    const int64_t H = model.hidden;
    const auto add = [&](const std::string& leaf, int64_t rows, int64_t cols) {
      const std::vector<float> w = normal({rows, cols}, 1.0 / std::sqrt(double(cols)), rng);
      const std::string name = prefix + leaf;
      if (!model.is_fp8()) {
        tensors[name + ".weight"] = StoredTensor::of(w, DType::bf16, {rows, cols});
        return;
      }
      const QuantizedMatrices q = quantize_matrices(
          TensorView::contiguous(const_cast<float*>(w.data()), DType::f32, {1, rows, cols}), 1,
          QuantParams::Fp8Block(kFp8Block));
      const TensorView qw = q.weight.view(), qs = q.scale.view();
      tensors[name + ".weight"] = {
          DType::f8e4m3,
          {rows, cols},
          {q.weight.data<uint8_t>(), q.weight.data<uint8_t>() + qw.nbytes()}};
      tensors[name + ".weight_scale_inv"] = {
          DType::f32,
          {qs.dim(1), qs.dim(2)},
          {q.scale.data<uint8_t>(), q.scale.data<uint8_t>() + qs.nbytes()}};
    };
    add(gate, inner, H);
    add(up, inner, H);
    add(down, H, inner);
  }
};

// A fresh directory named after the running test, removed with everything in it.
class TestDir {
 public:
  TestDir() {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = fmt::format("moekit_hf_{}_{}_{}", test->test_suite_name(), test->name(),
                                   std::random_device{}());
    std::replace(name.begin(), name.end(), '/', '_');
    path_ = std::filesystem::path(::testing::TempDir()) / name;
    std::filesystem::create_directories(path_);
  }
  TestDir(const TestDir&) = delete;
  TestDir& operator=(const TestDir&) = delete;
  ~TestDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace moekit::test
