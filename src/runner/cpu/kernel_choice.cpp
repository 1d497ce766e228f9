#include "runner/cpu/kernel_choice.hpp"

#include <string>
#include <utility>

#include <fmt/format.h>

#include "moekit/error.hpp"
#include "runner/cpu/gemm_bf16.hpp"
#include "runner/cpu/gemm_int8.hpp"
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

// Whether the GEMM rows of a layer in format q take the AVX-512 BF16 GEMM (given the CPU has
// it), and why. Its weights must be exact in bf16 and every K the GEMMs meet (H, I, a shared
// expert's I) must keep pairs of k inside one scale group.
// Whether the GEMM rows of an int4-group-a8 layer can take the int8 GEMM (on AVX-512 VNNI or
// AVX2): every K it meets in whole int4 blocks and groups of at most one of its K-blocks.
bool int8_gemm_reads(const ModelSpec& spec, const QuantParams& q, std::string& reason) {
  if (q.weight_dtype != DType::i4 || q.activation != ActivationQuant::int8_per_token_group) {
    return false;
  }
  for (const int64_t k : {spec.hidden, spec.intermediate, spec.shared_intermediate}) {
    if (k == 0) continue;
    const int64_t group = q.block_cols == 0 ? k : q.block_cols;
    if (!gemm_int8_reads(group, k)) {
      reason = fmt::format(
          "; the int8 GEMM not for groups of {} along a K of {} (it needs multiples of 4 of at "
          "most 256)",
          group, k);
      return false;
    }
  }
  return true;
}

