#include "moekit/dtype.hpp"

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "moekit/error.hpp"

namespace moekit {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float from_bits(uint32_t bits) {
  return std::bit_cast<float>(bits);
}
uint32_t to_bits(float value) {
  return std::bit_cast<uint32_t>(value);
}

// ---------------------------------------------------------------------------------------------
// DType metadata

struct DTypeRow {
  DType dtype;
  const char* name;
  int bits;
  bool is_float;
};

constexpr DTypeRow kDTypeRows[] = {
    {DType::f32, "f32", 32, true},   {DType::f16, "f16", 16, true},
    {DType::bf16, "bf16", 16, true}, {DType::f8e4m3, "f8e4m3", 8, true},
    {DType::i32, "i32", 32, false},  {DType::i8, "i8", 8, false},
    {DType::i4, "i4", 4, false},
};

TEST(DType, NameBitsAndFloatnessMatchTable) {
  for (const DTypeRow& row : kDTypeRows) {
    SCOPED_TRACE(row.name);
    EXPECT_EQ(dtype_name(row.dtype), row.name);
    EXPECT_EQ(dtype_bits(row.dtype), row.bits);
    EXPECT_EQ(dtype_is_float(row.dtype), row.is_float);
  }
}

TEST(DType, ParseInvertsName) {
  for (const DTypeRow& row : kDTypeRows) {
    EXPECT_EQ(parse_dtype(row.name), row.dtype) << row.name;
  }
}

TEST(DType, ParseRejectsUnknownNames) {
  for (const char* name : {"", "F32", "float32", "fp16", "bfloat16", "f8", "e4m3", "int8", "int4",
                           " f32", "f32 ", "f16\n"}) {
    EXPECT_EQ(parse_dtype(name), std::nullopt) << '"' << name << '"';
  }
}

TEST(DType, UnknownEnumValueIsRejected) {
  const auto bogus = static_cast<DType>(200);
  for (auto call : {+[](DType d) { (void)dtype_name(d); }, +[](DType d) { (void)dtype_bits(d); },
                    +[](DType d) { (void)dtype_is_float(d); }}) {
    try {
      call(bogus);
      ADD_FAILURE() << "no exception";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), Errc::invalid_argument);
    }
  }
}

TEST(DType, StorageBytesRoundsPackedTypesUp) {
  struct Case {
    DType dtype;
    int64_t n;
    int64_t bytes;
  };
  const Case cases[] = {
      {DType::f32, 0, 0},     {DType::f32, 3, 12}, {DType::f16, 3, 6}, {DType::bf16, 5, 10},
      {DType::f8e4m3, 3, 3},  {DType::i32, 7, 28}, {DType::i8, 5, 5},  {DType::i4, 0, 0},
      {DType::i4, 1, 1},      {DType::i4, 2, 1},   {DType::i4, 3, 2},  {DType::i4, 4, 2},
      {DType::i4, 1001, 501},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(dtype_storage_bytes(c.dtype, c.n), c.bytes) << dtype_name(c.dtype) << " n=" << c.n;
  }
}

TEST(DType, StorageBytesRejectsNegativeCountAndOverflow) {
  EXPECT_THROW(dtype_storage_bytes(DType::f32, -1), Error);
  EXPECT_THROW(dtype_storage_bytes(DType::i4, -1), Error);
  EXPECT_THROW(dtype_storage_bytes(DType::f32, std::numeric_limits<int64_t>::max() / 2), Error);
  EXPECT_EQ(dtype_storage_bytes(DType::i4, std::numeric_limits<int64_t>::max()),
            std::numeric_limits<int64_t>::max() / 2 + 1);
}

// ---------------------------------------------------------------------------------------------
// Narrow float formats. Each format is described only by its bit layout; the expected values
// below come from that layout through std::ldexp, independently of src/core/dtype.cpp.

struct Format {
  const char* name;
  int exponent_bits;
  int mantissa_bits;
  int bias;
  bool ieee_specials;  // exponent all ones = inf/NaN (f16, bf16); e4m3fn: only S.1111.111 is NaN
  float (*decode)(uint32_t bits);
  uint32_t (*encode)(float value);

