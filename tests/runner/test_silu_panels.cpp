// silu_gated_panels (src/runner/cpu/silu_panels.hpp) against gate / (1 + exp(-gate)) x up in
// double precision, on GEMM1 tiles as panel16 lays them out: random gates over the range where
// the sigmoid moves, gates past +-88 where exp leaves f32's range, NaN, and a partial last panel.

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "moekit/platform.hpp"
#include "runner/cpu/silu_panels.hpp"

namespace moekit::cpu {
namespace {

size_t sz(int64_t i) {
  return static_cast<size_t>(i);
}

double silu_gated(double gate, double up) {
  return gate / (1.0 + std::exp(-gate)) * up;
}

TEST(SiluGatedPanels, MatchesTheDoubleFormulaWithinAFewUlps) {
  const Platform machine = Platform::probe();
  if (!(machine.avx2 && machine.fma)) GTEST_SKIP() << "this CPU lacks AVX2 and FMA";
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> wide(-30.0f, 30.0f);
  const float special[] = {0.0f, -0.0f, 88.0f, -88.0f, 89.0f, -89.0f, 1e4f, -1e4f, 1e-30f, -1e-30f};
  for (const int64_t n : {1, 7, 8, 9, 24, 101}) {
    const int64_t panels = (n + 7) / 8;
    std::vector<float> y(sz(panels * 16));
    for (float& v : y) v = wide(rng);
    for (size_t i = 0; i < std::size(special) && i < sz(n); ++i) y[i / 8 * 16 + i % 8] = special[i];
    std::vector<float> act(sz(n) + 1, std::numeric_limits<float>::quiet_NaN());
    silu_gated_panels(y.data(), n, act.data());
    for (int64_t i = 0; i < n; ++i) {
      const float gate = y[sz(i / 8 * 16 + i % 8)];
      const float up = y[sz(i / 8 * 16 + 8 + i % 8)];
      const double want = silu_gated(gate, up);
      // Past a gate of -88 exp(-gate) leaves f32's range and the output is below 1e-30 (f32's
      // own std::exp gives exactly 0 there): there only its size is checked.
      ASSERT_NEAR(act[sz(i)], want, 4e-7 * std::abs(want) + 1e-30)
          << "n " << n << " output " << i << ": gate " << gate << ", up " << up;
    }
    EXPECT_TRUE(std::isnan(act[sz(n)])) << "wrote past the " << n << " outputs";
  }
}

TEST(SiluGatedPanels, KeepsNanInGateOrUp) {
  const Platform machine = Platform::probe();
  if (!(machine.avx2 && machine.fma)) GTEST_SKIP() << "this CPU lacks AVX2 and FMA";
  std::vector<float> y(16, 1.0f);
  y[2] = std::numeric_limits<float>::quiet_NaN();   // a gate
  y[13] = std::numeric_limits<float>::quiet_NaN();  // the up of output 5
  std::vector<float> act(8);
  silu_gated_panels(y.data(), 8, act.data());
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_EQ(std::isnan(act[sz(i)]), i == 2 || i == 5) << "output " << i << ": " << act[sz(i)];
  }
}

}  // namespace
}  // namespace moekit::cpu
