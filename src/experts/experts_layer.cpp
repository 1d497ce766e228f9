#include "experts/experts_layer.hpp"

#include "moekit/error.hpp"
#include "runner/registry.hpp"

namespace moekit {
namespace {

std::unique_ptr<QuantMethod> create_quant_method(const Plan& plan, const ExpertsProblem& problem) {
  const CoreEntry* core = find_core(plan.runner);
  if (core == nullptr) fail(Errc::internal, "plan names a runner core that is not registered");
  auto method = std::make_unique<QuantMethod>(
      plan.quant, plan.options.device,
      core->packer != nullptr ? core->packer(plan, problem) : nullptr);
  method->create_weights(problem.slots, problem.hidden, problem.intermediate);
  return method;
}

std::unique_ptr<Dispatcher> create_dispatcher(const Plan& plan, const ExpertsProblem& problem,
                                              std::vector<int32_t> global_to_local) {
  // The shared experts computed apart see this rank's tokens only: their rows never leave it.
  const bool routed = problem.role == ExpertsRole::routed;
  const DispatcherEntry* entry = find_dispatcher(routed ? plan.options.a2a : A2AKind::none);
  if (entry == nullptr) fail(Errc::internal, "plan names a dispatcher that is not registered");
  return entry->create(
      {.hidden = problem.hidden,
       .columns = problem.columns,
       .max_tokens = plan.options.max_tokens,
       .max_received_tokens = problem.max_tokens,
       .global_to_local = std::move(global_to_local),
       .device = plan.options.device,
       .comm = plan.comm == CommKind::none || !routed ? nullptr : &world_communicator(plan.comm),
       .timeout_ms = plan.options.comm_timeout_ms,
       .mode = plan.a2a_mode,
       .wire = plan.a2a_wire,
       .quant = plan.quant,
       .physical = plan.location.physical,
       .per_rank = plan.location.per_rank(),
       .map_in_runner = plan.fusions.map_in_sort});
}

}  // namespace

ExpertsLayer::ExpertsLayer(const Plan& plan, const ExpertsProblem& problem,
                           std::vector<int32_t> global_to_local)
    : problem_(problem),
      quant_(create_quant_method(plan, problem_)),
      dispatcher_(create_dispatcher(plan, problem_, std::move(global_to_local))),
      runner_(plan, problem_),
      scratch_(Buffer::allocate(plan.options.device,
                                dispatcher_->scratch_bytes() + runner_.scratch_bytes())) {}

void ExpertsLayer::load(int slot, const MatrixSource& gate, const MatrixSource& up,
                        const MatrixSource& down) {
  quant_->load_expert(slot, gate, up, down);
}

void ExpertsLayer::set_input_scales(float w13, float w2) {
  quant_->set_input_scales(w13, w2);
}

void ExpertsLayer::forward(const ExecContext& ctx, const TensorView& hidden,
                           const int32_t* global_ids, const float* weights, float* combined,
                           const TensorView* output, const routing::cuda::RouteArgs* route) {
  void* dispatch_scratch = scratch_.data();
  void* runner_scratch = static_cast<char*>(scratch_.data()) + dispatcher_->scratch_bytes();
  DispatchOutput dispatched =
      dispatcher_->dispatch(ctx, hidden, global_ids, weights, combined, dispatch_scratch);
  if (output != nullptr) {
    // resolve fuses the output into the combine only where the dispatcher's combine moves
    // nothing and the cuda core writes the sum.
    if (dispatcher_->collective() || dispatched.sum != combined) {
      fail(Errc::internal,
           "the layer's output written by the runner, with a dispatcher whose "
           "combine returns the sums");
    }
    dispatched.output = output->data;
    dispatched.output_dtype = output->dtype;
  }
  // resolve leaves the routing to the runner only where the standard dispatcher hands it the
  // global ids as they are (map_in_sort), so nothing before it reads them.
  dispatched.route = route;
  runner_.run(ctx, dispatched, quant_->apply(), runner_scratch);
  dispatcher_->combine(ctx, dispatched, combined, dispatch_scratch);
}

bool ExpertsLayer::collective() const {
  return dispatcher_->collective();
}

void ExpertsLayer::abandon(const ExecContext& ctx) {
  dispatcher_->abandon(ctx, scratch_.data());
}

void ExpertsLayer::synchronize(const ExecContext& ctx) {
  dispatcher_->synchronize(ctx, scratch_.data());
}

}  // namespace moekit
