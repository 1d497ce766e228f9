#pragma once
// Layer 4's tables: runner cores by kind, fused ops by (a2a, runner), permutes by formats.
// resolve() reads them to decide; ExpertsRunner reads them to build what was decided.

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
  std::unique_ptr<RunnerCore> (*create)(const ExpertsProblem&);
};

// Replaces pre-permute, core and post-permute for one (a2a, runner): dispatch output in,
// weighted sum in token order out.
class FusedOp {
 public:
  virtual ~FusedOp() = default;
  virtual int64_t scratch_bytes() const = 0;
  virtual void run(const DispatchOutput& input, const CoreWeights& weights, float* combined,
                   void* scratch, ThreadPool& pool) const = 0;
};

struct FusedOpEntry {
  A2AKind a2a;
  RunnerKind runner;
  std::string_view name;
  Capability (*supports)(const Deployment&);
  std::unique_ptr<FusedOp> (*create)(const ExpertsProblem&);
};

// Dispatch format -> core format.
class PrePermute {
 public:
  virtual ~PrePermute() = default;
  virtual int64_t scratch_bytes() const = 0;
  virtual void run(const DispatchOutput& input, RunnerBatch& batch, float* combined, void* scratch,
                   ThreadPool& pool) const = 0;
};

// Core format -> combine format (the weighted sum in token order).
class PostPermute {
 public:
  virtual ~PostPermute() = default;
  virtual void run(const RunnerBatch& batch, const DispatchOutput& input, float* combined,
                   ThreadPool& pool) const = 0;
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

// The kernels of the cpu runner on a platform, with the reason: resolve() records the choice
// and the experts layer builds the cpu core or fused op and the weight layout from it.
struct CpuKernelChoice {
  CpuKernels kernels;
  std::string_view name;
  std::string reason;
};
CpuKernelChoice choose_cpu_kernels(const Platform& platform);

const CoreEntry* find_core(RunnerKind kind);
const FusedOpEntry* find_fused_op(A2AKind a2a, RunnerKind runner);
const PrePermuteEntry* find_pre_permute(DispatchFormat from, RunnerFormat to);
const PostPermuteEntry* find_post_permute(RunnerFormat from, DispatchFormat to);

// The backends' own declarations, one pair per file under runner/.
Capability reference_supports(const Deployment& deployment);
std::unique_ptr<RunnerCore> make_reference_core(const ExpertsProblem& problem);
Capability cpu_supports(const Deployment& deployment);
std::unique_ptr<RunnerCore> make_cpu_core(const ExpertsProblem& problem);
Capability cpu_decode_supports(const Deployment& deployment);
std::unique_ptr<FusedOp> make_cpu_decode_op(const ExpertsProblem& problem);
std::unique_ptr<PrePermute> make_pass_through_pre(const ExpertsProblem& problem);
std::unique_ptr<PostPermute> make_pass_through_post(const ExpertsProblem& problem);
std::unique_ptr<PrePermute> make_group_by_expert(const ExpertsProblem& problem);
std::unique_ptr<PostPermute> make_weighted_sum_to_tokens(const ExpertsProblem& problem);

}  // namespace moekit
