// quantize_e4m3_row (src/runner/cpu/e4m3_rows.hpp), the AVX2 and AVX-512F e4m3 rounding of the
// fp8 formats' GEMM inputs, against the scalar reference quantize_activation_row, bit for bit:
// every value and every group's scale, on random rows and on the edges (zeros of both signs,
// values that land in e4m3's subnormals, ties, values that saturate at 448, infinities, NaN,
// rows below the 1e-10 amax floor), and on a sweep of the float bit patterns.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "moekit/error.hpp"
#include "moekit/platform.hpp"
#include "quant/activation_quant.hpp"
#include "runner/cpu/e4m3_rows.hpp"

namespace moekit::cpu {
namespace {

size_t sz(int64_t i) {
  return static_cast<size_t>(i);
}

// What a rounding needs of the CPU, empty where this one has it.
std::string missing(E4m3Rounding rounding) {
  const Platform machine = Platform::probe();
  if (rounding == E4m3Rounding::avx2 && !(machine.avx2 && machine.fma && machine.f16c)) {
    return "AVX2, FMA and F16C";
  }
  if (rounding == E4m3Rounding::avx512 && !machine.avx512f) return "AVX-512F";
  return "";
}

std::string rounding_name(E4m3Rounding rounding) {
  switch (rounding) {
    case E4m3Rounding::scalar:
      return "scalar";
    case E4m3Rounding::avx2:
      return "avx2";
    case E4m3Rounding::avx512:
      return "avx512";
  }
  return "?";
}

QuantParams activations(ActivationQuant quant, int64_t group) {
  QuantParams q = QuantParams::Fp8Block(128);
  q.activation = quant;
  q.activation_group = group;
  return q;
}

// Compares the rounding's values and scales with the reference's, bit for bit, on one row.
void expect_reference(E4m3Rounding rounding, const QuantParams& q, float static_scale,
                      const std::vector<float>& x, const std::string& what) {
  const int64_t n = static_cast<int64_t>(x.size());
  const int64_t group = activation_group(q, n);
  const int64_t groups = n == 0 ? 0 : (n + group - 1) / group;
  const float poison = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> want(x.size() + 1, poison), got(x.size() + 1, poison);
  std::vector<float> want_scales(sz(groups) + 1, poison), got_scales(sz(groups) + 1, poison);
  quantize_activation_row(q, static_scale, x.data(), n, want.data(), want_scales.data());
  quantize_e4m3_row(rounding, q, static_scale, x.data(), n, got.data(), got_scales.data());
  for (int64_t k = 0; k <= n; ++k) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got[sz(k)]), std::bit_cast<uint32_t>(want[sz(k)]))
        << what << ": value " << k << " of " << n << " (x = " << (k < n ? x[sz(k)] : 0.0f)
        << "): got " << got[sz(k)] << ", want " << want[sz(k)];
  }
  if (q.activation == ActivationQuant::fp8_static) return;
  for (int64_t g = 0; g <= groups; ++g) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got_scales[sz(g)]),
              std::bit_cast<uint32_t>(want_scales[sz(g)]))
        << what << ": scale of group " << g;
  }
  // In place, as the runner calls it.
  std::vector<float> in_place = x;
  quantize_e4m3_row(rounding, q, static_scale, in_place.data(), n, in_place.data());
  for (int64_t k = 0; k < n; ++k) {
    ASSERT_EQ(std::bit_cast<uint32_t>(in_place[sz(k)]), std::bit_cast<uint32_t>(want[sz(k)]))
        << what << ": value " << k << " in place";
  }
}

// The e4m3 values around which rounding decides, times `scale`: each value up to 448, each tie
// between neighbours and a float ulp either side of it; below the smallest subnormal 2^-9 a
// quarter, a half (the tie with 0) and three quarters of it, and a float subnormal; zeros. The
// largest is 448: a row of these has the scale `scale` exactly. (What saturates past 448 is the
// static-scale sweep's.)
std::vector<float> edges(float scale) {
  std::vector<float> out;
  for (int code = 0; code < 0x7E; ++code) {
    const float v = to_float(e4m3_t{static_cast<uint8_t>(code)});
    const float tie = (v + to_float(e4m3_t{static_cast<uint8_t>(code + 1)})) / 2.0f;
    for (const float y : {v, tie, std::nextafter(tie, 0.0f), std::nextafter(tie, 1e9f)}) {
      out.push_back(y * scale);
      out.push_back(-y * scale);
    }
  }
  for (const float y :
       {448.0f, 0.25f * 0x1p-9f, 0.5f * 0x1p-9f, 0.75f * 0x1p-9f, 1e-40f, 0.0f, -0.0f}) {
    out.push_back(y * scale);
  }
  return out;
}

struct Kind {
  const char* name;
  ActivationQuant quant;
  int64_t group;  // per token group only
};

constexpr Kind kKinds[] = {{"per_token", ActivationQuant::fp8_per_token, 0},
                           {"group128", ActivationQuant::fp8_per_token_group, 128},
                           {"group7", ActivationQuant::fp8_per_token_group, 7},
                           {"group16", ActivationQuant::fp8_per_token_group, 16}};

