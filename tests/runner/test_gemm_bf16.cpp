// gemm_panels_bf16 (src/runner/cpu/gemm_bf16.hpp) against a double-precision product of the
// activations rounded to bf16 and the weights as the panel16 layout defines them. The weights
// are packed here, from values the test draws, by a packer written from the description in
// src/runner/cpu/panels.hpp, never by the library's.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "moekit/dtype.hpp"
#include "moekit/error.hpp"
#include "moekit/platform.hpp"
#include "runner/cpu/gemm_bf16.hpp"
#include "runner/cpu/panels.hpp"

namespace moekit::cpu {
namespace {

size_t sz(int64_t i) {
  return static_cast<size_t>(i);
}

bool cpu_runs_bf16_gemm() {
  return Platform::probe().avx512_bf16;
}

#define SKIP_WITHOUT_AVX512_BF16() \
  if (!cpu_runs_bf16_gemm()) GTEST_SKIP() << "this CPU (or its OS) lacks AVX-512 BF16"

double bf16_value(float x) {
  return static_cast<double>(to_float(to_bf16(x)));
}

// A packed bf16 [n, k] matrix and the value of each weight.
struct TestPanels {
  int64_t n = 0;
  int64_t k = 0;
  std::vector<uint8_t> data;
  std::vector<double> value;  // [n][k]