bool bf16_gemm_reads(const ModelSpec& spec, const QuantParams& q, std::string& reason) {
  switch (q.weight_dtype) {
    case DType::bf16:
      reason = "bf16 weights";
      break;
    case DType::f8e4m3:
      // The fp8 formats' GEMM inputs are e4m3 codes times a scale per row and group, the
      // weights' groups: the GEMM takes the codes (exact in bf16) and applies both scales to the
      // f32 sums, so it rounds nothing the f32 GEMM does not. (Rounding the inputs themselves to
      // bf16 would move GEMM1's sums enough to flip GEMM2's quantised inputs by e4m3 steps.)
      reason =
          "e4m3 weights widened exactly to bf16 once per K-block, the e4m3 inputs taken as "
          "their codes, the weights' and the inputs' scales on the f32 sums of each group";
      break;
    case DType::i4:
      if (q.activation == ActivationQuant::int8_per_token_group) {
        reason =
            "not for int4-group-a8: its rows are int8 values times scales, not bf16 values, "
            "so they keep the f32 GEMM, which computes them exactly";
        return false;
      }
      if (q.zero_points) {
        reason =
            "not for int4 with zero points: code - offset per row and group is not widened "
            "here, so they keep the f32 GEMM";
        return false;
      }
      reason =
          "int4 codes less 8 widened exactly to bf16 once per K-block, their scales on the "
          "f32 sums of each group";
      break;
    default:
      reason = fmt::format("not for {} weights, which bf16 cannot hold exactly",
                           dtype_name(q.weight_dtype));
      return false;
  }
  for (const int64_t k : {spec.hidden, spec.intermediate, spec.shared_intermediate}) {
    if (k == 0) continue;
    const int64_t group = q.block_cols == 0 ? k : q.block_cols;
    if (!gemm_bf16_reads(q.weight_dtype, q.zero_points, group, k)) {
      reason = fmt::format(
          "not for scale groups of {} along a K of {}: a pair of k would "
          "straddle two groups",
          group, k);
      return false;
    }
  }
  return true;
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

struct Prefetches {
  StreamPrefetch panel, int8;
  std::string reason;
};

// How far ahead two streaming kernels prefetch for one or two rows. Measured against 2 KB into
// L1 (Qwen3-30B-A3B decode, 2 threads; docs/PERFORMANCE.md, sessions 18 and 19): on Zen 2 (AMD
// family 17h) the f32 and 16-bit panels took 0.81x the time at T = 1 and 0.84x at T = 16 with
// 768 bytes, and AVX2's int8 rows (int4-group-a8) 0.93x and 0.95x with 512 bytes into L1 and
// 4 KB into L2 (the int16 rows level, so they keep 2 KB); on an Intel Xeon with AVX-512 BF16 the
// panels took 1.18x and 1.20x with 768 bytes. Machines not measured keep 2 KB into L1.
Prefetches stream_prefetches(const Platform& platform) {
  if (platform.cpu_vendor == "AuthenticAMD" && platform.cpu_family == 0x17) {
    return {.panel = {.l1_bytes = 768},
            .int8 = {.l1_bytes = 512, .l2_bytes = 4096},
            .reason =
                "for one or two streamed rows, 16-bit panels 768 bytes ahead and int8 rows "
                "512 bytes ahead into L1 and 4 KB into L2 (AMD family 17h, Zen 2: measured "
                "0.81x and 0.93x the time of 2 KB)"};
  }
  return {.panel = {},
          .int8 = {},
          .reason =
              "2 KB ahead for every streamed row (shorter distances measured faster on "
              "Zen 2 alone)"};
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
  Prefetches prefetches = stream_prefetches(platform);
  k.panel_prefetch = prefetches.panel;
  k.int8_prefetch = prefetches.int8;
  k.prefetch_reason = std::move(prefetches.reason);
  // The e4m3 rounding of the fp8 formats' GEMM inputs gives the reference's values whichever
  // vectors it uses, so the widest the CPU has.
  k.e4m3 = platform.avx512f ? E4m3Rounding::avx512 : E4m3Rounding::avx2;
  k.avx512_vnni = platform.avx512_vnni;
  k.e4m3_stream_avx512 = platform.avx512f && q.weight_dtype == DType::f8e4m3;
  std::string reads;
  const bool bf16_format = bf16_gemm_reads(spec, q, reads);
  k.bf16_gemm = platform.avx512_bf16 && bf16_format;
  if (k.bf16_gemm) {
    k.gemm_reason =
        "GEMM rows with bf16 activations rounded to bf16 and run on AVX-512 BF16 dot "
        "products (" +
        reads + ")";
  } else if (platform.avx512_bf16) {
    k.gemm_reason = "GEMM rows in f32; the AVX-512 BF16 GEMM " + reads;
  } else {
    k.gemm_reason = "GEMM rows in f32 (no AVX-512 BF16)";
  }
  std::string int8_reason;
  k.int8_gemm = int8_gemm_reads(spec, q, int8_reason);
  if (k.int8_gemm) {
    k.gemm_reason = platform.avx512_vnni
                        ? "GEMM rows quantised to int8 as the format defines them and multiplied "
                          "by the int4 codes on AVX-512 VNNI (vpdpbusd), exactly in int32 per group"
                        : "GEMM rows quantised to int8 as the format defines them and multiplied "
                          "by the int4 codes on AVX2 (pmaddubsw), exactly in int32 per group";
  } else {
    k.gemm_reason += int8_reason;
  }
  k.routed_int4 = int4_rows(q, spec.hidden, spec.intermediate);
  k.shared_int4 = int4_rows(q, spec.hidden, spec.shared_intermediate);
  k.name = "avx2 panel16";
  if (k.bf16_gemm) k.name += " + avx512-bf16 gemm";
  if (k.int8_gemm) k.name += " + int8 gemm";
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
  text += "; " + k.gemm_reason;
  if (k.routed_int4.half != Int4Rows::f32 || k.routed_int4.f32 != Int4Rows::f32) {
    text += fmt::format(
        "; int4 rows streamed as {} (f32 activations) / {} (bf16, f16 activations), {} dot "
        "products",
        int4_rows_name(k.routed_int4.f32), int4_rows_name(k.routed_int4.half),
        k.avx512_vnni ? "AVX-512 VNNI" : "AVX2 (pmaddwd / pmaddubsw)");
  }
  if (k.e4m3_stream_avx512) text += "; e4m3 rows streamed on AVX-512F vectors";
  text += "; prefetch " + k.prefetch_reason;
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
