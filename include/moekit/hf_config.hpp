#pragma once
// A Hugging Face model directory's config.json read for its MoE layers: which family, which
// decoder layers are MoE, the ModelSpec of those layers, the weight format and the checkpoint's
// tensor names of one layer's MoE weights. Each family follows its own reference code (the
// transformers model, and DeepSeek's modeling_deepseek.py for DeepSeek-V2/V3): a key that the
// reference gives a default may be absent, and a setting of the MoE layer that moekit does not
// compute is refused by name rather than ignored.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/dtype.hpp"
#include "moekit/quant.hpp"
#include "moekit/spec.hpp"

namespace moekit {

enum class ModelFamily {
  deepseek_v2,
  deepseek_v3,
  qwen2_moe,
  qwen3_moe,
  qwen3_next,
  mixtral,
  glm4_moe,
  olmoe
};
std::string_view family_name(ModelFamily family);

// Module paths without the ".weight" suffix: a quantised checkpoint stores its scales next to
// the weight under the same path ("...gate_proj.weight_scale_inv").
struct ExpertTensorNames {
  std::string gate, up, down;
  bool operator==(const ExpertTensorNames&) const = default;
};

struct MoeTensorNames {
  std::string router;                          // "model.layers.3.mlp.gate.weight" [E, H]
  std::optional<std::string> correction_bias;  // "model.layers.3.mlp.gate.e_score_correction_bias"
  std::optional<ExpertTensorNames> shared;     // DeepSeek/GLM "mlp.shared_experts.*",
                                               // Qwen2-MoE, Qwen3-Next "mlp.shared_expert.*"
  std::optional<std::string> shared_gate;      // Qwen2-MoE, Qwen3-Next
                                               // "mlp.shared_expert_gate.weight" [1, H]
  std::string expert_prefix;                   // "model.layers.3.mlp.experts."
  ExpertTensorNames expert_leaf;  // {"gate_proj", "up_proj", "down_proj"}; Mixtral w1 w3 w2
  int n_experts = 0;

  // "model.layers.3.mlp.experts.7.gate_proj" ...; invalid_argument outside [0, n_experts).
  ExpertTensorNames expert(int e) const;
};

// Which decoder layers hold an MoE block, as the family's reference decides it: layer l is MoE
// when l >= first_k_dense_replace, l % moe_layer_freq == 0, (l + 1) % decoder_sparse_step == 0
// and l is not in mlp_only_layers. A family sets only the keys its reference reads.
struct MoeLayerRule {
  int first_k_dense_replace = 0;
  int moe_layer_freq = 1;
  int decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;
};

struct HfModelConfig {
  ModelFamily family = ModelFamily::deepseek_v3;
  std::string model_type;  // as written in config.json ("kimi_k2" reads as deepseek_v3)
  int num_layers = 0;      // num_hidden_layers
  MoeLayerRule layers;
  ModelSpec spec;                    // the MoE layers' spec; spec.name is the family name
  std::optional<QuantParams> quant;  // from quantization_config; nullopt = float weights
  DType weight_dtype = DType::bf16;  // torch_dtype: bf16 / f16 / f32 (bf16 if absent)
  std::vector<std::string> ignored;  // keys that do not change the MoE layer, for `inspect`

  bool is_moe_layer(int layer) const;
  // Why `layer` is dense ("first_k_dense_replace = 3"); "" for an MoE layer.
  std::string dense_reason(int layer) const;
  std::vector<int> moe_layers() const;
  // invalid_argument for a dense or out-of-range layer.
  MoeTensorNames tensor_names(int layer) const;

  // invalid_argument naming `label` and the key at fault for any config moekit cannot run.
  static HfModelConfig parse(std::string_view json_text, std::string_view label = "config.json");
  // Reads dir/config.json; io when it cannot be read.
  static HfModelConfig from_directory(const std::string& dir);
};

}  // namespace moekit
