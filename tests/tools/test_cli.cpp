// The moekit command, run as a subprocess: exit codes 0 (success), 2 (a configuration refused by
// resolve()), 1 (any other error), and what it prints.

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "moekit/platform.hpp"
#include "support/run_moekit.hpp"

namespace moekit {
namespace {

using RunResult = test::CommandResult;
using test::run_moekit;

bool contains(const std::string& text, const std::string& word) {
  return text.find(word) != std::string::npos;
}

// A spec file in a fresh temporary directory, removed with the object.
class TempSpecFile {
 public:
  explicit TempSpecFile(const std::string& json) {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("moekit-cli-" + std::to_string(getpid()) + "-" + info->name());
    std::filesystem::create_directories(dir_);
    path_ = dir_ / "spec.json";
    std::ofstream(path_) << json;
  }
  ~TempSpecFile() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  TempSpecFile(const TempSpecFile&) = delete;
  TempSpecFile& operator=(const TempSpecFile&) = delete;
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path dir_;
  std::filesystem::path path_;
};

// ---------------------------------------------------------------------------------------------
// explain for each preset

class CliExplainPreset : public testing::TestWithParam<const char*> {};

TEST_P(CliExplainPreset, ExitsZeroAndNamesTheFiveLayers) {
  const RunResult r = run_moekit(std::string("explain --preset ") + GetParam());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, std::string("plan for ") + GetParam())) << r.output;
  for (const char* layer : {"1 block", "2 experts", "3 dispatcher", "4 runner", "5 quant method"}) {
    EXPECT_TRUE(contains(r.output, layer)) << "'" << layer << "' not in:\n" << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, CliExplainPreset, testing::Values("dsv3", "qwen3-moe", "mixtral"),
                         [](const testing::TestParamInfo<const char*>& param_info) {
                           std::string name = param_info.param;
                           std::erase(name, '-');
                           return name;
                         });

// ---------------------------------------------------------------------------------------------
// Exit codes

struct ExitRow {
  const char* label;
  const char* args;
  int exit_code;
  std::vector<std::string> mentions;  // each must appear in the output
};
void PrintTo(const ExitRow& row, std::ostream* os) {
  *os << row.label;
}

class CliExit : public testing::TestWithParam<ExitRow> {};

TEST_P(CliExit, ExitCodeAndMessage) {
  const ExitRow& row = GetParam();
  const RunResult r = run_moekit(row.args);
  EXPECT_EQ(r.exit_code, row.exit_code) << "moekit " << row.args << "\n" << r.output;
  for (const std::string& word : row.mentions) {
    EXPECT_TRUE(contains(r.output, word)) << "'" << word << "' not in:\n" << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Explain, CliExit,
    testing::Values(
        ExitRow{
            "runner_cuda_refused", "explain --preset dsv3 --runner cuda", 2, {"refused", "cuda"}},
        ExitRow{"device_cuda_refused", "explain --device cuda:0", 2, {"refused", "cuda:0"}},
        ExitRow{"a2a_mpi_refused", "explain --a2a mpi --ep-size 2", 2, {"refused", "mpi"}},
        ExitRow{"int4_on_cuda_refused",
                "explain --weights int4-group --runner cuda",
                2,
                {"refused", "int4-group", "cuda"}},
        ExitRow{"fp8_block_explained",
                "explain --weights fp8-block",
                0,
                {"fp8-block", "e4m3 weights, f32 scale per 128 x 128 block"}},
        ExitRow{"format_flag_of_another_format_is_an_error",
                "explain --weights fp8-block --group-size 64",
                1,
                {"--group-size", "int4-group"}},
        ExitRow{"odd_int4_group_refused",
                "explain --weights int4-group --group-size 63",
                2,
                {"refused", "even group size"}},
        ExitRow{"unknown_scale_dtype_is_an_error",
                "explain --weights int4-group --scale-dtype f32",
                1,
                {"--scale-dtype", "bf16, f16"}},
        ExitRow{"int4_parameters_explained",
                "explain --weights int4-group --group-size 64 --scale-dtype f16 --zero-points",
                0,
                {"one f16 scale per group of 64 columns with zero points", "w13_qzeros i8"}},
        ExitRow{"int4_int8_activations_explained",
                "explain --weights int4-group --activations int8 --group-size 64",
                0,
                {"int4-group-a8", "activations int8 per token per group (dynamic) of 64 columns"}},
        ExitRow{"unknown_int4_activations_is_an_error",
                "explain --weights int4-group --activations static",
                1,
                {"--activations 'static' is not one of unquantized, int8"}},
        ExitRow{"activations_of_a_format_without_choices_is_an_error",
                "explain --weights fp8-block --activations int8",
                1,
                {"--activations applies to --weights fp8-tensor or int4-group"}},
        ExitRow{"fp8_static_channel_explained",
                "explain --weights fp8-tensor --fp8-scaling channel --activations static",
                0,
                {"one f32 scale per output channel", "static scale", "w13_weight_scale f32"}},
        ExitRow{"fallback_refused_under_strict",
                "explain --form fused-slot --preset qwen3-moe --strict",
                2,
                {"strict", "fused-slot"}},
        ExitRow{"fallback_allowed_without_strict",
                "explain --form fused-slot --preset qwen3-moe",
                0,
                {"FALLBACK", "fused-slot"}},
        ExitRow{"unknown_runner_is_an_error", "explain --runner nonsense", 1, {"nonsense"}},
        ExitRow{"missing_spec_file_is_an_error",
                "explain --spec /nonexistent.json",
                1,
                {"/nonexistent.json"}}),
    [](const testing::TestParamInfo<ExitRow>& param_info) {
      return std::string(param_info.param.label);
    });

// What the parser refuses (a value out of range or of the wrong type, an unknown or missing
// flag) exits 1 with the parser's message, as any other error; what resolve refuses exits 2.
INSTANTIATE_TEST_SUITE_P(
    CommandLine, CliExit,
    testing::Values(
        ExitRow{"tokens_out_of_range", "demo --tokens 100000000", 1, {"--tokens", "100000000"}},
        ExitRow{"tokens_not_a_number", "demo --tokens many", 1, {"--tokens", "many"}},
        ExitRow{"no_repeats", "demo --repeats 0", 1, {"--repeats", "0"}},
        ExitRow{"unknown_flag", "demo --frobnicate", 1, {"--frobnicate"}},
        ExitRow{"flag_of_another_subcommand", "matrix --tokens 4", 1, {"--tokens"}},
        ExitRow{"threads_not_a_number", "explain --threads all", 1, {"--threads", "all"}},
        ExitRow{"negative_threads_refused", "demo --threads -1", 2, {"threads=-1"}},
        ExitRow{"bad_runner", "demo --runner bogus", 1, {"--runner", "bogus"}},
        ExitRow{"preset_and_spec_together", "explain --preset dsv3 --spec x.json", 1, {"--spec"}},
        ExitRow{"no_max_tokens_refused", "explain --max-tokens 0", 2, {"max_tokens"}},
        ExitRow{"rank_outside_the_ranks_refused", "explain --ep-size 2 --ep-rank 2", 2, {"rank 2"}},
        ExitRow{"run_without_a_model", "run --layer 1 --input a --output b", 1, {"--model"}},
        ExitRow{"inspect_without_a_model", "inspect", 1, {"--model"}},
        ExitRow{"bench_experts_out_of_range", "bench --experts 0", 1, {"--experts"}},
        ExitRow{"bench_negative_seconds", "bench --max-seconds -1", 1, {"--max-seconds"}},
        ExitRow{"no_subcommand", "", 1, {"subcommand"}},
        ExitRow{"unknown_subcommand", "frobnicate", 1, {"subcommand"}}),
    [](const testing::TestParamInfo<ExitRow>& param_info) {
      return std::string(param_info.param.label);
    });

// One thread more than resolve grants on this machine (4 per hardware thread), so that a
// command that failed to refuse would start only a few threads too many, not starve the machine.
int threads_above_the_limit() {
  return std::max(4, 4 * Platform::probe().cpu_threads) + 1;
}

TEST(CliThreads, DemoRefusesMoreThreadsThanTheLimitNamingIt) {
  const int threads = threads_above_the_limit();
  const RunResult r = run_moekit(fmt::format("demo --tokens 1 --repeats 1 --threads {}", threads));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, fmt::format("threads={}", threads))) << r.output;
  EXPECT_TRUE(contains(r.output, fmt::format("limit {}", threads - 1))) << r.output;
}

