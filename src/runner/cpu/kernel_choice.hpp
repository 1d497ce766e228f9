#pragma once
// The one function that decides the cpu runner's kernels (CpuKernels in moekit/plan.hpp).
// resolve() calls it once and records the result; the cpu core, its fused op and the bench read
// the plan, never the machine.

#include "contracts/experts_problem.hpp"
#include "moekit/plan.hpp"

namespace moekit::cpu {

// Decides the kernels of a layer of `spec` in format q on `platform`:
// - the base set: the AVX2+FMA+F16C panel16 kernels where the CPU has all three, else the
//   portable row-at-a-time code on the canonical layout;
// - bf16 GEMM rows: bf16 activations against bf16, e4m3 or symmetric int4 weights (all exact
//   in bf16) take the AVX-512 BF16 GEMM (gemm_panels_bf16), which rounds the GEMM's inputs to
//   bf16 as the model's own bf16 matmuls do and applies the weights' scales to the f32 sums of
//   each group; f16 (finer than bf16) and f32 activations keep the f32 GEMM, as do int4 with zero
//   points;
// - int4-group-a8's GEMM rows: the int8 GEMM (the format's int8 rows times the int4 codes,
//   exactly in int32) where its K and groups are whole int4 blocks of at most 256, on AVX-512
//   VNNI where the CPU has it, else on AVX2's pmaddubsw; otherwise the f32 GEMM, which computes
//   the same rows exactly too but at the fp32 FMA rate;
// - streamed int4 rows (few rows per expert): int8 where the format quantises activations to
//   int8; int16 for activations that came in as bf16 or f16 (an error of at most 2^-16 of a
//   step's largest value, far below those dtypes' own rounding); f32 otherwise, and wherever a
//   K or group of the layer is not in whole int4 blocks or is too long for exact integer sums;
// - the integer kernels' dot products: AVX-512 VNNI where the CPU has it;
// - the fp8 formats' e4m3 rounding of GEMM inputs: AVX-512F where the CPU has it, else AVX2
//   (the scalar reference's values either way, e4m3_rows.hpp);
// - streamed e4m3 rows: AVX-512F where the CPU has it (one vector per panel step), else AVX2;
// - how far ahead one or two streamed rows of f32 and 16-bit panels, and of AVX2's int8 rows,
//   prefetch: by the CPU's maker and family, where distances were measured faster than 2 KB
//   (stream_prefetches).
CpuKernels choose_cpu_kernels(const Platform& platform, const ModelSpec& spec,
                              const QuantParams& q);

// The reason for a choice, for the plan's decision.
std::string describe(const CpuKernels& kernels);

// The plan's choice, for the runner parts built from it (an internal error without one).
const CpuKernels& planned_kernels(const Plan& plan);
// How one experts computation's streamed rows meet int4 weights: routed or shared experts.
Int4RowsByActivations int4_rows(const ExpertsProblem& problem, const CpuKernels& kernels);

}  // namespace moekit::cpu
