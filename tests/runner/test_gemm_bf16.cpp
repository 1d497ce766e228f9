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

// A packed [n, k] matrix (bf16, e4m3 or int4 with one scale per row and group of group_k
// values of k) and the value of each weight.
struct TestPanels {
  DType dtype = DType::bf16;
  int64_t n = 0;
  int64_t k = 0;
  int64_t group_k = 0;  // 0 for bf16
  std::vector<uint8_t> data;
  std::vector<float> scale;   // [panels][steps][16]
  std::vector<double> value;  // [n][k]

  int64_t panels() const { return (n + kPanelRows - 1) / kPanelRows; }
  int64_t steps() const { return group_k == 0 ? 0 : (k + group_k - 1) / group_k; }
  // int4 stores K in whole blocks of 4 k (32 bytes); bf16 32 bytes per k, e4m3 16.
  int64_t panel_bytes() const {
    if (dtype == DType::i4) return (k + 3) / 4 * 32;
    return k * (dtype == DType::bf16 ? 32 : 16);
  }
  PanelMatrix view() const {
    PanelMatrix w;
    w.dtype = dtype;
    w.data = data.data();
    w.n = n;
    w.k = k;
    w.group_k = group_k;
    w.scale = scale.empty() ? nullptr : scale.data();
    return w;
  }
  double at(int64_t row, int64_t col) const { return value[sz(row * k + col)]; }
  float& scale_of(int64_t row, int64_t col) {
    return scale[sz(((row / kPanelRows) * steps() + col / group_k) * kPanelRows +
                    row % kPanelRows)];
  }
  // Stores w(row, col) = v (rounded to bf16) at its panel16 place: panel row / 16, step col,
  // element row % 16.
  void set(int64_t row, int64_t col, float v) {
    const bf16_t b = to_bf16(v);
    const int64_t at = ((row / kPanelRows) * k + col) * kPanelRows + row % kPanelRows;
    std::memcpy(data.data() + at * 2, &b.bits, 2);
    value[sz(row * k + col)] = to_float(b);
  }
  // e4m3: byte row % 16 of step col. int4: the unsigned code u = q + 8 in block col / 4 of the
  // panel, 16-bit lane 2 (row % 8) + col % 2, nibble (col % 4 < 2 ? 0 : 2) + (row % 16 < 8 ? 0 :
  // 1) from the lowest; its value (u - 8) times the row's scale of the group.
  void set_code(int64_t row, int64_t col, uint8_t code) {
    uint8_t* panel = data.data() + (row / kPanelRows) * panel_bytes();
    const int j = static_cast<int>(row % kPanelRows);
    double v = 0.0;
    if (dtype == DType::f8e4m3) {
      panel[col * kPanelRows + j] = code;
      v = to_float(e4m3_t{code});
    } else {
      const int64_t lane = 2 * (j % 8) + col % 2;
      const int nibble = (col % 4 < 2 ? 0 : 2) + (j < 8 ? 0 : 1);
      uint8_t* byte = panel + col / 4 * 32 + 2 * lane + nibble / 2;
      const int shift = 4 * (nibble % 2);
      *byte = static_cast<uint8_t>((*byte & ~(0xF << shift)) | ((code & 0xF) << shift));
      v = static_cast<double>(code & 0xF) - 8.0;
    }
    value[sz(row * k + col)] = v * scale_of(row, col);
  }
};

