#pragma once
// Builds small layers and runs them with poisoned outputs, for the layer and matrix tests.

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/layer.hpp"
#include "moekit/testing.hpp"
#include "support/kernel_sets.hpp"
#include "support/oracle.hpp"

namespace moekit::test {

inline constexpr uint8_t kPoison = 0xD5;

// A DeepSeek-V3-shaped layer small enough for float64 oracles: grouped sigmoid routing with a
// correction bias, scaling, and one shared expert twice as wide as a routed one.
inline ModelSpec small_dsv3() {
  ModelSpec spec = ModelSpec::preset("dsv3");
  spec.name = "small-dsv3";
  spec.hidden = 48;
  spec.intermediate = 16;
  spec.n_experts = 16;
  spec.routing.n_group = 4;
  spec.routing.topk_group = 2;
  spec.routing.top_k = 4;
  spec.shared_intermediate = 32;
  return spec;
}

struct Inputs {
  Tensor hidden;
  Tensor logits;
};

inline Inputs random_inputs(const ModelSpec& spec, int64_t tokens, DType hidden_dtype,
                            uint64_t seed) {
  std::mt19937_64 rng(seed);
  return {random_tensor({tokens, spec.hidden}, hidden_dtype, rng),
          random_tensor({tokens, spec.n_experts}, DType::f32, rng, 2.0f)};
}

struct LayerRun {
  Tensor output;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// One forward with the output poisoned first, so an element the layer does not write fails.
inline LayerRun run_layer(MoeLayer& layer, const Inputs& in) {
  const ModelSpec& spec = layer.plan().spec;
  const int64_t T = in.hidden.view().dim(0), k = spec.routing.top_k;
  LayerRun run{Tensor::empty(in.hidden.view().dtype, {T, spec.hidden}),
               std::vector<int32_t>(T * k, -1), std::vector<float>(T * k, NAN)};
  run.output.fill_bytes(kPoison);
  const RoutingResult routing{TensorView::contiguous(run.ids.data(), DType::i32, {T, k}),
                              TensorView::contiguous(run.weights.data(), DType::f32, {T, k})};
  layer.forward(in.hidden, in.logits, run.output, &routing);
  return run;
}

inline LayerRun run_plan(const Plan& plan, const LayerWeights& weights, const Inputs& in) {
  MoeLayer layer(plan, weights);
  return run_layer(layer, in);
}

inline std::vector<double> as_doubles(const Tensor& t) {
  return to_doubles(t.view());
}

// The oracle's routing of a run's logits, with the routing the run reported checked against it.
inline OracleRouting oracle_routing(const ModelSpec& spec, const LayerWeights& weights,
                                    const Inputs& in, const LayerRun& run) {
  return oracle_routing(spec, weights.correction_bias, in.logits, run.ids, run.weights);
}

// A run's output against the oracle for the oracle's routing.
inline OracleComparison compare_with_oracle(const OracleLayer& oracle, const Inputs& in,
                                            const OracleRouting& routing, const LayerRun& run) {
  return compare_with_oracle(oracle, in.hidden, routing, as_doubles(run.output),
                             run.output.view().dtype);
}

inline OracleComparison compare_with_oracle(const ModelSpec& spec, const LayerWeights& weights,
                                            const QuantParams& quant, const Inputs& in,
                                            const OracleRouting& routing, const LayerRun& run) {
  return compare_with_oracle(OracleLayer(spec, weights, quant), in, routing, run);
}

// Runs every rank of options.ep on the same inputs and platform: the sum of the ranks' outputs,
// and rank 0's run (its routing is every rank's).
struct RankSum {
  std::vector<double> sum;
  LayerRun rank0;
};

inline RankSum run_all_ranks(const ModelSpec& spec, Options options, const LayerWeights& weights,
                             const Inputs& in, const Platform& platform = Platform::cpu_only(2)) {
  RankSum result{std::vector<double>(static_cast<size_t>(in.hidden.view().numel()), 0.0), {}};
  for (int rank = 0; rank < options.ep.size; ++rank) {
    options.ep.rank = rank;
    LayerRun run = run_plan(resolve(spec, options, platform), weights, in);
    const std::vector<double> part = as_doubles(run.output);
    for (size_t i = 0; i < part.size(); ++i) result.sum[i] += part[i];
    if (rank == 0) result.rank0 = std::move(run);
  }
  return result;
}

}  // namespace moekit::test
