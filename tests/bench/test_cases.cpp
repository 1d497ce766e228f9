// The benchmark's case table and what the command line adds to it.

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "bench/cases.hpp"
#include "moekit/error.hpp"

namespace moekit::bench {
namespace {

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(HeadlineCases, TheCpuTableIsQwen3InBf16Int4WithAndWithoutInt8ActivationsAndFp8Block) {
  const std::vector<BenchCase> cases = headline_cases(DeviceKind::cpu);
  ASSERT_EQ(cases.size(), 1u);
  const BenchCase& c = cases[0];
  EXPECT_EQ(c.name, "cpu-qwen3-30b-a3b");
  EXPECT_EQ(c.spec.n_experts, 128);
  EXPECT_EQ(c.spec.routing.top_k, 8);
  EXPECT_EQ(c.spec.hidden, 2048);
  EXPECT_EQ(c.spec.intermediate, 768);
  EXPECT_EQ(c.formats,
            (std::vector<QuantParams>{WeightFormat::bf16, WeightFormat::int4_group,
                                      QuantParams::Int4GroupA8(), WeightFormat::fp8_block}));
  EXPECT_EQ(c.tokens, (std::vector<int64_t>{1, 16, 512}));
}

TEST(HeadlineCases, TheCudaTableHasTheFourGpuCases) {
  std::vector<std::string> names;
  for (const BenchCase& c : headline_cases(DeviceKind::cuda)) names.push_back(c.name);
  EXPECT_EQ(names, (std::vector<std::string>{"dsv3-decode", "dsv3-prefill", "qwen3-30b-a3b",
                                             "mixtral-8x7b"}));
}

TEST(HeadlineCases, EveryCaseIsRoutedExpertsOnly) {
  for (const DeviceKind device : {DeviceKind::cpu, DeviceKind::cuda}) {
    for (const BenchCase& c : headline_cases(device)) {
      EXPECT_EQ(c.spec.n_shared, 0) << c.name;
      EXPECT_EQ(c.spec.routing.n_group, 1) << c.name;
      EXPECT_EQ(c.spec.routing.scoring, Scoring::softmax) << c.name;
      EXPECT_TRUE(c.spec.problems().empty()) << c.name;
    }
  }
}

TEST(FindCase, ReturnsTheNamedCase) {
  EXPECT_EQ(find_case("mixtral-8x7b", DeviceKind::cuda).spec.intermediate, 14336);
}

TEST(FindCase, AnUnknownNameListsTheDevicesCases) {
  const std::string message = error_of([] { find_case("qwen9", DeviceKind::cpu); });
  EXPECT_NE(message.find("'qwen9'"), std::string::npos) << message;
  EXPECT_NE(message.find("cpu-qwen3-30b-a3b"), std::string::npos) << message;
}

TEST(FindCase, AnotherDevicesCaseNamesThatDevice) {
  const std::string message = error_of([] { find_case("dsv3-decode", DeviceKind::cpu); });
  EXPECT_NE(message.find("--device cuda"), std::string::npos) << message;
}

TEST(BenchCaseTimeOnly, DropsTheSkewedRowsWithTheCasesOwnCounts) {
  BenchCase c = find_case("qwen3-30b-a3b", DeviceKind::cuda);
  ASSERT_FALSE(c.skewed_tokens.empty());
  c.time_only({1, 4});
  EXPECT_EQ(c.tokens, (std::vector<int64_t>{1, 4}));
  EXPECT_TRUE(c.skewed_tokens.empty());
}

TEST(ParseTokenList, ReadsCommaSeparatedCounts) {
  EXPECT_EQ(parse_token_list("1,16,512"), (std::vector<int64_t>{1, 16, 512}));
  EXPECT_EQ(parse_token_list("7"), (std::vector<int64_t>{7}));
}

class ParseTokenListRefuses : public testing::TestWithParam<const char*> {};

TEST_P(ParseTokenListRefuses, NamingTheBadEntry) {
  const std::string text = GetParam();
  const std::string message = error_of([&] { parse_token_list(text); });
  EXPECT_NE(message.find("--tokens '" + text + "'"), std::string::npos) << message;
  EXPECT_NE(message.find("not a positive integer"), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(BadLists, ParseTokenListRefuses,
                         testing::Values("", "1,,2", "1,", "0", "-3", "x", "1.5", "16 ",
                                         "99999999999999999999"));

TEST(ParseRouting, KnowsUniformAndSkewed) {
  EXPECT_EQ(parse_routing("uniform"), Routing::uniform);
  EXPECT_EQ(parse_routing("skewed"), Routing::skewed);
  EXPECT_EQ(parse_routing("zipf"), std::nullopt);
  EXPECT_EQ(routing_name(Routing::skewed), "skewed");
}

}  // namespace
}  // namespace moekit::bench