// Rows past n in the last panel are zero, as the layout says.
TestPanels zero_panels(int64_t n, int64_t k, DType dtype = DType::bf16, int64_t group_k = 0) {
  TestPanels t;
  t.dtype = dtype;
  t.n = n;
  t.k = k;
  t.group_k = group_k;
  t.data.assign(sz(t.panels() * t.panel_bytes()), 0);
  t.scale.assign(sz(t.panels() * t.steps() * kPanelRows), 0.0f);
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

// Every e4m3 code but the two NaNs (subnormals, zeros of both signs and +-448 included), or
// every int4 code, with scales of either sign spanning 2^-12 to 2^4.
TestPanels random_quantized(DType dtype, int64_t n, int64_t k, int64_t group_k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> exponent(-12.0f, 4.0f);
  TestPanels t = zero_panels(n, k, dtype, group_k);
  for (float& s : t.scale) s = std::exp2(exponent(rng)) * (rng() % 2 == 0 ? 1.0f : -1.0f);
  for (int64_t row = 0; row < n; ++row) {
    for (int64_t col = 0; col < k; ++col) {
      uint8_t code = static_cast<uint8_t>(rng());
      if (dtype == DType::f8e4m3 && (code & 0x7F) == 0x7F) code ^= 1;
      t.set_code(row, col, code);
    }
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

// Which entry of the GEMM a test calls: f32 rows, or rows rounded beforehand (round_rows_bf16,
// Bf16Rows), as the runner calls it.
enum class Entry { f32, rounded };

// The product of rows [0, m) of a with w through `entry`. Rounded rows get a stride above the
// least, and every value round_rows_bf16 need not write is a NaN, which the GEMM must not read.
void call_gemm(Entry entry, const std::vector<float>& a, int64_t lda, int64_t m,
               const PanelMatrix& w, int64_t p_begin, int64_t p_end, float* out, int64_t ldc,
               void* work, const InputScales& scales = {}) {
  if (entry == Entry::f32) {
    gemm_panels_bf16(a.data(), lda, m, w, p_begin, p_end, out, ldc, work, scales);
    return;
  }
  const int64_t ld = bf16_rows_ld(w.k) + 2;
  std::vector<bf16_t> rows(sz(m * ld), to_bf16(std::numeric_limits<float>::quiet_NaN()));
  round_rows_bf16(a.data(), lda, m, w.k, rows.data(), ld, scales);
  gemm_panels_bf16(Bf16Rows{rows.data(), ld}, m, w, p_begin, p_end, out, ldc, work, scales);
}

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

// Runs the GEMM of case c on w with random activations (from seed) into a poisoned output and
// checks every element: those of the range against a double-precision product of the
// activations rounded to bf16 and the weights' values, the others untouched.
void expect_product(const Case& c, const TestPanels& w, uint64_t seed, Entry entry) {
  const int64_t lda = c.k + 3;
  const int64_t ldc = c.n + 5;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> a(sz(c.m * lda));
  for (float& x : a) x = normal(rng);
  const float poison = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(sz(c.m * ldc), poison);
  Scratch work(c.k);

  call_gemm(entry, a, lda, c.m, w.view(), c.p_begin, c.p_end, out.data(), ldc, work.get());

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
      // The products of two bf16 values are exact in f32, so only the f32 sums (and, with
      // scales, one product per group) round: their errors, of random sign, stay far below 1e-5
      // of the sum of the terms' magnitudes, while a wrong weight, pair, row, scale or
      // unrounded activation misses by far more.
      ASSERT_NEAR(got, want, 1e-5 * magnitude) << "row " << r << " column " << col;
    }
  }
}

class GemmPanelsBf16Matches : public testing::TestWithParam<Case> {};

TEST_P(GemmPanelsBf16Matches, DoublePrecisionProductAndWritesOnlyItsPanels) {
  SKIP_WITHOUT_AVX512_BF16();
  const Case& c = GetParam();
  expect_product(c, random_panels(c.n, c.k, 7), 11, Entry::f32);
}

TEST_P(GemmPanelsBf16Matches, SameFromRowsRoundedBeforehand) {
  SKIP_WITHOUT_AVX512_BF16();
  const Case& c = GetParam();
  expect_product(c, random_panels(c.n, c.k, 13), 17, Entry::rounded);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmPanelsBf16Matches, testing::ValuesIn(cases()), case_name);

struct QuantizedCase {
  DType dtype;
  int64_t group_k;
  Case shape;
};

std::string quantized_name(const testing::TestParamInfo<QuantizedCase>& info) {
  std::string name(info.param.dtype == DType::i4 ? "int4" : "e4m3");
  name += "_group" + std::to_string(info.param.group_k) + "_" + describe(info.param.shape);
  return name;
}

void PrintTo(const QuantizedCase& c, std::ostream* os) {
  *os << quantized_name({c, 0});
}

// Groups: one scale per row (group = K, odd K for e4m3), groups below a K-block (several per
// block, with a partial last group), one above it (K-blocks end where a group does, one of them
// starting inside an int4 block of 4 k), tiny groups of 2; panel ranges as above. Rows: tile
// heights and splits around 8, 32, and past one A block.
std::vector<QuantizedCase> quantized_cases() {
  struct Shape {
    DType dtype;
    int64_t group_k, k, n, p_begin, p_end;
  };
  const Shape shapes[] = {
      {DType::f8e4m3, 601, 601, 33, 0, 3},  {DType::f8e4m3, 37, 37, 20, 0, 2},
      {DType::f8e4m3, 128, 2048, 50, 1, 4}, {DType::f8e4m3, 128, 300, 48, 0, 3},
      {DType::f8e4m3, 32, 201, 40, 0, 3},   {DType::f8e4m3, 384, 1000, 16, 0, 1},
      {DType::f8e4m3, 2, 10, 17, 0, 2},     {DType::i4, 128, 2048, 50, 0, 4},
      {DType::i4, 32, 768, 40, 1, 3},       {DType::i4, 302, 906, 33, 0, 3},
      {DType::i4, 200, 200, 16, 0, 1},      {DType::i4, 64, 1000, 100, 2, 7},
      {DType::i4, 2, 14, 20, 0, 2}};
  std::vector<QuantizedCase> out;
  for (const Shape& s : shapes) {
    for (const int64_t m : {1, 5, 8, 9, 17, 32, 33}) {
      out.push_back({s.dtype, s.group_k, {m, s.k, s.n, s.p_begin, s.p_end}});
    }
  }
  out.push_back({DType::f8e4m3, 128, {300, 300, 48, 0, 3}});
  out.push_back({DType::i4, 64, {300, 1000, 100, 2, 7}});
  return out;
}

class GemmPanelsBf16Quantized : public testing::TestWithParam<QuantizedCase> {};

// e4m3 and int4 weights widen to bf16 exactly and take their scales per group: the product of
// their values, as panels.hpp defines them, with the activations rounded to bf16.
TEST_P(GemmPanelsBf16Quantized, DoublePrecisionProductOfTheFormatsValues) {
  SKIP_WITHOUT_AVX512_BF16();
  const QuantizedCase& c = GetParam();
  const uint64_t seed = static_cast<uint64_t>(c.shape.m * 7919 + c.shape.k * 31 + c.group_k);
  expect_product(c.shape, random_quantized(c.dtype, c.shape.n, c.shape.k, c.group_k, seed),
                 seed + 1, Entry::f32);
}

TEST_P(GemmPanelsBf16Quantized, SameFromRowsRoundedBeforehand) {
  SKIP_WITHOUT_AVX512_BF16();
  const QuantizedCase& c = GetParam();
  const uint64_t seed = static_cast<uint64_t>(c.shape.m * 7829 + c.shape.k * 37 + c.group_k);
  expect_product(c.shape, random_quantized(c.dtype, c.shape.n, c.shape.k, c.group_k, seed),
                 seed + 1, Entry::rounded);
}

INSTANTIATE_TEST_SUITE_P(Formats, GemmPanelsBf16Quantized, testing::ValuesIn(quantized_cases()),
                         quantized_name);

class GemmPanelsBf16InputScales : public testing::TestWithParam<QuantizedCase> {};

// GEMM inputs that are e4m3 codes times a scale per row and group (the fp8 formats' quantised
// activations), with those scales given: the product of the inputs as they are, not rounded to
// bf16 (which would miss by up to 2^-9 of each value, far beyond the tolerance).
void expect_input_scaled_product(const QuantizedCase& c, uint64_t seed, Entry entry) {
  const Case& shape = c.shape;
  const TestPanels w = random_quantized(DType::f8e4m3, shape.n, shape.k, c.group_k, seed);
  std::mt19937_64 rng(seed + 1);
  std::uniform_real_distribution<float> exponent(-20.0f, 6.0f);
  const int64_t groups = w.steps();
  const int64_t ld = groups + 1;
  std::vector<float> scales(sz(shape.m * ld));
  for (float& x : scales) x = std::exp2(exponent(rng));
  const int64_t lda = shape.k + 3;
  std::vector<float> a(sz(shape.m * lda));
  for (int64_t r = 0; r < shape.m; ++r) {
    for (int64_t kk = 0; kk < shape.k; ++kk) {
      uint8_t code = static_cast<uint8_t>(rng());
      if ((code & 0x7F) == 0x7F) code ^= 1;
      a[sz(r * lda + kk)] = to_float(e4m3_t{code}) * scales[sz(r * ld + kk / c.group_k)];
    }
  }
  const int64_t ldc = shape.n + 5;
  std::vector<float> out(sz(shape.m * ldc), std::numeric_limits<float>::quiet_NaN());
  Scratch work(shape.k);

  call_gemm(entry, a, lda, shape.m, w.view(), shape.p_begin, shape.p_end, out.data(), ldc,
            work.get(), {scales.data(), ld, c.group_k});

  const int64_t first = shape.p_begin * kPanelRows;
  const int64_t last = std::min(shape.p_end * kPanelRows, shape.n);
  for (int64_t r = 0; r < shape.m; ++r) {
    for (int64_t col = 0; col < ldc; ++col) {
      const float got = out[sz(r * ldc + col)];
      if (col < first || col >= last) {
        ASSERT_TRUE(std::isnan(got)) << "row " << r << " column " << col << " was written";
        continue;
      }
      double want = 0.0;
      double magnitude = 0.0;
      for (int64_t kk = 0; kk < shape.k; ++kk) {
        const double term = static_cast<double>(a[sz(r * lda + kk)]) * w.at(col, kk);
        want += term;
        magnitude += std::abs(term);
      }
      ASSERT_NEAR(got, want, 1e-5 * magnitude) << "row " << r << " column " << col;
    }
  }
}

TEST_P(GemmPanelsBf16InputScales, DoublePrecisionProductOfTheInputsAsTheyAre) {
  SKIP_WITHOUT_AVX512_BF16();
  const QuantizedCase& c = GetParam();
  expect_input_scaled_product(
      c, static_cast<uint64_t>(c.shape.m * 131 + c.shape.k * 17 + c.group_k), Entry::f32);
}

TEST_P(GemmPanelsBf16InputScales, SameFromRowsRoundedBeforehand) {
  SKIP_WITHOUT_AVX512_BF16();
  const QuantizedCase& c = GetParam();
  expect_input_scaled_product(
      c, static_cast<uint64_t>(c.shape.m * 137 + c.shape.k * 19 + c.group_k), Entry::rounded);
}

std::vector<QuantizedCase> input_scale_cases() {
  std::vector<QuantizedCase> out;
  for (const QuantizedCase& c : quantized_cases()) {
    if (c.dtype == DType::f8e4m3) out.push_back(c);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Fp8Inputs, GemmPanelsBf16InputScales,
                         testing::ValuesIn(input_scale_cases()), quantized_name);

// The e4m3 NaN codes stay NaN: only the rows of the column whose weight is one turn NaN.
TEST(GemmPanelsBf16, E4m3NanWeightMakesItsColumnNan) {
  SKIP_WITHOUT_AVX512_BF16();
  TestPanels w = random_quantized(DType::f8e4m3, 32, 40, 40, 3);
  w.set_code(5, 17, 0xFF);
  const int64_t m = 3;
  std::vector<float> a(sz(m * w.k), 0.5f);
  std::vector<float> out(sz(m * w.n));
  Scratch work(w.k);

  gemm_panels_bf16(a.data(), w.k, m, w.view(), 0, 2, out.data(), w.n, work.get());

  for (int64_t r = 0; r < m; ++r) {
    for (int64_t col = 0; col < w.n; ++col) {
      EXPECT_EQ(std::isnan(out[sz(r * w.n + col)]), col == 5) << "row " << r << " column " << col;
    }
  }
}

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
  const TestPanels e4m3 = random_quantized(DType::f8e4m3, 20, 8, 8, 2);
  PanelMatrix unscaled = e4m3.view();
  unscaled.scale = nullptr;
  expect_invalid(
      [&] { gemm_panels_bf16(a.data(), 8, 1, unscaled, 0, 1, out.data(), 32, work.get()); },
      "need a scale grid");
  PanelMatrix odd_groups = e4m3.view();
  odd_groups.group_k = 3;
  expect_invalid(
      [&] { gemm_panels_bf16(a.data(), 8, 1, odd_groups, 0, 1, out.data(), 32, work.get()); },
      "groups of 3");
  const TestPanels int4 = random_quantized(DType::i4, 20, 8, 8, 2);
  PanelMatrix zero_points = int4.view();
  const std::vector<float> offsets(int4.scale.size(), 8.0f);
  zero_points.offset = offsets.data();
  expect_invalid(
      [&] { gemm_panels_bf16(a.data(), 8, 1, zero_points, 0, 1, out.data(), 32, work.get()); },
      "zero points");
  expect_invalid(
      [&] {
        gemm_panels_bf16(a.data(), 8, 1, e4m3.view(), 0, 1, out.data(), 32, work.get(),
                         {e4m3.scale.data(), 1, 4});
      },
      "groups of 4");
  expect_invalid(
      [&] {
        gemm_panels_bf16(a.data(), 8, 1, e4m3.view(), 0, 1, out.data(), 32, work.get(),
                         {e4m3.scale.data(), 0, 8});
      },
      "stride 0");
  PanelMatrix empty = good;
  empty.k = 0;
  expect_invalid([&] { gemm_panels_bf16(a.data(), 8, 1, empty, 0, 0, out.data(), 32, work.get()); },
                 "non-empty");
}

// round_rows_bf16 on its own: each value rounded as the GEMM rounds it (to_bf16: nearest even),
// a zero after an odd row, nothing written past a row's padding or past the last row.
TEST(RoundRowsBf16, RoundsEachValueAndPadsOddRowsWithZero) {
  SKIP_WITHOUT_AVX512_BF16();
  for (const int64_t k : {1, 7, 32, 33, 200, 601}) {
    const int64_t m = 5;
    const int64_t lda = k + 3;
    const int64_t ld = bf16_rows_ld(k);
    std::mt19937_64 rng(static_cast<uint64_t>(k));
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> a(sz(m * lda));
    for (float& x : a) x = normal(rng);
    const bf16_t poison = to_bf16(std::numeric_limits<float>::quiet_NaN());
    std::vector<bf16_t> out(sz((m + 1) * ld), poison);

    round_rows_bf16(a.data(), lda, m, k, out.data(), ld);

    const int64_t padded = (k + 31) / 32 * 32;  // the rounding writes 32 values at a time
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < ld; ++j) {
        const uint16_t got = out[sz(r * ld + j)].bits;
        if (j < k) {
          ASSERT_EQ(got, to_bf16(a[sz(r * lda + j)]).bits)
              << "K " << k << " row " << r << " k " << j;
        } else if (j == k && k % 2 != 0) {
          ASSERT_EQ(got, 0) << "K " << k << " row " << r << ": the odd pad";
        } else if (j >= padded) {
          ASSERT_EQ(got, poison.bits) << "K " << k << " row " << r << " k " << j << " was written";
        } else {
          ASSERT_TRUE(got == 0 || got == poison.bits) << "K " << k << " row " << r << " k " << j;
        }
      }
    }
    for (int64_t j = 0; j < ld; ++j) ASSERT_EQ(out[sz(m * ld + j)].bits, poison.bits);
  }
}