  int total_bits() const { return 1 + exponent_bits + mantissa_bits; }
  uint32_t sign_bit() const { return 1u << (exponent_bits + mantissa_bits); }
  uint32_t exponent_max() const { return (1u << exponent_bits) - 1; }
  uint32_t mantissa_mask() const { return (1u << mantissa_bits) - 1; }
  uint32_t exponent_of(uint32_t bits) const { return (bits >> mantissa_bits) & exponent_max(); }
  uint32_t mantissa_of(uint32_t bits) const { return bits & mantissa_mask(); }

  bool is_nan(uint32_t bits) const {
    if (exponent_of(bits) != exponent_max()) return false;
    return ieee_specials ? mantissa_of(bits) != 0 : mantissa_of(bits) == mantissa_mask();
  }
  bool is_inf(uint32_t bits) const {
    return ieee_specials && exponent_of(bits) == exponent_max() && mantissa_of(bits) == 0;
  }
  // Largest finite magnitude encoding.
  uint32_t max_finite() const {
    return ieee_specials ? (exponent_max() << mantissa_bits) - 1 : sign_bit() - 2;
  }
  // Value of a magnitude encoding read as a normal or subnormal number, with no specials; for
  // max_finite() + 1 this is the next value an unbounded exponent would give.
  double magnitude_value(uint32_t magnitude) const {
    const uint32_t exponent = magnitude >> mantissa_bits;
    const auto mantissa = static_cast<double>(mantissa_of(magnitude));
    if (exponent == 0) return std::ldexp(mantissa, 1 - bias - mantissa_bits);
    return std::ldexp(std::ldexp(1.0, mantissa_bits) + mantissa,
                      static_cast<int>(exponent) - bias - mantissa_bits);
  }
  double reference_value(uint32_t bits) const {
    const bool negative = (bits & sign_bit()) != 0;
    const uint32_t magnitude = bits & (sign_bit() - 1);
    double value = 0;
    if (is_nan(bits)) {
      value = std::numeric_limits<double>::quiet_NaN();
    } else if (is_inf(bits)) {
      value = std::numeric_limits<double>::infinity();
    } else {
      value = magnitude_value(magnitude);
    }
    return negative ? -value : value;
  }
};

// Reference rounding by search: among all finite magnitudes (ascending with their encodings)
// and the one past the top, pick the nearest in double arithmetic, ties to the even encoding.
// Past the top means inf for IEEE-like formats and saturation for e4m3fn.
uint32_t reference_encode(const Format& format, const std::vector<double>& magnitudes,
                          float value) {
  const uint32_t sign = std::signbit(value) ? format.sign_bit() : 0;
  const double target = std::fabs(static_cast<double>(value));
  const uint32_t past_top = format.max_finite() + 1;
  uint32_t chosen = past_top;
  const auto above = std::lower_bound(magnitudes.begin(), magnitudes.end(), target);
  if (above != magnitudes.end()) {
    const auto high = static_cast<uint32_t>(above - magnitudes.begin());
    if (*above == target || high == 0) {
      chosen = high;
    } else {
      const uint32_t low = high - 1;
      const double below_distance = target - magnitudes[low];
      const double above_distance = *above - target;
      if (below_distance < above_distance) {
        chosen = low;
      } else if (above_distance < below_distance) {
        chosen = high;
      } else {
        chosen = (low % 2 == 0) ? low : high;
      }
    }
  }
  if (chosen == past_top && !format.ieee_specials) chosen = format.max_finite();
  return sign | chosen;
}

// Ascending magnitudes of encodings 0 .. max_finite() + 1.
std::vector<double> magnitude_table(const Format& format) {
  std::vector<double> table;
  for (uint32_t m = 0; m <= format.max_finite() + 1; ++m)
    table.push_back(format.magnitude_value(m));
  return table;
}

const Format kF16{"f16",
                  5,
                  10,
                  15,
                  true,
                  [](uint32_t b) { return to_float(f16_t{static_cast<uint16_t>(b)}); },
                  [](float v) { return static_cast<uint32_t>(to_f16(v).bits); }};
const Format kBF16{"bf16",
                   8,
                   7,
                   127,
                   true,
                   [](uint32_t b) { return to_float(bf16_t{static_cast<uint16_t>(b)}); },
                   [](float v) { return static_cast<uint32_t>(to_bf16(v).bits); }};
