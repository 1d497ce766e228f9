// The GPU benchmark's parts that need no GPU: its case table, the roofline of a GPU result, the
// report, and the refusals of the GPU commands on a machine without one.

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "bench/gpu_bench.hpp"
#include "bench/random_layer.hpp"
#include "moekit/platform.hpp"
#include "support/hf_checkpoint.hpp"
#include "support/run_moekit.hpp"

namespace moekit::bench {
namespace {

GpuCeilings h200_like() {
  GpuCeilings g;
  g.name = "test GPU";
  g.l2_bytes = int64_t{60} << 20;
  g.read_bytes_per_s = 4.0e12;
  g.bf16_flops_per_s = 600e12;
  g.fp8_flops_per_s = 1200e12;
  g.peak_method = "given";
  return g;
}

std::vector<int64_t> gpu_tokens(const std::string& prefix, WeightFormat format) {
  std::vector<int64_t> tokens;
  for (const BenchCase& c : headline_cases(DeviceKind::cuda)) {
    const bool has = std::any_of(c.formats.begin(), c.formats.end(),
                                 [format](const QuantParams& f) { return f.format == format; });
    if (c.name.rfind(prefix, 0) == 0 && has) {
      tokens.insert(tokens.end(), c.tokens.begin(), c.tokens.end());
    }
  }
  return tokens;
}

struct Moments {
  double mean = 0.0, stddev = 0.0, largest = 0.0;
};

template <typename Value>
Moments moments_of(const Tensor& t, const Value& value) {
  const int64_t n = t.view().numel();
  double sum = 0.0, squares = 0.0;
  Moments m;
  for (int64_t i = 0; i < n; ++i) {
    const double v = value(i);
    sum += v;
    squares += v * v;
    m.largest = std::max(m.largest, std::fabs(v));
  }
  m.mean = sum / static_cast<double>(n);
  m.stddev = std::sqrt(squares / static_cast<double>(n) - m.mean * m.mean);
  return m;
}

// The GPU bench makes fp8 experts directly as e4m3 codes and its logits in f32.
TEST(FastRandomE4m3, HasTheAskedDeviationWithinTheFormatsRange) {
  const Tensor t = fast_random_e4m3({int64_t{1} << 20}, 64.0f, 3, 2);
  const Moments m = moments_of(t, [&t](int64_t i) { return to_float(t.data<e4m3_t>()[i]); });
  EXPECT_NEAR(m.mean, 0.0, 0.5);
  EXPECT_NEAR(m.stddev, 64.0, 1.5);  // e4m3 rounding of a few percent, evenly signed
  EXPECT_LE(m.largest, 64.0 * 3.5);
}

TEST(FastRandomF32, HasTheAskedMeanAndDeviationAndDependsOnTheSeed) {
  const Tensor t = fast_random_f32({int64_t{1} << 20}, 2.0f, 9, 2);
  const Moments m = moments_of(t, [&t](int64_t i) { return t.data<float>()[i]; });
  EXPECT_NEAR(m.mean, 0.0, 0.01);
  EXPECT_NEAR(m.stddev, 2.0, 0.02);
  EXPECT_NE(fast_random_f32({4}, 1.0f, 9, 1).data<float>()[0],
            fast_random_f32({4}, 1.0f, 10, 1).data<float>()[0]);
}

TEST(GpuCases, CoverTheBenchmarkTokenCountsInBf16AndFp8Block) {
  for (const WeightFormat format : {WeightFormat::bf16, WeightFormat::fp8_block}) {
    SCOPED_TRACE(std::string(weight_format_name(format)));
    EXPECT_EQ(gpu_tokens("dsv3", format), (std::vector<int64_t>{1, 8, 64, 512, 4096, 16384}));
    EXPECT_EQ(gpu_tokens("qwen3", format), (std::vector<int64_t>{1, 8, 64, 512, 4096}));
  }
  EXPECT_EQ(gpu_tokens("mixtral", WeightFormat::bf16), (std::vector<int64_t>{1, 64, 1024}));
}

TEST(GpuCases, IncludeSkewedRouting) {
  int skewed = 0;
  for (const BenchCase& c : headline_cases(DeviceKind::cuda)) {
    skewed += static_cast<int>(c.skewed_tokens.size());
  }
  EXPECT_GE(skewed, 1);
}

TEST(GpuResult, DecodeIsBoundByTheDistinctExpertsWeightBytes) {
  const BenchCase c = find_case("dsv3-decode", DeviceKind::cuda);
  const GpuCaseResult r =
      gpu_result(c, WeightFormat::bf16, 1, Routing::uniform, h200_like(), {20e-6, 10e-6, 30e-6}, 8);
  const int64_t expert = 3 * 7168 * 2048 * 2;
  const int64_t activations = 2 * 7168 * 2 + 256 * 4;
  EXPECT_EQ(r.roofline.bytes, 8 * expert + activations);
  EXPECT_EQ(r.roofline.bound, Bound::memory);
  EXPECT_DOUBLE_EQ(r.roofline.floor_s, static_cast<double>(r.roofline.bytes) / 4.0e12);
  EXPECT_DOUBLE_EQ(r.timing.median_s, 20e-6);
  EXPECT_DOUBLE_EQ(r.floor_ratio(), r.roofline.floor_s / 20e-6);
  EXPECT_DOUBLE_EQ(r.bytes_per_s(), static_cast<double>(r.roofline.bytes) / 20e-6);
  EXPECT_TRUE(r.graph);
}

TEST(GpuResult, PrefillIsBoundByTheFormatsTensorCorePeak) {
  const BenchCase c = find_case("dsv3-prefill", DeviceKind::cuda);
  const double flops = 6.0 * 16384 * 8 * 7168 * 2048;
  const GpuCaseResult bf16 =
      gpu_result(c, WeightFormat::bf16, 16384, Routing::uniform, h200_like(), {0.05}, 256);
  EXPECT_EQ(bf16.roofline.bound, Bound::compute);
  EXPECT_DOUBLE_EQ(bf16.roofline.flops, flops);
  EXPECT_DOUBLE_EQ(bf16.roofline.floor_s, flops / 600e12);
  EXPECT_FALSE(bf16.graph);
  const GpuCaseResult fp8 =
      gpu_result(c, WeightFormat::fp8_block, 16384, Routing::uniform, h200_like(), {0.05}, 256);
  EXPECT_DOUBLE_EQ(fp8.roofline.floor_s, flops / 1200e12);
  EXPECT_DOUBLE_EQ(fp8.peak_flops_per_s, 1200e12);
}

TEST(GpuResult, Fp8WithoutAnFp8PeakFallsBackToTheBf16One) {
  GpuCeilings g = h200_like();
  g.fp8_flops_per_s = 0.0;
  EXPECT_DOUBLE_EQ(g.peak_for(WeightFormat::fp8_block), 600e12);
}

GpuReport report_of(bool second_ok) {
  GpuReport report;
  report.gpu = h200_like();
  const BenchCase c = find_case("qwen3-30b-a3b", DeviceKind::cuda);
  report.results.push_back(
      gpu_result(c, WeightFormat::bf16, 1, Routing::uniform, h200_like(), {30e-6}, 8));
  report.results.push_back(
      gpu_result(c, WeightFormat::fp8_block, 512, Routing::skewed, h200_like(), {100e-6}, 100));
  report.results[0].ok = true;
  report.results[1].ok = second_ok;
  return report;
}

TEST(GpuReport, FailsWhenAnyResultFailedItsCheck) {
  EXPECT_TRUE(report_of(true).all_ok());
  EXPECT_FALSE(report_of(false).all_ok());
  EXPECT_FALSE(GpuReport{}.all_ok());
}

TEST(GpuReport, TableNamesTheCeilingsAndEveryResult) {
  const std::string table = report_of(false).table();
  EXPECT_NE(table.find("4.00 TB/s"), std::string::npos) << table;
  EXPECT_NE(table.find("bf16 600 TFLOP/s, fp8 1200 TFLOP/s"), std::string::npos) << table;
  EXPECT_NE(table.find("skewed"), std::string::npos) << table;
  EXPECT_NE(table.find("FAILED"), std::string::npos) << table;
}

TEST(GpuReport, SummaryCountsChecksAndSpreadsTheFloorRatio) {
  const GpuReport report = report_of(false);
  const std::string summary = report.summary();
  EXPECT_NE(summary.find("1/2 checked ok"), std::string::npos) << summary;
  const double low =
      100.0 * std::min(report.results[0].floor_ratio(), report.results[1].floor_ratio());
  EXPECT_NE(summary.find(fmt::format("min {:.0f}", low)), std::string::npos) << summary;
}

TEST(GpuReport, JsonCarriesTheRooflineOfEachResult) {
  const GpuReport report = report_of(true);
  const nlohmann::json json = nlohmann::json::parse(report.json());
  EXPECT_DOUBLE_EQ(json.at("gpu").at("read_bandwidth_tbs").get<double>(), 4.0);
  const nlohmann::json& rows = json.at("results");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].at("routing"), "skewed");
  EXPECT_EQ(rows[1].at("weights"), "fp8-block");
  EXPECT_DOUBLE_EQ(rows[1].at("floor_ratio").get<double>(), report.results[1].floor_ratio());
  EXPECT_DOUBLE_EQ(rows[0].at("median_us").get<double>(), 30.0);
  EXPECT_TRUE(rows[0].at("graph").get<bool>());
}

