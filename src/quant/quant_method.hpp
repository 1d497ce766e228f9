#pragma once
// Layer 5: which weight tensors exist (create_weights), how one expert's weights get into them
// (load_expert), which runner cores can read them (supports), and what a core is handed (apply).

#include <memory>
#include <vector>

#include "plan/capability.hpp"
#include "runner/runner_core.hpp"

namespace moekit {

class QuantMethod {
 public:
  virtual ~QuantMethod() = default;
  virtual QuantParams params() const = 0;
  virtual void create_weights(int slots, int64_t hidden, int64_t intermediate) = 0;
  // gate, up: [I, H]; down: [H, I]; 2-D views with contiguous rows, any float dtype on the CPU.
  virtual void load_expert(int slot, const TensorView& gate, const TensorView& up,
                           const TensorView& down) = 0;
  virtual CoreWeights apply() const = 0;
};

struct QuantEntry {
  WeightFormat format;
  Capability (*supports_runner)(RunnerKind runner);
  std::unique_ptr<QuantMethod> (*create)(WeightFormat format);
};

const std::vector<QuantEntry>& quant_table();
const QuantEntry* find_quant(WeightFormat format);

Capability unquantized_supports_runner(RunnerKind runner);
std::unique_ptr<QuantMethod> make_unquantized(WeightFormat format);

}  // namespace moekit
