#include "quant/activation_wire.hpp"

#include <array>
#include <cstring>

#include <fmt/format.h>

#include "quant/activation_quant.hpp"

namespace moekit {
namespace {

const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> values = [] {
    std::array<float, 256> v{};
    for (int b = 0; b < 256; ++b) v[b] = to_float(e4m3_t{static_cast<uint8_t>(b)});
    return v;
  }();
  return values;
}

void store(void* out, DType dtype, int64_t k, float v) {
  if (dtype == DType::bf16) {
    static_cast<bf16_t*>(out)[k] = to_bf16(v);
  } else {
    static_cast<float*>(out)[k] = v;
  }
}

}  // namespace

std::optional<std::string> e4m3_wire_refusal(const QuantParams& q) {
  switch (q.activation) {
    case ActivationQuant::fp8_per_token:
    case ActivationQuant::fp8_per_token_group:
      return std::nullopt;
    case ActivationQuant::none:
      return fmt::format("{} keeps GEMM1's inputs as they come: e4m3 would round them", q.name());
    case ActivationQuant::fp8_static:
      return fmt::format(
          "{} quantises GEMM1's inputs with the checkpoint's static scale, which the sending "
          "rank does not hold",
          q.name());
    case ActivationQuant::int8_per_token_group:
      return fmt::format("{} quantises GEMM1's inputs to int8, not e4m3", q.name());
  }
  return "an activation quantisation without an e4m3 wire";
}

E4m3Wire e4m3_wire(const QuantParams& q, int64_t cols) {
  return {cols, activation_group(q, cols)};
}

bool e4m3_wire_carries(DType dtype) {
  return dtype == DType::f32 || dtype == DType::bf16;
}

void encode_e4m3_row(const E4m3Wire& wire, const QuantParams& q, const float* x, std::byte* to) {
  auto* codes = reinterpret_cast<uint8_t*>(to);
  std::byte* scales = to + wire.cols;
  for (int64_t g = 0; g < wire.groups(); ++g) {
    const int64_t k0 = g * wire.group, k1 = std::min(wire.cols, k0 + wire.group);
    const float scale = activation_group_scale(q, 0.0f, x, k0, k1);
    for (int64_t k = k0; k < k1; ++k) codes[k] = to_e4m3(x[k] / scale).bits;
    std::memcpy(scales + g * static_cast<int64_t>(sizeof(float)), &scale, sizeof scale);
  }
}

void decode_e4m3_row(const E4m3Wire& wire, const std::byte* from, DType dtype, void* out) {
  const auto* codes = reinterpret_cast<const uint8_t*>(from);
  const std::byte* scales = from + wire.cols;
  const std::array<float, 256>& value = e4m3_values();
  for (int64_t g = 0; g < wire.groups(); ++g) {
    const int64_t k0 = g * wire.group, k1 = std::min(wire.cols, k0 + wire.group);
    float scale = 0.0f;
    std::memcpy(&scale, scales + g * static_cast<int64_t>(sizeof(float)), sizeof scale);
    // A NaN code (or an infinite scale, from an infinity in the group) restores as NaN, which
    // quantises to NaN again, as the row itself does.
    for (int64_t k = k0; k < k1; ++k) store(out, dtype, k, value[codes[k]] * scale);
  }
}

}  // namespace moekit
