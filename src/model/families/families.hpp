#pragma once
// One reader per model family: each reads the keys its reference reads for the MoE layer
// (layer count, which layers are MoE, sizes, routing, shared experts) with that reference's
// defaults. The keys every family shares (hidden_act, torch_dtype, quantization_config) are read
// by HfModelConfig::parse.

#include "model/config_reader.hpp"
#include "moekit/hf_config.hpp"

namespace moekit {

// Far above any model in use (the largest have about 100 layers); it bounds the work of
// listing the MoE layers of a hostile config.
inline constexpr int kMaxLayers = 4096;

void read_deepseek_v2(ConfigReader& reader, HfModelConfig& config);
void read_deepseek_v3(ConfigReader& reader, HfModelConfig& config);
void read_glm4_moe(ConfigReader& reader, HfModelConfig& config);
void read_qwen2_moe(ConfigReader& reader, HfModelConfig& config);
void read_qwen3_moe(ConfigReader& reader, HfModelConfig& config);
void read_qwen3_next(ConfigReader& reader, HfModelConfig& config);
void read_mixtral(ConfigReader& reader, HfModelConfig& config);
void read_olmoe(ConfigReader& reader, HfModelConfig& config);

}  // namespace moekit
