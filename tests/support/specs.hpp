#pragma once
// Small layers of every routing variant and activation, for the layer suites of every runner.

#include <vector>

#include "support/layer_fixture.hpp"

namespace moekit::test {

inline ModelSpec with_activation(ModelSpec spec, Activation activation) {
  spec.activation = activation;
  return spec;
}

inline ModelSpec small_softmax(int experts, int top_k, bool renormalize) {
  ModelSpec spec;
  spec.name = "small-softmax";
  spec.hidden = 40;
  spec.intermediate = 24;
  spec.n_experts = experts;
  spec.routing = {.scoring = Scoring::softmax, .top_k = top_k, .renormalize = renormalize};
  return spec;
}

// Qwen2-MoE: softmax without renormalising, and one shared expert behind a sigmoid gate.
inline ModelSpec small_qwen2_moe() {
  ModelSpec spec = small_softmax(8, 2, false);
  spec.n_shared = 1;
  spec.shared_intermediate = 48;
  spec.shared_gate = true;
  return spec;
}

inline ModelSpec small_sqrt_softplus() {
  ModelSpec spec = small_softmax(12, 3, true);
  spec.routing.scoring = Scoring::sqrt_softplus;
  spec.routing.routed_scaling_factor = 1.5f;
  return spec;
}

// DeepSeek-V2's group_limited_greedy: sigmoid scores, groups by their best, no correction bias.
inline ModelSpec sigmoid_grouped_without_bias() {
  ModelSpec spec = small_dsv3();
  spec.routing.correction_bias = false;
  spec.routing.group_score = GroupScore::max;
  return spec;
}

inline ModelSpec sigmoid_biased_without_renormalising() {
  ModelSpec spec = small_dsv3();
  spec.routing.renormalize = false;
  return spec;
}

// Llama-4-style: one expert per token by sigmoid score.
inline ModelSpec sigmoid_top1() {
  ModelSpec spec = small_softmax(8, 1, false);
  spec.routing.scoring = Scoring::sigmoid;
  return spec;
}

struct NamedSpec {
  const char* name;
  ModelSpec spec;
};

// Every scoring, grouping, bias, renormalisation and activation the spec can say.
inline std::vector<NamedSpec> routing_specs() {
  return {
      {"dsv3", small_dsv3()},
      {"sigmoid_grouped_no_bias", sigmoid_grouped_without_bias()},
      {"sigmoid_bias_no_renorm", sigmoid_biased_without_renormalising()},
      {"sigmoid_top1", sigmoid_top1()},
      {"qwen", small_softmax(16, 4, true)},
      {"mixtral", small_softmax(8, 2, true)},
      {"softmax_no_renorm", small_softmax(8, 3, false)},
      {"softmax_top1", small_softmax(8, 1, true)},
      {"sqrt_softplus", small_sqrt_softplus()},
      {"gelu", with_activation(small_softmax(8, 2, true), Activation::GeluGated())},
      {"swiglu_oai",
       with_activation(small_softmax(8, 2, true), Activation::SwigluOai(1.702f, 7.0f))},
      {"qwen2_shared_gate", small_qwen2_moe()},
  };
}

}  // namespace moekit::test
