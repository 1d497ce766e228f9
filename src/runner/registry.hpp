#pragma once
// Layer 4's tables: runner cores by kind, fused ops by (a2a, runner), permutes by formats.
// resolve() reads them to decide; ExpertsRunner reads them to build what was decided.
//
// A core's row also answers which weight formats it reads (`reads`), so a new runner adds its
// row and touches no format's file, and may supply its own weight layout (`packer`), which the
// quant method fills as experts load.

#include <memory>
#include <string_view>
#include <vector>

#include "plan/capability.hpp"
#include "runner/runner_core.hpp"

namespace moekit {

struct CoreEntry {
  RunnerKind kind;
  RunnerFormat format;
  Capability (*supports)(const Deployment&);
  Capability (*reads)(const QuantParams&);
  std::unique_ptr<RunnerCore> (*create)(const Plan&, const ExpertsProblem&);
  // nullptr: the core reads the canonical layout.
  std::unique_ptr<WeightPacker> (*packer)(const Plan&, const ExpertsProblem&);
  // Records the core's kernel choices in the plan (and their decision); nullptr: none to make.
  void (*decide_kernels)(Plan&);
};

// Replaces pre-permute, core and post-permute for one (a2a, runner): dispatch output in,
// weighted sum in token order out (DispatchOutput::sum).
class FusedOp {
 public:
  virtual ~FusedOp() = default;
  virtual int64_t scratch_bytes() const = 0;
  virtual void run(const ExecContext& ctx, const DispatchOutput& input, const CoreWeights& weights,
                   void* scratch) const = 0;
};

struct FusedOpEntry {
  A2AKind a2a;
  RunnerKind runner;
  std::string_view name;
  // Asked once the runner and its kernels are in the plan.
  Capability (*supports)(const Plan&);
  std::unique_ptr<FusedOp> (*create)(const Plan&, const ExpertsProblem&);
};

// Dispatch format -> core format.
class PrePermute {
 public:
  virtual ~PrePermute() = default;
  virtual int64_t scratch_bytes() const = 0;
  virtual void run(const ExecContext& ctx, const DispatchOutput& input, RunnerBatch& batch,
                   void* scratch) const = 0;
};

// Core format -> combine format (the weighted sum in token order).
class PostPermute {
 public:
  virtual ~PostPermute() = default;
  virtual void run(const ExecContext& ctx, const RunnerBatch& batch,
                   const DispatchOutput& input) const = 0;
};

struct PrePermuteEntry {
  DispatchFormat from;
  RunnerFormat to;
  std::string_view name;
  std::unique_ptr<PrePermute> (*create)(const ExpertsProblem&);
};

struct PostPermuteEntry {
  RunnerFormat from;
  DispatchFormat to;
  std::string_view name;
  std::unique_ptr<PostPermute> (*create)(const ExpertsProblem&);
};

const std::vector<CoreEntry>& core_table();
const std::vector<FusedOpEntry>& fused_op_table();
const std::vector<PrePermuteEntry>& pre_permute_table();
const std::vector<PostPermuteEntry>& post_permute_table();

const CoreEntry* find_core(RunnerKind kind);
const FusedOpEntry* find_fused_op(A2AKind a2a, RunnerKind runner);
const PrePermuteEntry* find_pre_permute(DispatchFormat from, RunnerFormat to);
const PostPermuteEntry* find_post_permute(RunnerFormat from, DispatchFormat to);

// The backends' own declarations, one group per file under runner/.
Capability reference_supports(const Deployment& deployment);
Capability reference_reads(const QuantParams& quant);
std::unique_ptr<RunnerCore> make_reference_core(const Plan& plan, const ExpertsProblem& problem);

Capability cpu_supports(const Deployment& deployment);
Capability cpu_reads(const QuantParams& quant);
std::unique_ptr<RunnerCore> make_cpu_core(const Plan& plan, const ExpertsProblem& problem);
std::unique_ptr<WeightPacker> make_cpu_packer(const Plan& plan, const ExpertsProblem& problem);
void cpu_decide_kernels(Plan& plan);
Capability cpu_decode_supports(const Plan& plan);
std::unique_ptr<FusedOp> make_cpu_decode_op(const Plan& plan, const ExpertsProblem& problem);

#ifdef MOEKIT_WITH_CUDA
Capability cuda_supports(const Deployment& deployment);
Capability cuda_reads(const QuantParams& quant);
std::unique_ptr<RunnerCore> make_cuda_core(const Plan& plan, const ExpertsProblem& problem);
void cuda_decide_kernels(Plan& plan);
#endif

std::unique_ptr<PrePermute> make_pass_through_pre(const ExpertsProblem& problem);
std::unique_ptr<PostPermute> make_pass_through_post(const ExpertsProblem& problem);
std::unique_ptr<PrePermute> make_group_by_expert(const ExpertsProblem& problem);
std::unique_ptr<PostPermute> make_weighted_sum_to_tokens(const ExpertsProblem& problem);

}  // namespace moekit
