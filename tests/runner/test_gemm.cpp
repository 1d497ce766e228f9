// gemm_panels (src/runner/cpu/gemm.hpp) against a double-precision product with the weights as
// the panel16 layout defines them. The weights are packed here, from codes the test draws, by a
// packer written from the description in src/runner/cpu/panels.hpp, never by the library's.

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
#include "runner/cpu/gemm.hpp"
#include "runner/cpu/panels.hpp"

namespace moekit::cpu {
namespace {

size_t sz(int64_t i) {
  return static_cast<size_t>(i);
}

bool cpu_runs_gemm() {
  const Platform p = Platform::probe();
  return p.avx2 && p.fma && p.f16c;
}

// A packed [n, k] matrix and the value the format gives each of its weights.
struct TestPanels {
  DType dtype = DType::f32;
  int64_t n = 0;
  int64_t k = 0;
  int64_t group_k = 0;
  std::vector<uint8_t> data;
  std::vector<float> scale;
  std::vector<float> offset;
  std::vector<double> value;  // [n][k]

  PanelMatrix view() const {
    PanelMatrix w;
    w.dtype = dtype;
    w.data = data.data();
    w.n = n;
    w.k = k;
    w.group_k = group_k;
    w.scale = scale.empty() ? nullptr : scale.data();
    w.offset = offset.empty() ? nullptr : offset.data();
    return w;
  }
  double at(int64_t row, int64_t col) const { return value[sz(row * k + col)]; }
};

bool quantized(DType dtype) {
  return dtype == DType::f8e4m3 || dtype == DType::i4;
}

// Draws every weight's code (and, for quantised dtypes, a scale and, unless symmetric, an int4
// offset per row and group), stores the codes in panel16 order and records the value each one
// stands for. Rows past n in the last panel are zero codes with zero scales.
TestPanels random_panels(DType dtype, int64_t n, int64_t k, int64_t group_k, bool symmetric,
                         uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> nibble(0, 15);
  std::uniform_real_distribution<float> positive(0.01f, 0.1f);

  TestPanels t;
  t.dtype = dtype;
  t.n = n;
  t.k = k;
  t.group_k = quantized(dtype) ? group_k : 0;
  const PanelMatrix shape = t.view();
  const int64_t panels = shape.panels();
  t.data.assign(sz(panels * shape.panel_bytes()), 0);
  t.value.assign(sz(n * k), 0.0);
  if (quantized(dtype)) {
    t.scale.assign(sz(panels * shape.scale_steps() * kPanelRows), 0.0f);
    if (dtype == DType::i4 && !symmetric) t.offset.assign(t.scale.size(), 0.0f);
    for (int64_t p = 0; p < panels; ++p) {
      for (int64_t g = 0; g < shape.scale_steps(); ++g) {
        for (int64_t j = 0; j < kPanelRows && p * kPanelRows + j < n; ++j) {
          const size_t at = sz((p * shape.scale_steps() + g) * kPanelRows + j);
          t.scale[at] = positive(rng);
          const int zero_point = nibble(rng) - 8;
          if (!t.offset.empty()) t.offset[at] = static_cast<float>(8 + zero_point);
        }
      }
    }
  }
  for (int64_t row = 0; row < n; ++row) {
    const int64_t p = row / kPanelRows;
    const int64_t j = row % kPanelRows;
    uint8_t* panel = t.data.data() + p * shape.panel_bytes();
    for (int64_t col = 0; col < k; ++col) {
      const size_t grid =
          quantized(dtype) ? sz((p * shape.scale_steps() + col / group_k) * kPanelRows + j) : 0;
      double& value = t.value[sz(row * k + col)];
      switch (dtype) {
        case DType::f32: {
          const float v = normal(rng);
          std::memcpy(panel + (col * kPanelRows + j) * 4, &v, 4);
          value = v;
          break;
        }
        case DType::bf16: {
          const bf16_t v = to_bf16(normal(rng));
          std::memcpy(panel + (col * kPanelRows + j) * 2, &v.bits, 2);
          value = to_float(v);
          break;
        }
        case DType::f16: {
          const f16_t v = to_f16(normal(rng));
          std::memcpy(panel + (col * kPanelRows + j) * 2, &v.bits, 2);
          value = to_float(v);
          break;
        }
        case DType::f8e4m3: {
          uint8_t code = 0x7F;
          while ((code & 0x7F) == 0x7F) code = static_cast<uint8_t>(byte(rng));
          panel[col * kPanelRows + j] = code;
          value = static_cast<double>(to_float(e4m3_t{code})) * t.scale[grid];
          break;
        }
        default: {
          const int code = nibble(rng);
          const Int4Location at = int4_location(col, static_cast<int>(j));
          panel[at.byte] = static_cast<uint8_t>(panel[at.byte] | code << at.shift);
          const double offset = symmetric ? kSymmetricOffset : t.offset[grid];
          value = (code - offset) * t.scale[grid];
          break;
        }
      }
    }
  }
  return t;
}

struct Case {
  DType dtype;
  int64_t m;
  int64_t k;
  int64_t n;
  int64_t group_k;
  int64_t p_begin;
  int64_t p_end;
  bool symmetric = false;  // int4 without offsets
};

std::string describe(const Case& c) {
  return std::string(dtype_name(c.dtype)) + "_m" + std::to_string(c.m) + "_K" +
         std::to_string(c.k) + "_N" + std::to_string(c.n) + "_group" + std::to_string(c.group_k) +
         "_panels" + std::to_string(c.p_begin) + "to" + std::to_string(c.p_end) +
         (c.symmetric ? "_symmetric" : "");
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << describe(c);
}

std::string case_name(const testing::TestParamInfo<Case>& info) {
  return describe(info.param);
}

// Shapes: odd K with a partial last scale group and a partial last panel, of which only the
// last two panels are asked for; K equal to the group; K spanning several K-blocks with groups
// that straddle them and a last panel of one row.
std::vector<Case> cases() {
  struct Shape {
    int64_t k, n, group_k, p_begin, p_end;
  };
  const Shape shapes[] = {{201, 40, 64, 1, 3}, {72, 16, 72, 0, 1}, {601, 33, 96, 0, 3}};
  std::vector<Case> out;
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f8e4m3, DType::i4}) {
    for (const Shape& s : shapes) {
      // int4 packs two values per byte along K, so its K is even (K % 4 == 2: a partial block).
      const int64_t k = dtype == DType::i4 && s.k % 2 != 0 ? s.k + 1 : s.k;
      for (const int64_t m : {1, 2, 5, 6, 7, 31, 64}) {
        out.push_back({dtype, m, k, s.n, s.group_k, s.p_begin, s.p_end});
      }
    }
    // More rows than one A block holds.
    out.push_back({dtype, 500, 300, 20, 128, 0, 2});
  }
  // Symmetric int4 stores no offsets: every row's offset is 8.
  for (const Shape& s : shapes) {
    for (const int64_t m : {1, 7}) {
      out.push_back({DType::i4, m, s.k + s.k % 2, s.n, s.group_k, s.p_begin, s.p_end, true});
    }
  }
  // int4 groups that end in the middle of a block of 4 k.
  for (const int64_t m : {1, 7}) out.push_back({DType::i4, m, 90, 20, 30, 0, 2});
  return out;
}

