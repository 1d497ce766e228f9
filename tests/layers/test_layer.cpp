// Every compute path of the layer against the float64 oracle, on fresh random inputs, with
// poisoned outputs.

#include <gtest/gtest.h>

#include "moekit/error.hpp"
#include "support/layer_fixture.hpp"

namespace moekit::test {
namespace {

struct PathCase {
  const char* name;
  ModelSpec spec;
  RunnerKind runner;
  WeightFormat weights;
  DType hidden;
  int64_t tokens;
  int64_t max_tokens;
};

ModelSpec with_activation(ModelSpec spec, Activation activation) {
  spec.activation = activation;
  return spec;
}

ModelSpec small_softmax(int experts, int top_k, bool renormalize) {
  ModelSpec spec;
  spec.name = "small-softmax";
  spec.hidden = 40;
  spec.intermediate = 24;
  spec.n_experts = experts;
  spec.routing = {.scoring = Scoring::softmax, .top_k = top_k, .renormalize = renormalize};
  return spec;
}

// Qwen2-MoE: softmax without renormalising, and one shared expert behind a sigmoid gate.
ModelSpec small_qwen2_moe() {
  ModelSpec spec = small_softmax(8, 2, false);
  spec.n_shared = 1;
  spec.shared_intermediate = 48;
  spec.shared_gate = true;
  return spec;
}

ModelSpec small_sqrt_softplus() {
  ModelSpec spec = small_softmax(12, 3, true);
  spec.routing.scoring = Scoring::sqrt_softplus;
  spec.routing.routed_scaling_factor = 1.5f;
  return spec;
}

std::vector<PathCase> path_cases() {
  std::vector<PathCase> cases;
  const std::pair<const char*, ModelSpec> specs[] = {
      {"dsv3", small_dsv3()},
      {"qwen", small_softmax(16, 4, true)},
      {"mixtral", small_softmax(8, 2, true)},
      {"softmax_no_renorm", small_softmax(8, 3, false)},
      {"gelu", with_activation(small_softmax(8, 2, true), Activation::GeluGated())},
      {"swiglu_oai",
       with_activation(small_softmax(8, 2, true), Activation::SwigluOai(1.702f, 7.0f))},
      {"sqrt_softplus", small_sqrt_softplus()},
      {"qwen2_shared_gate", small_qwen2_moe()},
  };
  for (const auto& [name, spec] : specs) {
    for (RunnerKind runner : {RunnerKind::reference, RunnerKind::cpu}) {
      for (WeightFormat weights : {WeightFormat::f32, WeightFormat::bf16, WeightFormat::f16}) {
        for (DType hidden : {DType::f32, DType::bf16}) {
          cases.push_back({name, spec, runner, weights, hidden, 13, 64});
        }
      }
      cases.push_back({name, spec, runner, WeightFormat::f32, DType::f32, 3, 4});  // decode op
      cases.push_back({name, spec, runner, WeightFormat::f32, DType::f16, 1, 1});
    }
  }
  return cases;
}

class LayerPath : public ::testing::TestWithParam<PathCase> {};

TEST_P(LayerPath, MatchesFloat64Oracle) {
  const PathCase& c = GetParam();
  Options options;
  options.runner = c.runner;
  options.weights = c.weights;
  options.max_tokens = c.max_tokens;
  const Plan plan = resolve(c.spec, options, Platform::cpu_only(3));
  const RandomWeights weights = RandomWeights::make(c.spec, random_weights_dtype(c.weights), 11);
  const Inputs in = random_inputs(c.spec, c.tokens, c.hidden, 12);
  const LayerRun run = run_plan(plan, weights.view(), in);
  const std::vector<double> want =
      oracle_output(c.spec, weights.view(), in.hidden, run.ids, run.weights);
  EXPECT_LT(relative_l2(run.output, want), tolerance(c.hidden)) << plan.explain();
}

std::string path_name(const ::testing::TestParamInfo<PathCase>& info) {
  const PathCase& c = info.param;
  std::string name =
      fmt::format("{}_{}_{}_{}_T{}_max{}", c.name, runner_name(c.runner),
                  weight_format_name(c.weights), dtype_name(c.hidden), c.tokens, c.max_tokens);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

INSTANTIATE_TEST_SUITE_P(AllPaths, LayerPath, ::testing::ValuesIn(path_cases()), path_name);

TEST(Layer, DecodeBatchesUseTheFusedOpAndLargerOnesThePermutedCore) {
  Options options;
  options.runner = RunnerKind::cpu;
  options.max_tokens = 4;
  EXPECT_EQ(resolve(small_dsv3(), options, Platform::cpu_only(2)).fused_op, "cpu-decode");
  options.max_tokens = 5;
  EXPECT_FALSE(resolve(small_dsv3(), options, Platform::cpu_only(2)).fused_op.has_value());
  options.max_tokens = 4;
  options.fused_ops = FusedOps::off;
  EXPECT_FALSE(resolve(small_dsv3(), options, Platform::cpu_only(2)).fused_op.has_value());
}

TEST(Layer, ResultDoesNotDependOnThreadCount) {
  const ModelSpec spec = small_dsv3();
  const RandomWeights weights = RandomWeights::make(spec, DType::bf16, 3);
  const Inputs in = random_inputs(spec, 21, DType::f32, 4);
  Options options;
  options.runner = RunnerKind::cpu;
  options.max_tokens = 32;
  options.threads = 1;
  const LayerRun one = run_plan(resolve(spec, options, Platform::cpu_only(1)), weights.view(), in);
  options.threads = 3;
  const LayerRun three =
      run_plan(resolve(spec, options, Platform::cpu_only(3)), weights.view(), in);
  EXPECT_EQ(as_doubles(one.output), as_doubles(three.output));
}

TEST(Layer, ReportsTheRoutingItUsed) {
  const ModelSpec spec = small_dsv3();
  const RandomWeights weights = RandomWeights::make(spec, DType::f32, 5);
  const Inputs in = random_inputs(spec, 6, DType::f32, 6);
  Options options;
  options.max_tokens = 8;
  const LayerRun run = run_plan(resolve(spec, options, Platform::cpu_only(2)), weights.view(), in);
  for (size_t i = 0; i < run.ids.size(); ++i) {
    EXPECT_GE(run.ids[i], 0);
    EXPECT_LT(run.ids[i], spec.n_experts);
    EXPECT_GT(run.weights[i], 0.0f);
  }
  // Renormalised then scaled: each token's weights sum to the routed scaling factor.
  for (int64_t t = 0; t < 6; ++t) {
    float sum = 0;
    for (int j = 0; j < spec.routing.top_k; ++j) sum += run.weights[t * spec.routing.top_k + j];
    EXPECT_NEAR(sum, spec.routing.routed_scaling_factor, 1e-5);
  }
}

TEST(Layer, WeightsOfAnotherFloatTypeAreConvertedAtLoad) {
  const ModelSpec spec = small_softmax(8, 2, true);
  const RandomWeights f32_weights = RandomWeights::make(spec, DType::f32, 9);
  const Inputs in = random_inputs(spec, 5, DType::f32, 10);
  Options options;
  options.weights = WeightFormat::bf16;
  options.max_tokens = 8;
  const LayerRun run =
      run_plan(resolve(spec, options, Platform::cpu_only(2)), f32_weights.view(), in);
  const std::vector<double> exact =
      oracle_output(spec, f32_weights.view(), in.hidden, run.ids, run.weights);
  const double error = relative_l2(run.output, exact);
  EXPECT_GT(error, 1e-6) << "bf16 storage must round the f32 weights";
  EXPECT_LT(error, 1e-2);
}

}  // namespace
}  // namespace moekit::test
