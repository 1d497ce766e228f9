// The roofline arithmetic of shared/BENCHMARKS.md: bytes per format, the expected number of
// distinct experts, and the floor as the larger of the memory and compute times.

#include <cmath>
#include <ostream>
#include <vector>

#include <gtest/gtest.h>

#include "bench/cases.hpp"
#include "bench/roofline.hpp"
#include "moekit/error.hpp"

namespace moekit::bench {
namespace {

struct BytesRow {
  const char* label;
  QuantParams format;
  int64_t hidden, intermediate;
  int64_t bytes;
};
void PrintTo(const BytesRow& row, std::ostream* os) {
  *os << row.label;
}

class ExpertBytes : public testing::TestWithParam<BytesRow> {};

TEST_P(ExpertBytes, CountsWeightsScalesAndZeroPointsAsStored) {
  const BytesRow& row = GetParam();
  EXPECT_EQ(expert_bytes(row.format, row.hidden, row.intermediate), row.bytes);
}

// Qwen3-30B-A3B's expert: gate and up [768, 2048], down [2048, 768], 4,718,592 weights.
INSTANTIATE_TEST_SUITE_P(
    Formats, ExpertBytes,
    testing::Values(
        BytesRow{"f32", WeightFormat::f32, 2048, 768, 4718592 * 4},
        BytesRow{"bf16", WeightFormat::bf16, 2048, 768, 4718592 * 2},
        // Half a byte per weight; a bf16 scale per 128 columns: 2*768*16 + 2048*6 scales.
        BytesRow{"int4_group_128", WeightFormat::int4_group, 2048, 768, 2359296 + 36864 * 2},
        BytesRow{"int4_group_zero_points", QuantParams::Int4Group(128, DType::bf16, true), 2048,
                 768, 2359296 + 36864 * 3},
        BytesRow{"int4_group_64_f16", QuantParams::Int4Group(64, DType::f16), 2048, 768,
                 2359296 + 73728 * 2},
        // Groups round up at a partial edge: w13 [120, 100] has 2 groups a row, w2 [100, 60] 1.
        BytesRow{"int4_partial_groups", QuantParams::Int4Group(64), 100, 60,
                 6000 + 3000 + (120 * 2 + 100) * 2},
        // 128 x 128 tiles: gate and up 6 x 16 each, down 16 x 6, f32.
        BytesRow{"fp8_block", WeightFormat::fp8_block, 2048, 768, 4718592 + 288 * 4},
        BytesRow{"fp8_tensor", WeightFormat::fp8_tensor, 2048, 768, 4718592 + 3 * 4},
        BytesRow{"fp8_channel", QuantParams::Fp8Tensor(Fp8Scaling::per_channel), 2048, 768,
                 4718592 + (2 * 768 + 2048) * 4}),
    [](const testing::TestParamInfo<BytesRow>& row) { return std::string(row.param.label); });

TEST(ExpectedDistinctExperts, OneTokenSelectsExactlyTopK) {
  EXPECT_DOUBLE_EQ(expected_distinct_experts(128, 8, 1), 8.0);
}

TEST(ExpectedDistinctExperts, NoTokensSelectNothing) {
  EXPECT_DOUBLE_EQ(expected_distinct_experts(128, 8, 0), 0.0);
}

TEST(ExpectedDistinctExperts, FollowsTheUniformFormulaInBetween) {
  // 128 * (1 - (120/128)^16)
  EXPECT_NEAR(expected_distinct_experts(128, 8, 16), 82.4225, 1e-3);
}

TEST(ExpectedDistinctExperts, ApproachesEveryExpertForLargeBatches) {
  EXPECT_NEAR(expected_distinct_experts(128, 8, 4096), 128.0, 1e-9);
}

TEST(CountDistinctExperts, CountsEachExpertOnce) {
  const std::vector<int32_t> ids = {3, 1, 3, 7, 1, 0};
  EXPECT_EQ(count_distinct_experts(ids, 8), 4);
}

TEST(CountDistinctExperts, RefusesAnIdOutsideTheExperts) {
  const std::vector<int32_t> ids = {3, 8};
  EXPECT_THROW(count_distinct_experts(ids, 8), Error);
}

// E=4, top-2, H=8, I=4, bf16; one token routed to 2 experts:
//   bytes = 2 * (3*8*4 weights * 2) + hidden in and out (2 * 8 * 2) + logits (4 * 4) = 432
//   flops = 6 * 1 * 2 * 8 * 4 = 384
struct FloorRow {
  const char* label;
  double bandwidth, peak;
  double floor_s;
  Bound bound;
};
void PrintTo(const FloorRow& row, std::ostream* os) {
  *os << row.label;
}

class RooflineFloor : public testing::TestWithParam<FloorRow> {};

TEST_P(RooflineFloor, IsTheLongerOfStreamingTheBytesAndDoingTheFlops) {
  const FloorRow& row = GetParam();
  const BenchCase c =
      BenchCase::Routed("tiny", 4, 2, 8, 4, {WeightFormat::bf16}, {1}, DeviceKind::cpu);
  const Ceilings ceilings = Ceilings::Known(2, SimdIsa::portable, row.bandwidth, row.peak);
  const Roofline r =
      Roofline::Of(c.spec, WeightFormat::bf16, 1, 2, DType::bf16, ceilings, ComputePeak::fma);
  EXPECT_EQ(r.bytes, 432);
  EXPECT_DOUBLE_EQ(r.flops, 384.0);
  EXPECT_DOUBLE_EQ(r.floor_s, row.floor_s);
  EXPECT_EQ(r.bound, row.bound);
}

INSTANTIATE_TEST_SUITE_P(Bounds, RooflineFloor,
                         testing::Values(FloorRow{"memory", 10e9, 100e9, 432 / 10e9, Bound::memory},
                                         FloorRow{"compute", 10e9, 1e9, 384 / 1e9, Bound::compute}),
                         [](const testing::TestParamInfo<FloorRow>& row) {
                           return std::string(row.param.label);
                         });

TEST(Roofline, CountsSixFlopsPerWeightPerRoutedToken) {
  const BenchCase c =
      BenchCase::Routed("qwen3", 128, 8, 2048, 768, {WeightFormat::bf16}, {512}, DeviceKind::cpu);
  const Ceilings ceilings = Ceilings::Known(2, SimdIsa::avx2_fma, 34.5e9, 204e9);
  const Roofline r =
      Roofline::Of(c.spec, WeightFormat::bf16, 512, 128, DType::bf16, ceilings, ComputePeak::fma);
  EXPECT_DOUBLE_EQ(r.flops, 6.0 * 512 * 8 * 2048 * 768);
}

// Where the plan's GEMM runs on bf16 or int8 dot products (CpuKernels::bf16_rows, int8_gemm),
// that peak is the compute ceiling, if the machine measured one; otherwise the FMA's.
TEST(Roofline, PlannedDotProductsAreBoundByTheirOwnPeak) {
  const BenchCase c =
      BenchCase::Routed("qwen3", 128, 8, 2048, 768, {WeightFormat::bf16}, {512}, DeviceKind::cpu);
  const double flops = 6.0 * 512 * 8 * 2048 * 768;
  Ceilings all = Ceilings::Known(2, SimdIsa::avx2_fma, 1e15, 200e9, 400e9);
  all.int8_dot_ops_per_s = 800e9;
  const Ceilings fma_only = Ceilings::Known(2, SimdIsa::avx2_fma, 1e15, 200e9);
  struct Row {
    const Ceilings& ceilings;
    ComputePeak peak;
    double rate;
  };
  const Row rows[] = {{all, ComputePeak::bf16_dot, 400e9},
                      {all, ComputePeak::int8_dot, 800e9},
                      {all, ComputePeak::fma, 200e9},
                      {fma_only, ComputePeak::bf16_dot, 200e9},
                      {fma_only, ComputePeak::int8_dot, 200e9}};
  for (const Row& row : rows) {
    EXPECT_DOUBLE_EQ(
        Roofline::Of(c.spec, WeightFormat::bf16, 512, 128, DType::bf16, row.ceilings, row.peak)
            .floor_s,
        flops / row.rate)
        << "peak " << static_cast<int>(row.peak) << " at " << row.rate;
  }
}

TEST(BoundName, NamesBothBounds) {
  EXPECT_EQ(bound_name(Bound::memory), "memory");
  EXPECT_EQ(bound_name(Bound::compute), "compute");
}

}  // namespace
}  // namespace moekit::bench
