#include "runner/registry.hpp"

namespace moekit {

const std::vector<CoreEntry>& core_table() {
  static const std::vector<CoreEntry> table = {
      {RunnerKind::reference, RunnerFormat::standard, reference_supports, reference_reads,
       make_reference_core, nullptr, nullptr},
      {RunnerKind::cpu, RunnerFormat::contiguous, cpu_supports, cpu_reads, make_cpu_core,
       make_cpu_packer, cpu_decide_kernels},
#ifdef MOEKIT_WITH_CUDA
      {RunnerKind::cuda, RunnerFormat::standard, cuda_supports, cuda_reads, make_cuda_core, nullptr,
       cuda_decide_kernels},
#endif
  };
  return table;
}

const std::vector<FusedOpEntry>& fused_op_table() {
  static const std::vector<FusedOpEntry> table = {
      {A2AKind::none, RunnerKind::cpu, "cpu-decode", cpu_decode_supports, make_cpu_decode_op},
      {A2AKind::mpi, RunnerKind::cpu, "cpu-decode", cpu_decode_supports, make_cpu_decode_op},
  };
  return table;
}

const std::vector<PrePermuteEntry>& pre_permute_table() {
  static const std::vector<PrePermuteEntry> table = {
      {DispatchFormat::standard, RunnerFormat::standard, "pass-through", make_pass_through_pre},
      {DispatchFormat::standard, RunnerFormat::contiguous, "group rows by expert",
       make_group_by_expert},
  };
  return table;
}

const std::vector<PostPermuteEntry>& post_permute_table() {
  static const std::vector<PostPermuteEntry> table = {
      {RunnerFormat::standard, DispatchFormat::standard, "pass-through", make_pass_through_post},
      {RunnerFormat::contiguous, DispatchFormat::standard, "weighted sum to token order",
       make_weighted_sum_to_tokens},
  };
  return table;
}

const CoreEntry* find_core(RunnerKind kind) {
  for (const CoreEntry& entry : core_table()) {
    if (entry.kind == kind) return &entry;
  }
  return nullptr;
}

const FusedOpEntry* find_fused_op(A2AKind a2a, RunnerKind runner) {
  for (const FusedOpEntry& entry : fused_op_table()) {
    if (entry.a2a == a2a && entry.runner == runner) return &entry;
  }
  return nullptr;
}

const PrePermuteEntry* find_pre_permute(DispatchFormat from, RunnerFormat to) {
  for (const PrePermuteEntry& entry : pre_permute_table()) {
    if (entry.from == from && entry.to == to) return &entry;
  }
  return nullptr;
}

const PostPermuteEntry* find_post_permute(RunnerFormat from, DispatchFormat to) {
  for (const PostPermuteEntry& entry : post_permute_table()) {
    if (entry.from == from && entry.to == to) return &entry;
  }
  return nullptr;
}

}  // namespace moekit
