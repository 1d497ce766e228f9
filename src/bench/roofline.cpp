#include "bench/roofline.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "moekit/error.hpp"
#include "quant/quant_method.hpp"

namespace moekit::bench {

std::string_view bound_name(Bound bound) {
  return bound == Bound::memory ? "memory" : "compute";
}

int64_t expert_bytes(const QuantParams& format, int64_t hidden, int64_t intermediate) {
  return weight_bytes(format, 1, hidden, intermediate);
}

double expected_distinct_experts(int experts, int top_k, int64_t tokens) {
  const double miss = 1.0 - static_cast<double>(top_k) / experts;
  return experts * (1.0 - std::pow(miss, static_cast<double>(tokens)));
}

int count_distinct_experts(std::span<const int32_t> ids, int experts) {
  std::vector<bool> seen(static_cast<size_t>(experts), false);
  int distinct = 0;
  for (int32_t id : ids) {
    if (id < 0 || id >= experts) {
      fail(Errc::internal, "routed expert id {} is outside [0, {})", id, experts);
    }
    if (!seen[id]) {
      seen[id] = true;
      ++distinct;
    }
  }
  return distinct;
}

Roofline Roofline::Of(const ModelSpec& spec, const QuantParams& format, int64_t tokens,
                      int distinct, DType activations, const Ceilings& ceilings, ComputePeak peak) {
  const int64_t H = spec.hidden, I = spec.intermediate;
  Roofline r;
  r.bytes = distinct * expert_bytes(format, H, I) +
            2 * dtype_storage_bytes(activations, tokens * H) +
            dtype_storage_bytes(DType::f32, tokens * spec.n_experts);
  r.flops = 6.0 * static_cast<double>(tokens) * spec.routing.top_k * static_cast<double>(H) *
            static_cast<double>(I);
  const double memory_s = static_cast<double>(r.bytes) / ceilings.read_bytes_per_s;
  double rate = ceilings.fma_flops_per_s;
  if (peak == ComputePeak::bf16_dot && ceilings.bf16_dot_flops_per_s > 0) {
    rate = ceilings.bf16_dot_flops_per_s;
  }
  if (peak == ComputePeak::int8_dot && ceilings.int8_dot_ops_per_s > 0) {
    rate = ceilings.int8_dot_ops_per_s;
  }
  const double compute_s = r.flops / rate;
  r.bound = compute_s > memory_s ? Bound::compute : Bound::memory;
  r.floor_s = std::max(memory_s, compute_s);
  return r;
}

}  // namespace moekit::bench
