// DeepSeek-V2, DeepSeek-V3 (and Kimi-K2, which ships the V3 architecture) and GLM-4.5, whose
// MoE block is DeepSeek-V3's. Defaults are the transformers config classes'; the keys those
// classes lack (scoring_func, topk_method, moe_layer_freq) take the defaults of DeepSeek's own
// configuration_deepseek.py, whose modeling_deepseek.py is the routing reference for V2 and V3.

#include <cfloat>
#include <optional>
#include <string>

#include "model/families/families.hpp"

namespace moekit {
namespace {

struct DeepseekDefaults {
  int num_layers;
  int hidden;
  int moe_intermediate;
  std::optional<int> routed_experts;
  std::optional<int> top_k;
  int shared_experts;
  int first_k_dense_replace;
};

// Sizes, expert counts and the dense-layer prefix, common to the three families.
void read_sizes(ConfigReader& reader, HfModelConfig& config, const DeepseekDefaults& defaults,
                const char* experts_alias) {
  ModelSpec& spec = config.spec;
  config.num_layers = reader.integer("num_hidden_layers", defaults.num_layers, 0, kMaxLayers);
  spec.hidden = reader.integer("hidden_size", defaults.hidden, 1);
  spec.intermediate = reader.integer("moe_intermediate_size", defaults.moe_intermediate, 1);
  const char* experts_key = experts_alias == nullptr
                                ? "n_routed_experts"
                                : reader.aliased("n_routed_experts", experts_alias);
  const std::optional<int> experts =
      reader.integer_or_null(experts_key, defaults.routed_experts, 1);
  if (!experts) {
    reader.refuse("{} is null: every layer is a dense MLP, there is no MoE layer to run",
                  experts_key);
  }
  spec.n_experts = *experts;
  spec.routing.top_k = reader.require(
      reader.integer_or_null("num_experts_per_tok", defaults.top_k, 1), "num_experts_per_tok");
  // One shared MLP of n_shared_experts times the routed width; null or 0 means none.
  const std::optional<int> shared =
      reader.integer_or_null("n_shared_experts", defaults.shared_experts, 0);
  if (shared && *shared > 0) {
    spec.n_shared = 1;
    spec.shared_intermediate = spec.intermediate * *shared;
  }
  config.layers.first_k_dense_replace =
      reader.integer("first_k_dense_replace", defaults.first_k_dense_replace, 0);
}

float read_scaling_factor(ConfigReader& reader, double fallback) {
  const double factor = reader.number("routed_scaling_factor", fallback);
  if (!(factor > 0 && factor <= FLT_MAX)) {
    reader.refuse("routed_scaling_factor must be a positive number, got {}", factor);
  }
  return static_cast<float>(factor);
}

void require_value(ConfigReader& reader, const char* key, const std::string& fallback,
                   const std::string& supported, const char* what) {
  const std::string value = reader.string(key, fallback);
  if (value != supported) {
    reader.refuse("{} '{}' is not supported; moekit {} '{}'", key, value, what, supported);
  }
}

// DeepSeek-V3 and GLM-4.5 route alike: sigmoid scores, the correction bias added for the choice,
// groups scored by the sum of their two best choices, then the routed scaling factor always.
void read_noaux_tc_routing(ConfigReader& reader, HfModelConfig& config, int n_group,
                           int topk_group) {
  RoutingSpec& routing = config.spec.routing;
  routing.scoring = Scoring::sigmoid;
  routing.correction_bias = true;
  routing.group_score = GroupScore::top2_sum;
  routing.n_group = reader.integer("n_group", n_group, 1);
  routing.topk_group = reader.integer("topk_group", topk_group, 1);
}

}  // namespace

void read_deepseek_v2(ConfigReader& reader, HfModelConfig& config) {
  read_sizes(reader, config,
             {.num_layers = 32,
              .hidden = 4096,
              .moe_intermediate = 1407,
              .routed_experts = 64,
              .top_k = std::nullopt,
              .shared_experts = 2,
              .first_k_dense_replace = 0},
             "num_experts");
  config.layers.moe_layer_freq = reader.integer("moe_layer_freq", 1, 1);
  require_value(reader, "scoring_func", "softmax", "softmax",
                "scores deepseek_v2 experts (DeepSeek-V2's MoEGate) with");
  RoutingSpec& routing = config.spec.routing;
  routing.scoring = Scoring::softmax;
  // "gready" is how DeepSeek's own V2 configuration and early modeling code spell greedy.
  const std::string method = reader.string("topk_method", "greedy");
  if (method == "group_limited_greedy") {
    routing.group_score = GroupScore::max;
    routing.n_group = reader.require(reader.integer_or_null("n_group", std::nullopt, 1), "n_group");
    routing.topk_group =
        reader.require(reader.integer_or_null("topk_group", std::nullopt, 1), "topk_group");
  } else if (method != "greedy" && method != "gready") {
    reader.refuse(
        "topk_method '{}' is not supported; moekit routes deepseek_v2 with 'greedy' or "
        "'group_limited_greedy'",
        method);
  }
  // DeepSeek-V2 either renormalises the top-k weights (k > 1) or scales them, never both.
  const bool norm_topk_prob = reader.boolean("norm_topk_prob", false);
  const float factor = read_scaling_factor(reader, 1.0);
  routing.renormalize = norm_topk_prob && routing.top_k > 1;
  routing.routed_scaling_factor = routing.renormalize ? 1.0f : factor;
}

void read_deepseek_v3(ConfigReader& reader, HfModelConfig& config) {
  read_sizes(reader, config,
             {.num_layers = 61,
              .hidden = 7168,
              .moe_intermediate = 2048,
              .routed_experts = 256,
              .top_k = 8,
              .shared_experts = 1,
              .first_k_dense_replace = 3},
             "num_local_experts");
  config.layers.moe_layer_freq = reader.integer("moe_layer_freq", 1, 1);
  require_value(reader, "scoring_func", "sigmoid", "sigmoid",
                "scores deepseek_v3 experts (DeepSeek-V3's MoEGate) with");
  require_value(reader, "topk_method", "noaux_tc", "noaux_tc", "routes deepseek_v3 with");
  read_noaux_tc_routing(reader, config, 8, 4);
  RoutingSpec& routing = config.spec.routing;
  routing.renormalize = reader.boolean("norm_topk_prob", true) && routing.top_k > 1;
  routing.routed_scaling_factor = read_scaling_factor(reader, 2.5);
}

void read_glm4_moe(ConfigReader& reader, HfModelConfig& config) {
  read_sizes(reader, config,
             {.num_layers = 46,
              .hidden = 4096,
              .moe_intermediate = 1408,
              .routed_experts = 128,
              .top_k = 8,
              .shared_experts = 1,
              .first_k_dense_replace = 1},
             nullptr);
  // The transformers GLM-4.5 code reads none of these; a config that sets them otherwise
  // describes a layer that code does not compute.
  require_value(reader, "scoring_func", "sigmoid", "sigmoid", "scores glm4_moe experts with");
  require_value(reader, "topk_method", "noaux_tc", "noaux_tc", "routes glm4_moe with");
  if (reader.integer("moe_layer_freq", 1, 1) != 1) {
    reader.refuse(
        "moe_layer_freq is not supported for glm4_moe: every layer from "
        "first_k_dense_replace on is MoE");
  }
  read_noaux_tc_routing(reader, config, 1, 1);
  RoutingSpec& routing = config.spec.routing;
  // Unlike DeepSeek's code, the GLM-4.5 router renormalises for any k (k = 1 gives weight 1).
  routing.renormalize = reader.boolean("norm_topk_prob", true);
  routing.routed_scaling_factor = read_scaling_factor(reader, 1.0);
}

}  // namespace moekit
