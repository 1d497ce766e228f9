// `moekit run` on broken checkpoints and inputs: each exits 1 (an error) or 2 (a configuration
// refused) with a message that names the culprit.

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "support/hf_checkpoint.hpp"

namespace moekit::test {
namespace {

namespace fs = std::filesystem;

constexpr int kExitError = 1;
constexpr int kExitRefused = 2;
constexpr int64_t kTokens = 7;

const std::string kLayer1 = "model.layers.1.mlp.";

using EditCheckpoint = std::function<void(HfCheckpoint&)>;         // before it is written
using EditFiles = std::function<void(const fs::path& model_dir)>;  // after
using EditInput = std::function<void(TensorMap& input)>;

struct BadCase {
  std::string label;
  TinyHfModel model;
  std::vector<std::string> mentions;  // each must appear in the output
  EditCheckpoint edit_checkpoint;
  EditFiles edit_files;
  EditInput edit_input;
  int layer = 1;
  std::string flags;
  int exit_code = kExitError;

  static BadCase checkpoint(std::string label, TinyHfModel model, EditCheckpoint edit,
                            std::vector<std::string> mentions) {
    BadCase c = of(std::move(label), std::move(model), std::move(mentions));
    c.edit_checkpoint = std::move(edit);
    return c;
  }
  static BadCase files(std::string label, TinyHfModel model, EditFiles edit,
                       std::vector<std::string> mentions) {
    BadCase c = of(std::move(label), std::move(model), std::move(mentions));
    c.edit_files = std::move(edit);
    return c;
  }
  // An input file edited, for the DeepSeek-V3 checkpoint.
  static BadCase input(std::string label, EditInput edit, std::vector<std::string> mentions) {
    BadCase c = of(std::move(label), TinyHfModel::deepseek_v3(), std::move(mentions));
    c.edit_input = std::move(edit);
    return c;
  }
  static BadCase layer_of(std::string label, int layer, std::vector<std::string> mentions) {
    BadCase c = of(std::move(label), TinyHfModel::deepseek_v3(), std::move(mentions));
    c.layer = layer;
    return c;
  }
  static BadCase of(std::string label, TinyHfModel model, std::vector<std::string> mentions) {
    BadCase c;
    c.label = std::move(label);
    c.model = std::move(model);
    c.mentions = std::move(mentions);
    return c;
  }
};

void PrintTo(const BadCase& c, std::ostream* os) {
  *os << c.label;
}

StoredTensor random_bf16(int64_t rows, int64_t cols) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> dist;
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (float& v : values) v = dist(rng);
  return StoredTensor::of(values, DType::bf16, {rows, cols});
}

// The tensor `name` stored again in `dtype` with its shape.
std::function<void(HfCheckpoint&)> restore_as(const std::string& name, DType dtype) {
  return [=](HfCheckpoint& c) {
    StoredTensor& t = c.tensors.at(name);
    const std::vector<double> values = t.values();
    t = StoredTensor::of(std::vector<float>(values.begin(), values.end()), dtype, t.shape);
  };
}

std::function<void(HfCheckpoint&)> erase(const std::string& name) {
  return [=](HfCheckpoint& c) { ASSERT_EQ(c.tensors.erase(name), 1u) << name; };
}

std::function<void(HfCheckpoint&)> set_config(const std::string& key, nlohmann::json value) {
  return [=](HfCheckpoint& c) { c.config[key] = value; };
}

std::vector<BadCase> bad_cases() {
  const TinyHfModel bf16 = TinyHfModel::deepseek_v3();
  const TinyHfModel fp8 = TinyHfModel::deepseek_v3().fp8();
  const TinyHfModel sharded = TinyHfModel::deepseek_v3().fp8().sharded(3);
  const std::string shard1 = HfCheckpoint::shard_name(0, 3),
                    shard2 = HfCheckpoint::shard_name(1, 3);
  BadCase int4_on_fp8 =
      BadCase::of("Int4OnAnFp8Checkpoint", fp8, {"e4m3", "int4", "quantises float weights only"});
  int4_on_fp8.flags = "--quantize int4-group";
  int4_on_fp8.exit_code = kExitRefused;
  return {
      BadCase::checkpoint("MissingExpertUpProj", bf16, erase(kLayer1 + "experts.3.up_proj.weight"),
                          {"missing tensor", kLayer1 + "experts.3.up_proj.weight"}),
      BadCase::checkpoint("ExpertWeightStoredI32", bf16,
                          restore_as(kLayer1 + "experts.5.down_proj.weight", DType::i32),
                          {kLayer1 + "experts.5.down_proj.weight", "I32"}),
      BadCase::checkpoint("GateProjStoredF32InAnFp8Checkpoint", fp8,
                          restore_as(kLayer1 + "experts.2.gate_proj.weight", DType::f32),
                          {kLayer1 + "experts.2.gate_proj.weight", "F32"}),
      BadCase::checkpoint("MissingWeightScaleInv", fp8,
                          erase(kLayer1 + "experts.4.up_proj.weight_scale_inv"),
                          {"missing tensor", kLayer1 + "experts.4.up_proj.weight_scale_inv"}),
      BadCase::checkpoint("ScaleGridTransposed", fp8,
                          [](HfCheckpoint& c) {
                            // down_proj [160, 96] has a [2, 1] grid of 128 x 128 blocks.
                            c.tensors[kLayer1 + "experts.6.down_proj.weight_scale_inv"] =
                                StoredTensor::of({0.01f, 0.01f}, DType::f32, {1, 2});
                          },
                          {kLayer1 + "experts.6.down_proj.weight_scale_inv", "[1, 2]", "[2, 1]"}),
      BadCase::checkpoint("MissingCorrectionBias", bf16,
                          erase(kLayer1 + "gate.e_score_correction_bias"),
                          {"missing tensor", kLayer1 + "gate.e_score_correction_bias"}),
      BadCase::checkpoint(
          "RouterGateOfTheWrongWidth", bf16,
          [](HfCheckpoint& c) { c.tensors[kLayer1 + "gate.weight"] = random_bf16(16, 128); },
          {kLayer1 + "gate.weight", "[16, 128]", "[16, 160]"}),
      BadCase::files("TruncatedShard", sharded,
                     [=](const fs::path& dir) {
                       const fs::path shard = dir / shard1;
                       fs::resize_file(shard, fs::file_size(shard) - 1000);
                     },
                     {shard1}),
      BadCase::files("IndexNamesAMissingShard", sharded,
                     [=](const fs::path& dir) { fs::remove(dir / shard2); },
                     {shard2, "model.safetensors.index.json"}),
      BadCase::checkpoint("UnknownModelType", bf16, set_config("model_type", "deepseek_v9"),
                          {"config.json", "unknown model family 'deepseek_v9'"}),
      BadCase::checkpoint("UnsupportedScoringFunction", TinyHfModel::deepseek_v2_grouped(),
                          set_config("scoring_func", "sigmoid"),
                          {"config.json", "scoring_func 'sigmoid' is not supported"}),
      BadCase::checkpoint("UnsupportedTopkMethodOfDeepseekV2", TinyHfModel::deepseek_v2_grouped(),
                          set_config("topk_method", "noaux_tc"),
                          {"config.json", "topk_method 'noaux_tc' is not supported"}),
      BadCase::checkpoint("UnsupportedTopkMethodOfDeepseekV3", bf16,
                          set_config("topk_method", "group_limited_greedy"),
                          {"config.json", "topk_method 'group_limited_greedy' is not supported"}),
      BadCase::layer_of("DenseLayer", 0,
                        {"layer 0", "no MoE weights", "first_k_dense_replace = 1"}),
      BadCase::layer_of("LayerOutOfRange", 3, {"layer 3", "num_hidden_layers = 3"}),
      BadCase::input("InputWithoutHiddenStates",
                     [](TensorMap& in) {
                       in["hidden"] = in.at("hidden_states");
                       in.erase("hidden_states");
                     },
                     {"hidden_states"}),
      BadCase::input("HiddenStatesOfTheWrongWidth",
                     [](TensorMap& in) { in["hidden_states"] = random_bf16(kTokens, 128); },
                     {"'hidden_states'", "[T, 160]", "[7, 128]"}),
      BadCase::input("RouterLogitsOfTheWrongShape",
                     [](TensorMap& in) { in["router_logits"] = random_bf16(kTokens, 8); },
                     {"'router_logits'", "[7, 16]", "[7, 8]"}),
      BadCase::input("NanInHiddenStates",
                     [](TensorMap& in) {
                       StoredTensor& h = in.at("hidden_states");
                       std::vector<double> v = h.values();
                       v[3 * 160 + 5] = NAN;
                       h = StoredTensor::of(std::vector<float>(v.begin(), v.end()), DType::bf16,
                                            h.shape);
                     },
                     {"hidden_states", "row 3", "column 5"}),
      int4_on_fp8,
  };
}

class BadCheckpoint : public testing::TestWithParam<BadCase> {};

TEST_P(BadCheckpoint, ExitsWithItsCodeAndNamesTheCulprit) {
  const BadCase& c = GetParam();
  const TestDir dir;
  const fs::path model_dir = dir.path() / "model";
  HfCheckpoint checkpoint = HfCheckpoint::random(c.model, 3);
  if (c.edit_checkpoint) c.edit_checkpoint(checkpoint);
  checkpoint.write(model_dir);
  if (c.edit_files) c.edit_files(model_dir);
  TensorMap input{{"hidden_states", random_bf16(kTokens, c.model.hidden)}};
  if (c.edit_input) c.edit_input(input);
  const std::string in = dir / "in.safetensors", out = dir / "out.safetensors";
  write_tensor_file(in, input);

  const CommandResult r =
      run_moekit(fmt::format("run --model '{}' --layer {} --input '{}' --output '{}' {}",
                             model_dir.string(), c.layer, in, out, c.flags));
  EXPECT_EQ(r.exit_code, c.exit_code) << r.output;
  for (const std::string& text : c.mentions) {
    EXPECT_TRUE(r.mentions(text)) << "'" << text << "' not in:\n" << r.output;
  }
  EXPECT_FALSE(fs::exists(out)) << "a failed run wrote its output file";
}

INSTANTIATE_TEST_SUITE_P(HfCheckpoint, BadCheckpoint, testing::ValuesIn(bad_cases()),
                         [](const testing::TestParamInfo<BadCase>& param_info) {
                           return param_info.param.label;
                         });

// A rank of an expert-parallel run reads only its own experts' weights, yet a checkpoint that
// lacks another rank's expert is still refused: it is not the model config.json describes.
TEST(BadCheckpoint, AMissingExpertFailsEveryRankNotOnlyTheOneHoldingIt) {
  const TestDir dir;
  HfCheckpoint checkpoint = HfCheckpoint::random(TinyHfModel::deepseek_v3(), 3);
  checkpoint.tensors.erase(kLayer1 + "experts.12.gate_proj.weight");
  checkpoint.write(dir.path() / "model");
  const std::string in = dir / "in.safetensors";
  write_tensor_file(in, {{"hidden_states", random_bf16(kTokens, 160)}});
  const CommandResult r = run_moekit(
      fmt::format("run --model '{}' --layer 1 --input '{}' --output '{}' --ep-size 2 --ep-rank 0",
                  (dir.path() / "model").string(), in, dir / "out.safetensors"));
  EXPECT_EQ(r.exit_code, kExitError) << r.output;
  EXPECT_TRUE(r.mentions(kLayer1 + "experts.12.gate_proj.weight")) << r.output;
}

}  // namespace
}  // namespace moekit::test
