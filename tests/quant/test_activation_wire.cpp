// The e4m3 wire of the all-to-all (quant/activation_wire.hpp): a row quantised on the sending
// rank and restored on the receiving one must quantise, in the runner, to exactly what the row
// itself quantises to (quantize_activation_row, the runner's own step), bit for bit, values and
// scales; and it takes the bytes it says.

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "moekit/dtype.hpp"
#include "moekit/quant.hpp"
#include "quant/activation_quant.hpp"
#include "quant/activation_wire.hpp"

namespace moekit {
namespace {

constexpr int64_t kCols = 256;

struct WireCase {
  std::string name;
  QuantParams quant;
  DType dtype;
};

// The runner's GEMM1 input for a row of `dtype` (widened to f32 as the runner widens it): its
// quantised values and scales, as bits.
struct Quantised {
  std::vector<uint32_t> values, scales;
  bool operator==(const Quantised&) const = default;
};

Quantised runner_input(const QuantParams& q, const void* row, DType dtype) {
  std::vector<float> x(kCols), scales(static_cast<size_t>(kCols));
  convert_to_f32(row, dtype, kCols, x.data());
  quantize_activation_row(q, 0.0f, x.data(), kCols, x.data(), scales.data());
  const int64_t groups = e4m3_wire(q, kCols).groups();
  Quantised out;
  for (float v : x) out.values.push_back(std::bit_cast<uint32_t>(v));
  for (int64_t g = 0; g < groups; ++g) out.scales.push_back(std::bit_cast<uint32_t>(scales[g]));
  return out;
}

// Rows of every kind a group can hold: ordinary values across magnitudes, signed zeros, groups
// under the amax floor, several values tied for the largest, and a NaN.
std::vector<float> make_row(std::mt19937_64& rng, int kind) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-30.0f, 30.0f);
  std::vector<float> x(kCols);
  const float magnitude = std::exp2(exponent(rng));
  for (float& v : x) v = normal(rng) * magnitude;
  switch (kind % 6) {
    case 1:
      for (int64_t k = 0; k < kCols; k += 3) x[k] = k % 2 == 0 ? 0.0f : -0.0f;
      break;
    case 2:
      for (float& v : x) v *= 1e-12f / magnitude;  // under kActivationAmaxFloor
      break;
    case 3:
      for (int64_t k = 0; k < kCols; k += 5)
        x[k] = k % 2 == 0 ? 7.0f * magnitude : -7.0f * magnitude;
      break;
    case 4:
      x[17] = std::nanf("");
      break;
    default:
      break;
  }
  return x;
}

class E4m3WireRows : public ::testing::TestWithParam<WireCase> {};

TEST_P(E4m3WireRows, ARestoredRowQuantisesToTheSameCodesAndScalesAsTheRowItself) {
  const WireCase& c = GetParam();
  const E4m3Wire wire = e4m3_wire(c.quant, kCols);
  std::mt19937_64 rng(91);
  const int64_t row_bytes = dtype_storage_bytes(c.dtype, kCols);
  std::vector<std::byte> row(static_cast<size_t>(row_bytes)), restored(row.size());
  std::vector<std::byte> on_wire(static_cast<size_t>(wire.row_bytes()));
  std::vector<float> widened(kCols);
  for (int i = 0; i < 20000; ++i) {
    const std::vector<float> x = make_row(rng, i);
    convert_from_f32(x.data(), kCols, row.data(), c.dtype);
    convert_to_f32(row.data(), c.dtype, kCols, widened.data());
    encode_e4m3_row(wire, c.quant, widened.data(), on_wire.data());
    std::fill(restored.begin(), restored.end(), std::byte{0xFF});
    decode_e4m3_row(wire, on_wire.data(), c.dtype, restored.data());
    ASSERT_EQ(runner_input(c.quant, restored.data(), c.dtype),
              runner_input(c.quant, row.data(), c.dtype))
        << "row " << i;
  }
}

