// Expert parallelism without communication: each rank computes only its experts, and the
// ranks' partial outputs add up to the single-rank output.

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "moekit/error.hpp"
#include "support/layer_fixture.hpp"

namespace moekit::test {
namespace {

struct Ranks {
  int ep_size;
  int redundant;
  BlockForm form;
};

constexpr Ranks kRanks[] = {
    {2, 0, BlockForm::standard},   {4, 0, BlockForm::standard},   {8, 0, BlockForm::standard},
    {2, 2, BlockForm::standard},   {4, 4, BlockForm::standard},   {8, 8, BlockForm::standard},
    {8, 24, BlockForm::standard},  {4, 0, BlockForm::fused_slot}, {4, 4, BlockForm::fused_slot},
    {8, 8, BlockForm::fused_slot}, {2, 2, BlockForm::overlapped}, {4, 4, BlockForm::overlapped}};

// Every layout of ranks on every kernel set, through the cpu runner at a batch and at decode
// sizes (its fused op).
struct EpCase {
  KernelSet set;
  Ranks ranks;
  int64_t tokens;
  int64_t max_tokens;
};

std::vector<EpCase> ep_cases() {
  std::vector<EpCase> cases;
  for (KernelSet set : kKernelSets) {
    for (const Ranks& ranks : kRanks) {
      cases.push_back({set, ranks, 24, 32});
      cases.push_back({set, ranks, 3, 4});
    }
  }
  return cases;
}

class RanksSum : public KernelSetTest<EpCase> {};

TEST_P(RanksSum, RanksSumToTheSingleRankOutputAndTheOracle) {
  const EpCase& c = GetParam();
  const Ranks& r = c.ranks;
  const ModelSpec spec = small_dsv3();
  const RandomWeights weights = RandomWeights::make(spec, DType::f32, 21);
  const Inputs in = random_inputs(spec, c.tokens, DType::f32, 22);
  Options options;
  options.runner = RunnerKind::cpu;
  options.weights = WeightFormat::f32;
  options.form = r.form;
  options.max_tokens = c.max_tokens;
  const LayerRun single = run_plan(resolve(spec, options, platform(2)), weights.view(), in);
  options.ep = moekit::ExpertParallel::Rank(r.ep_size, 0, r.redundant);
  for (int rank = 0; rank < r.ep_size; ++rank) {
    options.ep.rank = rank;
    const Plan plan = resolve(spec, options, platform(2));
    EXPECT_EQ(plan.form, r.form) << plan.explain();
    EXPECT_EQ(plan.local_routed * r.ep_size, spec.n_experts + r.redundant);
  }
  const RankSum ranks = run_all_ranks(spec, options, weights.view(), in, platform(2));
  EXPECT_LT(relative_l2(single.output, ranks.sum), 1e-5);
  const OracleRouting routing = oracle_routing(spec, weights.view(), in, ranks.rank0);
  EXPECT_TRUE(routing.agrees());
  EXPECT_LT(relative_l2(ranks.sum, oracle_output(spec, weights.view(), in.hidden, routing)), 1e-5);
}

std::string ep_name(const ::testing::TestParamInfo<EpCase>& info) {
  const EpCase& c = info.param;
  std::string name =
      fmt::format("{}_ep{}_redundant{}_{}_T{}", kernel_set_test_name(c.set), c.ranks.ep_size,
                  c.ranks.redundant, block_form_name(c.ranks.form), c.tokens);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

void PrintTo(const EpCase& c, std::ostream* os) {
  *os << ep_name({c, 0});
}

INSTANTIATE_TEST_SUITE_P(SizesAndReplicas, RanksSum, ::testing::ValuesIn(ep_cases()), ep_name);

TEST(ExpertLocation, ReplicasServeTheirOwnRanksTokens) {
  const ExpertLocation location = ExpertLocation::build(16, moekit::ExpertParallel::Rank(4, 0, 4));
  ASSERT_EQ(location.physical, 20);
  ASSERT_EQ(location.per_rank(), 5);
  // Physical 16..19 replicate logical 0..3 and sit on rank 3; rank 3 uses them, others do not.
  for (int logical = 0; logical < 4; ++logical) {
    EXPECT_EQ(location.physical_to_logical[16 + logical], logical);
    EXPECT_EQ(location.rank_table[3][logical], 16 + logical);
    EXPECT_EQ(location.owner(location.rank_table[3][logical]), 3);
  }
  for (int rank = 0; rank < 4; ++rank) {
    for (int logical = 0; logical < 16; ++logical) {
      EXPECT_EQ(location.physical_to_logical[location.rank_table[rank][logical]], logical);
    }
  }
}

TEST(ExpertLocation, PhysicalExpertsThatDoNotDivideOverRanksAreRefused) {
  try {
    ExpertLocation::build(16, moekit::ExpertParallel::Rank(4, 0, 3));
    FAIL() << "19 physical experts over 4 ranks must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::config_refused);
    EXPECT_NE(std::string(e.what()).find("19 physical experts"), std::string::npos) << e.what();
  }
}

TEST(ExpertParallelPlan, ARankHoldsOnlyItsExperts) {
  Options options;
  options.ep = moekit::ExpertParallel::Rank(4, 2);
  const Plan plan = resolve(small_dsv3(), options, Platform::cpu_only(2));
  EXPECT_EQ(plan.local_routed, 4);
  EXPECT_EQ(plan.first_local, 8);
  EXPECT_FALSE(plan.adds_shared_output) << "only rank 0 adds the shared experts";
}

}  // namespace
}  // namespace moekit::test
