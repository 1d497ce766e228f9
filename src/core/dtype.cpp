#include "moekit/dtype.hpp"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "moekit/error.hpp"

namespace moekit {
namespace {

constexpr std::array<DType, 7> kAllDTypes = {DType::f32, DType::f16, DType::bf16, DType::f8e4m3,
                                             DType::i32, DType::i8,  DType::i4};

[[noreturn]] void fail_unknown(DType dtype) {
  fail(Errc::invalid_argument, "unknown dtype value {}", static_cast<int>(dtype));
}

// value / 2^shift rounded to nearest, ties to even; shift is in [1, 31].
uint32_t shift_round_even(uint32_t value, int shift) {
  const uint32_t quotient = value >> shift;
  const uint32_t remainder = value & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  const bool round_up = remainder > half || (remainder == half && (quotient & 1u) != 0);
  return quotient + (round_up ? 1u : 0u);
}

// Encodes the magnitude of a finite float (`abs_bits`, sign cleared) in a binary format with
// `mantissa_bits` stored mantissa bits and exponent bias `bias`, as if that format's exponent
// had no upper limit; each caller turns results past its largest finite encoding into inf or
// saturates them. Working on the integer significand keeps the rounding exact, and the sum
// base + rounded significand lets a mantissa carry step into the next exponent (and a
// subnormal into the smallest normal) without a special case.
uint32_t round_magnitude(uint32_t abs_bits, int mantissa_bits, int bias) {
  const int float_exponent = static_cast<int>(abs_bits >> 23);
  uint32_t significand = abs_bits & 0x7FFFFFu;
  int scale_exponent = 1;  // float subnormals have the scale of exponent field 1
  if (float_exponent != 0) {
    significand |= 0x800000u;
    scale_exponent = float_exponent;
  }
  const int target_exponent = scale_exponent - 127 + bias;
  int shift = 23 - mantissa_bits;
  uint32_t base = 0;
  if (target_exponent >= 1) {
    base = static_cast<uint32_t>(target_exponent - 1) << mantissa_bits;
  } else {
    shift += 1 - target_exponent;
  }
  // significand < 2^24, so from a shift of 25 on the value is below half the smallest subnormal.
  if (shift > 24) return 0;
  return base + shift_round_even(significand, shift);
}

template <typename Element, typename Convert>
void decode_loop(const void* src, int64_t n, float* dst, Convert convert) {
  const auto* in = static_cast<const Element*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = convert(in[i]);
}

template <typename Element, typename Convert>
void encode_loop(const float* src, int64_t n, void* dst, Convert convert) {
  auto* out = static_cast<Element*>(dst);
  for (int64_t i = 0; i < n; ++i) out[i] = convert(src[i]);
}

// Rounds to nearest even (the default floating-point environment) and refuses what does not
// land in [lo, hi]; the range is checked after rounding, so for i4 7.5 (-> 8) is refused and
// -8.5 (-> -8) accepted. NaN and inf fail both comparisons.
int64_t round_to_integer(float value, int64_t index, double lo, double hi, DType dtype) {
  const double rounded = std::nearbyint(static_cast<double>(value));
  if (!(rounded >= lo && rounded <= hi)) {
    fail(Errc::invalid_argument, "convert_from_f32: element {} ({}) is not representable in {}",
         index, value, dtype_name(dtype));
  }
  return static_cast<int64_t>(rounded);
}

}  // namespace

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::f8e4m3:
      return "f8e4m3";
    case DType::i32:
      return "i32";
    case DType::i8:
      return "i8";
    case DType::i4:
      return "i4";
  }
  fail_unknown(dtype);
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (DType dtype : kAllDTypes) {
    if (dtype_name(dtype) == name) return dtype;
  }
  return std::nullopt;
}

int dtype_bits(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 32;
    case DType::f16:
      return 16;
    case DType::bf16:
      return 16;
    case DType::f8e4m3:
      return 8;
    case DType::i32:
      return 32;
    case DType::i8:
      return 8;
    case DType::i4:
      return 4;
  }
  fail_unknown(dtype);
}

int64_t dtype_storage_bytes(DType dtype, int64_t n) {
  require(n >= 0, "dtype_storage_bytes: negative element count {}", n);
  if (dtype == DType::i4) return n / 2 + n % 2;
  const int64_t element_bytes = dtype_bits(dtype) / 8;
  require(n <= std::numeric_limits<int64_t>::max() / element_bytes,
          "dtype_storage_bytes: {} elements of {} overflow int64", n, dtype_name(dtype));
  return n * element_bytes;
}

bool dtype_is_float(DType dtype) {
  switch (dtype) {
    case DType::f32:
    case DType::f16:
    case DType::bf16:
    case DType::f8e4m3:
      return true;
    case DType::i32:
    case DType::i8:
    case DType::i4:
      return false;
  }
  fail_unknown(dtype);
}

