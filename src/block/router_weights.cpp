#include "block/router_weights.hpp"

#include <cmath>

#include <fmt/format.h>

#include "moekit/error.hpp"

namespace moekit {

std::vector<float> router_weight_values(const TensorView& t, const char* name, Shape shape,
                                        bool f32_only) {
  const bool dtype_ok =
      t.dtype == DType::f32 || (!f32_only && (t.dtype == DType::bf16 || t.dtype == DType::f16));
  if (t.data == nullptr || !(t.shape == shape) || !dtype_ok || t.device.kind != DeviceKind::cpu ||
      !t.is_contiguous()) {
    fail(Errc::invalid_argument, "{}: expected contiguous {} {} on the CPU, got {}", name,
         f32_only ? "f32" : "f32/bf16/f16", shape.str(),
         t.data == nullptr ? std::string("nothing") : t.describe());
  }
  std::vector<float> values(static_cast<size_t>(t.numel()));
  convert_to_f32(t.data, t.dtype, t.numel(), values.data());
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      const std::string at = shape.rank == 1 ? fmt::format("[{}]", i) : fmt::format("[0, {}]", i);
      fail(Errc::invalid_argument, "{}: element {} is {}", name, at, values[i]);
    }
  }
  return values;
}

}  // namespace moekit
