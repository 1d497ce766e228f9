#pragma once
// Layer 5, the quant method: which weight tensors exist for a format and their shapes
// (create_weights), how one expert's weights get into them (load_expert: copied when they come
// in the format, quantised when they come as floats), and what a core is handed (apply).
// A format contributes an entry to the quant table (one file per format in this folder): which
// runner cores read it and which layers it can hold, each with a reason, and the names its
// tensors carry in checkpoints.

#include <string>
#include <vector>

#include "plan/capability.hpp"
#include "runner/runner_core.hpp"

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
  Capability (*supports_runner)(RunnerKind runner, const QuantParams& params);
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

// How a quant method stores the weights: as the format defines them (every core reads this),
// or packed in panel16 for the cpu runner's AVX2 kernels (runner/cpu/panels.hpp).
enum class WeightLayout { canonical, panel16 };

class QuantMethod {
 public:
  explicit QuantMethod(const QuantParams& params, WeightLayout layout = WeightLayout::canonical);

  const QuantParams& params() const { return params_; }
  WeightLayout layout() const { return layout_; }
  void create_weights(int slots, int64_t hidden, int64_t intermediate);
  // gate, up: [I, H]; down: [H, I]. Packed layouts go through one expert in the canonical
  // layout, so quantising and copying are the same code for every layout.
  void load_expert(int slot, const MatrixSource& gate, const MatrixSource& up,
                   const MatrixSource& down);
  // fp8_static: the scales of the two GEMM inputs, one for all experts.
  void set_input_scales(float w13, float w2);
  CoreWeights apply() const;

 private:
  // The canonical tensors of `slots` slots, as weight_tensors() lists them, with the views.
  struct Canonical {
    std::vector<Tensor> tensors;
    StoredMatrices w13;
    StoredMatrices w2;
  };
  Canonical create_canonical(int slots) const;

  QuantParams params_;
  WeightLayout layout_;
  int64_t hidden_ = 0;
  int64_t intermediate_ = 0;
  Canonical canonical_;  // the weights, or empty when packed
  cpu::PanelBuffer w13_panels_;
  cpu::PanelBuffer w2_panels_;
  CoreWeights weights_;
};

// The answer every format gives today: the CPU-side cores (reference, cpu) read it, with the
// format's reason; no GPU core is built for it yet.
Capability read_by_cpu_cores(RunnerKind runner, WeightFormat format, std::string reason);

// The formats' own capability checks, one pair per file in this folder.
Capability unquantized_supports_runner(RunnerKind runner, const QuantParams& params);
Capability unquantized_supports_spec(const ModelSpec& spec, const QuantParams& params);
Capability fp8_tensor_supports_runner(RunnerKind runner, const QuantParams& params);
Capability fp8_tensor_supports_spec(const ModelSpec& spec, const QuantParams& params);
Capability fp8_block_supports_runner(RunnerKind runner, const QuantParams& params);
Capability fp8_block_supports_spec(const ModelSpec& spec, const QuantParams& params);
Capability int4_group_supports_runner(RunnerKind runner, const QuantParams& params);
Capability int4_group_supports_spec(const ModelSpec& spec, const QuantParams& params);

}  // namespace moekit
