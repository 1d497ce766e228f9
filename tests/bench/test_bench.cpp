// Running a case: every format and batch is timed, checked against the reference runner and
// reported; refusals are recorded, not thrown; the report has the shape the scripts read.

#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "bench/bench.hpp"
#include "moekit/error.hpp"

namespace moekit::bench {
namespace {

// Made-up ceilings: these tests check the bookkeeping, not the machine.
const Ceilings kCeilings = Ceilings::Known(2, SimdIsa::portable, 20e9, 100e9);

BenchLog quiet_log() {
  return {[](const std::string&) {}, [](const std::string&) {}};
}

BenchSettings quick_settings() {
  BenchSettings settings;
  settings.repeats = 3;
  settings.warmup = 1;
  settings.flush_bytes = 1 << 20;
  return settings;
}

BenchReport run(const BenchCase& c, const BenchSettings& settings,
                const Options& options = Options{}) {
  BenchReport report;
  report.machine = kCeilings;
  run_case(c, options, Platform::probe(), settings, quiet_log(), report);
  return report;
}

TEST(RunCase, TimesEveryFormatAndBatchAndMatchesTheReference) {
  const BenchCase c =
      BenchCase::Routed("tiny", 8, 2, 64, 32, {WeightFormat::bf16, WeightFormat::int4_group},
                        {1, 6}, DeviceKind::cpu);
  const BenchReport report = run(c, quick_settings());
  ASSERT_EQ(report.results.size(), 4u);
  EXPECT_TRUE(report.refusals.empty());
  EXPECT_GT(report.setup_s, 0.0);
  const std::vector<std::pair<WeightFormat, int64_t>> order = {{WeightFormat::bf16, 1},
                                                               {WeightFormat::bf16, 6},
                                                               {WeightFormat::int4_group, 1},
                                                               {WeightFormat::int4_group, 6}};
  for (size_t i = 0; i < order.size(); ++i) {
    const CaseResult& r = report.results[i];
    EXPECT_EQ(r.format.format, order[i].first);
    EXPECT_EQ(r.tokens, order[i].second);
    EXPECT_TRUE(r.ok) << "error " << r.error;
    EXPECT_EQ(r.timing.repeats, 3);
    EXPECT_GT(r.timing.min_s, 0.0);
    EXPECT_LE(r.timing.min_s, r.timing.median_s);
    EXPECT_LE(r.timing.median_s, r.timing.max_s);
    EXPECT_GE(r.distinct_experts, 2);
    EXPECT_LE(r.distinct_experts, std::min<int64_t>(8, 2 * r.tokens));
    EXPECT_EQ(r.roofline.bytes, Roofline::Of(c.spec, r.format, r.tokens, r.distinct_experts,
                                             DType::bf16, kCeilings, ComputePeak::fma)
                                    .bytes);
  }
}

TEST(RunCase, ASlowCaseStopsRepeatingAtItsBudget) {
  BenchSettings settings = quick_settings();
  settings.repeats = 10;
  settings.budget_s = 1e-12;
  const BenchCase c =
      BenchCase::Routed("tiny", 8, 2, 64, 32, {WeightFormat::bf16}, {2}, DeviceKind::cpu);
  const BenchReport report = run(c, settings);
  ASSERT_EQ(report.results.size(), 1u);
  EXPECT_EQ(report.results[0].timing.repeats, kMinRepeats);
}

TEST(RunCase, SkewedRoutingSelectsFewerExpertsThanUniform) {
  const BenchCase c =
      BenchCase::Routed("wide", 64, 8, 32, 16, {WeightFormat::bf16}, {16}, DeviceKind::cpu);
  BenchSettings skewed = quick_settings();
  skewed.routing = Routing::skewed;
  const BenchReport uniform_report = run(c, quick_settings());
  const BenchReport skewed_report = run(c, skewed);
  ASSERT_EQ(uniform_report.results.size(), 1u);
  ASSERT_EQ(skewed_report.results.size(), 1u);
  EXPECT_LT(skewed_report.results[0].distinct_experts + 5,
            uniform_report.results[0].distinct_experts);
  EXPECT_EQ(skewed_report.results[0].routing, Routing::skewed);
}

TEST(RunCase, AGpuCaseIsRecordedAsRefusedNotThrown) {
  Options options;
  options.device = Device::cuda(0);
  const BenchReport report =
      run(find_case("mixtral-8x7b", DeviceKind::cuda), quick_settings(), options);
  EXPECT_TRUE(report.results.empty());
  ASSERT_EQ(report.refusals.size(), 1u);
  EXPECT_EQ(report.refusals[0].case_name, "mixtral-8x7b");
  EXPECT_NE(report.refusals[0].message.find("refused"), std::string::npos)
      << report.refusals[0].message;
}

TEST(RunCase, RefusesFp8StaticActivationsWithoutCalibratedScales) {
  const BenchCase c =
      BenchCase::Routed("tiny", 8, 2, 64, 32,
                        {QuantParams::Fp8Tensor(Fp8Scaling::per_tensor, Fp8Activations::static_)},
                        {1}, DeviceKind::cpu);
  EXPECT_THROW(run(c, quick_settings()), Error);
}

TEST(Timing, TakesTheMedianAndTheExtremes) {
  const Timing t = Timing::Of({0.3, 0.1, 0.2, 0.5, 0.4});
  EXPECT_DOUBLE_EQ(t.median_s, 0.3);
  EXPECT_DOUBLE_EQ(t.min_s, 0.1);
  EXPECT_DOUBLE_EQ(t.max_s, 0.5);
  EXPECT_EQ(t.repeats, 5);
}

CaseResult made_up_result(double error) {
  CaseResult r;
  r.case_name = "cpu-qwen3-30b-a3b";
  r.spec = find_case("cpu-qwen3-30b-a3b", DeviceKind::cpu).spec;
  r.format = WeightFormat::int4_group;
  r.tokens = 16;
  r.runner = "cpu";
  r.path = "contiguous core";
  r.timing = Timing::Of({0.04, 0.05, 0.06});
  r.distinct_experts = 80;
  r.expected_distinct_experts = 82.4;
  r.roofline = Roofline::Of(r.spec, r.format, 16, 80, DType::bf16, kCeilings, ComputePeak::fma);
  r.error = error;
  r.ok = error <= kBf16Tolerance;
  return r;
}

TEST(BenchReport, JsonHasExactlyTheAgreedKeysInOrder) {
  BenchReport report;
  report.machine = kCeilings;
  report.results.push_back(made_up_result(1e-3));
  const nlohmann::ordered_json json = nlohmann::ordered_json::parse(report.json());
  std::vector<std::string> keys;
  for (const auto& [key, value] : json.items()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"machine", "results"}));
  keys.clear();
  for (const auto& [key, value] : json["machine"].items()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"threads", "isa", "read_bandwidth_gbs",
                                            "fma_peak_gflops", "bf16_dot_peak_gflops",
                                            "int8_dot_peak_gops", "int8_dot_isa"}));
  keys.clear();
  for (const auto& [key, value] : json["results"][0].items()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"case",
                                            "experts",
                                            "top_k",
                                            "hidden",
                                            "intermediate",
                                            "weights",
                                            "tokens",
                                            "runner",
                                            "routing",
                                            "median_ms",
                                            "min_ms",
                                            "max_ms",
                                            "repeats",
                                            "distinct_experts",
                                            "expected_distinct_experts",
                                            "bytes",
                                            "flops",
                                            "read_bandwidth_gbs",
                                            "read_bandwidth_before_gbs",
                                            "read_bandwidth_after_gbs",
                                            "floor_ms",
                                            "floor_ratio",
                                            "gbs",
                                            "gflops",
                                            "bound",
                                            "error",
                                            "ok"}));
}

