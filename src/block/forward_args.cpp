#include "block/forward_args.hpp"

#include <fmt/format.h>

#include "moekit/error.hpp"

namespace moekit {
namespace {

bool is_activation_dtype(DType dtype) {
  return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
}

// A caller's tensor: on the plan's device, contiguous, one of f32/bf16/f16, and the expected
// shape (a dimension of -1 matches any size).
void check_input(const TensorView& t, const char* name, std::initializer_list<int64_t> expected,
                 Device device) {
  std::string want = "[";
  bool shape_ok = t.rank() == static_cast<int>(expected.size());
  int axis = 0;
  for (int64_t d : expected) {
    want += fmt::format("{}{}", axis ? ", " : "", d < 0 ? std::string("T") : std::to_string(d));
    shape_ok = shape_ok && (d < 0 || t.dim(axis) == d);
    ++axis;
  }
  want += "]";
  if (t.data == nullptr && t.numel() > 0) fail(Errc::invalid_argument, "{}: no data", name);
  if (!shape_ok)
    fail(Errc::invalid_argument, "{}: expected shape {}, got {}", name, want, t.describe());
  if (!is_activation_dtype(t.dtype)) {
    fail(Errc::invalid_argument, "{}: dtype must be f32, bf16 or f16, got {}", name, t.describe());
  }
  if (t.device != device) {
    fail(Errc::invalid_argument, "{}: the plan runs on {}, got {}", name, device.str(),
         t.describe());
  }
  if (!t.is_contiguous())
    fail(Errc::invalid_argument, "{}: must be contiguous, got {}", name, t.describe());
}

// forward() writes the output after it has read every input, but a stage on another device or
// stream may not: an output that shares memory with an input is refused rather than half-read.
void check_no_overlap(const TensorView& output, const TensorView& input, const char* name) {
  if (output.nbytes() == 0 || input.nbytes() == 0) return;
  const auto* out = static_cast<const char*>(output.data);
  const auto* in = static_cast<const char*>(input.data);
  if (out < in + input.nbytes() && in < out + output.nbytes()) {
    fail(Errc::invalid_argument, "output: overlaps {} ({} and {} share memory)", name,
         output.describe(), input.describe());
  }
}

void check_routing_result(const RoutingResult& routing, int64_t T, int top_k, Device device) {
  const bool ids_ok = routing.ids.dtype == DType::i32 && routing.ids.shape == Shape{T, top_k} &&
                      routing.ids.is_contiguous() && routing.ids.device == device;
  const bool weights_ok = routing.weights.dtype == DType::f32 &&
                          routing.weights.shape == Shape{T, top_k} &&
                          routing.weights.is_contiguous() && routing.weights.device == device;
  if (!ids_ok) {
    fail(Errc::invalid_argument, "topk_ids: expected contiguous i32[{}, {}] on {}, got {}", T,
         top_k, device.str(), routing.ids.describe());
  }
  if (!weights_ok) {
    fail(Errc::invalid_argument, "topk_weights: expected contiguous f32[{}, {}] on {}, got {}", T,
         top_k, device.str(), routing.weights.describe());
  }
}

}  // namespace

void check_forward_arguments(const Plan& plan, const TensorView& hidden, const TensorView& logits,
                             const TensorView& output, const RoutingResult* routing) {
  const ModelSpec& spec = plan.spec;
  const Device device = plan.options.device;
  check_input(hidden, "hidden_states", {-1, spec.hidden}, device);
  const int64_t T = hidden.dim(0);
  check_input(logits, "router_logits", {T, spec.n_experts}, device);
  check_input(output, "output", {T, spec.hidden}, device);
  if (output.dtype != hidden.dtype) {
    fail(Errc::invalid_argument, "output: dtype must match hidden_states ({}), got {}",
         dtype_name(hidden.dtype), output.describe());
  }
  if (T > plan.options.max_tokens) {
    fail(Errc::invalid_argument, "hidden_states: {} tokens exceed the plan's max_tokens {}", T,
         plan.options.max_tokens);
  }
  check_no_overlap(output, hidden, "hidden_states");
  check_no_overlap(output, logits, "router_logits");
  if (routing != nullptr) check_routing_result(*routing, T, spec.routing.top_k, device);
}

}  // namespace moekit
