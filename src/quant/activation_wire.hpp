#pragma once
// Rows of hidden states as e4m3 codes with their activation scales, for an all-to-all whose
// receiving runner quantises GEMM1's inputs to e4m3 anyway (fp8-block: one scale per token per
// group of columns; fp8-tensor with dynamic scales: one per token). The sender quantises with
// the runner's own numerics (activation_group_scale, then x / scale to e4m3), so the codes and
// scales are the ones the runner would compute from the row.
//
// The runner quantises whatever rows it is given, so the receiver does not hand it the codes:
// it restores each value as code x scale, the value the runner's quantisation gives it, rounded
// to the hidden states' dtype, and the runner's quantisation turns that row into exactly the same
// codes and scales again:
// - a code: code x scale rounded to f32 or bf16 is within 2^-9 (relative) of code x scale, far
//   inside the e4m3 step around the code (1/16 at least), so it divides back to the same code;
// - a scale: the group's largest value has code 448 and comes back as 448 x scale. For bf16
//   rows that rounds back to the row's amax, a bf16 value within 2^-23 of it; for f32 rows,
//   448 x (a / 448) / 448 == a / 448 in f32 for every normal a (tests/quant/
//   test_activation_wire.cpp checks every mantissa; the exponent only shifts it), so the runner
//   recomputes the same scale either way.
// f16 rows are not carried: near f16's subnormals its steps are as coarse as e4m3's.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "moekit/dtype.hpp"
#include "moekit/quant.hpp"

namespace moekit {

// One row on the wire: `cols` e4m3 codes, then one f32 scale per `group` columns.
struct E4m3Wire {
  int64_t cols = 0;
  int64_t group = 0;

  int64_t groups() const { return (cols + group - 1) / group; }
  int64_t row_bytes() const { return cols + groups() * static_cast<int64_t>(sizeof(float)); }
};

// to_e4m3(v).bits (ties to even, saturating at 448, NaN kept) with masks for branches, so that
// the sender's loop over a row vectorises; the codes must be the runner's, which tests check.
// Magnitudes are below 2^31, so signed compares order them.
inline uint8_t e4m3_bits(float v) {
  const auto bits = std::bit_cast<int32_t>(v);
  const int32_t sign = (bits >> 24) & 0x80;
  const int32_t a = bits & 0x7FFFFFFF;
  // |v| >= 2^-6 (normal e4m3): the float's bits rounded to 3 mantissa bits, a carry stepping
  // the exponent, then rebased from float's exponent bias (127) to e4m3's (7); from 448 on,
  // infinity included, 448 (0x7E).
  const auto u = static_cast<uint32_t>(a);  // a NaN's bits plus the rounding overflow int32
  const int32_t rounded =
      static_cast<int32_t>((u + 0x7FFFFu + ((u >> 20) & 1u)) >> 20) - (120 << 3);
  const int32_t normal = rounded < 0x7E ? rounded : 0x7E;
  // Below (subnormal e4m3, steps of 2^-9): 2^14 + |v| rounds |v| to a step, as 2^14's ulp is
  // 2^-9; the steps counted are the code, 8 being the smallest normal.
  const int32_t subnormal = std::bit_cast<int32_t>(16384.0f + std::bit_cast<float>(a)) - 0x46800000;
  const int32_t is_subnormal = -static_cast<int32_t>(a < 0x3C800000);
  const int32_t is_nan = -static_cast<int32_t>(a > 0x7F800000);
  const int32_t magnitude = (subnormal & is_subnormal) | (normal & ~is_subnormal);
  return static_cast<uint8_t>(sign | (0x7F & is_nan) | (magnitude & ~is_nan));
}

// Why rows for a format with these parameters cannot travel as e4m3 (the format keeps its
// GEMM inputs, or quantises them with a static scale or to int8); nullopt when they can.
std::optional<std::string> e4m3_wire_refusal(const QuantParams& q);
E4m3Wire e4m3_wire(const QuantParams& q, int64_t cols);
// The hidden states' dtypes whose rows the wire restores exactly: f32 and bf16.
bool e4m3_wire_carries(DType dtype);

// Row x (cols values, as f32) as codes and scales at `to` (row_bytes() bytes, no alignment).
void encode_e4m3_row(const E4m3Wire& wire, const QuantParams& q, const float* x, std::byte* to);
// The row of `dtype` (f32 or bf16) at `out` that quantises to the codes and scales at `from`.
void decode_e4m3_row(const E4m3Wire& wire, const std::byte* from, DType dtype, void* out);

}  // namespace moekit
