#include "quant/activation_wire.hpp"

#include <array>
#include <bit>
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

// The runner's amax of x[k0, k1) (a running std::max of |x|, which passes NaN over) as the
// largest magnitude's bits, which vectorises: the bits of non-negative floats order as they do.
std::array<float, 1> group_amax(const float* x, int64_t k0, int64_t k1) {
  int32_t amax = 0;
  for (int64_t k = k0; k < k1; ++k) {
    const int32_t a = std::bit_cast<int32_t>(x[k]) & 0x7FFFFFFF;
    amax = std::max(amax, a & -static_cast<int32_t>(a <= 0x7F800000));
  }
  return {std::bit_cast<float>(amax)};
}

// v rounded to bf16, ties to even; a NaN stays NaN (truncated: rounding could carry it to inf).
uint16_t bf16_bits(float v) {
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
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
    const float scale = activation_group_scale(q, 0.0f, &group_amax(x, k0, k1)[0], 0, 1);
    for (int64_t k = k0; k < k1; ++k) codes[k] = e4m3_bits(x[k] / scale);
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
    if (dtype == DType::bf16) {
      auto* y = static_cast<uint16_t*>(out);
      for (int64_t k = k0; k < k1; ++k) y[k] = bf16_bits(value[codes[k]] * scale);
    } else {
      auto* y = static_cast<float*>(out);
      for (int64_t k = k0; k < k1; ++k) y[k] = value[codes[k]] * scale;
    }
  }
}

}  // namespace moekit
