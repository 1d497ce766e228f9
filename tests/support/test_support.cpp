// The test support itself: kernel sets a machine lacks are named as missing (so the suites skip
// them with that reason), and the oracle's router follows the definitions, ties included.

#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "support/kernel_sets.hpp"
#include "support/oracle_routing.hpp"

namespace moekit::test {
namespace {

Platform avx2_machine() {
  Platform p = Platform::cpu_only(8);
  p.avx2 = p.fma = p.f16c = true;
  return p;
}

TEST(KernelSets, AMachineWithoutAvx512MissesOnlyTheAvx512Sets) {
  const Platform machine = avx2_machine();
  EXPECT_EQ(kernel_platform(KernelSet::portable, machine, 2).missing, "");
  EXPECT_EQ(kernel_platform(KernelSet::avx2, machine, 2).missing, "");
  EXPECT_EQ(kernel_platform(KernelSet::avx512_bf16, machine, 2).missing, "AVX-512 BF16");
  EXPECT_EQ(kernel_platform(KernelSet::avx512_vnni, machine, 2).missing, "AVX-512 VNNI");
  EXPECT_EQ(kernel_platform(KernelSet::all, machine, 2).missing, "");
}

TEST(KernelSets, AMachineWithoutAvx2MissesEverySetButPortableAndAll) {
  const Platform machine = Platform::cpu_only(8);
  EXPECT_EQ(kernel_platform(KernelSet::avx2, machine, 2).missing, "AVX2, FMA, F16C");
  EXPECT_EQ(kernel_platform(KernelSet::avx512_bf16, machine, 2).missing,
            "AVX2, FMA, F16C, AVX-512 BF16");
  EXPECT_EQ(kernel_platform(KernelSet::portable, machine, 2).missing, "");
  EXPECT_EQ(kernel_platform(KernelSet::all, machine, 2).missing, "");
}

TEST(KernelSets, EachSetKeepsOnlyItsOwnAvx512Feature) {
  Platform machine = avx2_machine();
  machine.avx512f = machine.avx512_bf16 = machine.avx512_vnni = true;
  const Platform avx2 = kernel_platform(KernelSet::avx2, machine, 3).platform;
  EXPECT_TRUE(avx2.avx2 && !avx2.avx512f && !avx2.avx512_bf16 && !avx2.avx512_vnni);
  EXPECT_EQ(avx2.cpu_threads, 3);
  const Platform bf16 = kernel_platform(KernelSet::avx512_bf16, machine, 3).platform;
  EXPECT_TRUE(bf16.avx512_bf16 && !bf16.avx512_vnni);
  const Platform vnni = kernel_platform(KernelSet::avx512_vnni, machine, 3).platform;
  EXPECT_TRUE(!vnni.avx512_bf16 && vnni.avx512_vnni);
  const Platform all = kernel_platform(KernelSet::all, machine, 3).platform;
  EXPECT_TRUE(all.avx512_bf16 && all.avx512_vnni);
  const Platform portable = kernel_platform(KernelSet::portable, machine, 3).platform;
  EXPECT_TRUE(!portable.avx2 && !portable.avx512_bf16 && portable.cpu_threads == 3);
}

// A set the machine lacks is a reported skip: on a machine with AVX2 alone, the AVX-512 cases
// never reach their body and show as skipped, naming the set and the missing feature.
struct SetCase {
  KernelSet set;
};

class OnAMachineWithoutAvx512 : public KernelSetTest<SetCase> {
 protected:
  Platform machine() const override { return avx2_machine(); }
  void TearDown() override {
    const bool lacking =
        GetParam().set == KernelSet::avx512_bf16 || GetParam().set == KernelSet::avx512_vnni;
    EXPECT_EQ(IsSkipped(), lacking);
  }
};

std::string set_case_name(const ::testing::TestParamInfo<SetCase>& info) {
  return kernel_set_test_name(info.param.set);
}

void PrintTo(const SetCase& c, std::ostream* os) {
  *os << kernel_set_name(c.set);
}

TEST_P(OnAMachineWithoutAvx512, ASetItLacksIsSkippedWithItsName) {
  EXPECT_FALSE(platform(1).avx512_bf16 || platform(1).avx512_vnni) << "a set the machine lacks ran";
}

INSTANTIATE_TEST_SUITE_P(KernelSets, OnAMachineWithoutAvx512,
                         ::testing::Values(SetCase{KernelSet::portable}, SetCase{KernelSet::avx2},
                                           SetCase{KernelSet::avx512_bf16},
                                           SetCase{KernelSet::avx512_vnni},
                                           SetCase{KernelSet::all}),
                         set_case_name);

// The oracle's router on hand-made logits.

TensorView row(std::vector<float>& logits) {
  return TensorView::contiguous(logits.data(), DType::f32,
                                {1, static_cast<int64_t>(logits.size())});
}

TEST(OracleRouter, TopKBySoftmaxRenormalised) {
  ModelSpec spec;
  spec.n_experts = 4;
  spec.routing = {.scoring = Scoring::softmax, .top_k = 2, .renormalize = true};
  std::vector<float> logits = {0.0f, 2.0f, 1.0f, -1.0f};
  const OracleRouting r = oracle_routing(spec, TensorView(), row(logits));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2}));
  EXPECT_NEAR(r.weights[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-12);
  EXPECT_NEAR(r.weights[0] + r.weights[1], 1.0, 1e-12);
}