const Format kE4M3{"e4m3",
                   4,
                   3,
                   7,
                   false,
                   [](uint32_t b) { return to_float(e4m3_t{static_cast<uint8_t>(b)}); },
                   [](float v) { return static_cast<uint32_t>(to_e4m3(v).bits); }};

class NarrowFloat : public ::testing::TestWithParam<const Format*> {
 protected:
  const Format& format() const { return *GetParam(); }
  uint32_t encoding_count() const { return 1u << format().total_bits(); }
};

TEST_P(NarrowFloat, DecodeMatchesBitFieldFormulaForEveryEncoding) {
  const Format& f = format();
  for (uint32_t bits = 0; bits < encoding_count(); ++bits) {
    const float decoded = f.decode(bits);
    const double expected = f.reference_value(bits);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(decoded)) << std::hex << bits;
      continue;
    }
    ASSERT_EQ(static_cast<double>(decoded), expected) << std::hex << bits;
    ASSERT_EQ(std::signbit(decoded), std::signbit(expected)) << std::hex << bits;
  }
}

TEST_P(NarrowFloat, EncodeRoundTripsEveryFiniteEncoding) {
  const Format& f = format();
  for (uint32_t bits = 0; bits < encoding_count(); ++bits) {
    if (f.is_nan(bits) || f.is_inf(bits)) continue;
    ASSERT_EQ(f.encode(f.decode(bits)), bits) << std::hex << bits;
  }
}

TEST_P(NarrowFloat, MidpointsBetweenAdjacentFiniteValuesRoundToEvenMantissa) {
  const Format& f = format();
  for (const uint32_t sign : {0u, f.sign_bit()}) {
    for (uint32_t low = 0; low < f.max_finite(); ++low) {
      const uint32_t high = low + 1;
      const double midpoint = (f.magnitude_value(low) + f.magnitude_value(high)) / 2;
      const auto mid = static_cast<float>(sign != 0 ? -midpoint : midpoint);
      ASSERT_EQ(std::fabs(static_cast<double>(mid)), midpoint) << "not representable in float";
      const uint32_t even = (low % 2 == 0) ? low : high;
      ASSERT_EQ(f.encode(mid), sign | even) << std::hex << low;
      ASSERT_EQ(f.encode(std::nextafter(mid, 0.0f)), sign | low) << std::hex << low;
      ASSERT_EQ(f.encode(std::nextafter(mid, std::copysign(kInf, mid))), sign | high)
          << std::hex << low;
    }
  }
}

TEST_P(NarrowFloat, RandomFloatsMatchNearestEvenSearchReference) {
  const Format& f = format();
  const std::vector<double> magnitudes = magnitude_table(f);
  std::mt19937 rng(12345);
  // Half the samples are arbitrary bit patterns (mostly far out of range), half have exponents
  // from just below the format's smallest subnormal to just above its largest value.
  const int low_exponent = 127 - f.bias - f.mantissa_bits - 3;
  const int high_exponent = 127 + static_cast<int>(f.exponent_max()) - f.bias + 2;
  std::uniform_int_distribution<int> exponent(std::max(low_exponent, 0),
                                              std::min(high_exponent, 255));
  for (int i = 0; i < (1 << 20); ++i) {
    auto bits = static_cast<uint32_t>(rng());
    if (i % 2 == 0) {
      bits = (bits & 0x807FFFFFu) | (static_cast<uint32_t>(exponent(rng)) << 23);
    }
    const float value = from_bits(bits);
    if (std::isnan(value)) continue;
    ASSERT_EQ(f.encode(value), reference_encode(f, magnitudes, value))
        << std::hex << bits << " = " << value;
  }
}

TEST_P(NarrowFloat, NaNEncodesToNaNKeepingSign) {
  const Format& f = format();
  // Payloads include ones whose top bits are zero or all ones, which a careless truncation
  // or rounding would turn into inf or carry into the sign.
  for (const uint32_t nan_bits : {0x7FC00000u, 0x7F800001u, 0x7F801FFFu, 0x7FBFFFFFu, 0x7FFFFFFFu,
                                  0x7FFF8000u, 0x7F808000u}) {
    for (const uint32_t sign : {0u, 0x80000000u}) {
      const uint32_t encoded = f.encode(from_bits(nan_bits | sign));
      EXPECT_TRUE(f.is_nan(encoded)) << std::hex << (nan_bits | sign) << " -> " << encoded;
      EXPECT_EQ((encoded & f.sign_bit()) != 0, sign != 0) << std::hex << (nan_bits | sign);
      EXPECT_TRUE(std::isnan(f.decode(encoded)));
    }
  }
}

