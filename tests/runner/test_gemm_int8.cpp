// gemm_panels_int8 (src/runner/cpu/gemm_int8.hpp) against a double-precision sum of what
// int4-group-a8 defines: per group, (code - offset) x the rows' int8 codes, times the weight and
// row scales. The int4 panels and the rows' codes (in the order k0, k2, k1, k3 of every 4 k) are
// laid out here from the descriptions in panels.hpp and stream.hpp, never by the library.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "moekit/error.hpp"
#include "moekit/platform.hpp"
#include "runner/cpu/gemm_int8.hpp"
#include "runner/cpu/panels.hpp"

namespace moekit::cpu {
namespace {

size_t sz(int64_t i) {
  return static_cast<size_t>(i);
}

// The kernel sets of the int8 GEMM, each skipped where this CPU (or its OS) lacks it.
std::string lacks(Int8Dot dot) {
  const Platform machine = Platform::probe();
  if (dot == Int8Dot::vnni) return machine.avx512_vnni ? "" : "AVX-512 VNNI";
  return machine.avx2 && machine.fma && machine.f16c ? "" : "AVX2, FMA and F16C";
}

#define SKIP_WITHOUT(dot)                                                                   \
  if (const std::string missing = lacks(dot); !missing.empty())                             \
  GTEST_SKIP() << "the " << (dot == Int8Dot::vnni ? "vnni" : "maddubs") << " kernels need " \
               << missing << ", which this machine lacks"

struct Case {
  Int8Dot dot;
  int64_t m, k, n, group_k, p_begin, p_end;
  bool zero_points;
};

std::string describe(const Case& c) {
  std::string name = c.dot == Int8Dot::vnni ? "vnni_m" : "maddubs_m";
  name += std::to_string(c.m);
  name += "_K" + std::to_string(c.k);
  name += "_N" + std::to_string(c.n);
  name += "_group" + std::to_string(c.group_k);
  name += "_panels" + std::to_string(c.p_begin);
  name += "to" + std::to_string(c.p_end);
  if (c.zero_points) name += "_zero_points";
  return name;
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << describe(c);
}

// Random int4 panels [n, k] with scales (and offsets 8 + zero point) per row and group; random
// rows of int8 codes with a scale per row and group, and the sums of their codes.
struct Problem {
  Case c;
  int64_t steps;
  std::vector<uint8_t> panels;
  std::vector<float> scale, offset;
  std::vector<int> code;   // [n][k], 0..15
  std::vector<int8_t> q;   // [m][k] in the order k0, k2, k1, k3 per 4 k
  std::vector<int> value;  // [m][k] the codes by k
  std::vector<float> row_scale, row_sum;

  explicit Problem(const Case& cs, uint64_t seed)
      : c(cs), steps((cs.k + cs.group_k - 1) / cs.group_k) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> exponent(-10.0f, 2.0f);
    const int64_t panel_count = (c.n + kPanelRows - 1) / kPanelRows;
    const int64_t panel_bytes = c.k / 4 * 32;
    panels.assign(sz(panel_count * panel_bytes), 0);
    scale.resize(sz(panel_count * steps * kPanelRows));
    offset.resize(scale.size());
    for (float& s : scale) s = std::exp2(exponent(rng)) * (rng() % 2 == 0 ? 1.0f : -1.0f);
    for (float& o : offset)
      o = c.zero_points ? static_cast<float>(8 + static_cast<int>(rng() % 9) - 4) : 8.0f;
    code.assign(sz(c.n * c.k), 0);
    for (int64_t row = 0; row < c.n; ++row) {
      uint8_t* panel = panels.data() + (row / kPanelRows) * panel_bytes;
      const int j = static_cast<int>(row % kPanelRows);
      for (int64_t col = 0; col < c.k; ++col) {
        const int u = static_cast<int>(rng() % 16);
        code[sz(row * c.k + col)] = u;
        // Lane 2 (j % 8) + k % 2 of block k / 4, nibble (k % 4 < 2 ? 0 : 2) + (j < 8 ? 0 : 1).
        const int64_t lane = 2 * (j % 8) + col % 2;
        const int nibble = (col % 4 < 2 ? 0 : 2) + (j < 8 ? 0 : 1);
        uint8_t& byte = panel[col / 4 * 32 + 2 * lane + nibble / 2];
        byte = static_cast<uint8_t>(byte | (u << (4 * (nibble % 2))));
      }
    }
    q.assign(sz(c.m * c.k), 0);
    value.assign(sz(c.m * c.k), 0);
    row_scale.resize(sz(c.m * steps));
    row_sum.assign(sz(c.m * steps), 0.0f);
    for (float& s : row_scale) s = std::exp2(exponent(rng));
    for (int64_t r = 0; r < c.m; ++r) {
      for (int64_t col = 0; col < c.k; ++col) {
        const int v = static_cast<int>(rng() % 255) - 127;
        value[sz(r * c.k + col)] = v;
        static constexpr int kOrder[4] = {0, 2, 1, 3};  // position of k % 4 in its block
        q[sz(r * c.k + col / 4 * 4 + kOrder[col % 4])] = static_cast<int8_t>(v);
        row_sum[sz(r * steps + col / c.group_k)] += static_cast<float>(v);
      }
    }
  }