// With input scales each value is divided by its row's and group's scale first: e4m3 codes
// times scales come back as the codes, exactly.
TEST(RoundRowsBf16, InputScalesLeaveTheCodes) {
  SKIP_WITHOUT_AVX512_BF16();
  const int64_t m = 3;
  const int64_t k = 300;
  const int64_t group = 128;
  const int64_t groups = 3;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> exponent(-20.0f, 6.0f);
  std::vector<float> scales(sz(m * groups));
  for (float& x : scales) x = std::exp2(exponent(rng));
  std::vector<float> a(sz(m * k));
  std::vector<float> codes(sz(m * k));
  for (int64_t i = 0; i < m * k; ++i) {
    uint8_t code = static_cast<uint8_t>(rng());
    if ((code & 0x7F) == 0x7F) code ^= 1;
    codes[sz(i)] = to_float(e4m3_t{code});
    a[sz(i)] = codes[sz(i)] * scales[sz(i / k * groups + i % k / group)];
  }
  const int64_t ld = bf16_rows_ld(k);
  std::vector<bf16_t> out(sz(m * ld), to_bf16(std::numeric_limits<float>::quiet_NaN()));

  round_rows_bf16(a.data(), k, m, k, out.data(), ld, {scales.data(), groups, group});

  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < k; ++j) {
      ASSERT_EQ(to_float(out[sz(r * ld + j)]), codes[sz(r * k + j)]) << "row " << r << " k " << j;
    }
  }
}

