// libFuzzer target for the config.json reader: any input either reads as a config or is refused
// with a moekit::Error (invalid_argument); an accepted config has a possible spec, at least one
// MoE layer, and names for every MoE layer and for its first and last expert.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "moekit/error.hpp"
#include "moekit/hf_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moekit;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  HfModelConfig config;
  try {
    config = HfModelConfig::parse(text);
  } catch (const Error& e) {
    if (e.code() != Errc::invalid_argument) __builtin_trap();
    return 0;
  }
  if (!config.spec.problems().empty()) __builtin_trap();
  if (config.quant && !config.quant->problems().empty()) __builtin_trap();
  const auto layers = config.moe_layers();
  if (layers.empty()) __builtin_trap();
  for (int layer = 0; layer < config.num_layers; ++layer) {
    if (config.is_moe_layer(layer) != config.dense_reason(layer).empty()) __builtin_trap();
  }
  for (int layer : layers) {
    const MoeTensorNames names = config.tensor_names(layer);
    if (names.n_experts != config.spec.n_experts) __builtin_trap();
    (void)names.expert(0);
    (void)names.expert(names.n_experts - 1);
  }
  (void)config.spec.summary();
  return 0;
}