  PanelMatrix view() const {
    PanelMatrix w;
    w.dtype = DType::i4;
    w.data = panels.data();
    w.n = c.n;
    w.k = c.k;
    w.group_k = c.group_k;
    w.scale = scale.data();
    w.offset = c.zero_points ? offset.data() : nullptr;
    return w;
  }
  Int8Matrix rows() const { return {q.data(), c.k, row_scale.data(), row_sum.data(), steps}; }
  double want(int64_t r, int64_t col, double& magnitude) const {
    double total = 0.0;
    magnitude = 0.0;
    for (int64_t g = 0; g < steps; ++g) {
      const int64_t at = ((col / kPanelRows) * steps + g) * kPanelRows + col % kPanelRows;
      double dot = 0.0;
      for (int64_t kk = g * c.group_k; kk < std::min(c.k, (g + 1) * c.group_k); ++kk) {
        dot += (code[sz(col * c.k + kk)] - static_cast<double>(offset[sz(at)])) *
               value[sz(r * c.k + kk)];
      }
      const double term = dot * scale[sz(at)] * row_scale[sz(r * steps + g)];
      total += term;
      magnitude += std::abs(term);
    }
    return total;
  }
};

std::vector<Case> cases() {
  struct Shape {
    int64_t k, n, group_k, p_begin, p_end;
  };
  // Groups of 4 (the smallest), 32, 128, 256 (one K-block), a group wider than K, a partial last
  // group; N of whole and partial panels, ranges inside the matrix.
  const Shape shapes[] = {{2048, 50, 128, 0, 4}, {768, 40, 32, 1, 3}, {300, 33, 128, 0, 3},
                          {512, 16, 256, 0, 1},  {36, 20, 4, 0, 2},   {100, 100, 128, 2, 7}};
  std::vector<Case> out;
  for (const Shape& s : shapes) {
    for (const int64_t m : {1, 3, 5, 8, 9, 17, 32, 33}) {
      for (const bool zero_points : {false, true}) {
        for (const Int8Dot dot : {Int8Dot::vnni, Int8Dot::maddubs}) {
          out.push_back({dot, m, s.k, s.n, s.group_k, s.p_begin, s.p_end, zero_points});
        }
      }
    }
  }
  for (const Int8Dot dot : {Int8Dot::vnni, Int8Dot::maddubs}) {
    out.push_back({dot, 256, 512, 48, 64, 0, 3, false});
  }
  return out;
}

class GemmPanelsInt8Matches : public testing::TestWithParam<Case> {};

TEST_P(GemmPanelsInt8Matches, TheFormatsIntegerSumsAndWritesOnlyItsPanels) {
  SKIP_WITHOUT(GetParam().dot);
  const Case& c = GetParam();
  const Problem problem(c, static_cast<uint64_t>(c.m * 977 + c.k * 13 + c.group_k + c.zero_points));
  const int64_t ldc = c.n + 5;
  std::vector<float> out(sz(c.m * ldc), std::numeric_limits<float>::quiet_NaN());
  std::vector<uint8_t> work(sz(gemm_int8_scratch_bytes() + 4));

  gemm_panels_int8(problem.rows(), c.m, problem.view(), c.p_begin, c.p_end, out.data(), ldc,
                   work.data() + 4, c.dot);

  const int64_t first = c.p_begin * kPanelRows;
  const int64_t last = std::min(c.p_end * kPanelRows, c.n);
  for (int64_t r = 0; r < c.m; ++r) {
    for (int64_t col = 0; col < ldc; ++col) {
      const float got = out[sz(r * ldc + col)];
      if (col < first || col >= last) {
        ASSERT_TRUE(std::isnan(got)) << "row " << r << " column " << col << " was written";
        continue;
      }
      double magnitude = 0.0;
      const double want = problem.want(r, col, magnitude);
      // Integer sums are exact; only one f32 product per group and the f32 sum of the groups
      // round, far below 1e-5 of the magnitudes, while a wrong code, order, offset or scale
      // misses by whole terms.
      ASSERT_NEAR(got, want, 1e-5 * magnitude + 1e-30) << "row " << r << " column " << col;
    }
  }
}

std::string case_name(const testing::TestParamInfo<Case>& info) {
  return describe(info.param);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmPanelsInt8Matches, testing::ValuesIn(cases()), case_name);

// The two kernels finish each group with the same f32 operations on the same exact integer sums,
// so where this machine has both they give the same floats.
TEST(GemmPanelsInt8, Avx2AndVnniGiveTheSameFloats) {
  SKIP_WITHOUT(Int8Dot::vnni);
  SKIP_WITHOUT(Int8Dot::maddubs);
  for (const Case& c : {Case{Int8Dot::vnni, 37, 2048, 100, 128, 0, 7, true},
                        Case{Int8Dot::vnni, 6, 768, 40, 32, 1, 3, false}}) {
    const Problem problem(c, 99);
    const int64_t ldc = c.n;
    std::vector<float> vnni(sz(c.m * ldc)), maddubs(sz(c.m * ldc));
    std::vector<uint8_t> work(sz(gemm_int8_scratch_bytes()));
    gemm_panels_int8(problem.rows(), c.m, problem.view(), c.p_begin, c.p_end, vnni.data(), ldc,
                     work.data(), Int8Dot::vnni);
    gemm_panels_int8(problem.rows(), c.m, problem.view(), c.p_begin, c.p_end, maddubs.data(), ldc,
                     work.data(), Int8Dot::maddubs);
    for (int64_t r = 0; r < c.m; ++r) {
      for (int64_t col = c.p_begin * kPanelRows; col < std::min(c.n, c.p_end * kPanelRows); ++col) {
        ASSERT_EQ(vnni[sz(r * ldc + col)], maddubs[sz(r * ldc + col)])
            << describe(c) << " row " << r << " column " << col;
      }
    }
  }
}

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

TEST(GemmPanelsInt8, RejectsBadArguments) {
  SKIP_WITHOUT(Int8Dot::maddubs);
  const Problem problem({Int8Dot::maddubs, 4, 64, 20, 32, 0, 2, false}, 1);
  std::vector<float> out(4 * 32);
  std::vector<uint8_t> work(sz(gemm_int8_scratch_bytes()));
  const PanelMatrix good = problem.view();
  PanelMatrix bf16 = good;
  bf16.dtype = DType::bf16;
  expect_invalid(
      [&] {
        gemm_panels_int8(problem.rows(), 4, bf16, 0, 2, out.data(), 32, work.data(),
                         Int8Dot::maddubs);
      },
      "bf16");
  PanelMatrix wide = good;
  wide.group_k = 512;
  expect_invalid(
      [&] {
        gemm_panels_int8(problem.rows(), 4, wide, 0, 2, out.data(), 32, work.data(),
                         Int8Dot::maddubs);
      },
      "groups of 512");
  expect_invalid(
      [&] {
        gemm_panels_int8(problem.rows(), 4, good, 1, 3, out.data(), 32, work.data(),
                         Int8Dot::maddubs);
      },
      "[1, 3)");
  Int8Matrix short_rows = problem.rows();
  short_rows.ldq = 32;
  expect_invalid(
      [&] {
        gemm_panels_int8(short_rows, 4, good, 0, 2, out.data(), 32, work.data(), Int8Dot::maddubs);
      },
      "rows of 32 codes");
  expect_invalid(
      [&] {
        gemm_panels_int8(problem.rows(), 4, good, 0, 2, out.data(), 19, work.data(),
                         Int8Dot::maddubs);
      },
      "ldc 19");
  expect_invalid(
      [&] {
        gemm_panels_int8(problem.rows(), 4, good, 0, 2, out.data(), 32, nullptr, Int8Dot::maddubs);
      },
      "must not be null");
}

}  // namespace
}  // namespace moekit::cpu