  PanelMatrix view() const {
    PanelMatrix w;
    w.dtype = DType::bf16;
    w.data = data.data();
    w.n = n;
    w.k = k;
    return w;
  }
  double at(int64_t row, int64_t col) const { return value[sz(row * k + col)]; }
  // Stores w(row, col) = v (rounded to bf16) at its panel16 place: panel row / 16, step col,
  // element row % 16.
  void set(int64_t row, int64_t col, float v) {
    const bf16_t b = to_bf16(v);
    const int64_t at = ((row / kPanelRows) * k + col) * kPanelRows + row % kPanelRows;
    std::memcpy(data.data() + at * 2, &b.bits, 2);
    value[sz(row * k + col)] = to_float(b);
  }
};

// Rows past n in the last panel are zero, as the layout says.
TestPanels zero_panels(int64_t n, int64_t k) {
  TestPanels t;
  t.n = n;
  t.k = k;
  t.data.assign(sz(t.view().panels() * kPanelRows * k * 2), 0);
  t.value.assign(sz(n * k), 0.0);
  return t;
}

TestPanels random_panels(int64_t n, int64_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  TestPanels t = zero_panels(n, k);
  for (int64_t row = 0; row < n; ++row) {
    for (int64_t col = 0; col < k; ++col) t.set(row, col, normal(rng));
  }
  return t;
}

// Scratch at an address 4 bytes past a cache line: the kernel must align it itself.
struct Scratch {
  explicit Scratch(int64_t k) : bytes(sz(gemm_bf16_scratch_bytes(k) + 68)) {}
  void* get() {
    const auto address = reinterpret_cast<uintptr_t>(bytes.data());
    return bytes.data() + ((64 - address % 64) % 64 + 4);
  }
  std::vector<uint8_t> bytes;
};

struct Case {
  int64_t m;
  int64_t k;
  int64_t n;
  int64_t p_begin;
  int64_t p_end;
};

std::string describe(const Case& c) {
  // Appended piece by piece: g++ 12 warns (-Wrestrict, wrongly) on "literal" + std::string.
  std::string name = "m";
  name += std::to_string(c.m);
  name += "_K" + std::to_string(c.k);
  name += "_N" + std::to_string(c.n);
  name += "_panels" + std::to_string(c.p_begin);
  name += "to" + std::to_string(c.p_end);
  return name;
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << describe(c);
}

std::string case_name(const testing::TestParamInfo<Case>& info) {
  return describe(info.param);
}

// Shapes: K odd and even, below one K-block (256), a whole number of them and spanning several
// with a partial last one; N a whole panel, with a partial last panel (of one row, of a few),
// and panel ranges that start and end inside the matrix. Rows: every tile height and split
// (tiles hold up to 8 rows), the usual 32, a full A block (256) and more than one (300).
std::vector<Case> cases() {
  struct Shape {
    int64_t k, n, p_begin, p_end;
  };
  const Shape shapes[] = {{7, 16, 0, 1},   {200, 40, 1, 3},  {601, 33, 0, 3}, {768, 100, 2, 7},
                          {513, 80, 0, 5}, {2048, 50, 0, 4}, {1, 20, 1, 2},   {256, 200, 3, 13}};
  std::vector<Case> out;
  for (const Shape& s : shapes) {
    for (const int64_t m : {1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 17, 23, 31, 32, 33, 40, 256}) {
      out.push_back({m, s.k, s.n, s.p_begin, s.p_end});
    }
  }
  out.push_back({300, 601, 33, 0, 3});
  out.push_back({300, 2048, 64, 1, 4});
  return out;
}

class GemmPanelsBf16Matches : public testing::TestWithParam<Case> {};

TEST_P(GemmPanelsBf16Matches, DoublePrecisionProductAndWritesOnlyItsPanels) {
  SKIP_WITHOUT_AVX512_BF16();
  const Case& c = GetParam();
  const TestPanels w = random_panels(c.n, c.k, 7);
  const int64_t lda = c.k + 3;
  const int64_t ldc = c.n + 5;
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> a(sz(c.m * lda));
  for (float& x : a) x = normal(rng);
  const float poison = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(sz(c.m * ldc), poison);
  Scratch work(c.k);

  gemm_panels_bf16(a.data(), lda, c.m, w.view(), c.p_begin, c.p_end, out.data(), ldc, work.get());

  const int64_t first = c.p_begin * kPanelRows;
  const int64_t last = std::min(c.p_end * kPanelRows, c.n);
  for (int64_t r = 0; r < c.m; ++r) {
    for (int64_t col = 0; col < ldc; ++col) {
      const float got = out[sz(r * ldc + col)];
      if (col < first || col >= last) {
        ASSERT_TRUE(std::isnan(got)) << "row " << r << " column " << col << " was written";
        continue;
      }
      double want = 0.0;
      double magnitude = 0.0;
      for (int64_t kk = 0; kk < c.k; ++kk) {
        const double term = bf16_value(a[sz(r * lda + kk)]) * w.at(col, kk);
        want += term;
        magnitude += std::abs(term);
      }
      // The products of two bf16 values are exact in f32, so only the f32 sums round: their
      // errors, of random sign, stay far below 1e-5 of the sum of the terms' magnitudes,
      // while a wrong weight, pair, row or unrounded activation misses by far more.
      ASSERT_NEAR(got, want, 1e-5 * magnitude) << "row " << r << " column " << col;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmPanelsBf16Matches, testing::ValuesIn(cases()), case_name);

// With w(n, k) = 1 where n == k and 0 elsewhere, c[r][n] = bf16(a[r][n]) exactly.
TEST(GemmPanelsBf16, RoundsActivationsToNearestEven) {
  SKIP_WITHOUT_AVX512_BF16();
  const int64_t k = 16;
  TestPanels w = zero_panels(16, k);
  for (int64_t j = 0; j < k; ++j) w.set(j, j, 1.0f);
  const float ulp = 0x1p-7f;  // of bf16 at 1
  const std::vector<float> values = {
      1.0f + ulp / 2,              // tie between 1 and 1 + ulp: to 1 (even)
      1.0f + 3 * ulp / 2,          // tie between 1 + ulp and 1 + 2 ulp: up to 1 + 2 ulp
      -(1.0f + ulp / 2),           // the same ties below zero
      -(1.0f + 3 * ulp / 2),       //
      1.0f + ulp / 2 + 0x1p-20f,   // just above a tie: up
      1.0f + ulp / 2 - 0x1p-20f,   // just below a tie: down
      std::nextafter(2.0f, 0.0f),  // carries into the exponent: 2
      3.0e38f,                     // near the largest bf16
      0x1p-60f * 1.3f,             // (times 2^-40 still a normal float)
      0.0f,                        //
      -0.0f,                       //
      0x1.0101p+0f,                // just more than half an ulp: up
      0x1.00ffp+0f,                // just less than half an ulp: down
      0x1.0180p+0f,                // three quarters of an ulp: up
      123.456f,                    //
      -7.0e-3f};
  ASSERT_EQ(values.size(), sz(k));
  const int64_t m = 3;  // the values, then shifted by one k, then scaled
  std::vector<float> a(sz(m * k));
  for (int64_t j = 0; j < k; ++j) {
    a[sz(j)] = values[sz(j)];
    a[sz(k + j)] = values[sz((j + 1) % k)];
    a[sz(2 * k + j)] = values[sz(j)] * 0x1p-40f;
  }
  std::vector<float> out(sz(m * k), std::numeric_limits<float>::quiet_NaN());
  Scratch work(k);

  gemm_panels_bf16(a.data(), k, m, w.view(), 0, 1, out.data(), k, work.get());

  for (int64_t i = 0; i < m * k; ++i) {
    const float want = to_float(to_bf16(a[sz(i)]));
    // A product with 1 and sums with zeros: exact, signed zeros aside (a -0 adds to +0).
    EXPECT_TRUE(out[sz(i)] == want)
        << "a = " << a[sz(i)] << " gave " << out[sz(i)] << ", bf16(a) = " << want;
  }
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 1.0f + 2 * ulp);
  EXPECT_EQ(out[6], 2.0f);
}

TEST(GemmPanelsBf16, RoundsPastTheLargestBf16ToInfinity) {
  SKIP_WITHOUT_AVX512_BF16();
  TestPanels w = zero_panels(16, 1);
  w.set(0, 0, 1.0f);
  const float a = std::numeric_limits<float>::max();
  std::vector<float> out(16);
  Scratch work(w.k);

  gemm_panels_bf16(&a, 1, 1, w.view(), 0, 1, out.data(), 16, work.get());

  // Only column 0: the other columns are inf times a zero weight.
  EXPECT_EQ(out[0], std::numeric_limits<float>::infinity());
}

TEST(GemmPanelsBf16, NanActivationMakesOnlyItsRowNan) {
  SKIP_WITHOUT_AVX512_BF16();
  const TestPanels w = random_panels(32, 40, 3);
  const int64_t m = 3;
  std::vector<float> a(sz(m * w.k), 0.5f);
  a[sz(w.k + 17)] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(sz(m * w.n));
  Scratch work(w.k);

  gemm_panels_bf16(a.data(), w.k, m, w.view(), 0, 2, out.data(), w.n, work.get());

  for (int64_t r = 0; r < m; ++r) {
    for (int64_t col = 0; col < w.n; ++col) {
      EXPECT_EQ(std::isnan(out[sz(r * w.n + col)]), r == 1) << "row " << r << " column " << col;
    }
  }
}

TEST(GemmPanelsBf16, NoRowsOrNoPanelsWriteNothing) {
  SKIP_WITHOUT_AVX512_BF16();
  const TestPanels w = random_panels(32, 40, 5);
  std::vector<float> a(sz(4 * w.k), 1.0f);
  std::vector<float> out(sz(4 * w.n), std::numeric_limits<float>::quiet_NaN());
  Scratch work(w.k);
  gemm_panels_bf16(a.data(), w.k, 0, w.view(), 0, 2, out.data(), w.n, work.get());
  gemm_panels_bf16(a.data(), w.k, 4, w.view(), 1, 1, out.data(), w.n, work.get());
  for (const float x : out) ASSERT_TRUE(std::isnan(x));
}

// Calls f and expects Errc::invalid_argument whose message holds `names`.
template <typename F>
void expect_invalid(F f, const std::string& names) {
  try {
    f();
    ADD_FAILURE() << "accepted; expected an error naming " << names;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
    EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
  }
}

TEST(GemmPanelsBf16, RejectsBadArguments) {
  SKIP_WITHOUT_AVX512_BF16();
  const TestPanels w = random_panels(20, 8, 1);
  std::vector<float> a(sz(4 * 8), 1.0f);
  std::vector<float> out(sz(4 * 32));
  Scratch work(w.k);
  const PanelMatrix good = w.view();
  PanelMatrix f32 = good;
  f32.dtype = DType::f32;
  expect_invalid([&] { gemm_panels_bf16(a.data(), 8, 1, f32, 0, 1, out.data(), 32, work.get()); },
                 "f32");
  expect_invalid([&] { gemm_panels_bf16(a.data(), 8, 1, good, 1, 3, out.data(), 32, work.get()); },
                 "[1, 3)");
  expect_invalid([&] { gemm_panels_bf16(a.data(), 8, 1, good, 2, 1, out.data(), 32, work.get()); },
                 "[2, 1)");
  expect_invalid([&] { gemm_panels_bf16(a.data(), 8, -1, good, 0, 1, out.data(), 32, work.get()); },
                 "row count -1");
  expect_invalid([&] { gemm_panels_bf16(a.data(), 7, 2, good, 0, 1, out.data(), 32, work.get()); },
                 "lda 7");
  expect_invalid([&] { gemm_panels_bf16(a.data(), 8, 2, good, 0, 2, out.data(), 19, work.get()); },
                 "ldc 19");
  expect_invalid([&] { gemm_panels_bf16(nullptr, 8, 2, good, 0, 2, out.data(), 32, work.get()); },
                 "must not be null");
  expect_invalid([&] { gemm_panels_bf16(a.data(), 8, 2, good, 0, 2, out.data(), 32, nullptr); },
                 "must not be null");
  PanelMatrix empty = good;
  empty.k = 0;
  expect_invalid([&] { gemm_panels_bf16(a.data(), 8, 1, empty, 0, 0, out.data(), 32, work.get()); },
                 "non-empty");
}

}  // namespace
}  // namespace moekit::cpu
