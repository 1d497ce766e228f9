#include "runner/registry.hpp"

#include <fmt/format.h>

namespace moekit {

const std::vector<CoreEntry>& core_table() {
  static const std::vector<CoreEntry> table = {
      {RunnerKind::reference, RunnerFormat::standard, reference_supports, make_reference_core},
      {RunnerKind::cpu, RunnerFormat::contiguous, cpu_supports, make_cpu_core},
  };
  return table;
}

const std::vector<FusedOpEntry>& fused_op_table() {
  static const std::vector<FusedOpEntry> table = {
      {A2AKind::none, RunnerKind::cpu, "cpu-decode", cpu_decode_supports, make_cpu_decode_op},
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

CpuKernelChoice choose_cpu_kernels(const Platform& platform) {
  if (platform.avx2 && platform.fma && platform.f16c) {
    return {CpuKernels::avx2_panels, "avx2 panel16",
            fmt::format("AVX2+FMA+F16C: weights packed in panels of 16 rows at load, streamed for "
                        "few rows, blocked GEMM for many; int4 streamed against bf16/f16 "
                        "activations takes them as int16 per group, 16-bit dot products ({}), "
                        "and int4-group-a8 its int8 activations in 8-bit ones ({}); "
                        "bf16 weights against bf16 activations: {}",
                        platform.avx512_vnni ? "AVX-512 VNNI" : "pmaddwd",
                        platform.avx512_vnni ? "AVX-512 VNNI" : "pmaddubsw",
                        platform.avx512_bf16 ? "the GEMM rounds its inputs to bf16 and runs "
                                               "AVX-512 BF16 dot products"
                                             : "the f32 GEMM (no AVX-512 BF16)")};
  }
  return {CpuKernels::portable, "portable",
          "no AVX2+FMA+F16C on this platform: canonical weights widened a row at a time"};
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
