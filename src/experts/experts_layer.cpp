#include "experts/experts_layer.hpp"

#include "moekit/error.hpp"

namespace moekit {
namespace {

std::unique_ptr<QuantMethod> create_quant_method(const Plan& plan, const ExpertsProblem& problem) {
  const QuantEntry* entry = find_quant(plan.weights);
  if (entry == nullptr) {
    fail(Errc::internal, "plan names weight format {} with no quant method",
         weight_format_name(plan.weights));
  }
  auto method = entry->create(plan.weights);
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

void ExpertsLayer::load(int slot, const TensorView& gate, const TensorView& up,
                        const TensorView& down) {
  quant_->load_expert(slot, gate, up, down);
}

void ExpertsLayer::forward(const TensorView& hidden, const int32_t* global_ids,
                           const float* weights, float* combined, ThreadPool& pool) {
  const DispatchOutput dispatched =
      dispatcher_.dispatch(hidden, global_ids, weights, problem_.columns);
  runner_.run(dispatched, quant_->apply(), combined, scratch_.data(), pool);
}

}  // namespace moekit
