#include "experts/experts_layer.hpp"

#include "moekit/error.hpp"
#include "runner/registry.hpp"

namespace moekit {
namespace {

// The problem as the runner builds it: with the weight format and, for the cpu runner, the
// kernels the plan chose for its platform.
ExpertsProblem runner_problem(const Plan& plan, ExpertsProblem problem) {
  problem.quant = plan.quant;
  if (plan.runner == RunnerKind::cpu) {
    problem.kernels = choose_cpu_kernels(plan.platform).kernels;
    problem.avx512_vnni = plan.platform.avx512_vnni;
    problem.avx512_bf16 = plan.platform.avx512_bf16;
  }
  return problem;
}

std::unique_ptr<QuantMethod> create_quant_method(const Plan& plan, const ExpertsProblem& problem) {
  const WeightLayout layout =
      problem.kernels == CpuKernels::avx2_panels ? WeightLayout::panel16 : WeightLayout::canonical;
  auto method = std::make_unique<QuantMethod>(plan.quant, layout);
  method->create_weights(problem.slots, problem.hidden, problem.intermediate);
  return method;
}

}  // namespace

ExpertsLayer::ExpertsLayer(const Plan& plan, const ExpertsProblem& problem,
                           std::vector<int32_t> global_to_local)
    : problem_(runner_problem(plan, problem)),
      quant_(create_quant_method(plan, problem_)),
      dispatcher_(std::move(global_to_local), problem_.max_rows()),
      runner_(plan, problem_),
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
