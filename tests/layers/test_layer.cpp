// Every compute path of the layer on every kernel set against the float64 oracle, which routes
// by itself, on fresh random inputs, with poisoned outputs.

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "moekit/error.hpp"
#include "support/layer_fixture.hpp"
#include "support/specs.hpp"

namespace moekit::test {
namespace {

// H odd and I not a multiple of 8: part-filled vectors and panels everywhere in the float paths.
ModelSpec ragged_dsv3() {
  ModelSpec spec = small_dsv3();
  spec.name = "ragged-dsv3";
  spec.hidden = 37;
  spec.intermediate = 13;
  spec.shared_intermediate = 26;
  return spec;
}

// A path through the layer, and the batch sizes it is run at (one layer, one forward each).
struct Path {
  const char* name;
  RunnerKind runner;
  FusedOps fused_ops;
  int64_t max_tokens;
  std::vector<int64_t> tokens;
};

// The reference core; the cpu core with its permutes; the cpu fused op at decode sizes; and
// larger batches with fused ops allowed, which on AVX2 the fused op serves too. The reference
// core reads no kernel set, so it runs on the portable set only.
std::vector<Path> paths(KernelSet set) {
  std::vector<Path> p;
  if (set == KernelSet::portable) {
    p.push_back({"reference", RunnerKind::reference, FusedOps::auto_, 16, {0, 1, 3, 13}});
  }
  p.push_back({"core", RunnerKind::cpu, FusedOps::off, 16, {0, 1, 3, 13}});
  p.push_back({"decode", RunnerKind::cpu, FusedOps::auto_, 4, {0, 1, 3}});
  if (set != KernelSet::portable) {
    p.push_back({"fused_batch", RunnerKind::cpu, FusedOps::auto_, 64, {40}});
  }
  return p;
}

struct PathCase {
  KernelSet set;
  NamedSpec spec;
  Path path;
  WeightFormat weights;
  DType hidden;
};

// Every weight format with f32 and bf16 hidden states, and f16 hidden states, on the specs that
// exercise the kernels' shapes; every routing and activation with f32.
std::vector<PathCase> path_cases() {
  std::vector<PathCase> cases;
  const std::pair<WeightFormat, DType> formats[] = {
      {WeightFormat::f32, DType::f32},   {WeightFormat::f32, DType::bf16},
      {WeightFormat::f32, DType::f16},   {WeightFormat::bf16, DType::f32},
      {WeightFormat::bf16, DType::bf16}, {WeightFormat::bf16, DType::f16},
      {WeightFormat::f16, DType::f32},   {WeightFormat::f16, DType::f16}};
  const NamedSpec shapes[] = {{"dsv3", small_dsv3()}, {"ragged", ragged_dsv3()}};
  for (KernelSet set : kKernelSets) {
    for (const Path& path : paths(set)) {
      for (const NamedSpec& shape : shapes) {
        for (const auto& [weights, hidden] : formats) {
          cases.push_back({set, shape, path, weights, hidden});
        }
      }
      for (const NamedSpec& spec : routing_specs()) {
        if (std::string(spec.name) == "dsv3") continue;  // above
        cases.push_back({set, spec, path, WeightFormat::f32, DType::f32});
      }
    }
  }
  return cases;
}

class LayerPath : public KernelSetTest<PathCase> {};

TEST_P(LayerPath, MatchesFloat64OracleAtEveryBatchSize) {
  const PathCase& c = GetParam();
  const ModelSpec& spec = c.spec.spec;
  Options options;
  options.runner = c.path.runner;
  options.weights = c.weights;
  options.max_tokens = c.path.max_tokens;
  options.fused_ops = c.path.fused_ops;
  const Plan plan = resolve(spec, options, platform(3));
  if (c.path.max_tokens <= 4 && c.path.runner == RunnerKind::cpu) {
    ASSERT_EQ(plan.fused_op, "cpu-decode") << plan.explain();
  }
  if (c.path.fused_ops == FusedOps::off) {
    ASSERT_FALSE(plan.fused_op.has_value()) << plan.explain();
  }
  const RandomWeights weights = RandomWeights::make(spec, random_weights_dtype(c.weights), 11);
  const OracleLayer oracle(spec, weights.view(), WeightFormat::f32);
  MoeLayer layer(plan, weights.view());
  for (int64_t tokens : c.path.tokens) {
    SCOPED_TRACE(fmt::format("T={}", tokens));
    const Inputs in = random_inputs(spec, tokens, c.hidden, 12 + static_cast<uint64_t>(tokens));
    const LayerRun run = run_layer(layer, in);
    const OracleRouting routing = oracle_routing(spec, weights.view(), in, run);
    EXPECT_TRUE(routing.agrees());
    EXPECT_TRUE(compare_with_oracle(oracle, in, routing, run).within(tolerance(c.hidden)))
        << plan.explain();
  }
}

std::string path_name(const ::testing::TestParamInfo<PathCase>& info) {
  const PathCase& c = info.param;
  std::string name = fmt::format("{}_{}_{}_{}_{}", kernel_set_test_name(c.set), c.spec.name,
                                 c.path.name, weight_format_name(c.weights), dtype_name(c.hidden));
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

void PrintTo(const PathCase& c, std::ostream* os) {
  *os << path_name({c, 0});
}

INSTANTIATE_TEST_SUITE_P(AllPaths, LayerPath, ::testing::ValuesIn(path_cases()), path_name);

// One and two threads give the same bits, on every path of every kernel set.
struct ThreadCase {
  KernelSet set;
  Path path;
  WeightFormat weights;
  DType hidden;
};

std::vector<ThreadCase> thread_cases() {
  std::vector<ThreadCase> cases;
  for (KernelSet set : kKernelSets) {
    for (const Path& path : paths(set)) {
      cases.push_back({set, path, WeightFormat::bf16, DType::f32});
      cases.push_back({set, path, WeightFormat::bf16, DType::bf16});
    }
  }
  return cases;
}

class LayerThreads : public KernelSetTest<ThreadCase> {};

TEST_P(LayerThreads, OneAndTwoThreadsGiveTheSameBits) {
  const ThreadCase& c = GetParam();
  const ModelSpec spec = small_dsv3();
  const RandomWeights weights = RandomWeights::make(spec, random_weights_dtype(c.weights), 3);
  Options options;
  options.runner = c.path.runner;
  options.weights = c.weights;
  options.max_tokens = c.path.max_tokens;
  options.fused_ops = c.path.fused_ops;
  const Inputs in = random_inputs(spec, c.path.tokens.back(), c.hidden, 4);
  options.threads = 1;
  const LayerRun one = run_plan(resolve(spec, options, platform(1)), weights.view(), in);
  options.threads = 2;
  const LayerRun two = run_plan(resolve(spec, options, platform(2)), weights.view(), in);
  EXPECT_EQ(as_doubles(one.output), as_doubles(two.output));
  EXPECT_EQ(one.ids, two.ids);
}

std::string thread_name(const ::testing::TestParamInfo<ThreadCase>& info) {
  const ThreadCase& c = info.param;
  return fmt::format("{}_{}_{}_{}", kernel_set_test_name(c.set), c.path.name,
                     weight_format_name(c.weights), dtype_name(c.hidden));
}

void PrintTo(const ThreadCase& c, std::ostream* os) {
  *os << thread_name({c, 0});
}

INSTANTIATE_TEST_SUITE_P(AllPaths, LayerThreads, ::testing::ValuesIn(thread_cases()), thread_name);

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

TEST(Layer, ReportsTheRoutingItUsed) {
  const ModelSpec spec = small_dsv3();
  const RandomWeights weights = RandomWeights::make(spec, DType::f32, 5);
  const Inputs in = random_inputs(spec, 6, DType::f32, 6);
  Options options;
  options.max_tokens = 8;
  const LayerRun run = run_plan(resolve(spec, options, Platform::cpu_only(2)), weights.view(), in);
  EXPECT_TRUE(oracle_routing(spec, weights.view(), in, run).agrees());
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
  const OracleRouting routing = oracle_routing(spec, f32_weights.view(), in, run);
  EXPECT_TRUE(routing.agrees());
  const double error =
      relative_l2(run.output, oracle_output(spec, f32_weights.view(), in.hidden, routing));
  EXPECT_GT(error, 1e-6) << "bf16 storage must round the f32 weights";
  EXPECT_LT(error, 1e-2);
}

}  // namespace
}  // namespace moekit::test