TEST_P(NarrowFloat, SignedZeroKeepsSign) {
  const Format& f = format();
  EXPECT_EQ(f.encode(0.0f), 0u);
  EXPECT_EQ(f.encode(-0.0f), f.sign_bit());
  // Values that underflow to zero keep their sign too.
  EXPECT_EQ(f.encode(-std::numeric_limits<float>::denorm_min()), f.sign_bit());
  EXPECT_TRUE(std::signbit(f.decode(f.sign_bit())));
}

INSTANTIATE_TEST_SUITE_P(Formats, NarrowFloat, ::testing::Values(&kF16, &kBF16, &kE4M3),
                         [](const ::testing::TestParamInfo<const Format*>& param) {
                           return std::string(param.param->name);
                         });

struct EncodeCase {
  float value;
  uint32_t bits;
};

// Hand-checked against the published tables, so that a shared mistake in the layout-based
// reference above and the implementation would not go unnoticed.
void expect_encodes(const Format& f, std::initializer_list<EncodeCase> cases) {
  for (const EncodeCase& c : cases) {
    EXPECT_EQ(f.encode(c.value), c.bits) << c.value;
    EXPECT_EQ(f.encode(-c.value), c.bits | f.sign_bit()) << -c.value;
  }
}

TEST(F16, KnownValues) {
  expect_encodes(kF16, {{1.0f, 0x3C00},
                        {0.5f, 0x3800},
                        {2.0f, 0x4000},
                        {0.1f, 0x2E66},
                        {0x1p-14f, 0x0400},
                        {0x1p-24f, 0x0001},
                        {0x1.ff8p-15f, 0x03FF},
                        {65504.0f, 0x7BFF}});
}

TEST(F16, OverflowRoundsToInfFrom65520) {
  expect_encodes(kF16, {{65519.0f, 0x7BFF},
                        {std::nextafter(65520.0f, 0.0f), 0x7BFF},
                        {65520.0f, 0x7C00},
                        {65536.0f, 0x7C00},
                        {1e6f, 0x7C00},
                        {std::numeric_limits<float>::max(), 0x7C00},
                        {kInf, 0x7C00}});
}

TEST(F16, UnderflowRoundsToEvenAtHalfTheSmallestSubnormal) {
  expect_encodes(kF16, {{0x1p-25f, 0x0000},
                        {std::nextafter(0x1p-25f, 1.0f), 0x0001},
                        {0x1.8p-24f, 0x0002},
                        {std::numeric_limits<float>::min(), 0x0000}});
}

TEST(BF16, KnownValues) {
  expect_encodes(kBF16, {{1.0f, 0x3F80},
                         {0.1f, 0x3DCD},
                         {3.0f, 0x4040},
                         {std::numeric_limits<float>::min(), 0x0080},
                         {std::numeric_limits<float>::denorm_min(), 0x0000},
                         {from_bits(0x00008000u), 0x0000},
                         {from_bits(0x00018000u), 0x0002}});
}

TEST(BF16, OverflowRoundsToInf) {
  expect_encodes(kBF16, {{from_bits(0x7F7F7FFFu), 0x7F7F},
                         {from_bits(0x7F7F8000u), 0x7F80},
                         {std::numeric_limits<float>::max(), 0x7F80},
                         {kInf, 0x7F80}});
}

TEST(E4M3, KnownValues) {
  expect_encodes(kE4M3, {{1.0f, 0x38},
                         {0.5f, 0x30},
                         {1.125f, 0x39},
                         {240.0f, 0x77},
                         {256.0f, 0x78},
                         {448.0f, 0x7E},
                         {0x1p-6f, 0x08},
                         {0x1.cp-7f, 0x07},
                         {0x1p-9f, 0x01},
                         {0x1p-10f, 0x00},
                         {0x1.8p-9f, 0x02}});
}

