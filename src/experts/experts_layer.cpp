#include "experts/experts_layer.hpp"

#include "moekit/error.hpp"

namespace moekit {
namespace {

std::unique_ptr<QuantMethod> create_quant_method(const Plan& plan, const ExpertsProblem& problem) {
  auto method = std::make_unique<QuantMethod>(plan.quant);
  method->create_weights(problem.slots, problem.hidden, problem.intermediate);
  return method;
}

}  // namespace

ExpertsLayer::ExpertsLayer(const Plan& plan, const ExpertsProblem& problem,
                           std::vector<int32_t> global_to_local)
    : problem_(problem),
      quant_(create_quant_method(plan, problem)),
      dispatcher_(std::move(global_to_local), problem.max_rows()),
      runner_(plan, problem),
      scratch_(Buffer::allocate(plan.options.device, runner_.scratch_bytes())) {}

void ExpertsLayer::load(int slot, const MatrixSource& gate, const MatrixSource& up,
                        const MatrixSource& down) {
  quant_->load_expert(slot, gate, up, down);
}

void ExpertsLayer::set_input_scales(float w13, float w2) {
  quant_->set_input_scales(w13, w2);
}

void ExpertsLayer::forward(const TensorView& hidden, const int32_t* global_ids,
                           const float* weights, float* combined, ThreadPool& pool) {
  const DispatchOutput dispatched =
      dispatcher_.dispatch(hidden, global_ids, weights, problem_.columns);
  runner_.run(dispatched, quant_->apply(), combined, scratch_.data(), pool);
}

}  // namespace moekit
