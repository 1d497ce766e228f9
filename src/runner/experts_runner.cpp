#include "runner/experts_runner.hpp"

#include "moekit/error.hpp"

namespace moekit {

ExpertsRunner::ExpertsRunner(const Plan& plan, const ExpertsProblem& problem) {
  if (plan.fused_op) {
    const FusedOpEntry* entry = find_fused_op(plan.options.a2a, plan.runner);
    if (entry == nullptr)
      fail(Errc::internal, "plan names fused op {} that is not registered", *plan.fused_op);
    fused_ = entry->create(plan, problem);
    return;
  }
  const CoreEntry* core = find_core(plan.runner);
  const PrePermuteEntry* pre = find_pre_permute(plan.dispatch_format, plan.core_format);
  const PostPermuteEntry* post = find_post_permute(plan.core_format, plan.dispatch_format);
  if (core == nullptr || pre == nullptr || post == nullptr) {
    fail(Errc::internal, "plan names a runner core or permute that is not registered");
  }
  core_ = core->create(plan, problem);
  pre_ = pre->create(problem);
  post_ = post->create(problem);
}

int64_t ExpertsRunner::scratch_bytes() const {
  if (fused_) return fused_->scratch_bytes();
  return pre_->scratch_bytes() + core_->scratch_bytes();
}

void ExpertsRunner::run(const ExecContext& ctx, const DispatchOutput& input,
                        const CoreWeights& weights, void* scratch) const {
  if (fused_) {
    fused_->run(ctx, input, weights, scratch);
    return;
  }
  RunnerBatch batch;
  pre_->run(ctx, input, batch, scratch);
  core_->run(ctx, batch, weights, static_cast<char*>(scratch) + pre_->scratch_bytes());
  post_->run(ctx, batch, input);
}

}  // namespace moekit
