#include "moekit/hf_config.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/published_configs.hpp"
#include "moekit/error.hpp"

namespace moekit {
namespace {

using nlohmann::json;
namespace cfg = testing_configs;

// `base` with each top-level key of `changes` set to its value (null included, unlike a merge
// patch, because null is a value config.json files hold).
std::string with(const char* base, const json& changes) {
  json object = json::parse(base);
  for (const auto& [key, value] : changes.items()) object[key] = value;
  return object.dump();
}

std::string without(const char* base, const char* key) {
  json object = json::parse(base);
  object.erase(key);
  return object.dump();
}

// Runs `action`, expects a moekit::Error of `code`, and returns its message.
std::string error_message(const std::function<void()>& action, Errc code) {
  try {
    action();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << "message: " << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-moekit exception: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

std::vector<int> range(int first, int end) {
  std::vector<int> layers;
  for (int layer = first; layer < end; ++layer) layers.push_back(layer);
  return layers;
}

void expect_same_spec(const ModelSpec& got, const ModelSpec& want) {
  EXPECT_EQ(got.name, want.name);
  EXPECT_EQ(got.hidden, want.hidden);
  EXPECT_EQ(got.intermediate, want.intermediate);
  EXPECT_EQ(got.n_experts, want.n_experts);
  EXPECT_EQ(got.routing.scoring, want.routing.scoring);
  EXPECT_EQ(got.routing.top_k, want.routing.top_k);
  EXPECT_EQ(got.routing.correction_bias, want.routing.correction_bias);
  EXPECT_EQ(got.routing.n_group, want.routing.n_group);
  EXPECT_EQ(got.routing.topk_group, want.routing.topk_group);
  EXPECT_EQ(got.routing.group_score, want.routing.group_score);
  EXPECT_EQ(got.routing.renormalize, want.routing.renormalize);
  EXPECT_EQ(got.routing.routed_scaling_factor, want.routing.routed_scaling_factor);
  EXPECT_EQ(got.n_shared, want.n_shared);
  EXPECT_EQ(got.shared_intermediate, want.shared_intermediate);
  EXPECT_EQ(got.shared_gate, want.shared_gate);
  EXPECT_EQ(got.activation.kind, want.activation.kind);
}

ModelSpec make_spec(const char* name, int64_t hidden, int64_t intermediate, int experts,
                    RoutingSpec routing, int64_t shared_intermediate = 0,
                    bool shared_gate = false) {
  ModelSpec spec;
  spec.name = name;
  spec.hidden = hidden;
  spec.intermediate = intermediate;
  spec.n_experts = experts;
  spec.routing = routing;
  spec.n_shared = shared_intermediate > 0 ? 1 : 0;
  spec.shared_intermediate = shared_intermediate;
  spec.shared_gate = shared_gate;
  spec.activation = Activation::SiluGated();
  return spec;
}

template <typename Case>
std::string case_name(const ::testing::TestParamInfo<Case>& param) {
  return param.param.name;
}

// ---------------------------------------------------------------------------------------------
// The published configs, read whole

struct PublishedCase {
  const char* name;
  const char* text;
  ModelFamily family;
  int num_layers;
  std::vector<int> moe_layers;
  ModelSpec spec;
  std::optional<QuantParams> quant;
};

std::ostream& operator<<(std::ostream& out, const PublishedCase& c) {
  return out << c.name;
}

const std::vector<PublishedCase>& published_cases() {
  static const std::vector<PublishedCase> cases = {
      {"DeepSeekV2Lite", cfg::kDeepseekV2Lite, ModelFamily::deepseek_v2, 27, range(1, 27),
       make_spec("deepseek_v2", 2048, 1408, 64, {.scoring = Scoring::softmax, .top_k = 6},
                 2 * 1408),
       std::nullopt},
      {"DeepSeekV2", cfg::kDeepseekV2, ModelFamily::deepseek_v2, 60, range(1, 60),
       make_spec("deepseek_v2", 5120, 1536, 160,
                 {.scoring = Scoring::softmax,
                  .top_k = 6,
                  .n_group = 8,
                  .topk_group = 3,
                  .group_score = GroupScore::max,
                  .routed_scaling_factor = 16.0f},
                 2 * 1536),
       std::nullopt},
      {"DeepSeekV3", cfg::kDeepseekV3, ModelFamily::deepseek_v3, 61, range(3, 61),
       make_spec("deepseek_v3", 7168, 2048, 256,
                 {.scoring = Scoring::sigmoid,
                  .top_k = 8,
                  .correction_bias = true,
                  .n_group = 8,
                  .topk_group = 4,
                  .group_score = GroupScore::top2_sum,
                  .renormalize = true,
                  .routed_scaling_factor = 2.5f},
                 2048),
       QuantParams::Fp8Block(128)},
      {"Qwen15MoeA27B", cfg::kQwen15MoeA27B, ModelFamily::qwen2_moe, 24, range(0, 24),
       make_spec("qwen2_moe", 2048, 1408, 60, {.scoring = Scoring::softmax, .top_k = 4}, 5632,
                 true),
       std::nullopt},
      {"Qwen3_30B_A3B", cfg::kQwen3_30B_A3B, ModelFamily::qwen3_moe, 48, range(0, 48),
       make_spec("qwen3_moe", 2048, 768, 128,
                 {.scoring = Scoring::softmax, .top_k = 8, .renormalize = true}),
       std::nullopt},
      {"Qwen3Next80B", cfg::kQwen3Next80B, ModelFamily::qwen3_next, 48, range(0, 48),
       make_spec("qwen3_next", 2048, 512, 512,
                 {.scoring = Scoring::softmax, .top_k = 10, .renormalize = true}, 512, true),
       std::nullopt},
      {"Olmoe1B7B", cfg::kOlmoe1B7B, ModelFamily::olmoe, 16, range(0, 16),
       make_spec("olmoe", 2048, 1024, 64, {.scoring = Scoring::softmax, .top_k = 8}), std::nullopt},
      {"Mixtral8x7B", cfg::kMixtral8x7B, ModelFamily::mixtral, 32, range(0, 32),
       make_spec("mixtral", 4096, 14336, 8,
                 {.scoring = Scoring::softmax, .top_k = 2, .renormalize = true}),
       std::nullopt},
      {"Glm45Air", cfg::kGlm45Air, ModelFamily::glm4_moe, 46, range(1, 46),
       make_spec("glm4_moe", 4096, 1408, 128,
                 {.scoring = Scoring::sigmoid,
                  .top_k = 8,
                  .correction_bias = true,
                  .group_score = GroupScore::top2_sum,
                  .renormalize = true},
                 1408),
       std::nullopt},
  };
  return cases;
}

class PublishedConfig : public ::testing::TestWithParam<PublishedCase> {};

TEST_P(PublishedConfig, ReadsFamilyLayersSpecAndFormat) {
  const PublishedCase& c = GetParam();
  const HfModelConfig config = HfModelConfig::parse(c.text);
  EXPECT_EQ(config.family, c.family);
  EXPECT_EQ(config.model_type, family_name(c.family));
  EXPECT_EQ(config.num_layers, c.num_layers);
  EXPECT_EQ(config.moe_layers(), c.moe_layers);
  expect_same_spec(config.spec, c.spec);
  EXPECT_TRUE(config.spec.problems().empty());
  EXPECT_EQ(config.quant, c.quant);
  EXPECT_EQ(config.weight_dtype, DType::bf16);
}

TEST_P(PublishedConfig, SetsAsideKeysThatDoNotShapeTheMoeLayer) {
  const HfModelConfig config = HfModelConfig::parse(GetParam().text);
  for (const char* key : {"vocab_size", "num_attention_heads", "rms_norm_eps", "architectures"}) {
    EXPECT_NE(std::find(config.ignored.begin(), config.ignored.end(), key), config.ignored.end())
        << key;
  }
  for (const char* key : {"model_type", "hidden_size", "num_experts_per_tok", "hidden_act",
                          "torch_dtype", "num_hidden_layers"}) {
    EXPECT_EQ(std::find(config.ignored.begin(), config.ignored.end(), key), config.ignored.end())
        << key;
  }
}

INSTANTIATE_TEST_SUITE_P(HfConfig, PublishedConfig, ::testing::ValuesIn(published_cases()),
                         case_name<PublishedCase>);

// ---------------------------------------------------------------------------------------------
// Family semantics

TEST(HfConfig, KimiK2ReadsAsDeepseekV3) {
  const HfModelConfig config =
      HfModelConfig::parse(with(cfg::kDeepseekV3, {{"model_type", "kimi_k2"},
                                                   {"n_routed_experts", 384},
                                                   {"n_group", 1},
                                                   {"topk_group", 1},
                                                   {"first_k_dense_replace", 1},
                                                   {"routed_scaling_factor", 2.827}}));
  EXPECT_EQ(config.family, ModelFamily::deepseek_v3);
  EXPECT_EQ(config.model_type, "kimi_k2");
  EXPECT_EQ(config.spec.name, "deepseek_v3");
  EXPECT_EQ(config.spec.n_experts, 384);
  EXPECT_EQ(config.spec.routing.routed_scaling_factor, 2.827f);
  EXPECT_EQ(config.moe_layers(), range(1, 61));
}

TEST(HfConfig, DeepseekV2ScalesOnlyWhenItDoesNotRenormalise) {
  const HfModelConfig normalised = HfModelConfig::parse(
      with(cfg::kDeepseekV2, {{"norm_topk_prob", true}, {"routed_scaling_factor", 16.0}}));
  EXPECT_TRUE(normalised.spec.routing.renormalize);
  EXPECT_EQ(normalised.spec.routing.routed_scaling_factor, 1.0f);

  const HfModelConfig scaled =
      HfModelConfig::parse(with(cfg::kDeepseekV2, {{"norm_topk_prob", false}}));
  EXPECT_FALSE(scaled.spec.routing.renormalize);
  EXPECT_EQ(scaled.spec.routing.routed_scaling_factor, 16.0f);
}

TEST(HfConfig, DeepseekRenormalisesOnlyAboveTopOne) {
  for (const char* base : {cfg::kDeepseekV2, cfg::kDeepseekV3}) {
    const HfModelConfig config = HfModelConfig::parse(
        with(base, {{"norm_topk_prob", true}, {"num_experts_per_tok", 1}, {"topk_group", 8}}));
    EXPECT_FALSE(config.spec.routing.renormalize) << config.model_type;
    EXPECT_NE(config.spec.routing.routed_scaling_factor, 1.0f) << config.model_type;
  }
}

TEST(HfConfig, DeepseekV3ScalesAfterRenormalising) {
  const HfModelConfig config =
      HfModelConfig::parse(with(cfg::kDeepseekV3, {{"routed_scaling_factor", 1.5}}));
  EXPECT_TRUE(config.spec.routing.renormalize);
  EXPECT_EQ(config.spec.routing.routed_scaling_factor, 1.5f);
}

TEST(HfConfig, Glm4MoeRenormalisesEvenATopOneChoice) {
  const HfModelConfig config =
      HfModelConfig::parse(with(cfg::kGlm45Air, {{"num_experts_per_tok", 1}}));
  EXPECT_TRUE(config.spec.routing.renormalize);
}

TEST(HfConfig, DeepseekV2GreedyIgnoresTheGroupKeys) {
  const HfModelConfig config =
      HfModelConfig::parse(with(cfg::kDeepseekV2Lite, {{"n_group", 4}, {"topk_group", 2}}));
  EXPECT_EQ(config.spec.routing.n_group, 1);
  EXPECT_EQ(config.spec.routing.topk_group, 1);
  EXPECT_NE(std::find(config.ignored.begin(), config.ignored.end(), "n_group"),
            config.ignored.end());
}

TEST(HfConfig, DeepseekV2AcceptsDeepseeksOwnSpellingOfGreedy) {
  const HfModelConfig config =
      HfModelConfig::parse(with(cfg::kDeepseekV2Lite, {{"topk_method", "gready"}}));
  EXPECT_EQ(config.spec.routing.n_group, 1);
}

TEST(HfConfig, DeepseekSharedExpertsAreOneWiderMlp) {
  const std::vector<std::pair<json, int>> cases = {{3, 3 * 2048}, {0, 0}, {nullptr, 0}};
  for (const auto& [shared, want_width] : cases) {
    const HfModelConfig config =
        HfModelConfig::parse(with(cfg::kDeepseekV3, {{"n_shared_experts", shared}}));
    EXPECT_EQ(config.spec.n_shared, want_width > 0 ? 1 : 0) << shared;
    EXPECT_EQ(config.spec.shared_intermediate, want_width) << shared;
  }
}

TEST(HfConfig, Qwen2MoeWithoutSharedExpertHasNoGate) {
  const HfModelConfig config =
      HfModelConfig::parse(with(cfg::kQwen15MoeA27B, {{"shared_expert_intermediate_size", 0}}));
  EXPECT_EQ(config.spec.n_shared, 0);
  EXPECT_FALSE(config.spec.shared_gate);
}

TEST(HfConfig, AbsentKeysTakeTheReferenceDefaults) {
  const HfModelConfig v3 = HfModelConfig::parse(R"({"model_type": "deepseek_v3"})");
  expect_same_spec(v3.spec, make_spec("deepseek_v3", 7168, 2048, 256,
                                      {.scoring = Scoring::sigmoid,
                                       .top_k = 8,
                                       .correction_bias = true,
                                       .n_group = 8,
                                       .topk_group = 4,
                                       .group_score = GroupScore::top2_sum,
                                       .renormalize = true,
                                       .routed_scaling_factor = 2.5f},
                                      2048));
  EXPECT_EQ(v3.moe_layers(), range(3, 61));
  EXPECT_EQ(v3.weight_dtype, DType::bf16);
  EXPECT_FALSE(v3.quant.has_value());

  const HfModelConfig qwen3 = HfModelConfig::parse(R"({"model_type": "qwen3_moe"})");
  expect_same_spec(qwen3.spec, make_spec("qwen3_moe", 2048, 768, 128,
                                         {.scoring = Scoring::softmax, .top_k = 8}));
  EXPECT_EQ(qwen3.num_layers, 24);

  const HfModelConfig qwen2 = HfModelConfig::parse(R"({"model_type": "qwen2_moe"})");
  expect_same_spec(qwen2.spec, make_spec("qwen2_moe", 2048, 1408, 60,
                                         {.scoring = Scoring::softmax, .top_k = 4}, 5632, true));

  const HfModelConfig next = HfModelConfig::parse(R"({"model_type": "qwen3_next"})");
  expect_same_spec(
      next.spec,
      make_spec("qwen3_next", 2048, 512, 512,
                {.scoring = Scoring::softmax, .top_k = 10, .renormalize = true}, 512, true));
  EXPECT_EQ(next.num_layers, 48);

  const HfModelConfig olmoe = HfModelConfig::parse(R"({"model_type": "olmoe"})");
  expect_same_spec(olmoe.spec,
                   make_spec("olmoe", 2048, 2048, 64, {.scoring = Scoring::softmax, .top_k = 8}));
  EXPECT_EQ(olmoe.num_layers, 16);

  const HfModelConfig mixtral = HfModelConfig::parse(R"({"model_type": "mixtral"})");
  expect_same_spec(mixtral.spec,
                   make_spec("mixtral", 4096, 14336, 8,
                             {.scoring = Scoring::softmax, .top_k = 2, .renormalize = true}));

  const HfModelConfig glm = HfModelConfig::parse(R"({"model_type": "glm4_moe"})");
  expect_same_spec(glm.spec, make_spec("glm4_moe", 4096, 1408, 128,
                                       {.scoring = Scoring::sigmoid,
                                        .top_k = 8,
                                        .correction_bias = true,
                                        .group_score = GroupScore::top2_sum,
                                        .renormalize = true},
                                       1408));
  EXPECT_EQ(glm.moe_layers(), range(1, 46));

  const HfModelConfig v2 = HfModelConfig::parse(R"({"model_type": "deepseek_v2",
                                                    "num_experts_per_tok": 6})");
  expect_same_spec(v2.spec, make_spec("deepseek_v2", 4096, 1407, 64,
                                      {.scoring = Scoring::softmax, .top_k = 6}, 2 * 1407));
  EXPECT_EQ(v2.moe_layers(), range(0, 32));
}

TEST(HfConfig, ExpertCountAliasesOfTheConfigClassesAreRead) {
  const HfModelConfig v3 = HfModelConfig::parse(
      with(without(cfg::kDeepseekV3, "n_routed_experts").c_str(), {{"num_local_experts", 64}}));
  EXPECT_EQ(v3.spec.n_experts, 64);
  const HfModelConfig mixtral = HfModelConfig::parse(
      with(without(cfg::kMixtral8x7B, "num_local_experts").c_str(), {{"num_experts", 4}}));
  EXPECT_EQ(mixtral.spec.n_experts, 4);
  // transformers 5 writes Qwen-MoE's count under the Mixtral name.
  const HfModelConfig qwen3 = HfModelConfig::parse(
      with(without(cfg::kQwen3_30B_A3B, "num_experts").c_str(), {{"num_local_experts", 32}}));
  EXPECT_EQ(qwen3.spec.n_experts, 32);
}

TEST(HfConfig, TheNewerDtypeKeyIsRead) {
  const HfModelConfig config = HfModelConfig::parse(
      with(without(cfg::kMixtral8x7B, "torch_dtype").c_str(), {{"dtype", "float16"}}));
  EXPECT_EQ(config.weight_dtype, DType::f16);
}

// ---------------------------------------------------------------------------------------------
// Which layers are MoE, and why not

TEST(HfConfig, DenseReasonNamesTheKeyThatMadeALayerDense) {
  const struct {
    const char* base;
    json changes;
    int layer;
    const char* reason;
  } cases[] = {
      {cfg::kDeepseekV3, json::object(), 2, "first_k_dense_replace = 3"},
      {cfg::kDeepseekV3, json::object(), 3, ""},
      {cfg::kDeepseekV2, {{"moe_layer_freq", 2}}, 3, "moe_layer_freq = 2"},
      {cfg::kDeepseekV2, {{"moe_layer_freq", 2}}, 4, ""},
      {cfg::kQwen3_30B_A3B, {{"decoder_sparse_step", 2}}, 0, "decoder_sparse_step = 2"},
      {cfg::kQwen3_30B_A3B, {{"decoder_sparse_step", 2}}, 1, ""},
      {cfg::kQwen15MoeA27B, {{"mlp_only_layers", {0, 5}}}, 5, "mlp_only_layers holds 5"},
      {cfg::kMixtral8x7B, json::object(), 31, ""},
      {cfg::kMixtral8x7B, json::object(), 32, "layer 32 is outside num_hidden_layers = 32"},
      {cfg::kMixtral8x7B, json::object(), -1, "layer -1 is outside num_hidden_layers = 32"},
  };
  for (const auto& c : cases) {
    const HfModelConfig config = HfModelConfig::parse(with(c.base, c.changes));
    EXPECT_EQ(config.dense_reason(c.layer), c.reason) << c.changes << " layer " << c.layer;
    EXPECT_EQ(config.is_moe_layer(c.layer), std::string(c.reason).empty());
  }
}

TEST(HfConfig, QwenSparseStepCountsLayersFromOne) {
  const HfModelConfig config = HfModelConfig::parse(
      with(cfg::kQwen3_30B_A3B, {{"decoder_sparse_step", 4}, {"num_hidden_layers", 12}}));
  EXPECT_EQ(config.moe_layers(), (std::vector<int>{3, 7, 11}));
}

// ---------------------------------------------------------------------------------------------
// Tensor names

TEST(HfConfig, DeepseekV3LayerNamesItsGateBiasSharedAndRoutedExperts) {
  const MoeTensorNames names = HfModelConfig::parse(cfg::kDeepseekV3).tensor_names(3);
  EXPECT_EQ(names.router, "model.layers.3.mlp.gate.weight");
  EXPECT_EQ(names.correction_bias, "model.layers.3.mlp.gate.e_score_correction_bias");
  ASSERT_TRUE(names.shared.has_value());
  EXPECT_EQ(*names.shared, (ExpertTensorNames{"model.layers.3.mlp.shared_experts.gate_proj",
                                              "model.layers.3.mlp.shared_experts.up_proj",
                                              "model.layers.3.mlp.shared_experts.down_proj"}));
  EXPECT_FALSE(names.shared_gate.has_value());
  EXPECT_EQ(names.expert(7), (ExpertTensorNames{"model.layers.3.mlp.experts.7.gate_proj",
                                                "model.layers.3.mlp.experts.7.up_proj",
                                                "model.layers.3.mlp.experts.7.down_proj"}));
  EXPECT_EQ(names.expert(255).down, "model.layers.3.mlp.experts.255.down_proj");
}

TEST(HfConfig, Qwen2MoeLayerNamesItsSingularSharedExpertAndItsGate) {
  const MoeTensorNames names = HfModelConfig::parse(cfg::kQwen15MoeA27B).tensor_names(0);
  EXPECT_EQ(names.router, "model.layers.0.mlp.gate.weight");
  EXPECT_FALSE(names.correction_bias.has_value());
  ASSERT_TRUE(names.shared.has_value());
  EXPECT_EQ(names.shared->up, "model.layers.0.mlp.shared_expert.up_proj");
  EXPECT_EQ(names.shared_gate, "model.layers.0.mlp.shared_expert_gate.weight");
  EXPECT_EQ(names.expert(59).gate, "model.layers.0.mlp.experts.59.gate_proj");
}

TEST(HfConfig, Qwen3MoeLayerHasRoutedExpertsOnly) {
  const MoeTensorNames names = HfModelConfig::parse(cfg::kQwen3_30B_A3B).tensor_names(47);
  EXPECT_EQ(names.router, "model.layers.47.mlp.gate.weight");
  EXPECT_FALSE(names.correction_bias.has_value());
  EXPECT_FALSE(names.shared.has_value());
  EXPECT_FALSE(names.shared_gate.has_value());
  EXPECT_EQ(names.expert(0).up, "model.layers.47.mlp.experts.0.up_proj");
}

TEST(HfConfig, MixtralLayerNamesW1W3W2UnderBlockSparseMoe) {
  const MoeTensorNames names = HfModelConfig::parse(cfg::kMixtral8x7B).tensor_names(5);
  EXPECT_EQ(names.router, "model.layers.5.block_sparse_moe.gate.weight");
  EXPECT_FALSE(names.shared.has_value());
  EXPECT_EQ(names.expert(2), (ExpertTensorNames{"model.layers.5.block_sparse_moe.experts.2.w1",
                                                "model.layers.5.block_sparse_moe.experts.2.w3",
                                                "model.layers.5.block_sparse_moe.experts.2.w2"}));
}

TEST(HfConfig, Glm4MoeLayerNamesLikeDeepseekV3) {
  const MoeTensorNames names = HfModelConfig::parse(cfg::kGlm45Air).tensor_names(1);
  EXPECT_EQ(names.correction_bias, "model.layers.1.mlp.gate.e_score_correction_bias");
  EXPECT_EQ(names.shared->gate, "model.layers.1.mlp.shared_experts.gate_proj");
  EXPECT_EQ(names.expert(127).down, "model.layers.1.mlp.experts.127.down_proj");
}

TEST(HfConfig, NamesAreRefusedForLayersAndExpertsThatHaveNone) {
  const HfModelConfig v3 = HfModelConfig::parse(cfg::kDeepseekV3);
  const struct {
    std::function<void()> action;
    const char* expect;
  } cases[] = {
      {[&] { v3.tensor_names(0); },
       "layer 0 of this deepseek_v3 model has no MoE weights: "
       "first_k_dense_replace = 3"},
      {[&] { v3.tensor_names(61); }, "layer 61 is outside num_hidden_layers = 61"},
      {[&] { v3.tensor_names(-2); }, "layer -2 is outside"},
      {[&] { v3.tensor_names(3).expert(256); }, "expert 256 is outside the 256 experts"},
      {[&] { v3.tensor_names(3).expert(-1); }, "expert -1 is outside"},
  };
  for (const auto& c : cases) {
    EXPECT_NE(error_message(c.action, Errc::invalid_argument).find(c.expect), std::string::npos)
        << c.expect;
  }
}

// ---------------------------------------------------------------------------------------------
// Weight formats

TEST(HfConfig, QuantizationConfigGivesTheWeightFormat) {
  QuantParams tall_blocks = QuantParams::Fp8Block(128);
  tall_blocks.block_rows = 64;
  const struct {
    const char* name;
    json quantization;
    std::optional<QuantParams> want;
  } cases[] = {
      {"absent", nullptr, std::nullopt},
      {"dsv3 blocks",
       {{"activation_scheme", "dynamic"},
        {"fmt", "e4m3"},
        {"quant_method", "fp8"},
        {"weight_block_size", {128, 128}}},
       QuantParams::Fp8Block(128)},
      {"defaults to dynamic e4m3",
       {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}},
       QuantParams::Fp8Block(128)},
      {"non-square blocks",
       {{"quant_method", "fp8"}, {"weight_block_size", {64, 128}}},
       tall_blocks},
      {"per-tensor dynamic",
       {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}},
       QuantParams::Fp8Tensor(Fp8Scaling::per_tensor, Fp8Activations::dynamic)},
      {"per-tensor static",
       {{"quant_method", "fp8"}, {"activation_scheme", "static"}, {"ignored_layers", {"lm_head"}}},
       QuantParams::Fp8Tensor(Fp8Scaling::per_tensor, Fp8Activations::static_)},
      {"routers and the shared expert gate left unquantised",
       {{"quant_method", "fp8"},
        {"weight_block_size", {128, 128}},
        {"modules_to_not_convert",
         {"lm_head", "model.layers.0.mlp.gate", "model.layers.0.block_sparse_moe.gate",
          "model.layers.0.mlp.shared_expert_gate"}}},
       QuantParams::Fp8Block(128)},
  };
  for (const auto& c : cases) {
    const HfModelConfig config =
        HfModelConfig::parse(with(cfg::kMixtral8x7B, {{"quantization_config", c.quantization}}));
    EXPECT_EQ(config.quant, c.want) << c.name;
  }
}

TEST(HfConfig, TorchDtypeGivesTheFloatWeightType) {
  const std::vector<std::pair<const char*, DType>> cases = {
      {"bfloat16", DType::bf16}, {"float16", DType::f16}, {"float32", DType::f32}};
  for (const auto& [name, dtype] : cases) {
    EXPECT_EQ(HfModelConfig::parse(with(cfg::kGlm45Air, {{"torch_dtype", name}})).weight_dtype,
              dtype);
  }
}

// ---------------------------------------------------------------------------------------------
// Refusals: each names what is wrong

struct Refusal {
  const char* name;
  std::string text;
  std::vector<const char*> expect;  // substrings of the message
};

std::ostream& operator<<(std::ostream& out, const Refusal& r) {
  return out << r.name;
}

std::string quantized(const json& quantization) {
  return with(cfg::kDeepseekV3, {{"quantization_config", quantization}});
}

const std::vector<Refusal>& refusals() {
  static const std::vector<Refusal> cases = {
      {"UnknownFamily",
       with(cfg::kMixtral8x7B, {{"model_type", "llama"}}),
       {"config.json: unknown model family 'llama' (known: deepseek_v2, deepseek_v3, kimi_k2, "
        "qwen2_moe, qwen3_moe, qwen3_next, mixtral, glm4_moe, olmoe)"}},
      {"NoModelType", without(cfg::kMixtral8x7B, "model_type"), {"missing key 'model_type'"}},
      {"NotJson", R"({"model_type": "mixtral",)", {"config.json: not valid JSON"}},
      {"NotAnObject", "[1, 2]", {"the top level must be an object"}},
      {"V3SoftmaxScoring",
       with(cfg::kDeepseekV3, {{"scoring_func", "softmax"}}),
       {"scoring_func 'softmax' is not supported; moekit scores deepseek_v3", "'sigmoid'"}},
      {"V3GreedyTopk",
       with(cfg::kDeepseekV3, {{"topk_method", "greedy"}}),
       {"topk_method 'greedy' is not supported; moekit routes deepseek_v3 with 'noaux_tc'"}},
      {"V2NoauxTopk",
       with(cfg::kDeepseekV2, {{"topk_method", "noaux_tc"}}),
       {"topk_method 'noaux_tc' is not supported; moekit routes deepseek_v2 with 'greedy' or "
        "'group_limited_greedy'"}},
      {"V2SigmoidScoring",
       with(cfg::kDeepseekV2, {{"scoring_func", "sigmoid"}}),
       {"scoring_func 'sigmoid' is not supported"}},
      {"GlmSoftmaxScoring",
       with(cfg::kGlm45Air, {{"scoring_func", "softmax"}}),
       {"scoring_func 'softmax' is not supported"}},
      {"GlmLayerFrequency",
       with(cfg::kGlm45Air, {{"moe_layer_freq", 2}}),
       {"moe_layer_freq is not supported for glm4_moe"}},
      {"GeluActivation",
       with(cfg::kQwen3_30B_A3B, {{"hidden_act", "gelu"}}),
       {"hidden_act 'gelu' is not supported"}},
      {"Gptq",
       quantized({{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}}),
       {"quantization 'gptq' is not supported (moekit reads"}},
      {"Awq", quantized({{"quant_method", "awq"}}), {"quantization 'awq' is not supported"}},
      {"CompressedTensors",
       quantized({{"quant_method", "compressed-tensors"}}),
       {"quantization 'compressed-tensors' is not supported"}},
      {"OldCompressionConfig",
       with(cfg::kDeepseekV3, {{"compression_config", {{"format", "pack-quantized"}}}}),
       {"quantization 'compressed-tensors' is not supported"}},
      {"BitsAndBytes",
       quantized({{"quant_method", "bitsandbytes"}}),
       {"quantization 'bitsandbytes' is not supported"}},
      {"Mxfp4", quantized({{"quant_method", "mxfp4"}}), {"quantization 'mxfp4' is not supported"}},
      {"NoQuantMethod",
       quantized({{"fmt", "e4m3"}}),
       {"config.json: quantization_config: missing key 'quant_method'"}},
      {"Fp8E5m2",
       quantized({{"quant_method", "fp8"}, {"fmt", "e5m2"}, {"weight_block_size", {128, 128}}}),
       {"fmt 'e5m2' is not supported"}},
      {"Fp8StaticBlocks",
       quantized({{"quant_method", "fp8"},
                  {"activation_scheme", "static"},
                  {"weight_block_size", {128, 128}}}),
       {"activation_scheme 'static' are not supported"}},
      {"Fp8OneDimensionalBlock",
       quantized({{"quant_method", "fp8"}, {"weight_block_size", {128}}}),
       {"weight_block_size must be two positive integers"}},
      {"Fp8UnknownKey",
       quantized({{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}, {"kv_fp8", true}}),
       {"key 'kv_fp8' is not understood"}},
      {"Fp8UnquantisedExperts",
       quantized({{"quant_method", "fp8"},
                  {"weight_block_size", {128, 128}},
                  {"modules_to_not_convert", {"model.layers.3.mlp.experts.0.gate_proj"}}}),
       {"modules_to_not_convert keeps 'model.layers.3.mlp.experts.0.gate_proj' unquantised"}},
      {"Float8Dtype",
       with(cfg::kDeepseekV3, {{"torch_dtype", "float8_e4m3fn"}}),
       {"torch_dtype 'float8_e4m3fn' is not supported"}},
      {"DtypeKeysDisagree",
       with(cfg::kDeepseekV3, {{"dtype", "float16"}}),
       {"keys 'torch_dtype' and 'dtype' name the same setting and disagree"}},
      {"V2MissingTopK",
       without(cfg::kDeepseekV2, "num_experts_per_tok"),
       {"missing key 'num_experts_per_tok'", "deepseek_v2"}},
      {"V2GroupsWithoutNGroup", without(cfg::kDeepseekV2, "n_group"), {"missing key 'n_group'"}},
      {"V2NullTopK",
       with(cfg::kDeepseekV2Lite, {{"num_experts_per_tok", nullptr}}),
       {"missing key 'num_experts_per_tok'"}},
      {"HiddenSizeAsString",
       with(cfg::kDeepseekV3, {{"hidden_size", "7168"}}),
       {"key 'hidden_size' must be an integer >= 1, got \"7168\""}},
      {"ExpertCountAsFloat",
       with(cfg::kQwen3_30B_A3B, {{"num_experts", 128.0}}),
       {"key 'num_experts' must be an integer"}},
      {"NormAsString",
       with(cfg::kQwen3_30B_A3B, {{"norm_topk_prob", "true"}}),
       {"key 'norm_topk_prob' must be true or false"}},
      {"ScalingAsString",
       with(cfg::kDeepseekV3, {{"routed_scaling_factor", "2.5"}}),
       {"key 'routed_scaling_factor' must be a finite number"}},
      {"NegativeScaling",
       with(cfg::kDeepseekV3, {{"routed_scaling_factor", -1.0}}),
       {"routed_scaling_factor must be a positive number"}},
      {"MlpOnlyLayersNotAList",
       with(cfg::kQwen3_30B_A3B, {{"mlp_only_layers", "0"}}),
       {"key 'mlp_only_layers' must be a list of integers"}},
      {"ModelTypeNotAString", R"({"model_type": 3})", {"key 'model_type' must be a string"}},
      {"LayerFrequencyZero",
       with(cfg::kDeepseekV2, {{"moe_layer_freq", 0}}),
       {"key 'moe_layer_freq' must be an integer >= 1, got 0"}},
      {"TooManyLayers",
       with(cfg::kMixtral8x7B, {{"num_hidden_layers", 1000000}}),
       {"key 'num_hidden_layers' must be an integer from 0 to 4096"}},
      {"NullRoutedExperts",
       with(cfg::kDeepseekV3, {{"n_routed_experts", nullptr}}),
       {"n_routed_experts is null: every layer is a dense MLP"}},
      {"ZeroQwenExperts",
       with(cfg::kQwen15MoeA27B, {{"num_experts", 0}}),
       {"num_experts is 0: every layer is a dense MLP"}},
      {"AllLayersDense",
       with(cfg::kDeepseekV3, {{"first_k_dense_replace", 61}}),
       {"none of its num_hidden_layers = 61 layers is MoE", "first_k_dense_replace = 61"}},
      {"GroupsDoNotDivideExperts",
       with(cfg::kDeepseekV3, {{"n_group", 7}}),
       {"the MoE layer it describes is impossible", "n_group 7 does not divide the 256 experts"}},
      {"TopKAboveExperts",
       with(cfg::kMixtral8x7B, {{"num_experts_per_tok", 9}}),
       {"impossible", "top-k 9 must be between 1 and the number of experts 8"}},
      {"Qwen3SharedExpert",
       with(cfg::kQwen3_30B_A3B, {{"shared_expert_intermediate_size", 1024}}),
       {"qwen3_moe has no shared expert"}},
      {"AliasesDisagree",
       with(cfg::kDeepseekV3, {{"num_local_experts", 64}}),
       {"keys 'n_routed_experts' and 'num_local_experts' name the same setting"}},
  };
  return cases;
}

class HfConfigRefusal : public ::testing::TestWithParam<Refusal> {};

TEST_P(HfConfigRefusal, NamesTheFault) {
  const Refusal& r = GetParam();
  const std::string message =
      error_message([&] { HfModelConfig::parse(r.text); }, Errc::invalid_argument);
  EXPECT_EQ(message.rfind("config.json: ", 0), 0u) << message;
  for (const char* part : r.expect) {
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
}

INSTANTIATE_TEST_SUITE_P(HfConfig, HfConfigRefusal, ::testing::ValuesIn(refusals()),
                         case_name<Refusal>);

// ---------------------------------------------------------------------------------------------
// Reading a model directory

class HfConfigDirectory : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("moekit_hf_config_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& text) { std::ofstream(dir_ / "config.json") << text; }

  std::filesystem::path dir_;
};

TEST_F(HfConfigDirectory, ReadsConfigJson) {
  write(cfg::kQwen3_30B_A3B);
  const HfModelConfig config = HfModelConfig::from_directory(dir_.string());
  EXPECT_EQ(config.family, ModelFamily::qwen3_moe);
  EXPECT_EQ(config.spec.n_experts, 128);
}

TEST_F(HfConfigDirectory, ErrorsNameTheFile) {
  write(with(cfg::kQwen3_30B_A3B, {{"hidden_act", "relu"}}));
  const std::string message =
      error_message([&] { HfModelConfig::from_directory(dir_.string()); }, Errc::invalid_argument);
  EXPECT_NE(message.find((dir_ / "config.json").string() + ": hidden_act 'relu'"),
            std::string::npos)
      << message;
}

TEST_F(HfConfigDirectory, MissingConfigIsAnIoError) {
  const std::string message =
      error_message([&] { HfModelConfig::from_directory((dir_ / "absent").string()); }, Errc::io);
  EXPECT_NE(message.find("absent/config.json"), std::string::npos) << message;
}

}  // namespace
}  // namespace moekit