TEST(OracleRouter, BiasChoosesAndScoresWeigh) {
  ModelSpec spec;
  spec.n_experts = 4;
  spec.routing = {.scoring = Scoring::sigmoid,
                  .top_k = 1,
                  .correction_bias = true,
                  .routed_scaling_factor = 2.0f};
  std::vector<float> logits = {0.0f, 1.0f, 0.5f, -1.0f};
  std::vector<float> bias = {0.0f, 0.0f, 0.5f, 0.0f};
  const OracleRouting r =
      oracle_routing(spec, TensorView::contiguous(bias.data(), DType::f32, {4}), row(logits));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2}));
  EXPECT_NEAR(r.weights[0], 2.0 / (1.0 + std::exp(-0.5)), 1e-12) << "weights are unbiased";
}

TEST(OracleRouter, GroupsByTop2SumBeforeExperts) {
  // Group 0 holds the best single expert; group 1 the best pair.
  ModelSpec spec;
  spec.n_experts = 4;
  spec.routing = {.scoring = Scoring::sigmoid,
                  .top_k = 1,
                  .n_group = 2,
                  .topk_group = 1,
                  .group_score = GroupScore::top2_sum};
  std::vector<float> logits = {3.0f, -3.0f, 1.0f, 1.0f};
  EXPECT_EQ(oracle_routing(spec, TensorView(), row(logits)).ids, (std::vector<int32_t>{2}));
  spec.routing.group_score = GroupScore::max;
  EXPECT_EQ(oracle_routing(spec, TensorView(), row(logits)).ids, (std::vector<int32_t>{0}));
}

TEST(OracleRouter, AcceptsEitherSideOfATieAndNothingElse) {
  ModelSpec spec;
  spec.n_experts = 4;
  spec.routing = {.scoring = Scoring::sigmoid, .top_k = 1};
  std::vector<float> logits = {0.5f, 0.5f + 1e-7f, -1.0f, 0.0f};
  const std::vector<double> w1 = {1.0 / (1.0 + std::exp(-static_cast<double>(logits[1])))};
  const std::vector<float> weight = {static_cast<float>(w1[0])};
  EXPECT_TRUE(oracle_routing(spec, TensorView(), row(logits), {1}, weight).agrees());
  EXPECT_TRUE(oracle_routing(spec, TensorView(), row(logits), {0}, weight).agrees())
      << "expert 0 ties expert 1 within float32 rounding";
  EXPECT_FALSE(oracle_routing(spec, TensorView(), row(logits), {3}, weight).agrees());
  EXPECT_FALSE(oracle_routing(spec, TensorView(), row(logits), {1}, {0.9f}).agrees());
}

}  // namespace
}  // namespace moekit::test