TEST(BenchReport, JsonCarriesTheFiguresInItsUnits) {
  BenchReport report;
  report.machine = kCeilings;
  report.results.push_back(made_up_result(1e-3));
  report.results[0].read_before_bytes_per_s = 30e9;
  report.results[0].read_after_bytes_per_s = 25e9;
  const CaseResult& r = report.results[0];
  const nlohmann::json json = nlohmann::json::parse(report.json());
  EXPECT_DOUBLE_EQ(json["machine"]["read_bandwidth_gbs"].get<double>(), 20.0);
  EXPECT_DOUBLE_EQ(json["machine"]["fma_peak_gflops"].get<double>(), 100.0);
  const nlohmann::json& row = json["results"][0];
  EXPECT_EQ(row["weights"], "int4-group");
  EXPECT_NEAR(row["median_ms"].get<double>(), 50.0, 1e-12);
  EXPECT_EQ(row["bytes"].get<int64_t>(), r.roofline.bytes);
  EXPECT_EQ(row["flops"].get<int64_t>(), int64_t{6} * 16 * 8 * 2048 * 768);
  EXPECT_DOUBLE_EQ(row["floor_ratio"].get<double>(), r.roofline.floor_s / 0.05);
  EXPECT_NEAR(row["gbs"].get<double>(), static_cast<double>(r.roofline.bytes) / 0.05e9, 1e-9);
  EXPECT_EQ(row["bound"], bound_name(r.roofline.bound));
  EXPECT_DOUBLE_EQ(row["read_bandwidth_before_gbs"].get<double>(), 30.0);
  EXPECT_DOUBLE_EQ(row["read_bandwidth_after_gbs"].get<double>(), 25.0);
  EXPECT_NE(report.table().find("30.0/25.0"), std::string::npos) << report.table();
}

TEST(BenchReport, TheTableMarksAResultOverTheToleranceFailed) {
  BenchReport report;
  report.machine = kCeilings;
  report.results.push_back(made_up_result(1e-3));
  EXPECT_TRUE(report.all_ok());
  EXPECT_EQ(report.table().find("FAILED"), std::string::npos);
  report.results.push_back(made_up_result(0.5));
  EXPECT_FALSE(report.all_ok());
  EXPECT_NE(report.table().find("FAILED"), std::string::npos) << report.table();
}

TEST(BenchReport, TheTableWarnsOfAResultFasterThanItsFloor) {
  BenchReport report;
  report.machine = kCeilings;
  report.results.push_back(made_up_result(1e-3));
  EXPECT_EQ(report.table().find("faster than the floor"), std::string::npos);
  report.results[0].timing = Timing::Of({report.results[0].roofline.floor_s / 2});
  EXPECT_NE(report.table().find("1 result(s) ran faster than the floor"), std::string::npos)
      << report.table();
}

}  // namespace
}  // namespace moekit::bench