TEST(E4M3, MagnitudesPast448SaturateTo448) {
  expect_encodes(kE4M3, {{std::nextafter(448.0f, kInf), 0x7E},
                         {449.0f, 0x7E},
                         {464.0f, 0x7E},
                         {std::nextafter(464.0f, kInf), 0x7E},
                         {479.0f, 0x7E},
                         {480.0f, 0x7E},
                         {481.0f, 0x7E},
                         {1e6f, 0x7E},
                         {std::numeric_limits<float>::max(), 0x7E},
                         {kInf, 0x7E}});
  EXPECT_EQ(kE4M3Max, to_float(e4m3_t{0x7E}));
}

TEST(E4M3, NaNEncodesAs0x7FWithSign) {
  EXPECT_EQ(to_e4m3(kNaN).bits, 0x7F);
  EXPECT_EQ(to_e4m3(-kNaN).bits, 0xFF);
  EXPECT_TRUE(std::isnan(to_float(e4m3_t{0x7F})));
  EXPECT_TRUE(std::isnan(to_float(e4m3_t{0xFF})));
}

// ---------------------------------------------------------------------------------------------
// Packed int4

int sign_extend_nibble(unsigned nibble) {
  return nibble >= 8 ? static_cast<int>(nibble) - 16 : static_cast<int>(nibble);
}

TEST(Int4, EveryByteUnpacksToLowThenHighNibble) {
  for (unsigned byte = 0; byte < 256; ++byte) {
    const uint8_t packed[1] = {static_cast<uint8_t>(byte)};
    ASSERT_EQ(int4_get(packed, 0), sign_extend_nibble(byte & 0xFu)) << byte;
    ASSERT_EQ(int4_get(packed, 1), sign_extend_nibble(byte >> 4)) << byte;
  }
}

TEST(Int4, ElementTwoJIsLowNibbleOfByteJ) {
  const uint8_t packed[3] = {0x10, 0x32, 0x54};
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(int4_get(packed, i), i) << i;
}

TEST(Int4, SetThenGetRoundTripsWithoutDisturbingNeighbour) {
  for (const int64_t index : {0, 1, 4, 7}) {
    const int64_t neighbour = index ^ 1;
    for (int other = -8; other <= 7; ++other) {
      for (int value = -8; value <= 7; ++value) {
        uint8_t packed[4] = {0xA5, 0x5A, 0xC3, 0x3C};
        int4_set(packed, neighbour, other);
        int4_set(packed, index, value);
        ASSERT_EQ(int4_get(packed, index), value) << index;
        ASSERT_EQ(int4_get(packed, neighbour), other) << index;
        for (int64_t byte = 0; byte < 4; ++byte) {
          if (byte == index / 2) continue;
          const uint8_t original[4] = {0xA5, 0x5A, 0xC3, 0x3C};
          ASSERT_EQ(packed[byte], original[byte]) << "byte " << byte << " changed";
        }
      }
    }
  }
}

TEST(Int4, SetRejectsValuesOutsideMinus8To7) {
  for (const int value : {-9, 8, 15, 16, -16, 100, INT_MIN, INT_MAX}) {
    uint8_t packed[1] = {0x7E};
    try {
      int4_set(packed, 1, value);
      ADD_FAILURE() << "no exception for " << value;
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), Errc::invalid_argument);
      EXPECT_NE(std::string(error.what()).find(std::to_string(value)), std::string::npos)
          << error.what();
    }
    EXPECT_EQ(packed[0], 0x7E) << value;
  }
}

// ---------------------------------------------------------------------------------------------
// Bulk conversions

constexpr int64_t kBulkCount = 1001;  // odd, so that i4 ends in half a byte

std::vector<uint8_t> random_bytes(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(count);
  for (uint8_t& byte : bytes) byte = static_cast<uint8_t>(rng());
  return bytes;
}

// The element of `bytes` (laid out as `dtype`) read with the scalar API.
float scalar_to_f32(const std::vector<uint8_t>& bytes, DType dtype, int64_t i) {
  const auto load = [&](auto element) {
    std::memcpy(&element, bytes.data() + i * static_cast<int64_t>(sizeof(element)),
                sizeof(element));
    return element;
  };
  switch (dtype) {
    case DType::f32:
      return load(0.0f);
    case DType::f16:
      return to_float(load(f16_t{}));
    case DType::bf16:
      return to_float(load(bf16_t{}));
    case DType::f8e4m3:
      return to_float(load(e4m3_t{}));
    case DType::i32:
      return static_cast<float>(load(int32_t{}));
    case DType::i8:
      return static_cast<float>(load(int8_t{}));
    case DType::i4:
      return static_cast<float>(int4_get(bytes.data(), i));
  }
  return kNaN;
}