TEST(CliThreads, BenchRefusesMoreThreadsThanTheLimitBeforeMeasuring) {
  const int threads = threads_above_the_limit();
  const RunResult r = run_moekit(fmt::format(
      "bench --experts 8 --top-k 2 --hidden 64 --intermediate 32 --tokens 1 --repeats 1 "
      "--warmup 0 --bandwidth-bytes 4194304 --threads {}",
      threads));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, fmt::format("threads={}", threads))) << r.output;
  EXPECT_FALSE(contains(r.output, "ceilings measured")) << r.output;
}

TEST(CliExplain, RefusedRunnerNamesALegalRunner) {
  const RunResult r = run_moekit("explain --preset dsv3 --runner cuda");
  ASSERT_EQ(r.exit_code, 2) << r.output;
  const size_t legal = r.output.find("legal here:");
  ASSERT_NE(legal, std::string::npos) << r.output;
  const std::string legal_part = r.output.substr(legal);
  EXPECT_TRUE(contains(legal_part, "cpu")) << r.output;
  EXPECT_FALSE(contains(legal_part, "cuda")) << r.output;
}

TEST(CliExplain, ImpossibleSpecFileIsRefused) {
  const TempSpecFile spec(R"({"name": "impossible", "hidden_size": 16,
      "moe_intermediate_size": 8, "n_experts": 8, "top_k": 9, "scoring": "softmax"})");
  const RunResult r = run_moekit("explain --spec '" + spec.path() + "'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "impossible")) << r.output;
  EXPECT_TRUE(contains(r.output, "top-k")) << r.output;
}

