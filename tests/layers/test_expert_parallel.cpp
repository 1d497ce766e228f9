// Expert parallelism without communication: each rank computes only its experts, and the
// ranks' partial outputs add up to the single-rank output.

#include <gtest/gtest.h>

#include "moekit/error.hpp"
#include "support/layer_fixture.hpp"

namespace moekit::test {
namespace {

struct EpCase {
  int ep_size;
  int redundant;
  BlockForm form;
};

class RanksSum : public ::testing::TestWithParam<EpCase> {};

TEST_P(RanksSum, RanksSumToTheSingleRankOutput) {
  const EpCase& c = GetParam();
  const ModelSpec spec = small_dsv3();
  const RandomWeights weights = RandomWeights::make(spec, DType::f32, 21);
  const Inputs in = random_inputs(spec, 24, DType::f32, 22);
  Options options;
  options.runner = RunnerKind::cpu;
  options.weights = WeightFormat::f32;
  options.form = c.form;
  options.max_tokens = 32;
  const LayerRun single =
      run_plan(resolve(spec, options, Platform::cpu_only(2)), weights.view(), in);
  options.ep = moekit::ExpertParallel::Rank(c.ep_size, 0, c.redundant);
  for (int rank = 0; rank < c.ep_size; ++rank) {
    options.ep.rank = rank;
    EXPECT_EQ(resolve(spec, options, Platform::cpu_only(2)).local_routed * c.ep_size,
              spec.n_experts + c.redundant);
  }
  EXPECT_LT(relative_l2(single.output, run_all_ranks(spec, options, weights.view(), in).sum), 1e-5);
}

std::string ep_name(const ::testing::TestParamInfo<EpCase>& info) {
  std::string name = fmt::format("ep{}_redundant{}_{}", info.param.ep_size, info.param.redundant,
                                 block_form_name(info.param.form));
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

INSTANTIATE_TEST_SUITE_P(
    SizesAndReplicas, RanksSum,
    ::testing::Values(EpCase{2, 0, BlockForm::standard}, EpCase{4, 0, BlockForm::standard},
                      EpCase{8, 0, BlockForm::standard}, EpCase{2, 2, BlockForm::standard},
                      EpCase{4, 4, BlockForm::standard}, EpCase{8, 8, BlockForm::standard},
                      EpCase{8, 24, BlockForm::standard}, EpCase{4, 0, BlockForm::fused_slot},
                      EpCase{8, 8, BlockForm::fused_slot}, EpCase{2, 2, BlockForm::overlapped}),
    ep_name);

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

TEST(RanksSum, ARankHoldsOnlyItsExperts) {
  Options options;
  options.ep = moekit::ExpertParallel::Rank(4, 2);
  const Plan plan = resolve(small_dsv3(), options, Platform::cpu_only(2));
  EXPECT_EQ(plan.local_routed, 4);
  EXPECT_EQ(plan.first_local, 8);
  EXPECT_FALSE(plan.adds_shared_output) << "only rank 0 adds the shared experts";
}

}  // namespace
}  // namespace moekit::test