TEST(RoundRowsBf16, RejectsBadArguments) {
  SKIP_WITHOUT_AVX512_BF16();
  std::vector<float> a(sz(4 * 40), 1.0f);
  std::vector<bf16_t> out(sz(4 * bf16_rows_ld(40)));
  const int64_t ld = bf16_rows_ld(40);
  expect_invalid([&] { round_rows_bf16(a.data(), 40, 2, 40, out.data(), ld - 2); }, "strides");
  expect_invalid([&] { round_rows_bf16(a.data(), 40, 2, 40, out.data(), ld + 1); }, "even");
  expect_invalid([&] { round_rows_bf16(a.data(), 39, 2, 40, out.data(), ld); }, "strides 39");
  expect_invalid([&] { round_rows_bf16(a.data(), 40, -1, 40, out.data(), ld); }, "-1 rows");
  expect_invalid([&] { round_rows_bf16(nullptr, 40, 2, 40, out.data(), ld); }, "must not be null");
  const std::vector<float> scales(8, 1.0f);
  expect_invalid(
      [&] {
        round_rows_bf16(a.data(), 40, 2, 40, out.data(), ld, {scales.data(), 1, 8});
      },
      "groups of 8");
}

TEST(GemmPanelsBf16, RejectsBadRoundedRows) {
  SKIP_WITHOUT_AVX512_BF16();
  const TestPanels w = random_panels(20, 9, 1);
  const std::vector<bf16_t> rows(sz(4 * bf16_rows_ld(9)));
  std::vector<float> out(sz(4 * 32));
  Scratch work(w.k);
  // An odd K reads its zero pad: 10 values a row.
  expect_invalid(
      [&] {
        gemm_panels_bf16(Bf16Rows{rows.data(), 9}, 2, w.view(), 0, 1, out.data(), 32, work.get());
      },
      "lda 9");
  expect_invalid(
      [&] {
        gemm_panels_bf16(Bf16Rows{rows.data(), 11}, 2, w.view(), 0, 1, out.data(), 32, work.get());
      },
      "odd");
  expect_invalid(
      [&] {
        gemm_panels_bf16(Bf16Rows{nullptr, 10}, 2, w.view(), 0, 1, out.data(), 32, work.get());
      },
      "must not be null");
}

}  // namespace
}  // namespace moekit::cpu
