// The GPU router against the CPU router (ids) and float64 (weights), the logical -> physical map
// against a host loop over ExpertLocation, on odd batch sizes and expert counts.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cuda/cuda_support.hpp"
#include "moekit/expert_location.hpp"
#include "routing/cuda/route.hpp"
#include "routing/topk.hpp"

namespace moekit {
namespace {

using namespace cuda_testing;

struct RouteCase {
  const char* name;
  int n_experts;
  RoutingSpec spec;
};

RoutingSpec make(Scoring scoring, int top_k, bool bias, int n_group, int topk_group,
                 GroupScore rule, bool renormalize, float scaling) {
  return {scoring, top_k, bias, n_group, topk_group, rule, renormalize, scaling};
}

const RouteCase kCases[] = {
    {"mixtral_softmax_top2", 8, make(Scoring::softmax, 2, false, 1, 1, GroupScore::max, true, 1)},
    {"qwen_softmax_top8_e60", 60,
     make(Scoring::softmax, 8, false, 1, 1, GroupScore::max, false, 1)},
    {"softmax_top1_e3", 3, make(Scoring::softmax, 1, false, 1, 1, GroupScore::max, false, 1)},
    {"dsv3_sigmoid_bias_top2sum", 256,
     make(Scoring::sigmoid, 8, true, 8, 4, GroupScore::top2_sum, true, 2.5f)},
    {"dsv2_softmax_group_max_e160", 160,
     make(Scoring::softmax, 6, false, 8, 3, GroupScore::max, false, 16)},
    {"sigmoid_bias_ungrouped_e72", 72,
     make(Scoring::sigmoid, 4, true, 1, 1, GroupScore::max, true, 1)},
    {"sqrt_softplus_bias_e72", 72,
     make(Scoring::sqrt_softplus, 6, true, 6, 2, GroupScore::top2_sum, false, 1.5f)},
    // 16 experts per lane in each lane's sorted list.
    {"softmax_top10_e512", 512, make(Scoring::softmax, 10, false, 1, 1, GroupScore::max, true, 1)},
    // So much shared memory per token that a block routes one token.
    {"sigmoid_bias_top8_e2000", 2000,
     make(Scoring::sigmoid, 8, true, 1, 1, GroupScore::max, true, 1)},
};

// The routed weight of each id, in float64 from the same logits.
std::vector<double> reference_weights(const RoutingSpec& spec, const float* x, int n,
                                      const int32_t* ids) {
  std::vector<double> score(static_cast<size_t>(n));
  double max = x[0];
  for (int e = 1; e < n; ++e) max = std::max(max, double{x[e]});
  double sum = 0.0;
  for (int e = 0; e < n; ++e) {
    const double v = x[e];
    switch (spec.scoring) {
      case Scoring::softmax:
        score[e] = std::exp(v - max);
        sum += score[e];
        break;
      case Scoring::sigmoid:
        score[e] = 1.0 / (1.0 + std::exp(-v));
        break;
      case Scoring::sqrt_softplus:
        score[e] = std::sqrt(std::max(v, 0.0) + std::log1p(std::exp(-std::abs(v))));
        break;
    }
  }
  if (spec.scoring == Scoring::softmax) {
    for (double& s : score) s /= sum;
  }
  std::vector<double> w(static_cast<size_t>(spec.top_k));
  double routed = 0.0;
  for (int j = 0; j < spec.top_k; ++j) routed += (w[j] = score[ids[j]]);
  for (double& v : w)
    v = (spec.renormalize && routed > 0 ? v / routed : v) * spec.routed_scaling_factor;
  return w;
}

class CudaRoute : public ::testing::TestWithParam<std::tuple<RouteCase, DType, int64_t>> {};

TEST_P(CudaRoute, IdsMatchTheCpuRouterAndWeightsMatchFloat64) {
  MOEKIT_REQUIRE_GPU();
  const auto& [c, dtype, T] = GetParam();
  const int n = c.n_experts, k = c.spec.top_k;
  const Activations logits = as_dtype(normal(T * n, 17 + static_cast<uint32_t>(T)), dtype);
  std::vector<float> bias;
  if (c.spec.correction_bias) bias = normal(n, 5, 0.05f);

  std::vector<int32_t> cpu_ids(static_cast<size_t>(T * k));
  std::vector<float> cpu_weights(static_cast<size_t>(T * k));
  routing::select_experts(
      c.spec, n, TensorView::contiguous(const_cast<uint8_t*>(logits.bytes.data()), dtype, {T, n}),
      bias.empty() ? nullptr : bias.data(), false, cpu_ids.data(), cpu_weights.data(), nullptr);

  const Tensor d_logits = upload(logits.bytes, dtype, {T, n});
  const Tensor d_bias = upload(bias, DType::f32, {static_cast<int64_t>(bias.size())});
  Tensor ids = poisoned(DType::i32, {T, k});
  Tensor weights = poisoned(DType::f32, {T, k});
  routing::cuda::route({.logits = d_logits.view().data,
                        .logits_dtype = dtype,
                        .tokens = T,
                        .n_experts = n,
                        .spec = c.spec,
                        .correction_bias = bias.empty() ? nullptr : d_bias.data<float>(),
                        .ids = ids.data<int32_t>(),
                        .weights = weights.data<float>()},
                       nullptr);
  const std::vector<int32_t> gpu_ids = download<int32_t>(ids);
  const std::vector<float> gpu_weights = download<float>(weights);

  for (int64_t t = 0; t < T; ++t) {
    const int32_t* got = gpu_ids.data() + t * k;
    std::vector<int32_t> want(cpu_ids.begin() + t * k, cpu_ids.begin() + (t + 1) * k);
    std::vector<int32_t> have(got, got + k);
    std::sort(want.begin(), want.end());
    std::sort(have.begin(), have.end());
    ASSERT_EQ(have, want) << "token " << t;
    const std::vector<double> w = reference_weights(c.spec, logits.values.data() + t * n, n, got);
    for (int j = 0; j < k; ++j) {
      ASSERT_NEAR(gpu_weights[t * k + j], w[j], 1e-6 + 1e-5 * std::abs(w[j]))
          << "token " << t << " column " << j;
    }
  }
}

std::string route_name(const ::testing::TestParamInfo<CudaRoute::ParamType>& info) {
  const auto& [c, dtype, T] = info.param;
  return std::string(c.name) + "_" + std::string(dtype_name(dtype)) + "_T" + std::to_string(T);
}

INSTANTIATE_TEST_SUITE_P(Variants, CudaRoute,
                         ::testing::Combine(::testing::ValuesIn(kCases),
                                            ::testing::Values(DType::f32, DType::bf16, DType::f16),
                                            ::testing::Values(int64_t{0}, int64_t{1}, int64_t{3},
                                                              int64_t{257})),
                         route_name);

TEST(CudaRouteRows, ARowWithNaNStillGetsDistinctIdsInRange) {
  MOEKIT_REQUIRE_GPU();
  const RouteCase& c = kCases[3];  // grouped, with bias
  const int n = c.n_experts, k = c.spec.top_k;
  std::vector<float> x = normal(2 * n, 3);
  for (int e = 0; e < n; e += 3) x[e] = std::nanf("");
  x[n + 7] = INFINITY;
  const std::vector<float> bias = normal(n, 5, 0.05f);
  const Tensor d_logits = upload(x, DType::f32, {2, n});
  const Tensor d_bias = upload(bias, DType::f32, {n});
  Tensor ids = poisoned(DType::i32, {2, k});
  Tensor weights = poisoned(DType::f32, {2, k});
  routing::cuda::route({.logits = d_logits.view().data,
                        .tokens = 2,
                        .n_experts = n,
                        .spec = c.spec,
                        .correction_bias = d_bias.data<float>(),
                        .ids = ids.data<int32_t>(),
                        .weights = weights.data<float>()},
                       nullptr);
  const std::vector<int32_t> got = download<int32_t>(ids);
  for (int t = 0; t < 2; ++t) {
    std::vector<int32_t> row(got.begin() + t * k, got.begin() + (t + 1) * k);
    for (int32_t id : row) EXPECT_TRUE(id >= 0 && id < n) << id;
    std::sort(row.begin(), row.end());
    EXPECT_EQ(std::adjacent_find(row.begin(), row.end()), row.end()) << "token " << t;
  }
}

// As the block layer's to_physical: token t's source rank is t * ep / T.
TEST(CudaToPhysical, MapsThroughTheSourceRanksTableAndAddsSharedColumns) {
  MOEKIT_REQUIRE_GPU();
  const int n_logical = 12, k = 3, shared_slots = 2;
  const ExpertLocation location = ExpertLocation::build(n_logical, ExpertParallel::Rank(4, 1, 4));
  std::vector<int32_t> table;
  for (const std::vector<int>& rank : location.rank_table)
    table.insert(table.end(), rank.begin(), rank.end());
  const float slot_weight = 0.5f;
  for (const int64_t T : {1, 3, 257}) {
    for (const bool gated : {false, true}) {
      std::vector<int32_t> logical(static_cast<size_t>(T * k));
      for (int64_t i = 0; i < T * k; ++i)
        logical[i] = static_cast<int32_t>((i * 7 + i / k) % n_logical);
      const std::vector<float> weights = normal(T * k, 9);
      const std::vector<float> gate = normal(T, 11);
      const int columns = k + shared_slots;
      Tensor ids = poisoned(DType::i32, {T, columns});
      Tensor out_weights = poisoned(DType::f32, {T, columns});
      const Tensor d_logical = upload(logical, DType::i32, {T, k});
      const Tensor d_weights = upload(weights, DType::f32, {T, k});
      const Tensor d_table = upload(table, DType::i32, {static_cast<int64_t>(table.size())});
      const Tensor d_gate = upload(gate, DType::f32, {T});
      routing::cuda::to_physical({.logical_ids = d_logical.data<int32_t>(),
                                  .logical_weights = d_weights.data<float>(),
                                  .tokens = T,
                                  .top_k = k,
                                  .rank_table = d_table.data<int32_t>(),
                                  .n_logical = n_logical,
                                  .ep_size = location.ep_size,
                                  .shared_slots = shared_slots,
                                  .first_shared_id = location.physical,
                                  .shared_slot_weight = slot_weight,
                                  .shared_gate = gated ? d_gate.data<float>() : nullptr,
                                  .ids = ids.data<int32_t>(),
                                  .weights = out_weights.data<float>()},
                                 nullptr);
      const std::vector<int32_t> got_ids = download<int32_t>(ids);
      const std::vector<float> got_weights = download<float>(out_weights);
      for (int64_t t = 0; t < T; ++t) {
        const std::vector<int>& rank = location.rank_table[t * location.ep_size / T];
        for (int j = 0; j < columns; ++j) {
          const int64_t i = t * columns + j;
          if (j < k) {
            EXPECT_EQ(got_ids[i], rank[logical[t * k + j]]) << "T " << T << " entry " << i;
            EXPECT_EQ(got_weights[i], weights[t * k + j]);
          } else {
            EXPECT_EQ(got_ids[i], location.physical + j - k);
            EXPECT_EQ(got_weights[i], slot_weight * (gated ? gate[t] : 1.0f));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace moekit
