#pragma once
// Element types and exact scalar conversions. Conversions to narrow types round to nearest,
// ties to even; e4m3fn saturates to +-448 (it has no infinities) and keeps NaN as NaN.

#include <cstdint>
#include <optional>
#include <string_view>

namespace moekit {

enum class DType : uint8_t {
  f32,
  f16,
  bf16,
  f8e4m3,  // e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; 0x7F/0xFF are NaN
  i32,
  i8,  // int4 zero points: one per byte
  i4,  // signed 4-bit, two per byte, element 2j in the low nibble of byte j
};

std::string_view dtype_name(DType dtype);
std::optional<DType> parse_dtype(std::string_view name);
int dtype_bits(DType dtype);
// Bytes that n contiguous elements occupy (packed types round up to whole bytes).
int64_t dtype_storage_bytes(DType dtype, int64_t n);
bool dtype_is_float(DType dtype);

struct f16_t {
  uint16_t bits;
};
struct bf16_t {
  uint16_t bits;
};
struct e4m3_t {
  uint8_t bits;
};

float to_float(f16_t value);
float to_float(bf16_t value);
float to_float(e4m3_t value);
f16_t to_f16(float value);
bf16_t to_bf16(float value);
e4m3_t to_e4m3(float value);

inline constexpr float kE4M3Max = 448.0f;

// Packed int4: values in [-8, 7].
int int4_get(const uint8_t* packed, int64_t index);
void int4_set(uint8_t* packed, int64_t index, int value);

// Bulk conversions between a typed array and f32. Both arrays hold n contiguous elements
// (for i4, n nibbles starting at nibble 0 of `src`/`dst`). Float types only for f8/f16/bf16/f32;
// i32 and i4 convert by value.
void convert_to_f32(const void* src, DType src_dtype, int64_t n, float* dst);
void convert_from_f32(const float* src, int64_t n, void* dst, DType dst_dtype);

}  // namespace moekit
