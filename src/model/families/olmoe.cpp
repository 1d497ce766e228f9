// OLMoE, after the transformers model: every layer is MoE, softmax over all experts, top-k,
// renormalised only with norm_topk_prob (false in the published models); the experts' width is
// intermediate_size, and there is no shared expert.

#include "model/families/families.hpp"

namespace moekit {

void read_olmoe(ConfigReader& reader, HfModelConfig& config) {
  ModelSpec& spec = config.spec;
  config.num_layers = reader.integer("num_hidden_layers", 16, 0, kMaxLayers);
  spec.hidden = reader.integer("hidden_size", 2048, 1);
  spec.intermediate = reader.integer("intermediate_size", 2048, 1);
  spec.n_experts = reader.integer(reader.aliased("num_experts", "num_local_experts"), 64, 1);
  spec.routing.top_k = reader.integer("num_experts_per_tok", 8, 1);
  spec.routing.scoring = Scoring::softmax;
  spec.routing.renormalize = reader.boolean("norm_topk_prob", false);
}

}  // namespace moekit
