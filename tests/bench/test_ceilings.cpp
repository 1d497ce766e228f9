// The ceiling measurements and the fast weight generator: sound numbers on tiny sizes (their
// speed is not asserted; a shared test machine cannot promise any).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "bench/ceilings.hpp"
#include "bench/random_layer.hpp"
#include "moekit/dtype.hpp"
#include "moekit/error.hpp"
#include "moekit/platform.hpp"

namespace moekit::bench {
namespace {

std::vector<SimdIsa> isas_here() {
  std::vector<SimdIsa> isas = {SimdIsa::portable};
  if (best_simd_isa() == SimdIsa::avx2_fma) isas.push_back(SimdIsa::avx2_fma);
  return isas;
}

bool positive_finite(double value) {
  return std::isfinite(value) && value > 0.0;
}

TEST(Ceilings, MeasureGivesPositiveFiniteFigures) {
  const Ceilings c = Ceilings::Measure(2, CeilingSizes::Tiny());
  EXPECT_EQ(c.threads, 2);
  EXPECT_EQ(c.isa, best_simd_isa());
  EXPECT_TRUE(positive_finite(c.read_bytes_per_s)) << c.read_bytes_per_s;
  EXPECT_TRUE(positive_finite(c.fma_flops_per_s)) << c.fma_flops_per_s;
  EXPECT_TRUE(positive_finite(c.cpu_share)) << c.cpu_share;
}

TEST(Ceilings, EveryIsaHereMeasuresPositiveFiniteFigures) {
  const CeilingSizes tiny = CeilingSizes::Tiny();
  for (const SimdIsa isa : isas_here()) {
    EXPECT_TRUE(positive_finite(measure_read_bandwidth(1, tiny.read_bytes, 2, isa)))
        << simd_isa_name(isa);
    EXPECT_TRUE(positive_finite(measure_fma_peak(1, tiny.fma_iterations, 2, isa)))
        << simd_isa_name(isa);
  }
}

// The bf16 dot-product peak is measured exactly where the CPU has AVX-512 BF16, and asked for
// elsewhere it is an error, not a crash.
TEST(Ceilings, Bf16DotPeakIsMeasuredOnlyWhereTheCpuHasIt) {
  const Ceilings c = Ceilings::Measure(1, CeilingSizes::Tiny());
  if (Platform::probe().avx512_bf16) {
    EXPECT_TRUE(positive_finite(c.bf16_dot_flops_per_s)) << c.bf16_dot_flops_per_s;
  } else {
    EXPECT_EQ(c.bf16_dot_flops_per_s, 0.0);
    EXPECT_THROW(measure_bf16_dot_peak(1, 10, 1), Error);
  }
}

// The int8 dot-product peak is measured on the int8 GEMM's instruction: vpdpbusd where the CPU
// has AVX-512 VNNI, else pmaddubsw with AVX2; an ISA the CPU lacks is an error, not a crash.
TEST(Ceilings, Int8DotPeakIsMeasuredOnTheInt8GemmsInstruction) {
  const Ceilings c = Ceilings::Measure(1, CeilingSizes::Tiny());
  const Platform machine = Platform::probe();
  if (machine.avx512_vnni) {
    EXPECT_EQ(c.int8_isa, SimdIsa::avx512_vnni);
  } else if (machine.avx2 && machine.fma) {
    EXPECT_EQ(c.int8_isa, SimdIsa::avx2_fma);
  } else {
    EXPECT_EQ(c.int8_dot_ops_per_s, 0.0);
  }
  if (c.int8_isa != SimdIsa::portable) {
    EXPECT_TRUE(positive_finite(c.int8_dot_ops_per_s)) << c.int8_dot_ops_per_s;
  }
  if (machine.avx2) {
    EXPECT_TRUE(positive_finite(measure_int8_dot_peak(1, 1000, 1, SimdIsa::avx2_fma)));
  }
  if (!machine.avx512_vnni) {
    EXPECT_THROW(measure_int8_dot_peak(1, 10, 1, SimdIsa::avx512_vnni), Error);
  }
  EXPECT_THROW(measure_int8_dot_peak(1, 10, 1, SimdIsa::portable), Error);
}

TEST(Ceilings, RefuseAnEmptyMeasurement) {
  EXPECT_THROW(measure_read_bandwidth(0, 1 << 20, 1, SimdIsa::portable), Error);
  EXPECT_THROW(measure_fma_peak(1, 0, 1, SimdIsa::portable), Error);
}

TEST(SumFloats, AddsEveryElementIncludingTheTail) {
  for (const SimdIsa isa : isas_here()) {
    for (const int64_t n : {0, 5, 32, 1000, 1037}) {
      std::vector<float> values(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(i % 7);
      double expected = 0.0;
      for (float v : values) expected += v;
      EXPECT_EQ(sum_floats(values.data(), n, isa), expected) << simd_isa_name(isa) << ", n = " << n;
    }
  }
}

TEST(FastRandomBf16, HasTheAskedMeanAndDeviation) {
  const int64_t n = int64_t{1} << 20;
  const Tensor t = fast_random_bf16({n}, 0.5f, 11, 2);
  double sum = 0.0, squares = 0.0, largest = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = to_float(t.data<bf16_t>()[i]);
    sum += v;
    squares += v * v;
    largest = std::max(largest, std::fabs(v));
  }
  const double mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 0.005);
  EXPECT_NEAR(std::sqrt(squares / n - mean * mean), 0.5, 0.01);
  EXPECT_LE(largest, 0.5 * 3.5);  // a sum of four uniforms ends at sqrt(12) deviations
}

TEST(FastRandomBf16, DependsOnTheSeedNotOnTheThreads) {
  const Shape shape = {3, 100'003};
  const Tensor one = fast_random_bf16(shape, 1.0f, 5, 1);
  const Tensor two = fast_random_bf16(shape, 1.0f, 5, 2);
  const Tensor other = fast_random_bf16(shape, 1.0f, 6, 2);
  EXPECT_EQ(std::memcmp(one.data<uint16_t>(), two.data<uint16_t>(), one.view().nbytes()), 0);
  EXPECT_NE(std::memcmp(one.data<uint16_t>(), other.data<uint16_t>(), one.view().nbytes()), 0);
}

TEST(FastRandomWeights, ShapesTheRoutedExpertsInBf16) {
  ModelSpec spec = ModelSpec::preset("qwen3-moe");
  spec.n_experts = 4;
  const RandomWeights w = fast_random_weights(spec, 1, 2);
  EXPECT_EQ(w.w13.view().shape, (Shape{4, 2 * 768, 2048}));
  EXPECT_EQ(w.w2.view().shape, (Shape{4, 2048, 768}));
  EXPECT_EQ(w.w13.view().dtype, DType::bf16);
}

TEST(FastRandomWeights, RefusesSharedExperts) {
  EXPECT_THROW(fast_random_weights(ModelSpec::demo(), 1, 1), Error);
}

}  // namespace
}  // namespace moekit::bench