const WireCase kWireCases[] = {
    {"fp8_block_f32", QuantParams::Fp8Block(128), DType::f32},
    {"fp8_block_bf16", QuantParams::Fp8Block(128), DType::bf16},
    {"fp8_tensor_dynamic_f32", QuantParams::Fp8Tensor(), DType::f32},
    {"fp8_tensor_dynamic_bf16", QuantParams::Fp8Tensor(), DType::bf16},
};

std::string wire_case_name(const ::testing::TestParamInfo<WireCase>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Rows, E4m3WireRows, ::testing::ValuesIn(kWireCases), wire_case_name);

// The group's largest value comes back as 448 x scale, from which the runner must recompute the
// scale: for every f32 mantissa of an amax a (the exponent only shifts it), with scale = a / 448,
// 448 x scale / 448 gives the scale back, as f32 computes them. (Not so for an arbitrary f32
// scale: about one in nine of them does not survive 448 x s / 448.)
TEST(E4m3WireScales, EveryScaleComesBackFromItsLargestValueRestored) {
  const QuantParams q = QuantParams::Fp8Block(128);
  int64_t lost = 0;
  for (uint32_t bits = 0x3F800000; bits < 0x40000000; ++bits) {
    const float amax = std::bit_cast<float>(bits);
    const float scale = activation_group_scale(q, 0.0f, &amax, 0, 1);
    const float restored = to_float(to_e4m3(amax / scale)) * scale;
    if (activation_group_scale(q, 0.0f, &restored, 0, 1) != scale) ++lost;
  }
  EXPECT_EQ(lost, 0);
}

// The sender's branch-free codes are the runner's (to_e4m3), on a sample of every float and on
// every float near each e4m3 value and each rounding midpoint between two.
TEST(E4m3WireCodes, AreTheRunnersCodesOfEveryFloat) {
  int64_t differ = 0;
  const auto check = [&](uint32_t bits) {
    const float v = std::bit_cast<float>(bits);
    if (e4m3_bits(v) != to_e4m3(v).bits) ++differ;
  };
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFu; bits += 61) check(static_cast<uint32_t>(bits));
  for (int code = 0; code < 0x7E; ++code) {
    const float value = to_float(e4m3_t{static_cast<uint8_t>(code)});
    const float next = to_float(e4m3_t{static_cast<uint8_t>(code + 1)});
    for (const float at : {value, (value + next) / 2, next}) {
      for (const uint32_t sign : {0u, 0x80000000u}) {
        const uint32_t centre = std::bit_cast<uint32_t>(at) | sign;
        for (uint32_t d = 0; d < 4096; ++d) {
          check(centre + d);
          if (std::bit_cast<uint32_t>(at) >= d) check(centre - d);
        }
      }
    }
  }
  EXPECT_EQ(differ, 0);
}

TEST(E4m3WireBytes, ARowTakesItsCodesAndOneScalePerGroup) {
  EXPECT_EQ(e4m3_wire(QuantParams::Fp8Block(128), 1024).row_bytes(), 1024 + 8 * 4);
  EXPECT_EQ(e4m3_wire(QuantParams::Fp8Tensor(), 1024).row_bytes(), 1024 + 4);
}

TEST(E4m3WireBytes, FormatsThatDoNotQuantiseToE4m3WithDynamicScalesAreRefusedWithTheReason) {
  EXPECT_FALSE(e4m3_wire_refusal(QuantParams::Fp8Block(128)));
  EXPECT_FALSE(e4m3_wire_refusal(QuantParams::Fp8Tensor()));
  const struct {
    QuantParams quant;
    const char* reason;
  } refused[] = {
      {WeightFormat::bf16, "keeps GEMM1's inputs"},
      {QuantParams::Fp8Tensor(Fp8Scaling::per_tensor, Fp8Activations::static_), "static scale"},
      {QuantParams::Int4GroupA8(64), "int8"}};
  for (const auto& r : refused) {
    const std::optional<std::string> why = e4m3_wire_refusal(r.quant);
    ASSERT_TRUE(why) << r.quant.name();
    EXPECT_NE(why->find(r.reason), std::string::npos) << *why;
  }
  EXPECT_FALSE(e4m3_wire_carries(DType::f16));
}

}  // namespace
}  // namespace moekit
