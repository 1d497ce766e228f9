#pragma once
// Layer 4's core interface: a core computes GEMM1 (gate+up) -> activation -> GEMM2 (down) per
// routed row, reading the rows in its format (contracts/rows.hpp) and the weights the quant
// method hands it (contracts/weights.hpp).

#include <cstdint>

#include "contracts/exec.hpp"
#include "contracts/experts_problem.hpp"
#include "contracts/rows.hpp"
#include "contracts/weights.hpp"
#include "moekit/plan.hpp"

namespace moekit {

// A batch in a core's format. Standard: the core reads `standard` and writes the weighted sum
// over columns to standard->sum. Contiguous: the core reads and writes `contiguous`.
struct RunnerBatch {
  const DispatchOutput* standard = nullptr;
  ContiguousRows contiguous;
};

class RunnerCore {
 public:
  virtual ~RunnerCore() = default;
  virtual RunnerFormat format() const = 0;
  virtual int64_t scratch_bytes() const = 0;
  virtual void run(const ExecContext& ctx, RunnerBatch& batch, const CoreWeights& weights,
                   void* scratch) const = 0;
};

}  // namespace moekit
