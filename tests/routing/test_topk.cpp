#include "routing/topk.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/thread_pool.hpp"
#include "moekit/dtype.hpp"
#include "moekit/error.hpp"
#include "moekit/tensor.hpp"

namespace moekit::routing {
namespace {

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed route(const RoutingSpec& spec, int n_experts, const TensorView& logits, const float* bias,
             ThreadPool* pool = nullptr, bool check_finite = true) {
  const auto slots = static_cast<size_t>(logits.dim(0) * spec.top_k);
  Routed out{std::vector<int32_t>(slots, -1), std::vector<float>(slots, -1.0f)};
  select_experts(spec, n_experts, logits, bias, check_finite, out.ids.data(), out.weights.data(),
                 pool);
  return out;
}

Routed route_f32(const RoutingSpec& spec, int n_experts, std::vector<float>& logits,
                 const float* bias, ThreadPool* pool = nullptr, bool check_finite = true) {
  const int64_t rows = static_cast<int64_t>(logits.size()) / n_experts;
  return route(spec, n_experts,
               TensorView::contiguous(logits.data(), DType::f32, {rows, n_experts}), bias, pool,
               check_finite);
}

uint32_t test_seed() {
  if (const char* text = std::getenv("MOEKIT_TEST_SEED")) {
    return static_cast<uint32_t>(std::stoul(text));
  }
  return std::random_device{}();
}

std::string seed_note(uint32_t seed) {
  return fmt::format("seed {} (rerun with MOEKIT_TEST_SEED={})", seed, seed);
}

// The oracle: double precision, every candidate sorted, nothing shared with the implementation.
struct Expected {
  std::vector<int32_t> ids;
  std::vector<double> weights;
  // False when two candidates are so close that float32 rounding may legitimately order them
  // either way; such rows are redrawn rather than compared.
  bool decidable = true;
};

struct Candidate {
  double choice;
  int id;
};

bool ranks_before(const Candidate& a, const Candidate& b) {
  if (a.choice != b.choice) return a.choice > b.choice;
  return a.id < b.id;
}

bool too_close(double a, double b) {
  return std::abs(a - b) <= 1e-6 + 1e-5 * std::max(std::abs(a), std::abs(b));
}

Expected oracle(const RoutingSpec& spec, int n_experts, const float* logits, const float* bias) {
  std::vector<double> score(n_experts);
  for (int e = 0; e < n_experts; ++e) {
    const double x = logits[e];
    switch (spec.scoring) {
      case Scoring::softmax: {
        double total = 0.0;
        for (int other = 0; other < n_experts; ++other) total += std::exp(logits[other] - x);
        score[e] = 1.0 / total;
        break;
      }
      case Scoring::sigmoid:
        score[e] = std::exp(x) / (1.0 + std::exp(x));
        break;
      case Scoring::sqrt_softplus:
        score[e] = std::sqrt(x > 30.0 ? x : std::log(1.0 + std::exp(x)));
        break;
    }
  }
  std::vector<double> choice(score);
  if (spec.correction_bias) {
    for (int e = 0; e < n_experts; ++e) choice[e] += bias[e];
  }

  Expected expected;
  std::vector<bool> allowed(n_experts, true);
  if (spec.n_group > 1) {
    const int size = n_experts / spec.n_group;
    std::vector<Candidate> groups;
    for (int g = 0; g < spec.n_group; ++g) {
      std::vector<double> members(choice.begin() + g * size, choice.begin() + (g + 1) * size);
      std::sort(members.begin(), members.end(), std::greater<>());
      const double value =
          spec.group_score == GroupScore::max ? members[0] : members[0] + members[1];
      groups.push_back({value, g});
    }
    std::sort(groups.begin(), groups.end(), ranks_before);
    if (spec.topk_group < spec.n_group &&
        too_close(groups[spec.topk_group - 1].choice, groups[spec.topk_group].choice)) {
      expected.decidable = false;
    }
    std::fill(allowed.begin(), allowed.end(), false);
    for (int i = 0; i < spec.topk_group; ++i) {
      const int g = groups[i].id;
      std::fill(allowed.begin() + g * size, allowed.begin() + (g + 1) * size, true);
    }
  }

  std::vector<Candidate> candidates;
  for (int e = 0; e < n_experts; ++e) {
    if (allowed[e]) candidates.push_back({choice[e], e});
  }
  std::sort(candidates.begin(), candidates.end(), ranks_before);
  const int compared = std::min<int>(spec.top_k + 1, static_cast<int>(candidates.size()));
  for (int j = 0; j + 1 < compared; ++j) {
    if (too_close(candidates[j].choice, candidates[j + 1].choice)) expected.decidable = false;
  }

  double total = 0.0;
  for (int j = 0; j < spec.top_k; ++j) {
    expected.ids.push_back(candidates[j].id);
    total += score[candidates[j].id];
  }
  for (int32_t id : expected.ids) {
    const double w = spec.renormalize ? score[id] / total : score[id];
    expected.weights.push_back(w * spec.routed_scaling_factor);
  }
  return expected;
}

testing::AssertionResult matches(const Expected& expected, const int32_t* ids,
                                 const float* weights) {
  const int k = static_cast<int>(expected.ids.size());
  for (int j = 0; j < k; ++j) {
    if (ids[j] != expected.ids[j]) {
      return testing::AssertionFailure()
             << "slot " << j << ": id " << ids[j] << ", oracle " << expected.ids[j];
    }
    const double want = expected.weights[j];
    if (std::abs(weights[j] - want) > 1e-6 * std::abs(want)) {
      return testing::AssertionFailure()
             << "slot " << j << " (expert " << ids[j] << "): weight "
             << fmt::format("{:.9g}", weights[j]) << ", oracle " << fmt::format("{:.9g}", want);
    }
  }
  return testing::AssertionSuccess();
}

struct Case {
  std::string name;
  int n_experts;
  RoutingSpec spec;
  double logit_sigma;
  double bias_range;  // the correction bias is uniform in [-bias_range, bias_range]
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

class RouterMatchesOracle : public testing::TestWithParam<Case> {};

TEST_P(RouterMatchesOracle, OnRandomLogits) {
  const Case& c = GetParam();
  const int n = c.n_experts;
  const int k = c.spec.top_k;
  const uint32_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> logit(0.0f, static_cast<float>(c.logit_sigma));
  std::uniform_real_distribution<float> bias_value(static_cast<float>(-c.bias_range),
                                                   static_cast<float>(c.bias_range));

  std::vector<float> bias(n);
  for (float& b : bias) b = bias_value(rng);
  const float* bias_ptr = c.spec.correction_bias ? bias.data() : nullptr;

  constexpr int kRows = 400;
  std::vector<float> logits(static_cast<size_t>(kRows) * n);
  std::vector<Expected> expected;
  int redrawn = 0;
  for (int r = 0; r < kRows; ++r) {
    float* row = logits.data() + static_cast<size_t>(r) * n;
    for (;;) {
      for (int e = 0; e < n; ++e) row[e] = logit(rng);
      Expected want = oracle(c.spec, n, row, bias_ptr);
      if (want.decidable) {
        expected.push_back(std::move(want));
        break;
      }
      ++redrawn;
    }
  }
  EXPECT_LT(redrawn, kRows / 10) << "the oracle rejected too many rows to be a meaningful check";

  const Routed got = route_f32(c.spec, n, logits, bias_ptr);
  for (int r = 0; r < kRows; ++r) {
    const auto at = static_cast<size_t>(r) * k;
    const auto result = matches(expected[r], got.ids.data() + at, got.weights.data() + at);
    ASSERT_TRUE(result) << "row " << r;
  }
}

RoutingSpec softmax_spec(int top_k, bool renormalize) {
  return {.scoring = Scoring::softmax, .top_k = top_k, .renormalize = renormalize};
}

RoutingSpec dsv3_spec() {
  return {.scoring = Scoring::sigmoid,
          .top_k = 8,
          .correction_bias = true,
          .n_group = 8,
          .topk_group = 4,
          .group_score = GroupScore::top2_sum,
          .renormalize = true,
          .routed_scaling_factor = 2.5f};
}

// Softmax cases draw logits with sigma 1: float32 rounds x - max to 2^-24 relative, which exp
// turns into |x - max| * 2^-24 relative error in the score, and a wider spread would push the
// experts far below the max towards the 1e-6 tolerance through no fault of the router.
INSTANTIATE_TEST_SUITE_P(
    Models, RouterMatchesOracle,
    testing::Values(
        Case{"softmax_top2_no_renorm", 8, softmax_spec(2, false), 1.0, 0.0},
        Case{"mixtral_softmax_top2_renorm", 8, softmax_spec(2, true), 1.0, 0.0},
        Case{"qwen3_softmax_top8_renorm", 128, softmax_spec(8, true), 1.0, 0.0},
        Case{"dsv3_sigmoid_bias_top2sum_groups", 256, dsv3_spec(), 2.0, 0.3},
        Case{"dsv2_softmax_group_max",
             64,
             {.scoring = Scoring::softmax,
              .top_k = 6,
              .n_group = 8,
              .topk_group = 3,
              .group_score = GroupScore::max,
              .routed_scaling_factor = 16.0f},
             1.0,
             0.0},
        Case{"sqrt_softplus_bias_renorm",
             64,
             {.scoring = Scoring::sqrt_softplus,
              .top_k = 6,
              .correction_bias = true,
              .renormalize = true,
              .routed_scaling_factor = 1.5f},
             3.0,
             0.2},
        Case{
            "sigmoid_no_renorm_ungrouped", 64, {.scoring = Scoring::sigmoid, .top_k = 4}, 2.0, 0.0},
        Case{"top_k_equals_n_experts", 16, softmax_spec(16, true), 1.0, 0.0}),
    [](const testing::TestParamInfo<Case>& test) { return test.param.name; });

testing::AssertionResult fails_with(Errc code, const std::string& needle,
                                    const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& error) {
    if (error.code() != code) {
      return testing::AssertionFailure()
             << "wrong code " << errc_name(error.code()) << ": " << error.what();
    }
    if (std::string(error.what()).find(needle) == std::string::npos) {
      return testing::AssertionFailure() << "'" << error.what() << "' lacks '" << needle << "'";
    }
    return testing::AssertionSuccess();
  }
  return testing::AssertionFailure() << "nothing thrown";
}

TEST(SelectExperts, ExactTiesGoToTheLowerExpertId) {
  std::vector<float> flat(16, 0.0f);
  const Routed softmax = route_f32(softmax_spec(4, false), 16, flat, nullptr);
  EXPECT_EQ(softmax.ids, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(softmax.weights, std::vector<float>(4, 1.0f / 16.0f));

  // Equal groups too: group 0 wins, and all eight experts come from it.
  std::vector<float> flat256(256, 0.0f);
  const std::vector<float> zero_bias(256, 0.0f);
  const Routed grouped = route_f32(dsv3_spec(), 256, flat256, zero_bias.data());
  EXPECT_EQ(grouped.ids, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(grouped.weights, std::vector<float>(8, 0.125f * 2.5f));

  std::vector<float> pair = {0.0f, 0.0f, 3.0f, 0.0f, 1.0f, 0.0f, 3.0f, 0.0f};
  EXPECT_EQ(route_f32(softmax_spec(3, false), 8, pair, nullptr).ids,
            (std::vector<int32_t>{2, 6, 4}));

  // Groups 1 and 3 score the same under either rule; the lower group index is kept.
  std::vector<float> tied_groups = {-2.0f, -2.0f, 1.0f, 0.0f, -2.0f, -2.0f, 0.0f, 1.0f};
  for (GroupScore rule : {GroupScore::max, GroupScore::top2_sum}) {
    const RoutingSpec spec{.scoring = Scoring::sigmoid,
                           .top_k = 1,
                           .n_group = 4,
                           .topk_group = 1,
                           .group_score = rule};
    EXPECT_EQ(route_f32(spec, 8, tied_groups, nullptr).ids, std::vector<int32_t>{2});
  }
}

TEST(SelectExperts, CorrectionBiasChangesTheChoiceButNotTheWeight) {
  // sigmoid(1) = 0.73106 beats sigmoid(0.5) = 0.62246 until the bias adds 0.3 to expert 1.
  constexpr double kSigmoidHalf = 0.6224593312018546;
  constexpr double kSigmoidOne = 0.7310585786300049;
  std::vector<float> logits = {1.0f, 0.5f, 0.0f, 0.0f};
  const std::vector<float> bias = {0.0f, 0.3f, 0.0f, 0.0f};
  RoutingSpec spec{.scoring = Scoring::sigmoid, .top_k = 1};
  EXPECT_EQ(route_f32(spec, 4, logits, nullptr).ids, std::vector<int32_t>{0});

  spec.correction_bias = true;
  const Routed one = route_f32(spec, 4, logits, bias.data());
  EXPECT_EQ(one.ids, std::vector<int32_t>{1});
  EXPECT_NEAR(one.weights[0], kSigmoidHalf, 1e-6 * kSigmoidHalf);

  spec.top_k = 2;
  spec.renormalize = true;
  spec.routed_scaling_factor = 2.0f;
  const Routed two = route_f32(spec, 4, logits, bias.data());
  EXPECT_EQ(two.ids, (std::vector<int32_t>{1, 0}));
  const double total = kSigmoidHalf + kSigmoidOne;
  EXPECT_NEAR(two.weights[0], 2.0 * kSigmoidHalf / total, 1e-6);
  EXPECT_NEAR(two.weights[1], 2.0 * kSigmoidOne / total, 1e-6);
}

TEST(SelectExperts, ExcludedGroupIsNeverSelectedEvenWithTheBestExpert) {
  // Expert 0 has the best score (sigmoid(5) = 0.993) but its group sums to exactly 1.0, below
  // groups 1 (1.221) and 2 (1.124); group 3 sums to 0.538.
  std::vector<float> logits = {5.0f, -5.0f, 0.5f, 0.4f, 0.3f, 0.2f, -1.0f, -1.0f};
  RoutingSpec spec{.scoring = Scoring::sigmoid,
                   .top_k = 2,
                   .n_group = 4,
                   .topk_group = 2,
                   .group_score = GroupScore::top2_sum};
  EXPECT_EQ(route_f32(spec, 8, logits, nullptr).ids, (std::vector<int32_t>{2, 3}));
  spec.top_k = 3;
  EXPECT_EQ(route_f32(spec, 8, logits, nullptr).ids, (std::vector<int32_t>{2, 3, 4}));

  // Under the max rule group 0 is the best group, so the same logits do route to expert 0.
  spec.top_k = 2;
  spec.group_score = GroupScore::max;
  EXPECT_EQ(route_f32(spec, 8, logits, nullptr).ids, (std::vector<int32_t>{0, 2}));
}

TEST(SelectExperts, Top2SumCountsARepeatedBestValueTwice) {
  // Group 0 is {0.5, 0.881, 0.881, 0.047}: 1.762 with the repeat, 1.381 without it, either side
  // of group 1's 1.462.
  std::vector<float> logits = {0.0f, 2.0f, 2.0f, -3.0f, 1.0f, 1.0f, -3.0f, -3.0f};
  const RoutingSpec spec{.scoring = Scoring::sigmoid,
                         .top_k = 1,
                         .n_group = 2,
                         .topk_group = 1,
                         .group_score = GroupScore::top2_sum};
  EXPECT_EQ(route_f32(spec, 8, logits, nullptr).ids, std::vector<int32_t>{1});
}

TEST(SelectExperts, UnderflowedScoresRenormaliseToZeroNotNan) {
  std::vector<float> logits(8, -200.0f);
  const RoutingSpec spec{.scoring = Scoring::sigmoid, .top_k = 2, .renormalize = true};
  const Routed got = route_f32(spec, 8, logits, nullptr);
  EXPECT_EQ(got.ids, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(got.weights, (std::vector<float>{0.0f, 0.0f}));
}

TEST(SelectExperts, NonFiniteLogitsThrowNamingRowAndExpert) {
  constexpr int kRows = 6;
  constexpr int kExperts = 32;
  const RoutingSpec spec = softmax_spec(2, true);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Bad {
    int row;
    int expert;
    float value;
    std::string text;
  };
  for (const Bad& bad : {Bad{3, 17, nan, "row 3 has a non-finite value (nan) at expert 17"},
                         Bad{1, 0, inf, "row 1 has a non-finite value (inf) at expert 0"},
                         Bad{5, 31, -inf, "row 5 has a non-finite value (-inf) at expert 31"}}) {
    std::vector<float> logits(kRows * kExperts, 0.5f);
    logits[bad.row * kExperts + bad.expert] = bad.value;
    EXPECT_TRUE(fails_with(Errc::invalid_argument, "router_logits: " + bad.text,
                           [&] { route_f32(spec, kExperts, logits, nullptr); }));

    std::vector<bf16_t> half(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) half[i] = to_bf16(logits[i]);
    const auto view = TensorView::contiguous(half.data(), DType::bf16, {kRows, kExperts});
    EXPECT_TRUE(fails_with(Errc::invalid_argument, bad.text,
                           [&] { route(spec, kExperts, view, nullptr); }));
  }
}

TEST(SelectExperts, FirstNonFiniteRowIsReportedWhateverTheThreading) {
  constexpr int kRows = 64;
  constexpr int kExperts = 16;
  std::vector<float> logits(kRows * kExperts, 0.0f);
  logits[50 * kExperts + 3] = std::numeric_limits<float>::quiet_NaN();
  logits[20 * kExperts + 9] = std::numeric_limits<float>::infinity();
  logits[20 * kExperts + 11] = std::numeric_limits<float>::quiet_NaN();
  ThreadPool pool(4);
  for (int attempt = 0; attempt < 20; ++attempt) {
    EXPECT_TRUE(
        fails_with(Errc::invalid_argument, "row 20 has a non-finite value (inf) at expert 9",
                   [&] { route_f32(softmax_spec(2, false), kExperts, logits, nullptr, &pool); }));
  }
}

TEST(SelectExperts, UncheckedNonFiniteRowsStayInBounds) {
  constexpr int kExperts = 64;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const uint32_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> logit(0.0f, 2.0f);
  std::vector<float> bias(kExperts);
  for (float& b : bias) b = 0.1f * logit(rng);

  std::vector<float> clean(8 * kExperts);
  for (float& x : clean) x = logit(rng);
  std::vector<float> dirty = clean;
  dirty[0 * kExperts + 0] = nan;
  std::fill(dirty.begin() + 2 * kExperts, dirty.begin() + 3 * kExperts, nan);
  dirty[4 * kExperts + 40] = inf;
  dirty[5 * kExperts + 7] = -inf;
  std::fill(dirty.begin() + 6 * kExperts, dirty.begin() + 7 * kExperts, -inf);
  const std::vector<int> clean_rows = {1, 3, 7};

  const RoutingSpec sqrt_softplus{.scoring = Scoring::sqrt_softplus, .top_k = 4};
  for (const RoutingSpec& spec : {softmax_spec(4, true), dsv3_spec(), sqrt_softplus}) {
    const float* b = spec.correction_bias ? bias.data() : nullptr;
    const Routed want = route_f32(spec, kExperts, clean, b);
    const Routed got = route_f32(spec, kExperts, dirty, b, nullptr, false);
    const int k = spec.top_k;
    for (int r = 0; r < 8; ++r) {
      std::vector<int32_t> row(got.ids.begin() + r * k, got.ids.begin() + (r + 1) * k);
      for (int32_t id : row) EXPECT_TRUE(id >= 0 && id < kExperts) << "row " << r;
      std::sort(row.begin(), row.end());
      EXPECT_EQ(std::adjacent_find(row.begin(), row.end()), row.end()) << "row " << r;
    }
    for (int r : clean_rows) {
      for (int j = 0; j < k; ++j) {
        EXPECT_EQ(got.ids[r * k + j], want.ids[r * k + j]);
        EXPECT_EQ(got.weights[r * k + j], want.weights[r * k + j]);
      }
    }
  }
}

template <typename Half>
void expect_half_matches_f32(DType dtype, Half (*narrow)(float), float (*widen)(Half)) {
  constexpr int kRows = 300;
  constexpr int kExperts = 256;
  const uint32_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> logit(0.0f, 2.0f);
  std::vector<float> bias(kExperts);
  for (float& b : bias) b = 0.1f * logit(rng);

  std::vector<Half> half(kRows * kExperts);
  std::vector<float> widened(half.size());
  for (size_t i = 0; i < half.size(); ++i) {
    half[i] = narrow(logit(rng));
    widened[i] = widen(half[i]);
  }
  const auto view = TensorView::contiguous(half.data(), dtype, {kRows, kExperts});
  for (const RoutingSpec& spec : {softmax_spec(8, true), dsv3_spec()}) {
    const float* b = spec.correction_bias ? bias.data() : nullptr;
    const Routed want = route_f32(spec, kExperts, widened, b);
    const Routed got = route(spec, kExperts, view, b);
    EXPECT_EQ(got.ids, want.ids);
    EXPECT_EQ(got.weights, want.weights);
  }
}

TEST(SelectExperts, Bf16LogitsMatchTheSameValuesInF32) {
  expect_half_matches_f32<bf16_t>(DType::bf16, to_bf16, to_float);
}

TEST(SelectExperts, F16LogitsMatchTheSameValuesInF32) {
  expect_half_matches_f32<f16_t>(DType::f16, to_f16, to_float);
}

TEST(SelectExperts, MalformedLogitsThrowNamingRouterLogits) {
  const RoutingSpec spec = softmax_spec(2, false);
  std::vector<float> storage(64, 0.0f);
  void* data = storage.data();
  auto rejects = [&](const TensorView& view, const std::string& what) {
    std::vector<int32_t> ids(64, -1);
    std::vector<float> weights(64, -1.0f);
    return fails_with(Errc::invalid_argument, what, [&] {
      select_experts(spec, 8, view, nullptr, true, ids.data(), weights.data(), nullptr);
    });
  };
  EXPECT_TRUE(
      rejects(TensorView::contiguous(data, DType::i32, {4, 8}), "router_logits: dtype i32"));
  EXPECT_TRUE(rejects(TensorView::contiguous(data, DType::f8e4m3, {4, 8}), "router_logits: dtype"));
  EXPECT_TRUE(rejects(TensorView::contiguous(data, DType::f32, {32}), "router_logits: shape [32]"));
  EXPECT_TRUE(rejects(TensorView::contiguous(data, DType::f32, {4, 16}),
                      "router_logits: shape [4, 16] does not match [T, n_experts] = [T, 8]"));
  EXPECT_TRUE(rejects(TensorView::contiguous(data, DType::f32, {1, 4, 8}),
                      "router_logits: shape [1, 4, 8]"));

  TensorView strided = TensorView::contiguous(data, DType::f32, {4, 8});
  strided.strides[0] = 16;  // every other row of a [8, 8] buffer
  EXPECT_TRUE(rejects(strided, "router_logits: must be row-major contiguous"));

  EXPECT_TRUE(rejects(TensorView::contiguous(data, DType::f32, {4, 8}, Device::cuda(0)),
                      "router_logits: must be on the CPU"));
  EXPECT_TRUE(
      rejects(TensorView::contiguous(nullptr, DType::f32, {4, 8}), "router_logits: data is null"));
}

TEST(SelectExperts, InconsistentArgumentsThrow) {
  std::vector<float> logits(32, 0.0f);
  const std::vector<float> bias(8, 0.0f);
  RoutingSpec spec{.scoring = Scoring::sigmoid, .top_k = 2, .correction_bias = true};
  EXPECT_TRUE(fails_with(Errc::invalid_argument, "correction_bias: null",
                         [&] { route_f32(spec, 8, logits, nullptr); }));
  spec.correction_bias = false;
  EXPECT_TRUE(fails_with(Errc::invalid_argument, "correction_bias: given",
                         [&] { route_f32(spec, 8, logits, bias.data()); }));

  spec.top_k = 9;
  EXPECT_TRUE(fails_with(Errc::internal, "top_k 9", [&] {
    std::vector<int32_t> ids(64);
    std::vector<float> weights(64);
    const auto view = TensorView::contiguous(logits.data(), DType::f32, {4, 8});
    select_experts(spec, 8, view, nullptr, true, ids.data(), weights.data(), nullptr);
  }));
}

TEST(SelectExperts, EmptyBatchWritesNothing) {
  const RoutingSpec spec = dsv3_spec();
  const std::vector<float> bias(256, 0.0f);
  std::vector<int32_t> ids(16);
  std::vector<float> weights(16);
  std::memset(ids.data(), 0xA5, ids.size() * sizeof(int32_t));
  std::memset(weights.data(), 0xA5, weights.size() * sizeof(float));
  const std::vector<int32_t> ids_before = ids;
  const std::vector<uint32_t> weight_bits_before(
      reinterpret_cast<const uint32_t*>(weights.data()),
      reinterpret_cast<const uint32_t*>(weights.data() + weights.size()));
  ThreadPool pool(4);
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    const auto view = TensorView::contiguous(nullptr, DType::bf16, {0, 256});
    select_experts(spec, 256, view, bias.data(), true, ids.data(), weights.data(), p);
    EXPECT_EQ(ids, ids_before);
    EXPECT_EQ(
        std::memcmp(weights.data(), weight_bits_before.data(), weights.size() * sizeof(float)), 0);
    EXPECT_NO_THROW(select_experts(spec, 256, view, bias.data(), true, nullptr, nullptr, p));
  }
}

TEST(SelectExperts, ThreadPoolIsBitIdenticalToSerial) {
  constexpr int kRows = 1001;
  constexpr int kExperts = 256;
  const uint32_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> logit(0.0f, 2.0f);
  std::vector<float> bias(kExperts);
  for (float& b : bias) b = 0.1f * logit(rng);
  std::vector<float> logits(kRows * kExperts);
  for (float& x : logits) x = logit(rng);

  ThreadPool pool(4);
  for (const RoutingSpec& spec : {softmax_spec(8, true), dsv3_spec()}) {
    const float* b = spec.correction_bias ? bias.data() : nullptr;
    const Routed serial = route_f32(spec, kExperts, logits, b);
    const Routed parallel = route_f32(spec, kExperts, logits, b, &pool);
    EXPECT_EQ(parallel.ids, serial.ids);
    EXPECT_EQ(std::memcmp(parallel.weights.data(), serial.weights.data(),
                          serial.weights.size() * sizeof(float)),
              0);
  }
}

}  // namespace
}  // namespace moekit::routing
