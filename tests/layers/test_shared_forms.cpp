// The three block forms for shared experts give the same output.

#include <gtest/gtest.h>

#include "support/layer_fixture.hpp"

namespace moekit::test {
namespace {

TEST(SharedExperts, StandardOverlappedAndFusedSlotAgree) {
  ModelSpec spec = small_dsv3();
  spec.n_shared = 2;  // two shared experts, each split into two slots when fused
  const RandomWeights weights = RandomWeights::make(spec, DType::f32, 31);
  const Inputs in = random_inputs(spec, 17, DType::f32, 32);
  Options options;
  options.weights = WeightFormat::f32;
  options.max_tokens = 32;
  std::vector<LayerRun> runs;
  for (BlockForm form : {BlockForm::standard, BlockForm::overlapped, BlockForm::fused_slot}) {
    options.form = form;
    const Plan plan = resolve(spec, options, Platform::cpu_only(2));
    ASSERT_EQ(plan.form, form);
    runs.push_back(run_plan(plan, weights.view(), in));
  }
  const std::vector<double> want =
      oracle_output(spec, weights.view(), in.hidden, runs[0].ids, runs[0].weights);
  for (const LayerRun& run : runs) EXPECT_LT(relative_l2(run.output, want), 1e-5);
}

TEST(SharedExperts, SigmoidGateScalesTheSharedOutputInEveryForm) {
  ModelSpec spec = small_dsv3();
  spec.shared_gate = true;
  const RandomWeights weights = RandomWeights::make(spec, DType::f32, 35);
  const Inputs in = random_inputs(spec, 11, DType::f32, 36);
  Options options;
  options.weights = WeightFormat::f32;
  options.max_tokens = 16;
  for (BlockForm form : {BlockForm::standard, BlockForm::overlapped, BlockForm::fused_slot}) {
    options.form = form;
    const Plan plan = resolve(spec, options, Platform::cpu_only(2));
    ASSERT_EQ(plan.form, form);
    const LayerRun run = run_plan(plan, weights.view(), in);
    EXPECT_LT(relative_l2(run.output,
                          oracle_output(spec, weights.view(), in.hidden, run.ids, run.weights)),
              1e-5)
        << block_form_name(form);
    ModelSpec ungated = spec;
    ungated.shared_gate = false;
    EXPECT_GT(relative_l2(run.output,
                          oracle_output(ungated, weights.view(), in.hidden, run.ids, run.weights)),
              1e-2)
        << "the gate changed nothing in form " << block_form_name(form);
  }
}

TEST(SharedExperts, SharedGateMustBeGiven) {
  ModelSpec spec = small_dsv3();
  spec.shared_gate = true;
  const RandomWeights weights = RandomWeights::make(spec, DType::f32, 37);
  LayerWeights given = weights.view();
  given.shared_gate = TensorView();
  Options options;
  options.weights = WeightFormat::f32;
  const Plan plan = resolve(spec, options, Platform::cpu_only(2));
  try {
    MoeLayer layer(plan, given);
    FAIL() << "a missing shared gate was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weights.shared_gate"), std::string::npos) << e.what();
  }
}

TEST(SharedExperts, ScalingFactorAppliesToTheRoutedPartOnly) {
  // With the routed weights scaled by s, the oracle adds the shared output unscaled; changing s
  // must change the output by exactly the routed part.
  ModelSpec spec = small_dsv3();
  const RandomWeights weights = RandomWeights::make(spec, DType::f32, 33);
  const Inputs in = random_inputs(spec, 9, DType::f32, 34);
  Options options;
  options.weights = WeightFormat::f32;
  options.max_tokens = 16;
  spec.routing.routed_scaling_factor = 1.0f;
  const LayerRun unscaled =
      run_plan(resolve(spec, options, Platform::cpu_only(2)), weights.view(), in);
  spec.routing.routed_scaling_factor = 2.5f;
  const LayerRun scaled =
      run_plan(resolve(spec, options, Platform::cpu_only(2)), weights.view(), in);
  ModelSpec routed_only = spec;
  routed_only.n_shared = 0;
  const std::vector<double> routed =
      oracle_output(routed_only, weights.view(), in.hidden, unscaled.ids, unscaled.weights);
  const std::vector<double> a = as_doubles(unscaled.output), b = as_doubles(scaled.output);
  std::vector<double> predicted(a.size());
  for (size_t i = 0; i < a.size(); ++i) predicted[i] = a[i] + 1.5 * routed[i];
  EXPECT_LT(relative_l2(scaled.output, predicted), 1e-5);
}

TEST(SharedExperts, FusedSlotNeedsSharedWidthAMultipleOfRoutedWidth) {
  ModelSpec spec = small_dsv3();
  spec.shared_intermediate = 24;  // not a multiple of 16
  Options options;
  options.form = BlockForm::fused_slot;
  const Plan plan = resolve(spec, options, Platform::cpu_only(2));
  EXPECT_EQ(plan.form, BlockForm::standard);
  ASSERT_EQ(plan.fallbacks().size(), 1u);
  options.strict = true;
  EXPECT_THROW(resolve(spec, options, Platform::cpu_only(2)), Error);
}

}  // namespace
}  // namespace moekit::test
