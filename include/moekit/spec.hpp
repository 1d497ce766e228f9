#pragma once
// What a model's MoE layer computes: sizes, routing and activation. Independent of where or how
// it runs (that is Options and Plan).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moekit {

enum class ActivationKind {
  silu_gated,  // silu(gate) * up
  gelu_gated,  // gelu(gate) * up, erf form
  swiglu_oai,  // gpt-oss: g = min(gate, limit); u = clamp(up, -limit, limit); (u + 1) * g *
               // sigmoid(alpha * g)
};

struct Activation {
  ActivationKind kind = ActivationKind::silu_gated;
  float alpha = 0.0f;  // swiglu_oai only
  float limit = 0.0f;  // swiglu_oai only

  static Activation SiluGated() { return {ActivationKind::silu_gated, 0.0f, 0.0f}; }
  static Activation GeluGated() { return {ActivationKind::gelu_gated, 0.0f, 0.0f}; }
  static Activation SwigluOai(float alpha = 1.702f, float limit = 7.0f) {
    return {ActivationKind::swiglu_oai, alpha, limit};
  }
  std::string str() const;
};

enum class Scoring {
  softmax,        // softmax over all experts (Mixtral, Qwen)
  sigmoid,        // DeepSeek-V3
  sqrt_softplus,  // sqrt(softplus(logit))
};

// How a group of experts is scored when experts are grouped (n_group > 1).
enum class GroupScore {
  max,       // DeepSeek-V2 group_limited_greedy: the group's best score
  top2_sum,  // DeepSeek-V3 noaux_tc: the sum of the group's two best choice scores
};

struct RoutingSpec {
  Scoring scoring = Scoring::softmax;
  int top_k = 2;
  bool correction_bias = false;  // e_score_correction_bias: added for the choice only
  int n_group = 1;
  int topk_group = 1;
  GroupScore group_score = GroupScore::max;
  bool renormalize = false;  // norm_topk_prob: renormalise the routed k weights to sum 1
  float routed_scaling_factor = 1.0f;
};

struct ModelSpec {
  std::string name = "custom";
  int64_t hidden = 0;
  int64_t intermediate = 0;  // per routed expert
  int n_experts = 0;         // routed experts
  RoutingSpec routing;
  int n_shared = 0;  // shared experts, each a gated MLP of shared_intermediate
  int64_t shared_intermediate = 0;
  // Qwen2-MoE: the shared experts' output is scaled per token by sigmoid(hidden . g), g the
  // checkpoint's shared_expert_gate [1, H] (LayerWeights::shared_gate).
  bool shared_gate = false;
  Activation activation;

  // Presets with the real sizes of the models they name: "dsv3", "qwen3-moe", "mixtral".
  static ModelSpec preset(std::string_view name);
  static std::vector<std::string> preset_names();
  // The DeepSeek-V3-shaped layer of `moekit demo`, small enough to run in a second.
  static ModelSpec demo();
  // Our own JSON form (keys as in to_json()); throws invalid_argument naming the key at fault.
  static ModelSpec from_json(std::string_view json_text);
  static ModelSpec from_json_file(const std::string& path);
  std::string to_json() const;

  // Every reason this spec cannot describe a real layer; empty when it can.
  std::vector<std::string> problems() const;
  std::string summary() const;
};

std::string_view scoring_name(Scoring scoring);
std::string_view group_score_name(GroupScore rule);
std::string_view activation_name(ActivationKind kind);

}  // namespace moekit
