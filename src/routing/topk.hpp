#pragma once
// Router: logits -> top-k expert ids and weights, for every scoring and grouping the spec allows.

#include <cstdint>

#include "moekit/spec.hpp"
#include "moekit/tensor.hpp"

namespace moekit {
class ThreadPool;
}

namespace moekit::routing {

// logits: [T, n_experts], f32, bf16 or f16, on the CPU, row-major contiguous.
// correction_bias: n_experts floats, or nullptr when spec.correction_bias is false.
// ids: [T, top_k] int32 out; weights: [T, top_k] f32 out. Within a row the k entries are in
// decreasing order of choice score (score + bias), ties broken by the lower expert id.
// check_finite: a NaN or Inf logit throws invalid_argument naming its row and expert.
void select_experts(const RoutingSpec& spec, int n_experts, const TensorView& logits,
                    const float* correction_bias, bool check_finite, int32_t* ids, float* weights,
                    ThreadPool* pool);

}  // namespace moekit::routing
