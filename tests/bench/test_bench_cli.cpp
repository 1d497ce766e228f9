// moekit bench, run as a subprocess on a tiny custom case: exit codes, and the JSON it writes.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "moekit/platform.hpp"
#include "support/run_moekit.hpp"

namespace moekit {
namespace {

using RunResult = test::CommandResult;
using test::run_moekit;

bool contains(const std::string& text, const std::string& word) {
  return text.find(word) != std::string::npos;
}

// A small bandwidth array keeps the test quick; the figures are then cache speeds, which is
// fine here: only their presence and sanity are checked.
constexpr const char* kTinyCase =
    "bench --experts 8 --top-k 2 --hidden 64 --intermediate 32 --tokens 1,5 --repeats 3 "
    "--warmup 1 --bandwidth-bytes 4194304";

class BenchJson : public testing::Test {
 protected:
  void SetUp() override {
    path_ = std::filesystem::temp_directory_path() /
            ("moekit-bench-" + std::to_string(getpid()) + ".json");
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }
  std::filesystem::path path_;
};

TEST_F(BenchJson, ATinyCustomCaseWritesSaneResults) {
  const RunResult r = run_moekit(std::string(kTinyCase) + " --json '" + path_.string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "floor%")) << r.output;
  const nlohmann::json json = nlohmann::json::parse(std::ifstream(path_));
  const nlohmann::json& machine = json.at("machine");
  EXPECT_GE(machine.at("threads").get<int>(), 1);
  EXPECT_TRUE(machine.at("isa") == "avx2+fma" || machine.at("isa") == "portable");
  EXPECT_GT(machine.at("read_bandwidth_gbs").get<double>(), 0.0);
  EXPECT_GT(machine.at("fma_peak_gflops").get<double>(), 0.0);
  const nlohmann::json& results = json.at("results");
  ASSERT_EQ(results.size(), 2u);
  for (size_t i = 0; i < results.size(); ++i) {
    const nlohmann::json& row = results[i];
    SCOPED_TRACE(row.dump());
    EXPECT_EQ(row.at("case"), "custom");
    EXPECT_EQ(row.at("experts"), 8);
    EXPECT_EQ(row.at("top_k"), 2);
    EXPECT_EQ(row.at("weights"), "bf16");
    EXPECT_EQ(row.at("tokens"), i == 0 ? 1 : 5);
    EXPECT_EQ(row.at("routing"), "uniform");
    EXPECT_EQ(row.at("repeats"), 3);
    EXPECT_TRUE(row.at("ok").get<bool>());
    EXPECT_LT(row.at("error").get<double>(), 2e-2);
    EXPECT_GT(row.at("min_ms").get<double>(), 0.0);
    EXPECT_LE(row.at("min_ms").get<double>(), row.at("median_ms").get<double>());
    EXPECT_LE(row.at("median_ms").get<double>(), row.at("max_ms").get<double>());
    EXPECT_GE(row.at("distinct_experts").get<int>(), 2);
    EXPECT_LE(row.at("distinct_experts").get<int>(), 8);
    EXPECT_GT(row.at("bytes").get<int64_t>(), 0);
    EXPECT_EQ(row.at("flops").get<int64_t>(), 6 * row.at("tokens").get<int64_t>() * 2 * 64 * 32);
    EXPECT_GT(row.at("floor_ratio").get<double>(), 0.0);
    EXPECT_TRUE(row.at("bound") == "memory" || row.at("bound") == "compute");
  }
}

// --cpu-isa avx2 plans and measures as on this CPU without its AVX-512: no bf16 dot-product peak,
// the int8 one on pmaddubsw, and int4-group-a8's GEMM rows on it, still checked.
TEST_F(BenchJson, CpuIsaAvx2PlansAndMeasuresWithoutAvx512) {
  if (!Platform::probe().avx2) GTEST_SKIP() << "this CPU lacks AVX2";
  const RunResult r = run_moekit(
      std::string(kTinyCase) +
      " --cpu-isa avx2 --weights int4-group --activations int8 --group-size 32 --json '" +
      path_.string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json json = nlohmann::json::parse(std::ifstream(path_));
  const nlohmann::json& machine = json.at("machine");
  EXPECT_EQ(machine.at("bf16_dot_peak_gflops").get<double>(), 0.0);
  EXPECT_EQ(machine.at("int8_dot_isa"), "avx2+fma");
  EXPECT_GT(machine.at("int8_dot_peak_gops").get<double>(), 0.0);
  for (const nlohmann::json& row : json.at("results")) {
    EXPECT_TRUE(row.at("ok").get<bool>()) << row.dump();
  }
}

TEST(BenchCli, AnUnknownCpuIsaExitsOneNamingIt) {
  const RunResult r = run_moekit("bench --cpu-isa avx9");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--cpu-isa")) << r.output;
  EXPECT_TRUE(contains(r.output, "avx9")) << r.output;
}

TEST(BenchCli, AnUnknownCaseExitsOneNamingTheCases) {
  const RunResult r = run_moekit("bench --case qwen9");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "'qwen9'")) << r.output;
  EXPECT_TRUE(contains(r.output, "cpu-qwen3-30b-a3b")) << r.output;
}

TEST(BenchCli, APartialCustomCaseExitsOne) {
  const RunResult r = run_moekit("bench --experts 8 --top-k 2");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--hidden")) << r.output;
}

TEST(BenchCli, ListNamesEveryCase) {
  const RunResult r = run_moekit("bench --list");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* name :
       {"cpu-qwen3-30b-a3b", "dsv3-decode", "dsv3-prefill", "qwen3-30b-a3b", "mixtral-8x7b"}) {
    EXPECT_TRUE(contains(r.output, name)) << name << " not in:\n" << r.output;
  }
}

}  // namespace
}  // namespace moekit