class E4m3Rows : public testing::TestWithParam<E4m3Rounding> {
 protected:
  void SetUp() override {
    const std::string lacks = missing(GetParam());
    if (!lacks.empty()) {
      GTEST_SKIP() << "the " << rounding_name(GetParam()) << " rounding needs " << lacks
                   << ", which this machine lacks";
    }
  }
};

TEST_P(E4m3Rows, MatchTheReferenceOnRandomRowsOfEveryLength) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> exponent(-40.0f, 40.0f);
  for (const Kind& kind : kKinds) {
    const QuantParams q = activations(kind.quant, kind.group);
    for (const int64_t n : {1, 3, 7, 8, 9, 15, 16, 17, 31, 127, 128, 129, 300, 768, 2048}) {
      std::vector<float> x(sz(n));
      const float magnitude = std::exp2(exponent(rng));
      for (float& v : x) v = normal(rng) * magnitude;
      expect_reference(GetParam(), q, 0.0f, x, std::string(kind.name) + " n " + std::to_string(n));
    }
  }
}

TEST_P(E4m3Rows, MatchTheReferenceOnTheEdges) {
  for (const Kind& kind : kKinds) {
    const QuantParams q = activations(kind.quant, kind.group);
    const std::string name = kind.name;
    // A row whose amax is 448 x 2^-3 (scale 2^-3, so x / scale is exact): every edge value as
    // is; then the same values shuffled into groups whose own amax differs.
    std::vector<float> edge = edges(0.125f);
    expect_reference(GetParam(), q, 0.0f, edge, name + " edges, scale 2^-3");
    std::mt19937 rng(5);
    std::shuffle(edge.begin(), edge.end(), rng);
    expect_reference(GetParam(), q, 0.0f, edge, name + " edges shuffled");
    expect_reference(GetParam(), q, 0.0f, std::vector<float>(300, 0.0f), name + " zeros");
    expect_reference(GetParam(), q, 0.0f, std::vector<float>(37, -0.0f), name + " negative zeros");
    // Below the amax floor of 1e-10: the scale is the floor's, the values round in its steps.
    std::vector<float> tiny(140);
    for (size_t i = 0; i < tiny.size(); ++i) tiny[i] = static_cast<float>(i % 13) * -3e-12f;
    expect_reference(GetParam(), q, 0.0f, tiny, name + " below the amax floor");
    // NaN never enters the amax; an infinity makes the scale infinite and its group NaN.
    std::vector<float> special(50, 1.5f);
    special[3] = std::numeric_limits<float>::quiet_NaN();
    special[20] = -std::numeric_limits<float>::quiet_NaN();
    special[40] = std::numeric_limits<float>::infinity();
    expect_reference(GetParam(), q, 0.0f, special, name + " NaN and inf");
    special[40] = 3e-39f;  // a float subnormal
    expect_reference(GetParam(), q, 0.0f, special, name + " NaN and a subnormal");
  }
}

// A static scale of 1 or 2^-4 leaves x / scale exact, so the sweep reaches the rounding itself
// (3 does not, and checks the division): every sign, exponent and top 7 mantissa bits, each with
// five low halves (0 makes the ties, 1 just past them, 0x7FFF, 0x8000, 0xFFFF), infinities, NaNs
// and values that saturate at 448 among them.
TEST_P(E4m3Rows, MatchTheReferenceOverTheFloatBitPatternsWithAStaticScale) {
  const QuantParams q = activations(ActivationQuant::fp8_static, 0);
  std::vector<float> x;
  x.reserve(65536 * 5);
  for (uint32_t high = 0; high < 65536; ++high) {
    for (const uint32_t low : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0xFFFFu}) {
      x.push_back(std::bit_cast<float>(high << 16 | low));
    }
  }
  for (const float scale : {1.0f, 0.0625f, 3.0f}) {
    expect_reference(GetParam(), q, scale, x, "static scale " + std::to_string(scale));
  }
}

TEST_P(E4m3Rows, RefusesAFormatWithoutE4m3Activations) {
  std::vector<float> x(4, 1.0f);
  const QuantParams int8 = activations(ActivationQuant::int8_per_token_group, 4);
  EXPECT_THROW(quantize_e4m3_row(GetParam(), int8, 0.0f, x.data(), 4, x.data()), Error);
  EXPECT_THROW(quantize_e4m3_row(GetParam(), QuantParams::Unquantized(WeightFormat::bf16), 0.0f,
                                 x.data(), 4, x.data()),
               Error);
}

INSTANTIATE_TEST_SUITE_P(Roundings, E4m3Rows,
                         testing::Values(E4m3Rounding::scalar, E4m3Rounding::avx2,
                                         E4m3Rounding::avx512),
                         [](const testing::TestParamInfo<E4m3Rounding>& param) {
                           return rounding_name(param.param);
                         });

}  // namespace
}  // namespace moekit::cpu