float to_float(f16_t value) {
  const uint32_t sign = static_cast<uint32_t>(value.bits & 0x8000u) << 16;
  const uint32_t exponent = (value.bits >> 10) & 0x1Fu;
  const uint32_t mantissa = value.bits & 0x3FFu;
  if (exponent == 0) {
    // mantissa * 2^-24 is exact in float; negation keeps -0.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  // Infinities and NaNs keep their payload: exponent 31 maps to float's all-ones exponent.
  const uint32_t float_exponent = exponent == 0x1F ? 0xFFu : exponent + (127 - 15);
  return std::bit_cast<float>(sign | (float_exponent << 23) | (mantissa << 13));
}

float to_float(bf16_t value) {
  return std::bit_cast<float>(static_cast<uint32_t>(value.bits) << 16);
}

float to_float(e4m3_t value) {
  const uint32_t sign = static_cast<uint32_t>(value.bits & 0x80u) << 24;
  const uint32_t exponent = (value.bits >> 3) & 0xFu;
  const uint32_t mantissa = value.bits & 0x7u;
  if (exponent == 0xF && mantissa == 0x7) return std::bit_cast<float>(sign | 0x7FC00000u);
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 0x1p-9f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + (127 - 7)) << 23) | (mantissa << 20));
}

f16_t to_f16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) {
    // Quiet bit set so that a payload whose top 10 bits are zero does not turn into inf.
    return {static_cast<uint16_t>(sign | 0x7E00u | ((abs_bits >> 13) & 0x3FFu))};
  }
  const uint32_t magnitude = round_magnitude(abs_bits, 10, 15);
  return {static_cast<uint16_t>(sign | (magnitude < 0x7C00u ? magnitude : 0x7C00u))};
}

bf16_t to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) {
    // Truncate rather than round: rounding could carry a NaN payload into inf.
    return {static_cast<uint16_t>((bits >> 16) | 0x0040u)};
  }
  // bf16 shares float's exponent range, so the largest result is 0x7F80 (inf) from overflow.
  return {static_cast<uint16_t>(sign | round_magnitude(abs_bits, 7, 127))};
}

e4m3_t to_e4m3(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  // NaN keeps its sign: 0x7F or 0xFF, the two NaN encodings of e4m3fn.
  if (abs_bits > 0x7F800000u) return {static_cast<uint8_t>(sign | 0x7Fu)};
  // e4m3fn has no inf, and 0x7F is NaN: everything rounding past 448 (0x7E), inf included,
  // saturates.
  const uint32_t magnitude = round_magnitude(abs_bits, 3, 7);
  return {static_cast<uint8_t>(sign | (magnitude < 0x7Eu ? magnitude : 0x7Eu))};
}

int int4_get(const uint8_t* packed, int64_t index) {
  const unsigned byte = packed[index >> 1];
  const int nibble = static_cast<int>((index & 1) != 0 ? byte >> 4 : byte & 0xFu);
  return (nibble ^ 8) - 8;  // sign-extends bit 3
}

void int4_set(uint8_t* packed, int64_t index, int value) {
  require(value >= -8 && value <= 7, "int4_set: value {} at index {} is outside [-8, 7]", value,
          index);
  const int shift = (index & 1) != 0 ? 4 : 0;
  uint8_t& byte = packed[index >> 1];
  const unsigned kept = byte & ~(0xFu << shift);
  byte = static_cast<uint8_t>(kept | ((static_cast<unsigned>(value) & 0xFu) << shift));
}

void convert_to_f32(const void* src, DType src_dtype, int64_t n, float* dst) {
  require(n >= 0, "convert_to_f32: negative element count {}", n);
  // Empty arrays may come with null pointers, which memcpy must not see.
  if (n == 0) return;
  switch (src_dtype) {
    case DType::f32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::f16:
      return decode_loop<f16_t>(src, n, dst, [](f16_t v) { return to_float(v); });
    case DType::bf16:
      return decode_loop<bf16_t>(src, n, dst, [](bf16_t v) { return to_float(v); });
    case DType::f8e4m3:
      return decode_loop<e4m3_t>(src, n, dst, [](e4m3_t v) { return to_float(v); });
    case DType::i32:
      return decode_loop<int32_t>(src, n, dst, [](int32_t v) { return static_cast<float>(v); });
    case DType::i8:
      return decode_loop<int8_t>(src, n, dst, [](int8_t v) { return static_cast<float>(v); });
    case DType::i4: {
      const auto* packed = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(int4_get(packed, i));
      return;
    }
  }
  fail_unknown(src_dtype);
}

void convert_from_f32(const float* src, int64_t n, void* dst, DType dst_dtype) {
  require(n >= 0, "convert_from_f32: negative element count {}", n);
  if (n == 0) return;
  switch (dst_dtype) {
    case DType::f32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::f16:
      return encode_loop<f16_t>(src, n, dst, [](float v) { return to_f16(v); });
    case DType::bf16:
      return encode_loop<bf16_t>(src, n, dst, [](float v) { return to_bf16(v); });
    case DType::f8e4m3:
      return encode_loop<e4m3_t>(src, n, dst, [](float v) { return to_e4m3(v); });
    case DType::i32: {
      auto* out = static_cast<int32_t*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        out[i] = static_cast<int32_t>(
            round_to_integer(src[i], i, -2147483648.0, 2147483647.0, DType::i32));
      }
      return;
    }
    case DType::i8: {
      auto* out = static_cast<int8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        out[i] = static_cast<int8_t>(round_to_integer(src[i], i, -128.0, 127.0, DType::i8));
      }
      return;
    }
    case DType::i4: {
      auto* packed = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        int4_set(packed, i, static_cast<int>(round_to_integer(src[i], i, -8.0, 7.0, DType::i4)));
      }
      return;
    }
  }
  fail_unknown(dst_dtype);
}

}  // namespace moekit
