#pragma once
// Layer 2: the physical experts this rank holds, with their quant method, dispatcher and runner,
// built in that order (the dispatcher may depend on the quant method's activation format).

#include <memory>
#include <vector>

#include "dispatch/dispatcher.hpp"
#include "quant/quant_method.hpp"
#include "runner/experts_runner.hpp"

namespace moekit {

class ExpertsLayer {
 public:
  ExpertsLayer(const Plan& plan, const ExpertsProblem& problem,
               std::vector<int32_t> global_to_local);

  void load(int slot, const MatrixSource& gate, const MatrixSource& up, const MatrixSource& down);
  void set_input_scales(float w13, float w2);

  // global_ids / weights: [T, problem.columns]. Writes the weighted sum to combined [T, H] f32,
  // in token order; or, given `output` (Plan::fusions.combine_to_output: a dispatcher whose rows
  // stay here and a runner that writes it), to output in its dtype, and combined is not written.
  // `route` (Plan::fusions.route_in_runner): the ids and weights are not written yet, and the
  // runner routes the batch with these arguments (DispatchOutput::route).
  void forward(const ExecContext& ctx, const TensorView& hidden, const int32_t* global_ids,
               const float* weights, float* combined, const TensorView* output = nullptr,
               const routing::cuda::RouteArgs* route = nullptr);
  // Whether forward() exchanges with other ranks (which then wait for this one), and how this
  // rank tells them that its input failed before forward() (Dispatcher::abandon).
  bool collective() const;
  void abandon(const ExecContext& ctx);
  // Dispatcher::synchronize: the exchanges left running, bounded by their deadline.
  void synchronize(const ExecContext& ctx);

 private:
  ExpertsProblem problem_;
  std::unique_ptr<QuantMethod> quant_;
  std::unique_ptr<Dispatcher> dispatcher_;
  ExpertsRunner runner_;
  Buffer scratch_;  // the dispatcher's, then the runner's
};

}  // namespace moekit