// The GPU commands on a machine without a GPU: resolve's refusal, exit 2. On a GPU machine they
// would run, which the device script exercises instead.
class GpuCommandsWithoutAGpu : public testing::TestWithParam<const char*> {};

TEST_P(GpuCommandsWithoutAGpu, ExitWithResolvesRefusal) {
  if (!Platform::probe().gpus.empty()) GTEST_SKIP() << "this machine has a GPU";
  const test::CommandResult r = test::run_moekit(GetParam());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("cuda"), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Commands, GpuCommandsWithoutAGpu,
                         testing::Values("bench --device cuda --tokens 1",
                                         "demo --device cuda --tokens 4",
                                         "demo --device cuda:1 --runner cuda --tokens 4"));

TEST(GpuCommandsWithoutAGpu, RunOnCuda0ExitsWithResolvesRefusalAndWritesNothing) {
  if (!Platform::probe().gpus.empty()) GTEST_SKIP() << "this machine has a GPU";
  const test::TestDir dir;
  const test::TinyHfModel model = test::TinyHfModel::mixtral();
  test::HfCheckpoint::random(model, 3).write(dir.path() / "model");
  const std::vector<float> hidden(static_cast<size_t>(3 * model.hidden), 0.5f);
  const std::string in = dir / "in.safetensors", out = dir / "out.safetensors";
  test::write_tensor_file(
      in, {{"hidden_states", test::StoredTensor::of(hidden, DType::bf16, {3, model.hidden})}});
  const test::CommandResult r = test::run_moekit(
      fmt::format("run --model '{}' --layer 0 --input '{}' --output '{}' --device cuda:0",
                  (dir.path() / "model").string(), in, out));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("cuda"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(out));
}

}  // namespace
}  // namespace moekit::bench