TEST(Bulk, ConvertToF32MatchesScalarDecodeForEveryDType) {
  for (const DTypeRow& row : kDTypeRows) {
    SCOPED_TRACE(row.name);
    // Random bit patterns, NaNs and infinities included; the vector of 4-byte elements keeps
    // every element type aligned.
    std::vector<uint32_t> words(kBulkCount);
    const std::vector<uint8_t> bytes = random_bytes(words.size() * 4, 7);
    std::memcpy(words.data(), bytes.data(), bytes.size());
    std::vector<float> out(kBulkCount, -1.0f);
    convert_to_f32(words.data(), row.dtype, kBulkCount, out.data());
    for (int64_t i = 0; i < kBulkCount; ++i) {
      ASSERT_EQ(to_bits(out[i]), to_bits(scalar_to_f32(bytes, row.dtype, i))) << i;
    }
  }
}

std::vector<float> random_float_bit_patterns(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> values(count);
  for (float& value : values) value = from_bits(static_cast<uint32_t>(rng()));
  return values;
}

TEST(Bulk, ConvertFromF32MatchesScalarEncodeForFloatDTypes) {
  // Random bit patterns mostly miss the narrow ranges; mix in values of ordinary magnitude.
  std::vector<float> src = random_float_bit_patterns(kBulkCount, 11);
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  for (size_t i = 0; i < src.size(); i += 2) src[i] = normal(rng);

  for (const DType dtype : {DType::f32, DType::f16, DType::bf16, DType::f8e4m3}) {
    SCOPED_TRACE(dtype_name(dtype));
    std::vector<uint32_t> out(kBulkCount);
    convert_from_f32(src.data(), kBulkCount, out.data(), dtype);
    const auto* out_bytes = reinterpret_cast<const uint8_t*>(out.data());
    for (int64_t i = 0; i < kBulkCount; ++i) {
      switch (dtype) {
        case DType::f16: {
          uint16_t bits = 0;
          std::memcpy(&bits, out_bytes + 2 * i, 2);
          ASSERT_EQ(bits, to_f16(src[i]).bits) << i;
          break;
        }
        case DType::bf16: {
          uint16_t bits = 0;
          std::memcpy(&bits, out_bytes + 2 * i, 2);
          ASSERT_EQ(bits, to_bf16(src[i]).bits) << i;
          break;
        }
        case DType::f8e4m3:
          ASSERT_EQ(out_bytes[i], to_e4m3(src[i]).bits) << i;
          break;
        default:
          ASSERT_EQ(out[i], to_bits(src[i])) << i;
          break;
      }
    }
  }
}

// Random integers in range plus an offset of k/16, |k| <= 7: below 2^20 the sum is exact in
// float and stays strictly inside (-0.5, 0.5) of the integer, so the expected result is known
// without rounding anything.
TEST(Bulk, ConvertFromF32ToIntegersRoundsToNearest) {
  struct Range {
    DType dtype;
    int lo;
    int hi;
  };
  for (const Range& range : {Range{DType::i32, -1000000, 1000000}, Range{DType::i8, -128, 127},
                             Range{DType::i4, -8, 7}}) {
    SCOPED_TRACE(dtype_name(range.dtype));
    std::mt19937 rng(17);
    std::uniform_int_distribution<int> integer(range.lo, range.hi);
    std::uniform_int_distribution<int> sixteenths(-7, 7);
    std::vector<int> expected(kBulkCount);
    std::vector<float> src(kBulkCount);
    for (int64_t i = 0; i < kBulkCount; ++i) {
      expected[i] = integer(rng);
      src[i] = static_cast<float>(expected[i]) + static_cast<float>(sixteenths(rng)) / 16.0f;
    }
    std::vector<int32_t> out(kBulkCount, 0x5A5A5A5A);
    convert_from_f32(src.data(), kBulkCount, out.data(), range.dtype);
    const auto* packed = reinterpret_cast<const uint8_t*>(out.data());
    for (int64_t i = 0; i < kBulkCount; ++i) {
      const int got = range.dtype == DType::i32  ? out[i]
                      : range.dtype == DType::i8 ? reinterpret_cast<const int8_t*>(packed)[i]
                                                 : int4_get(packed, i);
      ASSERT_EQ(got, expected[i]) << i << ": " << src[i];
    }
  }
}