class GemmPanelsMatches : public testing::TestWithParam<Case> {};

TEST_P(GemmPanelsMatches, DoublePrecisionProductAndWritesOnlyItsPanels) {
  if (!cpu_runs_gemm()) GTEST_SKIP() << "this CPU lacks AVX2, FMA or F16C";
  const Case& c = GetParam();
  const TestPanels w = random_panels(c.dtype, c.n, c.k, c.group_k, c.symmetric, 7);
  const int64_t lda = c.k + 3;
  const int64_t ldc = c.n + 5;
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> a(sz(c.m * lda));
  for (float& x : a) x = normal(rng);
  const float poison = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(sz(c.m * ldc), poison);
  std::vector<float> work(sz(gemm_scratch_floats(c.k)));

  gemm_panels(a.data(), lda, c.m, w.view(), c.p_begin, c.p_end, out.data(), ldc, work.data());

  const int64_t first = c.p_begin * kPanelRows;
  const int64_t last = std::min(c.p_end * kPanelRows, c.n);
  // A float sum of K products is within (K + 2) units of rounding of the sum of their
  // magnitudes (two more for a weight rounded once when widened); a wrong weight, row or column
  // misses by far more.
  const double tolerance = static_cast<double>(c.k + 2) * 0x1p-24;
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
        const double term = static_cast<double>(a[sz(r * lda + kk)]) * w.at(col, kk);
        want += term;
        magnitude += std::abs(term);
      }
      ASSERT_NEAR(got, want, tolerance * magnitude) << "row " << r << " column " << col;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryDtypeAndShape, GemmPanelsMatches, testing::ValuesIn(cases()),
                         case_name);

TEST(GemmPanels, E4m3NanCodeMakesOnlyItsColumnNan) {
  if (!cpu_runs_gemm()) GTEST_SKIP() << "this CPU lacks AVX2, FMA or F16C";
  TestPanels w = random_panels(DType::f8e4m3, 32, 40, 40, false, 3);
  w.data[sz(w.view().panel_bytes() + 5 * kPanelRows + 3)] = 0xFF;  // row 19, k = 5
  const int64_t m = 2;
  std::vector<float> a(sz(m * w.k), 1.0f);
  std::vector<float> out(sz(m * w.n));
  std::vector<float> work(sz(gemm_scratch_floats(w.k)));

  gemm_panels(a.data(), w.k, m, w.view(), 0, 2, out.data(), w.n, work.data());

  for (int64_t r = 0; r < m; ++r) {
    for (int64_t col = 0; col < w.n; ++col) {
      EXPECT_EQ(std::isnan(out[sz(r * w.n + col)]), col == 19) << "row " << r << " column " << col;
    }
  }
}

TEST(GemmPanels, RejectsAPanelRangePastTheMatrix) {
  if (!cpu_runs_gemm()) GTEST_SKIP() << "this CPU lacks AVX2, FMA or F16C";
  const TestPanels w = random_panels(DType::bf16, 20, 8, 0, false, 1);
  std::vector<float> a(8, 1.0f);
  std::vector<float> out(32);
  std::vector<float> work(sz(gemm_scratch_floats(w.k)));
  try {
    gemm_panels(a.data(), 8, 1, w.view(), 1, 3, out.data(), 32, work.data());
    FAIL() << "a range ending at panel 3 of 2 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("[1, 3)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moekit::cpu