TEST(CliExplain, ValidSpecFileIsExplained) {
  const TempSpecFile spec(R"({"name": "tiny", "hidden_size": 16,
      "moe_intermediate_size": 8, "n_experts": 8, "top_k": 2, "scoring": "softmax"})");
  const RunResult r = run_moekit("explain --spec '" + spec.path() + "'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "plan for tiny")) << r.output;
}

TEST(CliExplain, MalformedSpecFileIsAnErrorNamingTheFile) {
  const TempSpecFile spec(R"({"hidden_size": 16,)");
  const RunResult r = run_moekit("explain --spec '" + spec.path() + "'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, spec.path())) << r.output;
}

// ---------------------------------------------------------------------------------------------
// matrix and demo

TEST(CliMatrix, ReportsResolvingAndRefusedCombinations) {
  const RunResult r = run_moekit("matrix");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "ok: ")) << r.output;
  EXPECT_TRUE(contains(r.output, "refused")) << r.output;
  std::smatch totals;
  ASSERT_TRUE(std::regex_search(r.output, totals,
                                std::regex(R"((\d+) combinations resolve, (\d+) are refused)")))
      << r.output;
  EXPECT_GT(std::stoi(totals[1].str()), 0);
  EXPECT_GT(std::stoi(totals[2].str()), 0);
}

TEST(CliDemo, SmallRunChecksAgainstTheReference) {
  const RunResult r = run_moekit("demo --tokens 8 --repeats 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "relative L2 error")) << r.output;
}

class CliDemoFormat : public testing::TestWithParam<const char*> {};

TEST_P(CliDemoFormat, QuantisedRunChecksAgainstTheReferenceAndReportsTheFormatsCost) {
  const std::string args = GetParam();
  const RunResult r = run_moekit("demo --tokens 4 --repeats 1 " + args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::istringstream words(args);
  std::string flag, format;
  words >> flag >> format;
  EXPECT_TRUE(contains(r.output, "quantization: " + format + " costs")) << r.output;
  EXPECT_TRUE(contains(r.output, "(ok,")) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Formats, CliDemoFormat,
                         testing::Values("--weights fp8-tensor", "--weights fp8-block",
                                         "--weights int4-group",
                                         "--weights fp8-tensor --activations static",
                                         "--weights int4-group --zero-points --group-size 32"));

// ---------------------------------------------------------------------------------------------
// help and usage

class CliHelp : public testing::TestWithParam<const char*> {};

TEST_P(CliHelp, ExitsZeroWithUsage) {
  const RunResult r = run_moekit(GetParam());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "Usage")) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Commands, CliHelp,
                         testing::Values("--help", "demo --help", "explain --help", "matrix --help",
                                         "run --help", "inspect --help", "bench --help"),
                         [](const testing::TestParamInfo<const char*>& param_info) {
                           const std::string args = param_info.param;
                           return args == "--help" ? std::string("app")
                                                   : args.substr(0, args.find(' '));
                         });

TEST(CliUsage, AppHelpListsTheSubcommands) {
  const RunResult r = run_moekit("--help");
  for (const char* command : {"demo", "explain", "matrix"}) {
    EXPECT_TRUE(contains(r.output, command)) << "'" << command << "' not in:\n" << r.output;
  }
}

}  // namespace
}  // namespace moekit