struct IntegerCase {
  DType dtype;
  float value;
  int expected;
};

TEST(Bulk, ConvertFromF32ToIntegersBreaksTiesToEven) {
  const IntegerCase cases[] = {
      {DType::i32, 0.5f, 0},
      {DType::i32, 1.5f, 2},
      {DType::i32, 2.5f, 2},
      {DType::i32, -2.5f, -2},
      {DType::i32, -0.5f, 0},
      {DType::i32, 0.49999997f, 0},
      {DType::i32, 2147483520.0f, 2147483520},
      {DType::i32, -2147483648.0f, INT32_MIN},
      {DType::i8, 126.5f, 126},
      {DType::i8, -127.5f, -128},
      {DType::i8, -2.5f, -2},
      {DType::i4, 6.5f, 6},
      {DType::i4, 7.4f, 7},
      {DType::i4, -8.5f, -8},
      {DType::i4, -7.5f, -8},
      {DType::i4, -0.5f, 0},
  };
  for (const IntegerCase& c : cases) {
    int32_t out = 0;
    convert_from_f32(&c.value, 1, &out, c.dtype);
    const int got = c.dtype == DType::i32  ? out
                    : c.dtype == DType::i8 ? static_cast<int8_t>(out & 0xFF)
                                           : int4_get(reinterpret_cast<uint8_t*>(&out), 0);
    EXPECT_EQ(got, c.expected) << dtype_name(c.dtype) << " " << c.value;
  }
}

TEST(Bulk, ConvertFromF32ToIntegersRefusesUnrepresentableValuesNamingIndex) {
  struct Case {
    DType dtype;
    float value;
  };
  const Case cases[] = {
      {DType::i32, kNaN},
      {DType::i32, kInf},
      {DType::i32, -kInf},
      {DType::i32, 2147483648.0f},
      {DType::i32, -2147483904.0f},
      {DType::i32, 1e20f},
      {DType::i8, kNaN},
      {DType::i8, 127.5f},
      {DType::i8, -129.0f},
      {DType::i4, kNaN},
      {DType::i4, kInf},
      {DType::i4, 7.5f},
      {DType::i4, 8.0f},
      {DType::i4, -8.5000010f},
      {DType::i4, -9.0f},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << dtype_name(c.dtype) << " " << c.value);
    const float src[] = {1.0f, 2.0f, 3.0f, c.value, 4.0f};
    int32_t out[5] = {};
    try {
      convert_from_f32(src, 5, out, c.dtype);
      ADD_FAILURE() << "no exception";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), Errc::invalid_argument);
      EXPECT_NE(std::string(error.what()).find("element 3"), std::string::npos) << error.what();
    }
  }
}

TEST(Bulk, ConvertFromF32ToI4LeavesTrailingHalfByteUntouched) {
  const float src[] = {1.0f, -2.0f, 3.0f};
  uint8_t packed[2] = {0x00, 0xB0};
  convert_from_f32(src, 3, packed, DType::i4);
  EXPECT_EQ(packed[0], 0xE1);
  EXPECT_EQ(packed[1], 0xB3);
}

TEST(Bulk, EmptyConversionsAcceptNullAndNegativeCountsAreRejected) {
  for (const DTypeRow& row : kDTypeRows) {
    SCOPED_TRACE(row.name);
    EXPECT_NO_THROW(convert_to_f32(nullptr, row.dtype, 0, nullptr));
    EXPECT_NO_THROW(convert_from_f32(nullptr, 0, nullptr, row.dtype));
    float value = 0.0f;
    int32_t word = 0;
    EXPECT_THROW(convert_to_f32(&word, row.dtype, -1, &value), Error);
    EXPECT_THROW(convert_from_f32(&value, -1, &word, row.dtype), Error);
  }
}

}  // namespace
}  // namespace moekit
