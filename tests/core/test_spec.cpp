#include "moekit/spec.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "moekit/error.hpp"

namespace moekit {
namespace {

using nlohmann::json;

// Every field of two specs, compared one by one so a failure names the field.
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
  EXPECT_EQ(got.activation.kind, want.activation.kind);
  EXPECT_EQ(got.activation.alpha, want.activation.alpha);
  EXPECT_EQ(got.activation.limit, want.activation.limit);
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

// ---------------------------------------------------------------------------------------------
// Presets

ModelSpec expected_dsv3() {
  ModelSpec spec;
  spec.name = "dsv3";
  spec.hidden = 7168;
  spec.intermediate = 2048;
  spec.n_experts = 256;
  spec.routing = {.scoring = Scoring::sigmoid,
                  .top_k = 8,
                  .correction_bias = true,
                  .n_group = 8,
                  .topk_group = 4,
                  .group_score = GroupScore::top2_sum,
                  .renormalize = true,
                  .routed_scaling_factor = 2.5f};
  spec.n_shared = 1;
  spec.shared_intermediate = 2048;
  spec.activation = Activation::SiluGated();
  return spec;
}

ModelSpec expected_qwen3_moe() {  // Qwen3-30B-A3B
  ModelSpec spec;
  spec.name = "qwen3-moe";
  spec.hidden = 2048;
  spec.intermediate = 768;
  spec.n_experts = 128;
  spec.routing = {.scoring = Scoring::softmax, .top_k = 8, .renormalize = true};
  spec.activation = Activation::SiluGated();
  return spec;
}

ModelSpec expected_mixtral() {  // Mixtral-8x7B
  ModelSpec spec;
  spec.name = "mixtral";
  spec.hidden = 4096;
  spec.intermediate = 14336;
  spec.n_experts = 8;
  spec.routing = {.scoring = Scoring::softmax, .top_k = 2, .renormalize = true};
  spec.activation = Activation::SiluGated();
  return spec;
}

struct PresetRow {
  const char* name;
  ModelSpec (*expected)();
};
void PrintTo(const PresetRow& row, std::ostream* os) {
  *os << row.name;
}

class ModelSpecPreset : public testing::TestWithParam<PresetRow> {};

TEST_P(ModelSpecPreset, HasTheRealModelSizes) {
  expect_same_spec(ModelSpec::preset(GetParam().name), GetParam().expected());
}

TEST_P(ModelSpecPreset, HasNoProblems) {
  EXPECT_EQ(ModelSpec::preset(GetParam().name).problems(), std::vector<std::string>{});
}

TEST_P(ModelSpecPreset, IsListedInPresetNames) {
  const std::vector<std::string> names = ModelSpec::preset_names();
  EXPECT_NE(std::find(names.begin(), names.end(), GetParam().name), names.end());
}

INSTANTIATE_TEST_SUITE_P(Presets, ModelSpecPreset,
                         testing::Values(PresetRow{"dsv3", expected_dsv3},
                                         PresetRow{"qwen3-moe", expected_qwen3_moe},
                                         PresetRow{"mixtral", expected_mixtral}),
                         [](const testing::TestParamInfo<PresetRow>& param_info) {
                           std::string name = param_info.param.name;
                           std::erase(name, '-');
                           return name;
                         });

TEST(ModelSpecPresetNames, AreExactlyTheThreePresets) {
  EXPECT_EQ(ModelSpec::preset_names(), (std::vector<std::string>{"dsv3", "qwen3-moe", "mixtral"}));
}

TEST(ModelSpecPresetNames, UnknownPresetThrowsNamingIt) {
  const std::string message =
      error_message([] { ModelSpec::preset("llama-moe"); }, Errc::invalid_argument);
  EXPECT_NE(message.find("llama-moe"), std::string::npos) << message;
}

// ---------------------------------------------------------------------------------------------
// JSON round trip

ModelSpec swiglu_oai_spec() {  // gpt-oss shaped
  ModelSpec spec;
  spec.name = "gpt-oss-like";
  spec.hidden = 2880;
  spec.intermediate = 2880;
  spec.n_experts = 32;
  spec.routing = {.scoring = Scoring::softmax, .top_k = 4, .renormalize = true};
  spec.activation = Activation::SwigluOai(1.702f, 7.0f);
  return spec;
}

ModelSpec sqrt_softplus_gelu_spec() {  // every other enum value, with odd numbers
  ModelSpec spec;
  spec.name = "odd \"quoted\" name";
  spec.hidden = 96;
  spec.intermediate = 40;
  spec.n_experts = 12;
  spec.routing = {.scoring = Scoring::sqrt_softplus,
                  .top_k = 3,
                  .correction_bias = true,
                  .n_group = 4,
                  .topk_group = 2,
                  .group_score = GroupScore::max,
                  .renormalize = false,
                  .routed_scaling_factor = 0.1f};
  spec.n_shared = 2;
  spec.shared_intermediate = 80;
  spec.activation = Activation::GeluGated();
  return spec;
}

struct RoundTripRow {
  const char* label;
  std::function<ModelSpec()> make;
};
void PrintTo(const RoundTripRow& row, std::ostream* os) {
  *os << row.label;
}

class ModelSpecRoundTrip : public testing::TestWithParam<RoundTripRow> {};

TEST_P(ModelSpecRoundTrip, FromJsonOfToJsonIsTheSameSpec) {
  const ModelSpec spec = GetParam().make();
  const std::string text = spec.to_json();
  SCOPED_TRACE(text);
  expect_same_spec(ModelSpec::from_json(text), spec);
}

INSTANTIATE_TEST_SUITE_P(
    Specs, ModelSpecRoundTrip,
    testing::Values(RoundTripRow{"dsv3", [] { return ModelSpec::preset("dsv3"); }},
                    RoundTripRow{"qwen3moe", [] { return ModelSpec::preset("qwen3-moe"); }},
                    RoundTripRow{"mixtral", [] { return ModelSpec::preset("mixtral"); }},
                    RoundTripRow{"demo", [] { return ModelSpec::demo(); }},
                    RoundTripRow{"swiglu_oai", swiglu_oai_spec},
                    RoundTripRow{"swiglu_oai_custom_alpha_limit",
                                 [] {
                                   ModelSpec spec = swiglu_oai_spec();
                                   spec.activation = Activation::SwigluOai(1.25f, 3.5f);
                                   return spec;
                                 }},
                    RoundTripRow{"sqrt_softplus_gelu", sqrt_softplus_gelu_spec}),
    [](const testing::TestParamInfo<RoundTripRow>& param_info) {
      return std::string(param_info.param.label);
    });

// ---------------------------------------------------------------------------------------------
// JSON refusals

// A minimal valid spec: the required keys only.
json minimal_json() {
  return {{"hidden_size", 16},
          {"moe_intermediate_size", 8},
          {"n_experts", 8},
          {"top_k", 2},
          {"scoring", "softmax"}};
}

TEST(ModelSpecJson, MinimalSpecTakesTheDefaults) {
  const ModelSpec spec = ModelSpec::from_json(minimal_json().dump());
  ModelSpec want;
  want.hidden = 16;
  want.intermediate = 8;
  want.n_experts = 8;
  want.routing.top_k = 2;
  want.routing.scoring = Scoring::softmax;
  expect_same_spec(spec, want);
  EXPECT_EQ(spec.problems(), std::vector<std::string>{});
}

struct RefusalRow {
  const char* label;
  std::string text;                   // the JSON given to from_json
  std::vector<std::string> mentions;  // each must appear in the message
};
void PrintTo(const RefusalRow& row, std::ostream* os) {
  *os << row.label;
}

class ModelSpecJsonRefusal : public testing::TestWithParam<RefusalRow> {};

TEST_P(ModelSpecJsonRefusal, ThrowsInvalidArgumentNamingTheFault) {
  const RefusalRow& row = GetParam();
  SCOPED_TRACE(row.text);
  const std::string message =
      error_message([&] { ModelSpec::from_json(row.text); }, Errc::invalid_argument);
  for (const std::string& word : row.mentions) {
    EXPECT_NE(message.find(word), std::string::npos) << "'" << word << "' not in: " << message;
  }
}

// The minimal spec with `key` set to `value`.
std::string with(const char* key, json value) {
  json object = minimal_json();
  object[key] = std::move(value);
  return object.dump();
}

std::string without(const char* key) {
  json object = minimal_json();
  object.erase(key);
  return object.dump();
}

std::string swiglu_with(const char* key, json value) {
  json object = minimal_json();
  object["activation"] = "swiglu_oai";
  object[key] = std::move(value);
  return object.dump();
}

std::string refusal_name(const testing::TestParamInfo<RefusalRow>& param_info) {
  return param_info.param.label;
}

INSTANTIATE_TEST_SUITE_P(
    NotAnObject, ModelSpecJsonRefusal,
    testing::Values(RefusalRow{"empty", "", {"JSON"}},
                    RefusalRow{"unclosed_brace", "{\"hidden_size\": 16", {"JSON"}},
                    RefusalRow{"trailing_comma", R"({"hidden_size": 16,})", {"JSON"}},
                    RefusalRow{"array", "[1, 2]", {"object"}},
                    RefusalRow{"number", "42", {"object"}},
                    RefusalRow{"string", "\"dsv3\"", {"object"}},
                    RefusalRow{"null", "null", {"object"}}),
    refusal_name);

INSTANTIATE_TEST_SUITE_P(
    UnknownKey, ModelSpecJsonRefusal,
    testing::Values(RefusalRow{"misspelt", with("hiden_size", 16), {"hiden_size"}},
                    RefusalRow{"hf_name", with("num_experts_per_tok", 2), {"num_experts_per_tok"}},
                    RefusalRow{"case", with("Top_K", 2), {"Top_K"}}),
    refusal_name);

INSTANTIATE_TEST_SUITE_P(
    WrongType, ModelSpecJsonRefusal,
    testing::Values(
        RefusalRow{"hidden_string", with("hidden_size", "big"), {"hidden_size"}},
        RefusalRow{
            "intermediate_null", with("moe_intermediate_size", nullptr), {"moe_intermediate_size"}},
        RefusalRow{"n_experts_array", with("n_experts", json::array({8})), {"n_experts"}},
        RefusalRow{"top_k_string", with("top_k", "2"), {"top_k"}},
        RefusalRow{"scoring_number", with("scoring", 1), {"scoring"}},
        RefusalRow{"correction_bias_number", with("correction_bias", 1), {"correction_bias"}},
        RefusalRow{"n_group_string", with("n_group", "1"), {"n_group"}},
        RefusalRow{"topk_group_object", with("topk_group", json::object()), {"topk_group"}},
        RefusalRow{"group_score_bool", with("group_score", true), {"group_score"}},
        RefusalRow{"renormalize_string", with("renormalize", "yes"), {"renormalize"}},
        RefusalRow{
            "scaling_string", with("routed_scaling_factor", "2.5"), {"routed_scaling_factor"}},
        RefusalRow{"n_shared_string", with("n_shared_experts", "1"), {"n_shared_experts"}},
        RefusalRow{"shared_intermediate_bool",
                   with("shared_intermediate_size", false),
                   {"shared_intermediate_size"}},
        RefusalRow{"activation_number", with("activation", 0), {"activation"}},
        RefusalRow{"name_number", with("name", 5), {"name"}},
        RefusalRow{"swiglu_alpha_string", swiglu_with("swiglu_alpha", "x"), {"swiglu_alpha"}},
        RefusalRow{"swiglu_limit_null", swiglu_with("swiglu_limit", nullptr), {"swiglu_limit"}},
        // A count is an integer: neither a fraction nor a bool nor out of range.
        RefusalRow{"top_k_fraction", with("top_k", 2.5), {"top_k"}},
        RefusalRow{"top_k_bool", with("top_k", true), {"top_k"}},
        RefusalRow{"n_experts_over_int", with("n_experts", 4294967304LL), {"n_experts"}},
        RefusalRow{"hidden_over_int64", with("hidden_size", 1e20), {"hidden_size"}}),
    refusal_name);

INSTANTIATE_TEST_SUITE_P(
    UnknownEnumValue, ModelSpecJsonRefusal,
    testing::Values(RefusalRow{"scoring",
                               with("scoring", "softmaxx"),
                               {"scoring", "softmaxx", "softmax", "sigmoid", "sqrt_softplus"}},
                    RefusalRow{"group_score",
                               with("group_score", "top3_sum"),
                               {"group_score", "top3_sum", "max", "top2_sum"}},
                    RefusalRow{"activation",
                               with("activation", "relu"),
                               {"activation", "relu", "silu_gated", "gelu_gated", "swiglu_oai"}}),
    refusal_name);

INSTANTIATE_TEST_SUITE_P(
    MissingRequiredKey, ModelSpecJsonRefusal,
    testing::Values(RefusalRow{"hidden_size", without("hidden_size"), {"hidden_size"}},
                    RefusalRow{"moe_intermediate_size",
                               without("moe_intermediate_size"),
                               {"moe_intermediate_size"}},
                    RefusalRow{"n_experts", without("n_experts"), {"n_experts"}},
                    RefusalRow{"top_k", without("top_k"), {"top_k"}},
                    RefusalRow{"scoring", without("scoring"), {"scoring"}}),
    refusal_name);

INSTANTIATE_TEST_SUITE_P(SwigluParamsWithoutSwiglu, ModelSpecJsonRefusal,
                         testing::Values(RefusalRow{"alpha", with("swiglu_alpha", 1.0), {"swiglu"}},
                                         RefusalRow{
                                             "limit", with("swiglu_limit", 7.0), {"swiglu"}}),
                         refusal_name);

TEST(ModelSpecJsonFile, MissingFileThrowsIoNamingThePath) {
  const std::string path = "/nonexistent/moekit-test/spec.json";
  const std::string message = error_message([&] { ModelSpec::from_json_file(path); }, Errc::io);
  EXPECT_NE(message.find(path), std::string::npos) << message;
}

// ---------------------------------------------------------------------------------------------
// problems()

// A small valid spec each row breaks in one way: E=8 in 4 groups of 2, top-2.
ModelSpec small_spec() {
  ModelSpec spec;
  spec.name = "small";
  spec.hidden = 16;
  spec.intermediate = 8;
  spec.n_experts = 8;
  spec.routing = {.scoring = Scoring::sigmoid,
                  .top_k = 2,
                  .correction_bias = true,
                  .n_group = 4,
                  .topk_group = 2,
                  .group_score = GroupScore::top2_sum,
                  .renormalize = true,
                  .routed_scaling_factor = 2.5f};
  spec.n_shared = 1;
  spec.shared_intermediate = 16;
  return spec;
}

TEST(ModelSpecProblemsBase, SmallBaseSpecHasNone) {
  EXPECT_EQ(small_spec().problems(), std::vector<std::string>{});
}

struct ProblemRow {
  const char* label;
  std::function<void(ModelSpec&)> breakit;
  const char* mentions;  // the offending quantity, as the message names it
};
void PrintTo(const ProblemRow& row, std::ostream* os) {
  *os << row.label;
}

class ModelSpecProblems : public testing::TestWithParam<ProblemRow> {};

TEST_P(ModelSpecProblems, ReportsAProblemNamingTheQuantity) {
  ModelSpec spec = small_spec();
  GetParam().breakit(spec);
  const std::vector<std::string> problems = spec.problems();
  const std::string word = GetParam().mentions;
  EXPECT_TRUE(std::any_of(problems.begin(), problems.end(),
                          [&](const std::string& p) { return p.find(word) != std::string::npos; }))
      << "'" << word << "' in none of " << testing::PrintToString(problems);
}

INSTANTIATE_TEST_SUITE_P(
    Impossible, ModelSpecProblems,
    testing::Values(
        ProblemRow{"top_k_above_n_experts", [](ModelSpec& s) { s.routing.top_k = 9; }, "top-k"},
        ProblemRow{"top_k_zero", [](ModelSpec& s) { s.routing.top_k = 0; }, "top-k"},
        ProblemRow{"top_k_negative", [](ModelSpec& s) { s.routing.top_k = -1; }, "top-k"},
        ProblemRow{"n_group_not_dividing",
                   [](ModelSpec& s) {
                     s.routing.n_group = 3;
                     s.routing.topk_group = 3;
                   },
                   "n_group"},
        ProblemRow{"n_group_zero",
                   [](ModelSpec& s) {
                     s.routing.n_group = 0;
                     s.routing.topk_group = 0;
                   },
                   "n_group"},
        ProblemRow{"topk_group_above_n_group", [](ModelSpec& s) { s.routing.topk_group = 5; },
                   "topk_group"},
        ProblemRow{"topk_groups_too_small_for_top_k",
                   [](ModelSpec& s) {
                     s.routing.topk_group = 1;  // one group of 2 experts
                     s.routing.top_k = 3;
                   },
                   "topk_group"},
        ProblemRow{"top2_sum_with_one_expert_per_group",
                   [](ModelSpec& s) {
                     s.routing.n_group = 8;
                     s.routing.topk_group = 4;
                   },
                   "top2_sum"},
        ProblemRow{"zero_hidden", [](ModelSpec& s) { s.hidden = 0; }, "hidden"},
        ProblemRow{"negative_hidden", [](ModelSpec& s) { s.hidden = -16; }, "hidden"},
        ProblemRow{"zero_intermediate", [](ModelSpec& s) { s.intermediate = 0; }, "intermediate"},
        ProblemRow{"shared_without_intermediate", [](ModelSpec& s) { s.shared_intermediate = 0; },
                   "shared"},
        ProblemRow{"negative_shared_count", [](ModelSpec& s) { s.n_shared = -1; }, "shared"},
        ProblemRow{"zero_scaling_factor",
                   [](ModelSpec& s) { s.routing.routed_scaling_factor = 0.0f; }, "scaling factor"},
        ProblemRow{"negative_scaling_factor",
                   [](ModelSpec& s) { s.routing.routed_scaling_factor = -2.5f; }, "scaling factor"},
        ProblemRow{"nan_scaling_factor",
                   [](ModelSpec& s) {
                     s.routing.routed_scaling_factor = std::numeric_limits<float>::quiet_NaN();
                   },
                   "scaling factor"},
        ProblemRow{"infinite_scaling_factor",
                   [](ModelSpec& s) {
                     s.routing.routed_scaling_factor = std::numeric_limits<float>::infinity();
                   },
                   "scaling factor"},
        ProblemRow{"swiglu_zero_alpha",
                   [](ModelSpec& s) { s.activation = Activation::SwigluOai(0.0f, 7.0f); }, "alpha"},
        ProblemRow{"swiglu_negative_limit",
                   [](ModelSpec& s) { s.activation = Activation::SwigluOai(1.702f, -1.0f); },
                   "limit"}),
    [](const testing::TestParamInfo<ProblemRow>& param_info) {
      return std::string(param_info.param.label);
    });

TEST(ModelSpecProblemsBase, ZeroExpertsIsAProblemNamingTheExperts) {
  ModelSpec spec = small_spec();
  spec.n_experts = 0;
  const std::vector<std::string> problems = spec.problems();
  EXPECT_TRUE(std::any_of(problems.begin(), problems.end(), [](const std::string& p) {
    return p.find("number of experts") != std::string::npos;
  })) << testing::PrintToString(problems);
}

}  // namespace
}  // namespace moekit
