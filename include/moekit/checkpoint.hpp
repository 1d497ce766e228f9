#pragma once
// A Hugging Face model directory opened for its MoE layers: config.json read by HfModelConfig,
// the safetensors shards by CheckpointFiles, and one layer's weights, found by their hub names,
// handed to a MoeLayer one expert at a time (a rank reads only the experts it holds).

#include <string>
#include <vector>

#include "moekit/checkpoint_files.hpp"
#include "moekit/hf_config.hpp"
#include "moekit/layer.hpp"
#include "moekit/plan.hpp"

namespace moekit {

// The router's linear map [E, H] of one layer, widened to f32 once.
class RouterGate {
 public:
  RouterGate(const TensorView& weight, int64_t experts, int64_t hidden, const std::string& name);
  // logits [T, E] f32 = hidden [T, H] (f32/bf16/f16) times the weight's transpose, accumulated
  // in float64 so that the experts chosen do not depend on summation order.
  void logits(const TensorView& hidden, const TensorView& out) const;

 private:
  std::vector<float> weight_;
  int64_t experts_ = 0;
  int64_t hidden_ = 0;
};

class Checkpoint {
 public:
  // Reads config.json and opens the safetensors files; errors name the file and the fault.
  static Checkpoint open(const std::string& directory);

  const HfModelConfig& config() const { return config_; }
  const CheckpointFiles& files() const { return files_; }
  const std::string& directory() const { return files_.directory(); }

  // The MoE layer `layer`'s spec; invalid_argument for a dense or out-of-range layer.
  ModelSpec spec(int layer) const;
  // The format the checkpoint stores its expert weights in: quantization_config's, or the
  // float dtype of the first expert's gate weight.
  QuantParams stored_format(int layer) const;
  // The weight format for a plan: the stored one, or `requested` when the stored weights are
  // floats that the layer can quantise (or convert) at load time. Quantised weights are never
  // converted to another format: that is refused, naming both.
  QuantParams format_for(int layer, const std::optional<QuantParams>& requested) const;

  // The layer of `plan` (whose spec is spec(layer)) with this rank's experts read from disk.
  MoeLayer load(int layer, const Plan& plan) const;
  RouterGate router(int layer) const;

  // Every tensor of the layer's MoE block that the checkpoint must hold, by hub name.
  std::vector<std::string> required_tensors(int layer, const QuantParams& stored) const;

 private:
  Checkpoint(HfModelConfig config, CheckpointFiles files)
      : config_(std::move(config)), files_(std::move(files)) {}

  HfModelConfig config_;
  CheckpointFiles files_;
};

}  // namespace moekit
