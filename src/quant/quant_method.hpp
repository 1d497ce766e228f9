#pragma once
// Layer 5, the quant method: which weight tensors exist for a format and their shapes
// (create_weights), how one expert's weights get into them (load_expert: copied when they come
// in the format, quantised when they come as floats), and what a core is handed (apply).
// A format contributes an entry to the quant table (one file per format in this folder): its
// validity rule and description, which layers it can hold (with a reason), and the names its
// tensors carry in checkpoints. Which runners read a format is the runners' answer
// (runner/registry.hpp), so a new runner touches no format's file.

#include <memory>
#include <string>
#include <vector>

#include "contracts/weights.hpp"
#include "plan/capability.hpp"

namespace moekit {

// One expert matrix [N, K] as a quant method receives it: float weights, or weights already in
// the method's format with the scale grid (and zero points) of this one matrix. The block layer
// has checked shapes, dtypes and values against the plan's QuantParams.
struct MatrixSource {
  TensorView weight;
  TensorView scale;
  TensorView zero;
};

struct TensorNames {
  const char* weight;
  const char* scale;  // nullptr: the format has no scales
  const char* zero;   // nullptr: the format has no zero points
};

struct QuantEntry {
  WeightFormat format;
  // What is wrong with parameters that claim this format (QuantParams::problems).
  std::vector<std::string> (*problems)(const QuantParams& params);
  std::string (*describe)(const QuantParams& params);
  // Whether a layer of this spec can be stored in the format (int4 packs K in pairs, say).
  Capability (*supports_spec)(const ModelSpec& spec, const QuantParams& params);
  TensorNames names;
};

const std::vector<QuantEntry>& quant_table();
const QuantEntry* find_quant(WeightFormat format);

struct TensorSpec {
  std::string name;  // "w13_weight_scale_inv"
  DType dtype;
  Shape shape;
};

// The tensors a quant method of this format holds for `slots` experts, named as checkpoints of
// the format name them; create_weights() allocates exactly these.
std::vector<TensorSpec> weight_tensors(const QuantParams& params, int slots, int64_t hidden,
                                       int64_t intermediate);
// The bytes of those tensors: weights, scales and zero points as stored.
int64_t weight_bytes(const QuantParams& params, int slots, int64_t hidden, int64_t intermediate);

// Holds one layer's expert weights on the plan's device: in the canonical layout every core can
// read, or, where the runner supplied a WeightPacker, only in the runner's own layout (each
// expert passes through a one-slot canonical copy on the host as it loads).
class QuantMethod {
 public:
  QuantMethod(const QuantParams& params, Device device, std::unique_ptr<WeightPacker> packer);

  const QuantParams& params() const { return params_; }
  void create_weights(int slots, int64_t hidden, int64_t intermediate);
  // gate, up: [I, H]; down: [H, I] (host memory). Quantised when they come as floats, copied
  // when they come in the format.
  void load_expert(int slot, const MatrixSource& gate, const MatrixSource& up,
                   const MatrixSource& down);
  // fp8_static: the scales of the two GEMM inputs, one for all experts.
  void set_input_scales(float w13, float w2);
  CoreWeights apply() const;

 private:
  // The canonical tensors of `slots` slots on `device`, as weight_tensors() lists them.
  struct Canonical {
    std::vector<Tensor> tensors;
    StoredMatrices w13;
    StoredMatrices w2;
  };
  Canonical create_canonical(int slots, Device device) const;

  QuantParams params_;
  Device device_;
  std::unique_ptr<WeightPacker> packer_;
  int64_t hidden_ = 0;
  int64_t intermediate_ = 0;
  Canonical canonical_;         // the weights on the plan's device; empty when a packer holds them
  Tensor device_input_scales_;  // fp8_static on a GPU: [2] f32
  CoreWeights weights_;
};

// Each format's row of the quant table, from its own file in this folder.
QuantEntry unquantized_entry(WeightFormat format);  // f32, f16, bf16
QuantEntry fp8_tensor_entry();
QuantEntry fp8_block_entry();
QuantEntry int4_group_entry();

}  // namespace moekit
