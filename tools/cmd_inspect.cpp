// moekit inspect: what moekit reads in a Hugging Face model directory: the family, which layers
// are MoE, the experts and their format, the memory an expert-parallel rank holds, and the plan
// `auto` would choose for its MoE layers.

#include <cstdio>

#include "commands.hpp"
#include "moekit/checkpoint.hpp"
#include "quant/quant_method.hpp"

namespace moekit::cli {
namespace {

struct InspectFlags {
  PlanFlags plan;
  std::string model;
};

// "3-60" style ranges of sorted layer indices.
std::string ranges(const std::vector<int>& layers) {
  std::string text;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    text += fmt::format(
        "{}{}", text.empty() ? "" : ", ",
        i == j ? std::to_string(layers[i]) : fmt::format("{}-{}", layers[i], layers[j]));
    i = j + 1;
  }
  return text.empty() ? "none" : text;
}

double mib(int64_t bytes) {
  return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

int inspect(const InspectFlags& flags) {
  const Checkpoint checkpoint = Checkpoint::open(flags.model);
  const HfModelConfig& config = checkpoint.config();
  const std::vector<int> moe = config.moe_layers();
  std::printf("model:   %s\nfamily:  %s (model_type %s), %d decoder layers\n",
              checkpoint.directory().c_str(), std::string(family_name(config.family)).c_str(),
              config.model_type.c_str(), config.num_layers);
  std::printf("MoE layers: %s (%zu)\n", ranges(moe).c_str(), moe.size());
  std::vector<int> dense;
  for (int l = 0; l < config.num_layers; ++l) {
    if (!config.is_moe_layer(l)) dense.push_back(l);
  }
  if (!dense.empty()) {
    std::printf("dense layers: %s (layer %d: %s)\n", ranges(dense).c_str(), dense.front(),
                config.dense_reason(dense.front()).c_str());
  }
  if (moe.empty()) return 0;

  const int first = moe.front();
  const ModelSpec spec = checkpoint.spec(first);
  const QuantParams stored = checkpoint.stored_format(first);
  std::printf("layer:   %s\n", config.spec.summary().c_str());
  std::printf("weights: %s\n", stored.describe().c_str());

  int missing = 0;
  const std::vector<std::string> required = checkpoint.required_tensors(first, stored);
  for (const std::string& name : required) {
    if (!checkpoint.files().contains(name)) {
      if (missing++ == 0) std::printf("missing: %s\n", name.c_str());
    }
  }
  std::printf("tensors of layer %d: %zu required, %d missing\n", first, required.size(), missing);

  const int ep = flags.plan.ep_size;
  if (ep < 1) fail(Errc::invalid_argument, "--ep-size must be at least 1, got {}", ep);
  Options options = flags.plan.options();
  options.weights = checkpoint.format_for(first, flags.plan.requested_quant());
  const int64_t H = spec.hidden, I = spec.intermediate;
  const int64_t expert = weight_bytes(stored, 1, H, I);
  const int64_t shared =
      spec.n_shared > 0 ? weight_bytes(stored, spec.n_shared, H, spec.shared_intermediate) : 0;
  const int per_rank = (spec.n_experts + ep - 1) / ep;
  const int64_t layer_bytes = expert * spec.n_experts + shared;
  const int64_t rank_bytes = expert * per_rank + shared;
  std::printf(
      "memory:  %.2f MiB per expert, %.1f MiB per layer (shared %.1f MiB), %.1f MiB for all %zu "
      "MoE layers\n",
      mib(expert), mib(layer_bytes), mib(shared),
      mib(layer_bytes * static_cast<int64_t>(moe.size())), moe.size());
  std::printf(
      "         ep %d: %d routed experts per rank, %.1f MiB per rank per layer, %.1f MiB "
      "per rank in all\n",
      ep, per_rank, mib(rank_bytes), mib(rank_bytes * static_cast<int64_t>(moe.size())));

  const Resolution resolution = try_resolve(spec, options, Platform::probe());
  if (resolution.plan) {
    std::printf("\n%s", resolution.plan->explain().c_str());
  } else {
    std::printf("\nplan: refused: %s\n", resolution.refusal.c_str());
  }
  if (!config.ignored.empty()) {
    std::string keys;
    for (const std::string& key : config.ignored) keys += (keys.empty() ? "" : ", ") + key;
    std::printf("\nnot about the MoE layer, ignored: %s\n", keys.c_str());
  }
  return 0;
}

}  // namespace

Command add_inspect_command(CLI::App& app) {
  auto flags = std::make_shared<InspectFlags>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "describe a Hugging Face model directory's MoE layers and the plan for them");
  cmd->add_option("--model", flags->model, "model directory: config.json and *.safetensors")
      ->required();
  flags->plan.add_deployment(*cmd, "--quantize");
  return {cmd, [flags] { return inspect(*flags); }};
}

}  // namespace moekit::cli
