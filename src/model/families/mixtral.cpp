// Mixtral, after the transformers model: every layer is MoE, softmax over all experts, top-k,
// always renormalised; the experts' width is intermediate_size. router_jitter_noise only acts
// in training, so it does not change the layer moekit runs.

#include "model/families/families.hpp"

namespace moekit {

void read_mixtral(ConfigReader& reader, HfModelConfig& config) {
  ModelSpec& spec = config.spec;
  config.num_layers = reader.integer("num_hidden_layers", 32, 0, kMaxLayers);
  spec.hidden = reader.integer("hidden_size", 4096, 1);
  spec.intermediate = reader.integer("intermediate_size", 14336, 1);
  spec.n_experts = reader.integer(reader.aliased("num_local_experts", "num_experts"), 8, 1);
  spec.routing.top_k = reader.integer("num_experts_per_tok", 2, 1);
  spec.routing.scoring = Scoring::softmax;
  spec.routing.renormalize = true;
}

}  // namespace moekit
