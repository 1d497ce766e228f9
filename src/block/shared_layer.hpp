#pragma once
// The shared experts as an experts layer of their own, for the strategies that compute them
// apart from the routed ones: every token goes to each of them with weight 1 (a shared gate is
// the output stage's), and the sum lands in a buffer of the plan's device.

#include <vector>

#include "experts/experts_layer.hpp"

namespace moekit {

class SharedLayer {
 public:
  SharedLayer(const Plan& plan, int threads);

  ExpertsLayer& experts() { return experts_; }
  void run(const ExecContext& ctx, const TensorView& hidden);
  const float* output() const { return out_.data<float>(); }

 private:
  ExpertsLayer experts_;
  Tensor ids_;      // [max_tokens, n_shared]: shared expert s for column s
  Tensor weights_;  // [max_tokens, n_shared]: 1
  Tensor out_;      // [max_tokens, H] f32
};

}  // namespace moekit
