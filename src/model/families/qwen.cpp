// Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B), Qwen3-MoE and Qwen3-Next, after the transformers
// models: softmax over all experts, top-k, renormalised only with norm_topk_prob. Qwen2-MoE and
// Qwen3-Next add one shared expert whose output is gated per token by
// sigmoid(shared_expert_gate(x)). Qwen3-Next's attention (gated DeltaNet and full attention
// layers) does not concern the MoE layer.

#include <optional>

#include "model/families/families.hpp"

namespace moekit {
namespace {

struct QwenDefaults {
  int num_layers;
  int hidden;
  int moe_intermediate;
  int experts;
  int top_k;
  bool norm_topk_prob;
};

void read_qwen_common(ConfigReader& reader, HfModelConfig& config, const QwenDefaults& defaults) {
  ModelSpec& spec = config.spec;
  config.num_layers = reader.integer("num_hidden_layers", defaults.num_layers, 0, kMaxLayers);
  spec.hidden = reader.integer("hidden_size", defaults.hidden, 1);
  spec.intermediate = reader.integer("moe_intermediate_size", defaults.moe_intermediate, 1);
  // transformers 5 saves the count as num_local_experts: taking the family's default for it
  // would run a layer of the wrong size.
  const char* experts = reader.aliased("num_experts", "num_local_experts");
  spec.n_experts = reader.integer(experts, defaults.experts, 0);
  if (spec.n_experts == 0) {
    reader.refuse("{} is 0: every layer is a dense MLP, there is no MoE layer to run", experts);
  }
  spec.routing.top_k = reader.integer("num_experts_per_tok", defaults.top_k, 1);
  spec.routing.scoring = Scoring::softmax;
  spec.routing.renormalize = reader.boolean("norm_topk_prob", defaults.norm_topk_prob);
  config.layers.decoder_sparse_step = reader.integer("decoder_sparse_step", 1, 1);
  config.layers.mlp_only_layers = reader.integer_list("mlp_only_layers");
}

// One shared expert of shared_expert_intermediate_size columns, gated per token; none for 0.
void read_gated_shared_expert(ConfigReader& reader, HfModelConfig& config, int default_width) {
  const int shared = reader.integer("shared_expert_intermediate_size", default_width, 0);
  if (shared > 0) {
    config.spec.n_shared = 1;
    config.spec.shared_intermediate = shared;
    config.spec.shared_gate = true;
  }
}

}  // namespace

void read_qwen2_moe(ConfigReader& reader, HfModelConfig& config) {
  read_qwen_common(reader, config,
                   {.num_layers = 24,
                    .hidden = 2048,
                    .moe_intermediate = 1408,
                    .experts = 60,
                    .top_k = 4,
                    .norm_topk_prob = false});
  read_gated_shared_expert(reader, config, 5632);
}

void read_qwen3_moe(ConfigReader& reader, HfModelConfig& config) {
  read_qwen_common(reader, config,
                   {.num_layers = 24,
                    .hidden = 2048,
                    .moe_intermediate = 768,
                    .experts = 128,
                    .top_k = 8,
                    .norm_topk_prob = false});
  if (reader.integer("shared_expert_intermediate_size", 0, 0) != 0) {
    reader.refuse("shared_expert_intermediate_size is set, but qwen3_moe has no shared expert");
  }
}

void read_qwen3_next(ConfigReader& reader, HfModelConfig& config) {
  read_qwen_common(reader, config,
                   {.num_layers = 48,
                    .hidden = 2048,
                    .moe_intermediate = 512,
                    .experts = 512,
                    .top_k = 10,
                    .norm_topk_prob = true});
  read_gated_shared_expert(reader, config, 512);
}

}  // namespace moekit
