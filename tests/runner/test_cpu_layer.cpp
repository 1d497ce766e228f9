// The cpu runner's two kernel choices through the whole layer: the plan records the choice for
// the platform it is given, and the AVX2 kernels on panel16 weights (core and fused op, decode
// and larger batches) match the float64 oracle of each format, as the portable path does in
// tests/layers.

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "runner/cpu_fixture.hpp"
#include "support/layer_fixture.hpp"

namespace moekit::test {
namespace {

const Decision* find_decision(const Plan& plan, std::string_view topic) {
  for (const Decision& d : plan.decisions) {
    if (d.topic == topic) return &d;
  }
  return nullptr;
}

Platform with_avx2() {
  Platform p = Platform::cpu_only(2);
  p.avx2 = true;
  p.fma = true;
  p.f16c = true;
  return p;
}

TEST(CpuKernelChoice, IsAPlanDecisionThatFollowsThePlatform) {
  Options options;
  options.runner = RunnerKind::cpu;
  const Plan portable = resolve(small_dsv3(), options, Platform::cpu_only(2));
  ASSERT_NE(find_decision(portable, "kernels"), nullptr);
  EXPECT_EQ(find_decision(portable, "kernels")->choice, "portable");
  const Plan avx2 = resolve(small_dsv3(), options, with_avx2());
  ASSERT_NE(find_decision(avx2, "kernels"), nullptr);
  EXPECT_EQ(find_decision(avx2, "kernels")->choice, "avx2 panel16");
}

TEST(CpuKernelChoice, TheAvx2FusedOpServesEveryBatchSizeUnlessFusedOpsAreOff) {
  Options options;
  options.runner = RunnerKind::cpu;
  options.max_tokens = 512;
  EXPECT_EQ(resolve(small_dsv3(), options, with_avx2()).fused_op, "cpu-decode");
  EXPECT_FALSE(resolve(small_dsv3(), options, Platform::cpu_only(2)).fused_op.has_value());
  options.fused_ops = FusedOps::off;
  EXPECT_FALSE(resolve(small_dsv3(), options, with_avx2()).fused_op.has_value());
}

TEST(CpuKernelChoice, OtherRunnersRecordNoKernels) {
  Options options;
  options.runner = RunnerKind::reference;
  const Plan plan = resolve(small_dsv3(), options, with_avx2());
  EXPECT_EQ(find_decision(plan, "kernels"), nullptr);
}

struct Path {
  const char* name;
  int64_t tokens;
  int64_t max_tokens;
  FusedOps fused_ops;
};

// The fused op at decode and at a larger batch (tokens sharing experts, some taking the GEMM),
// and the core with its permutes.
constexpr Path kPaths[] = {{"fused_decode", 3, 4, FusedOps::auto_},
                           {"fused_batch", 40, 64, FusedOps::auto_},
                           {"core", 40, 64, FusedOps::off}};

ModelSpec layer_spec(const KernelShape& shape) {
  ModelSpec spec = small_dsv3();
  spec.name = "avx2-" + shape.name;
  spec.hidden = shape.hidden * 2;
  spec.intermediate = shape.intermediate * 2;
  spec.shared_intermediate = shape.intermediate * 4;
  return spec;
}

struct LayerCase {
  KernelFormat format;
  KernelShape shape;
  Path path;
};

std::vector<LayerCase> layer_cases() {
  std::vector<LayerCase> cases;
  for (const KernelFormat& f : kernel_formats()) {
    for (const KernelShape& s : kernel_shapes()) {
      for (const Path& p : kPaths) cases.push_back({f, s, p});
    }
  }
  return cases;
}

std::string layer_case_name(const ::testing::TestParamInfo<LayerCase>& info) {
  return info.param.format.name + "_" + info.param.shape.name + "_" + info.param.path.name;
}

class Avx2Layer : public ::testing::TestWithParam<LayerCase> {
 protected:
  void SetUp() override {
    if (!has_avx2()) GTEST_SKIP() << "this machine has no AVX2+FMA+F16C";
  }
};

TEST_P(Avx2Layer, MatchesTheOracleOfItsFormat) {
  const LayerCase& c = GetParam();
  const ModelSpec spec = layer_spec(c.shape);
  const QuantParams& quant = c.format.params;
  Options options;
  options.runner = RunnerKind::cpu;
  options.weights = quant;
  options.max_tokens = c.path.max_tokens;
  options.fused_ops = c.path.fused_ops;
  const Plan plan = resolve(spec, options, Platform::probe());
  ASSERT_EQ(plan.cpu_kernels->set, CpuKernelSet::avx2_panels);
  const RandomWeights given = RandomWeights::make(spec, random_weights_dtype(quant.format), 31);
  const Inputs in = random_inputs(spec, c.path.tokens, DType::f32, 37);
  const LayerRun run = run_plan(plan, given.view(), in);
  QuantizedLayerWeights quantized;
  LayerWeights oracle_weights = given.view();
  if (quant.quantized()) {
    quantized = quantize_layer(given.view(), quant);
    oracle_weights = quantized.view();
  }
  const OracleComparison comparison = compare_with_oracle(
      spec, oracle_weights, quant, in.hidden.view(), run.ids, run.weights, as_doubles(run.output));
  EXPECT_LT(comparison.error, tolerance(DType::f32)) << plan.explain();
  EXPECT_LE(comparison.rounded_apart, 2) << "tokens with a GEMM2 input rounded to a neighbour";
}

INSTANTIATE_TEST_SUITE_P(Formats, Avx2Layer, ::testing::ValuesIn(layer_cases()), layer_case_name);

}  // namespace
}  // namespace moekit::test
