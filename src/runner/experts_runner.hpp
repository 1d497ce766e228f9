#pragma once
// Layer 4 as built from a plan: either the fused op for (a2a, runner), or
// pre-permute -> core -> post-permute, chosen by formats.

#include <memory>

#include "runner/registry.hpp"

namespace moekit {

class ExpertsRunner {
 public:
  ExpertsRunner(const Plan& plan, const ExpertsProblem& problem);
  int64_t scratch_bytes() const;
  // Writes the weighted sum of the routed rows to input.sum [T, H], in token order.
  void run(const ExecContext& ctx, const DispatchOutput& input, const CoreWeights& weights,
           void* scratch) const;

 private:
  std::unique_ptr<FusedOp> fused_;
  std::unique_ptr<PrePermute> pre_;
  std::unique_ptr<RunnerCore> core_;
  std::unique_ptr<PostPermute> post_;
};

}  // namespace moekit
