// The three block forms for shared experts give the same output, on every kernel set.

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "support/layer_fixture.hpp"

namespace moekit::test {
namespace {

constexpr BlockForm kForms[] = {BlockForm::standard, BlockForm::overlapped, BlockForm::fused_slot};

// The cpu runner at decode sizes (its fused op) and at a batch (the core, or on AVX2 the fused
// op again), each at several batch sizes through one layer.
struct FormCase {
  KernelSet set;
  const char* path;
  int64_t max_tokens;
  std::vector<int64_t> tokens;
};

std::vector<FormCase> form_cases() {
  std::vector<FormCase> cases;
  for (KernelSet set : kKernelSets) {
    cases.push_back({set, "decode", 4, {1, 3}});
    cases.push_back({set, "batch", 32, {0, 17}});
  }
  return cases;
}

std::string form_case_name(const ::testing::TestParamInfo<FormCase>& info) {
  return kernel_set_test_name(info.param.set) + "_" + info.param.path;
}

void PrintTo(const FormCase& c, std::ostream* os) {
  *os << form_case_name({c, 0});
}

class SharedExperts : public KernelSetTest<FormCase> {
 protected:
  Plan plan(const ModelSpec& spec, BlockForm form) const {
    Options options;
    options.runner = RunnerKind::cpu;
    options.weights = WeightFormat::f32;
    options.max_tokens = GetParam().max_tokens;
    options.form = form;
    return resolve(spec, options, platform(2));
  }
};

TEST_P(SharedExperts, StandardOverlappedAndFusedSlotMatchTheOracle) {
  ModelSpec spec = small_dsv3();
  spec.n_shared = 2;  // two shared experts, each split into two slots when fused
  const RandomWeights weights = RandomWeights::make(spec, DType::f32, 31);
  for (BlockForm form : kForms) {
    SCOPED_TRACE(block_form_name(form));
    const Plan p = plan(spec, form);
    ASSERT_EQ(p.form, form) << p.explain();
    MoeLayer layer(p, weights.view());
    for (int64_t tokens : GetParam().tokens) {
      SCOPED_TRACE(fmt::format("T={}", tokens));
      const Inputs in = random_inputs(spec, tokens, DType::f32, 32);
      const LayerRun run = run_layer(layer, in);
      const OracleRouting routing = oracle_routing(spec, weights.view(), in, run);
      EXPECT_TRUE(routing.agrees());
      EXPECT_LT(relative_l2(run.output, oracle_output(spec, weights.view(), in.hidden, routing)),
                1e-5);
    }
  }
}

TEST_P(SharedExperts, SigmoidGateScalesTheSharedOutputInEveryForm) {
  ModelSpec spec = small_dsv3();
  spec.shared_gate = true;
  ModelSpec ungated = spec;
  ungated.shared_gate = false;
  const RandomWeights weights = RandomWeights::make(spec, DType::f32, 35);
  const Inputs in = random_inputs(spec, GetParam().tokens.back(), DType::f32, 36);
  for (BlockForm form : kForms) {
    SCOPED_TRACE(block_form_name(form));
    const Plan p = plan(spec, form);
    ASSERT_EQ(p.form, form) << p.explain();
    const LayerRun run = run_plan(p, weights.view(), in);
    const OracleRouting routing = oracle_routing(spec, weights.view(), in, run);
    EXPECT_TRUE(routing.agrees());
    EXPECT_LT(relative_l2(run.output, oracle_output(spec, weights.view(), in.hidden, routing)),
              1e-5);
    EXPECT_GT(relative_l2(run.output, oracle_output(ungated, weights.view(), in.hidden, routing)),
              1e-2)
        << "the gate changed nothing";
  }
}

TEST_P(SharedExperts, ScalingFactorAppliesToTheRoutedPartOnly) {
  // With the routed weights scaled by s, the oracle adds the shared output unscaled; changing s
  // must change the output by exactly the routed part.
  ModelSpec spec = small_dsv3();
  const RandomWeights weights = RandomWeights::make(spec, DType::f32, 33);
  const Inputs in = random_inputs(spec, GetParam().tokens.back(), DType::f32, 34);
  spec.routing.routed_scaling_factor = 1.0f;
  const LayerRun unscaled = run_plan(plan(spec, BlockForm::standard), weights.view(), in);
  ModelSpec routed_only = spec;
  routed_only.n_shared = 0;
  const OracleRouting routing = oracle_routing(spec, weights.view(), in, unscaled);
  EXPECT_TRUE(routing.agrees());
  const std::vector<double> routed = oracle_output(routed_only, weights.view(), in.hidden, routing);
  spec.routing.routed_scaling_factor = 2.5f;
  const LayerRun scaled = run_plan(plan(spec, BlockForm::standard), weights.view(), in);
  const std::vector<double> a = as_doubles(unscaled.output);
  std::vector<double> predicted(a.size());
  for (size_t i = 0; i < a.size(); ++i) predicted[i] = a[i] + 1.5 * routed[i];
  EXPECT_LT(relative_l2(scaled.output, predicted), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(KernelSets, SharedExperts, ::testing::ValuesIn(form_cases()),
                         form_case_name);

TEST(SharedGate, MustBeGiven) {
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

TEST(FusedSlotForm, NeedsSharedWidthAMultipleOfRoutedWidth) {
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
