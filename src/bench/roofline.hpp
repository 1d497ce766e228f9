#pragma once
// The roofline floor of one MoE layer (shared/BENCHMARKS.md): the time to stream the weights of
// every expert the batch selects once, or to do its FLOPs at the FMA peak, whichever is longer.

#include <cstdint>
#include <span>
#include <string_view>

#include "bench/ceilings.hpp"
#include "moekit/dtype.hpp"
#include "moekit/quant.hpp"
#include "moekit/spec.hpp"

namespace moekit::bench {

enum class Bound { memory, compute };
std::string_view bound_name(Bound bound);  // "memory", "compute"

// Bytes of one routed expert's gate, up and down matrices as `format` stores them: weights,
// scales and zero points.
int64_t expert_bytes(const QuantParams& format, int64_t hidden, int64_t intermediate);

// Distinct experts that T tokens each choosing k of E uniformly at random select, on average:
// E * (1 - (1 - k/E)^T).
double expected_distinct_experts(int experts, int top_k, int64_t tokens);

// Distinct values among routed expert ids.
int count_distinct_experts(std::span<const int32_t> ids, int experts);

// The compute ceiling of a layer: the fp32 FMA peak, or the dot products its GEMM runs on.
enum class ComputePeak { fma, bf16_dot, int8_dot };

struct Roofline {
  int64_t bytes = 0;   // the distinct experts' weights, plus activations in and out
  double flops = 0.0;  // 6 * T * k * H * I
  double floor_s = 0.0;
  Bound bound = Bound::memory;

  // For T tokens of `activations` (hidden states in, output out) and f32 router logits, when
  // the batch's routing selects `distinct` experts. peak: what the plan's GEMM runs on
  // (CpuKernels::bf16_rows: bf16 dot products; int8_gemm: int8 ones), whose peak then bounds the
  // compute where the ceilings have it (else the FMA peak).
  static Roofline Of(const ModelSpec& spec, const QuantParams& format, int64_t tokens, int distinct,
                     DType activations, const Ceilings& ceilings, ComputePeak peak);
};

}  // namespace moekit::bench
