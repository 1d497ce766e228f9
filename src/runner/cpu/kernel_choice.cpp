#include "runner/cpu/kernel_choice.hpp"

#include <fmt/format.h>

#include "moekit/error.hpp"
#include "runner/cpu/panels.hpp"
#include "runner/cpu/stream.hpp"

namespace moekit::cpu {
namespace {

Int4RowsByActivations int4_rows(const QuantParams& q, int64_t hidden, int64_t intermediate) {
  if (q.weight_dtype != DType::i4) return {};
  const bool int8 = q.activation == ActivationQuant::int8_per_token_group;
  for (const int64_t k : {hidden, intermediate}) {
    const int64_t group = q.block_cols == 0 ? k : q.block_cols;
    const int64_t longest = int8 ? kInt8MaxStep : kInt16MaxStep;
    if (k % kInt4BlockK != 0 || group % kInt4BlockK != 0 || group > longest) return {};
  }
  if (int8) return {Int4Rows::int8, Int4Rows::int8};
  return {Int4Rows::f32, Int4Rows::int16};
}

std::string_view int4_rows_name(Int4Rows rows) {
  switch (rows) {
    case Int4Rows::f32:
      return "f32";
    case Int4Rows::int16:
      return "int16";
    case Int4Rows::int8:
      return "int8";
  }
  return "?";
}

}  // namespace

CpuKernels choose_cpu_kernels(const Platform& platform, const ModelSpec& spec,
                              const QuantParams& q) {
  CpuKernels k;
  if (!(platform.avx2 && platform.fma && platform.f16c)) {
    k.name = "portable";
    return k;
  }
  k.set = CpuKernelSet::avx2_panels;
  k.avx512_vnni = platform.avx512_vnni;
  k.bf16_gemm = platform.avx512_bf16 && q.weight_dtype == DType::bf16;
  k.routed_int4 = int4_rows(q, spec.hidden, spec.intermediate);
  k.shared_int4 = int4_rows(q, spec.hidden, spec.shared_intermediate);
  k.name = "avx2 panel16";
  if (k.bf16_gemm) k.name += " + avx512-bf16 gemm";
  if (k.avx512_vnni) k.name += " + avx512-vnni";
  return k;
}

std::string describe(const CpuKernels& k) {
  if (k.set == CpuKernelSet::portable) {
    return "no AVX2+FMA+F16C on this platform: canonical weights widened a row at a time";
  }
  std::string text =
      "AVX2+FMA+F16C: weights packed in panels of 16 rows at load, streamed for few rows, "
      "blocked GEMM for many";
  text += k.bf16_gemm ? "; bf16 x bf16 GEMM rows rounded to bf16 and run on AVX-512 BF16 dot "
                        "products"
                      : "; GEMM rows in f32";
  if (k.routed_int4.half != Int4Rows::f32 || k.routed_int4.f32 != Int4Rows::f32) {
    text += fmt::format(
        "; int4 rows streamed as {} (f32 activations) / {} (bf16, f16 activations), {} dot "
        "products",
        int4_rows_name(k.routed_int4.f32), int4_rows_name(k.routed_int4.half),
        k.avx512_vnni ? "AVX-512 VNNI" : "AVX2 (pmaddwd / pmaddubsw)");
  }
  return text;
}

const CpuKernels& planned_kernels(const Plan& plan) {
  if (!plan.cpu_kernels)
    fail(Errc::internal, "a cpu runner part built from a plan without kernels");
  return *plan.cpu_kernels;
}

Int4RowsByActivations int4_rows(const ExpertsProblem& problem, const CpuKernels& kernels) {
  return problem.role == ExpertsRole::shared ? kernels.shared_int4 : kernels.routed_int4;
}

}  // namespace moekit::cpu
