// The cpu runner's AVX2 pieces one at a time: the quant method's panel16 packing against the
// canonical weights it replaces, the streaming kernel and the grouped GEMM1 -> activation ->
// GEMM2 -> weighted sum against double-precision loops over the same packed values.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "core/thread_pool.hpp"
#include "quant/activation_quant.hpp"
#include "quant/dequantize.hpp"
#include "runner/cpu/kernel_choice.hpp"
#include "runner/cpu/panel_moe.hpp"
#include "runner/cpu/stream.hpp"
#include "runner/cpu_fixture.hpp"
#include "runner/kernels.hpp"

namespace moekit::test {
namespace {

using cpu::PanelMatrix;

struct FormatShape {
  KernelFormat format;
  KernelShape shape;
};

// All formats, or the int4 formats that leave activations unquantised (W4A16).
std::vector<FormatShape> format_shapes(bool w4a16_only = false) {
  std::vector<FormatShape> cases;
  for (const KernelFormat& f : kernel_formats()) {
    const bool w4a16 = f.params.weight_dtype == DType::i4 && !f.params.quantizes_activations();
    if (w4a16_only && !w4a16) continue;
    for (const KernelShape& s : kernel_shapes()) cases.push_back({f, s});
  }
  return cases;
}

// The formats with e4m3 weights.
std::vector<FormatShape> e4m3_format_shapes() {
  std::vector<FormatShape> cases = format_shapes();
  std::erase_if(cases,
                [](const FormatShape& c) { return c.format.params.weight_dtype != DType::f8e4m3; });
  return cases;
}

std::string format_shape_name(const ::testing::TestParamInfo<FormatShape>& info) {
  return info.param.format.name + "_" + info.param.shape.name;
}

constexpr int kSlots = 3;

// The plan's kernels for a layer of this format and shape on a CPU with the given features.
CpuKernels planned_kernels(const QuantParams& q, int64_t H, int64_t I, bool avx512_bf16 = false,
                           bool avx512_vnni = false) {
  Platform platform = Platform::cpu_only(1);
  platform.avx2 = platform.fma = platform.f16c = true;
  platform.avx512_bf16 = avx512_bf16;
  platform.avx512_vnni = avx512_vnni;
  ModelSpec spec;
  spec.hidden = H;
  spec.intermediate = I;
  spec.shared_intermediate = I;
  return cpu::choose_cpu_kernels(platform, spec, q);
}

class PanelPacking : public ::testing::TestWithParam<FormatShape> {};

// Every packed value, padding included, equals the canonical value it stands for.
TEST_P(PanelPacking, HoldsExactlyTheCanonicalValues) {
  const auto& [format, shape] = GetParam();
  const int64_t H = shape.hidden, I = shape.intermediate;
  const TwoLayouts w(format.params, kSlots, H, I, 5);
  const CoreWeights canonical = w.canonical.apply();
  const CoreWeights packed = w.packed.apply();
  ASSERT_EQ(packed.w13.weight.data, nullptr) << "packed weights are not held twice";
  const auto check = [&](const StoredMatrices& m, const cpu::PanelStack& stack,
                         cpu::PanelOrder order, int64_t rows, int64_t K) {
    std::vector<float> row_values(K);
    int mismatches = 0;
    for (int s = 0; s < kSlots; ++s) {
      const PanelMatrix p = stack.slot(s);
      for (int64_t n = 0; n < p.panels() * cpu::kPanelRows; ++n) {
        const int64_t row = cpu::canonical_row(order, rows, n);
        if (row >= 0) dequantize_row(format.params, m, s, row, row_values.data());
        for (int64_t k = 0; k < K; ++k) {
          const float want = row >= 0 ? row_values[k] : 0.0f;
          if (cpu::panel_value(p, n, k) != want) ++mismatches;
        }
      }
    }
    return mismatches;
  };
  EXPECT_EQ(check(canonical.w13, cpu::panel_weights(packed).w13,
                  cpu::PanelOrder::gate_up_interleaved, 2 * I, H),
            0);
  EXPECT_EQ(check(canonical.w2, cpu::panel_weights(packed).w2, cpu::PanelOrder::rows, H, I), 0);
}

TEST(PanelPacking, InterleavesGateAndUpRowsOfTheSameIndex) {
  // I = 20: panel 2 holds gate rows 16-19 and up rows 36-39, the rest zero rows.
  EXPECT_EQ(cpu::canonical_row(cpu::PanelOrder::gate_up_interleaved, 40, 3), 3);
  EXPECT_EQ(cpu::canonical_row(cpu::PanelOrder::gate_up_interleaved, 40, 8 + 3), 20 + 3);
  EXPECT_EQ(cpu::canonical_row(cpu::PanelOrder::gate_up_interleaved, 40, 32 + 3), 19);
  EXPECT_EQ(cpu::canonical_row(cpu::PanelOrder::gate_up_interleaved, 40, 32 + 8 + 3), 39);
  EXPECT_EQ(cpu::canonical_row(cpu::PanelOrder::gate_up_interleaved, 40, 32 + 4), -1);
  EXPECT_EQ(cpu::canonical_row(cpu::PanelOrder::rows, 40, 40), -1);
}

INSTANTIATE_TEST_SUITE_P(Formats, PanelPacking, ::testing::ValuesIn(format_shapes()),
                         format_shape_name);

// sum_k x[k] w(n, k) in double over the packed values.
double naive_dot(const PanelMatrix& w, int64_t n, const float* x) {
  double sum = 0.0;
  for (int64_t k = 0; k < w.k; ++k) sum += static_cast<double>(x[k]) * cpu::panel_value(w, n, k);
  return sum;
}

// f32 accumulation against the double sum: relative to the sum of |x w|.
double abs_dot(const PanelMatrix& w, int64_t n, const float* x) {
  double sum = 0.0;
  for (int64_t k = 0; k < w.k; ++k)
    sum += std::abs(static_cast<double>(x[k]) * cpu::panel_value(w, n, k));
  return sum;
}

// Streams `in` over panels [p_begin, p_end) of m: e4m3 weights through the kernel `e4m3` names
// (AVX2's over the rows expanded for it), other dtypes through stream_panels.
void stream(const PanelMatrix& m, int64_t p_begin, int64_t p_end, const cpu::StreamRows& in,
            float* y, int64_t ldy, cpu::E4m3Stream e4m3) {
  if (m.dtype != DType::f8e4m3 || e4m3 == cpu::E4m3Stream::avx512) {
    cpu::stream_panels(m, p_begin, p_end, in, y, ldy);
    return;
  }
  const int64_t floats = cpu::e4m3_expanded_floats(m.k);
  std::vector<float> expanded(cpu::kStreamRows * floats, std::numeric_limits<float>::quiet_NaN());
  cpu::E4m3Rows rows;
  rows.m = in.m;
  for (int r = 0; r < in.m; ++r) {
    rows.unit[r] = cpu::expand_e4m3_row(in.x[r], m.k, expanded.data() + r * floats);
    rows.x[r] = expanded.data() + r * floats;
  }
  cpu::stream_panels_e4m3(m, p_begin, p_end, rows, y, ldy);
}

class StreamingKernel : public ::testing::TestWithParam<FormatShape> {
 protected:
  void SetUp() override {
    if (!has_avx2()) GTEST_SKIP() << "this machine has no AVX2+FMA+F16C";
  }
};

// Rows 1..kStreamRows through one pass, over w13 (K = H) and w2 (K = I), every panel.
void expect_stream_matches_a_double_loop(const FormatShape& param, cpu::E4m3Stream e4m3) {
  const auto& [format, shape] = param;
  const TwoLayouts w(format.params, 1, shape.hidden, shape.intermediate, 7);
  const CoreWeights packed = w.packed.apply();
  for (const PanelMatrix& m :
       {cpu::panel_weights(packed).w13.slot(0), cpu::panel_weights(packed).w2.slot(0)}) {
    const std::vector<float> x = random_rows(cpu::kStreamRows, m.k, 11);
    std::vector<float> sums(cpu::kStreamRows * std::max<int64_t>(1, m.scale_steps()));
    for (int r = 0; r < cpu::kStreamRows && m.dtype == DType::i4; ++r) {
      cpu::step_sums(x.data() + r * m.k, m.k, m.group_k, sums.data() + r * m.scale_steps());
    }
    for (int rows = 1; rows <= cpu::kStreamRows; ++rows) {
      cpu::StreamRows in;
      in.m = rows;
      for (int r = 0; r < rows; ++r) {
        in.x[r] = x.data() + r * m.k;
        in.x_sums[r] = sums.data() + r * m.scale_steps();
      }
      const int64_t ldy = m.panels() * cpu::kPanelRows;
      std::vector<float> y(rows * ldy, std::numeric_limits<float>::quiet_NaN());
      stream(m, 0, m.panels(), in, y.data(), ldy, e4m3);
      for (int r = 0; r < rows; ++r) {
        for (int64_t n = 0; n < ldy; ++n) {
          const double want = naive_dot(m, n, in.x[r]);
          ASSERT_NEAR(y[r * ldy + n], want, 1e-6 * abs_dot(m, n, in.x[r]) + 1e-30)
              << "rows " << rows << " row " << r << " n " << n << " K " << m.k;
        }
      }
    }
  }
}

TEST_P(StreamingKernel, MatchesADoubleLoopForEachRowCount) {
  expect_stream_matches_a_double_loop(GetParam(), cpu::E4m3Stream::avx2);
}

INSTANTIATE_TEST_SUITE_P(Formats, StreamingKernel, ::testing::ValuesIn(format_shapes()),
                         format_shape_name);

// Every e4m3 code but the two NaNs (which no quantisation writes), subnormals and both zeros
// included: a panel of 16 k whose step k holds codes 16 k to 16 k + 15, scaled per row by powers
// of two and by 0.75, streamed against one-hot rows, gives each code's value times its scale,
// rounded once, exactly as panel_value reads it.
void expect_every_e4m3_code_streams_as_its_value(cpu::E4m3Stream e4m3) {
  constexpr int64_t K = 16;
  alignas(64) uint8_t codes[K * cpu::kPanelRows];
  for (int i = 0; i < K * cpu::kPanelRows; ++i) {
    codes[i] = (i & 0x7F) == 0x7F ? 0 : static_cast<uint8_t>(i);
  }
  std::vector<float> scale(cpu::kPanelRows);
  for (int j = 0; j < cpu::kPanelRows; ++j) scale[j] = std::ldexp(j % 2 ? 0.75f : 1.0f, j - 8);
  const PanelMatrix m{.dtype = DType::f8e4m3,
                      .data = codes,
                      .n = cpu::kPanelRows,
                      .k = K,
                      .group_k = K,
                      .scale = scale.data()};
  for (int rows = 1; rows <= cpu::kStreamRows; ++rows) {
    for (int64_t hot = 0; hot < K; ++hot) {
      std::vector<float> x(K, 0.0f);
      x[hot] = 1.0f;
      cpu::StreamRows in;
      in.m = rows;
      for (int r = 0; r < rows; ++r) in.x[r] = x.data();
      std::vector<float> y(rows * cpu::kPanelRows, std::numeric_limits<float>::quiet_NaN());
      stream(m, 0, 1, in, y.data(), cpu::kPanelRows, e4m3);
      for (int r = 0; r < rows; ++r) {
        for (int j = 0; j < cpu::kPanelRows; ++j) {
          ASSERT_EQ(y[r * cpu::kPanelRows + j], cpu::panel_value(m, j, hot))
              << "code 0x" << std::hex << int{codes[hot * cpu::kPanelRows + j]} << std::dec
              << ", rows " << rows;
        }
      }
    }
  }
}

TEST(E4m3StreamingKernel, StreamsEveryFiniteCodeAsItsValue) {
  if (!has_avx2()) GTEST_SKIP() << "this machine has no AVX2+FMA+F16C";
  expect_every_e4m3_code_streams_as_its_value(cpu::E4m3Stream::avx2);
}

TEST(E4m3StreamingKernel, StreamsEveryFiniteCodeAsItsValueOnAvx512) {
  if (!Platform::probe().avx512f) GTEST_SKIP() << "this machine has no AVX-512F";
  expect_every_e4m3_code_streams_as_its_value(cpu::E4m3Stream::avx512);
}

// An odd K in odd scale steps, so that steps start and end inside the kernel's pairs of k, and
// rows whose values reach 2^20 and 2^100 beside ordinary ones, so that their expansion keeps
// them in f32's range: each output within f32 accumulation of the double loop.
void expect_e4m3_stream_handles_odd_steps_and_large_rows(cpu::E4m3Stream e4m3) {
  constexpr int64_t K = 37, kGroup = 5, kPanels = 2;
  constexpr int64_t kSteps = (K + kGroup - 1) / kGroup;
  std::mt19937_64 rng(23);
  std::vector<uint8_t> codes(kPanels * K * cpu::kPanelRows);
  for (uint8_t& c : codes) {
    c = static_cast<uint8_t>(rng());
    if ((c & 0x7F) == 0x7F) c = 0;  // no NaN codes: quantisation never writes them
  }
  std::uniform_real_distribution<float> unit(0.5f, 2.0f);
  std::vector<float> scale(kPanels * kSteps * cpu::kPanelRows);
  for (float& s : scale) s = unit(rng);
  const PanelMatrix m{.dtype = DType::f8e4m3,
                      .data = codes.data(),
                      .n = kPanels * cpu::kPanelRows,
                      .k = K,
                      .group_k = kGroup,
                      .scale = scale.data()};
  std::vector<float> x = random_rows(cpu::kStreamRows, K, 29);
  x[1 * K + 3] = 0x1p20f;
  x[2 * K + 36] = -0x1p100f;
  for (int rows = 1; rows <= cpu::kStreamRows; ++rows) {
    cpu::StreamRows in;
    in.m = rows;
    for (int r = 0; r < rows; ++r) in.x[r] = x.data() + r * K;
    const int64_t ldy = kPanels * cpu::kPanelRows;
    std::vector<float> y(rows * ldy, std::numeric_limits<float>::quiet_NaN());
    stream(m, 0, kPanels, in, y.data(), ldy, e4m3);
    for (int r = 0; r < rows; ++r) {
      for (int64_t n = 0; n < ldy; ++n) {
        const double want = naive_dot(m, n, in.x[r]);
        ASSERT_NEAR(y[r * ldy + n], want, 1e-6 * abs_dot(m, n, in.x[r]))
            << "rows " << rows << " row " << r << " n " << n;
      }
    }
  }
}

TEST(E4m3StreamingKernel, HandlesOddStepsAndLargeRows) {
  if (!has_avx2()) GTEST_SKIP() << "this machine has no AVX2+FMA+F16C";
  expect_e4m3_stream_handles_odd_steps_and_large_rows(cpu::E4m3Stream::avx2);
}

TEST(E4m3StreamingKernel, HandlesOddStepsAndLargeRowsOnAvx512) {
  if (!Platform::probe().avx512f) GTEST_SKIP() << "this machine has no AVX-512F";
  expect_e4m3_stream_handles_odd_steps_and_large_rows(cpu::E4m3Stream::avx512);
}

// The e4m3 kernel on AVX-512F vectors, where the plan picks it.
class E4m3Avx512StreamingKernel : public StreamingKernel {
 protected:
  void SetUp() override {
    if (!Platform::probe().avx512f) GTEST_SKIP() << "this machine has no AVX-512F";
  }
};

TEST_P(E4m3Avx512StreamingKernel, MatchesADoubleLoopForEachRowCount) {
  expect_stream_matches_a_double_loop(GetParam(), cpu::E4m3Stream::avx512);
}

INSTANTIATE_TEST_SUITE_P(Formats, E4m3Avx512StreamingKernel,
                         ::testing::ValuesIn(e4m3_format_shapes()), format_shape_name);

// The int16 kernel's dot product instructions this CPU has: pmaddwd always (AVX2), vpdpwssd
// where AVX-512 VNNI is present.
std::vector<cpu::Int16Dot> int16_dots() {
  if (Platform::probe().avx512_vnni) return {cpu::Int16Dot::pmaddwd, cpu::Int16Dot::vnni};
  return {cpu::Int16Dot::pmaddwd};
}

// int4 weights times rows quantised to int16: against a double loop over the same packed values
// and the dequantised q * scale, for every row count, K = H and K = I, with and without zero
// points; and within the quantisation's own error of the unquantised rows.
class Int16StreamingKernel : public StreamingKernel {};

TEST_P(Int16StreamingKernel, MatchesADoubleLoopOverTheDequantisedRows) {
  const auto& [format, shape] = GetParam();
  ASSERT_EQ(planned_kernels(format.params, shape.hidden, shape.intermediate).routed_int4.half,
            Int4Rows::int16);
  const TwoLayouts w(format.params, 1, shape.hidden, shape.intermediate, 7);
  const CoreWeights packed = w.packed.apply();
  for (const PanelMatrix& m :
       {cpu::panel_weights(packed).w13.slot(0), cpu::panel_weights(packed).w2.slot(0)}) {
    const int64_t steps = m.scale_steps();
    const std::vector<float> x = random_rows(cpu::kStreamRows, m.k, 11);
    std::vector<int16_t> q(x.size());
    std::vector<float> scale(cpu::kStreamRows * steps), sums(scale.size());
    for (int r = 0; r < cpu::kStreamRows; ++r) {
      cpu::quantize_int16(x.data() + r * m.k, m.k, m.group_k, q.data() + r * m.k,
                          scale.data() + r * steps, sums.data() + r * steps);
    }
    for (int rows = 1; rows <= cpu::kStreamRows; ++rows) {
      cpu::Int16Rows in;
      in.m = rows;
      for (int r = 0; r < rows; ++r) {
        in.q[r] = q.data() + r * m.k;
        in.scale[r] = scale.data() + r * steps;
        in.sums[r] = sums.data() + r * steps;
      }
      const int64_t ldy = m.panels() * cpu::kPanelRows;
      for (const cpu::Int16Dot dot : int16_dots()) {
        std::vector<float> y(rows * ldy, std::numeric_limits<float>::quiet_NaN());
        cpu::stream_panels_int16(m, 0, m.panels(), in, y.data(), ldy, dot);
        for (int r = 0; r < rows; ++r) {
          std::vector<float> dequantised(m.k);
          for (int64_t k = 0; k < m.k; ++k) {
            dequantised[k] = static_cast<float>(in.q[r][k]) * in.scale[r][k / m.group_k];
          }
          for (int64_t n = 0; n < ldy; ++n) {
            const double bound = abs_dot(m, n, &x[r * m.k]);
            ASSERT_NEAR(y[r * ldy + n], naive_dot(m, n, dequantised.data()), 1e-6 * bound + 1e-30)
                << "rows " << rows << " row " << r << " n " << n << " K " << m.k;
            ASSERT_NEAR(y[r * ldy + n], naive_dot(m, n, &x[r * m.k]), 1e-4 * bound + 1e-30);
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Int4Formats, Int16StreamingKernel,
                         ::testing::ValuesIn(format_shapes(/*w4a16_only=*/true)),
                         format_shape_name);

// The int16 kernel's int32 sums at their largest: every code 15 and every activation +-32767
// over a whole scale step. Steps up to kInt16HighTimes16MaxStep sum rows 8-15 at 16 times their
// codes (a lane ends within 7% of INT32_MAX at 256); longer steps shift the codes down. A sum
// that wrapped would be off by 2^32 times its scales.
TEST(Int16StreamingKernel, SumsExactlyAtTheLargestCodesAndActivationsOfEachStepLength) {
  for (const int64_t group : {int64_t{32}, cpu::kInt16HighTimes16MaxStep,
                              2 * cpu::kInt16HighTimes16MaxStep, cpu::kInt16MaxStep}) {
    for (const float sign : {1.0f, -1.0f}) {
      PanelMatrix m{.dtype = DType::i4, .n = cpu::kPanelRows, .k = 2 * group, .group_k = group};
      std::vector<uint8_t> codes(m.panel_bytes(), 0xFF);
      const std::vector<float> scale(m.scale_steps() * cpu::kPanelRows, 1.0f);
      m.data = codes.data();
      m.scale = scale.data();
      const std::vector<float> x(m.k, sign);
      std::vector<int16_t> q(m.k);
      std::vector<float> q_scale(m.scale_steps()), sums(m.scale_steps());
      cpu::quantize_int16(x.data(), m.k, group, q.data(), q_scale.data(), sums.data());
      ASSERT_EQ(q[0], sign * 32767);
      for (int rows = 1; rows <= cpu::kStreamRows; ++rows) {
        cpu::Int16Rows in;
        in.m = rows;
        for (int r = 0; r < rows; ++r) {
          in.q[r] = q.data();
          in.scale[r] = q_scale.data();
          in.sums[r] = sums.data();
        }
        for (const cpu::Int16Dot dot : int16_dots()) {
          std::vector<float> y(rows * cpu::kPanelRows, std::numeric_limits<float>::quiet_NaN());
          cpu::stream_panels_int16(m, 0, 1, in, y.data(), cpu::kPanelRows, dot);
          // (15 - 8) x (+-32767 x 1 / 32767) at each k.
          const double expected = 7.0 * sign * static_cast<double>(m.k);
          for (int64_t i = 0; i < rows * cpu::kPanelRows; ++i) {
            ASSERT_NEAR(y[i], expected, 1e-5 * std::abs(expected))
                << "step " << group << ", rows " << rows << ", output " << i;
          }
        }
      }
    }
  }
}

// The int8 kernel's dot product instructions this CPU has: pmaddubsw always (AVX2), vpdpbusd
// where AVX-512 VNNI is present.
std::vector<cpu::Int8Dot> int8_dots() {
  if (Platform::probe().avx512_vnni) return {cpu::Int8Dot::maddubs, cpu::Int8Dot::vnni};
  return {cpu::Int8Dot::maddubs};
}

// The int8 code quantize_int8 stored for k (Int8Rows: k0, k2, k1, k3 in each block of 4).
int8_t int8_code_at(const int8_t* q, int64_t k) {
  constexpr int kOrder[cpu::kInt4BlockK] = {0, 2, 1, 3};
  return q[k - k % cpu::kInt4BlockK + kOrder[k % cpu::kInt4BlockK]];
}

// int4 weights times rows quantised to int8: against a double loop over the same packed values
// and the dequantised q * scale, for every row count, K = H and K = I, with and without zero
// points; and within half a step of each group's scale of the unquantised rows.
class Int8StreamingKernel : public StreamingKernel {};

TEST_P(Int8StreamingKernel, MatchesADoubleLoopOverTheDequantisedRows) {
  const auto& [format, shape] = GetParam();
  const QuantParams a8 = QuantParams::Int4GroupA8(
      format.params.block_cols, format.params.scale_dtype, format.params.zero_points);
  ASSERT_EQ(planned_kernels(a8, shape.hidden, shape.intermediate).routed_int4.f32, Int4Rows::int8);
  const TwoLayouts w(a8, 1, shape.hidden, shape.intermediate, 7);
  const CoreWeights packed = w.packed.apply();
  for (const PanelMatrix& m :
       {cpu::panel_weights(packed).w13.slot(0), cpu::panel_weights(packed).w2.slot(0)}) {
    const int64_t steps = m.scale_steps();
    const std::vector<float> x = random_rows(cpu::kStreamRows, m.k, 11);
    std::vector<int8_t> q(x.size());
    std::vector<float> scale(cpu::kStreamRows * steps), sums(scale.size());
    for (int r = 0; r < cpu::kStreamRows; ++r) {
      cpu::quantize_int8(x.data() + r * m.k, m.k, m.group_k, q.data() + r * m.k,
                         scale.data() + r * steps, sums.data() + r * steps);
    }
    for (int rows = 1; rows <= cpu::kStreamRows; ++rows) {
      cpu::Int8Rows in;
      in.m = rows;
      for (int r = 0; r < rows; ++r) {
        in.q[r] = q.data() + r * m.k;
        in.scale[r] = scale.data() + r * steps;
        in.sums[r] = sums.data() + r * steps;
      }
      const int64_t ldy = m.panels() * cpu::kPanelRows;
      for (const cpu::Int8Dot dot : int8_dots()) {
        std::vector<float> y(rows * ldy, std::numeric_limits<float>::quiet_NaN());
        cpu::stream_panels_int8(m, 0, m.panels(), in, y.data(), ldy, dot);
        for (int r = 0; r < rows; ++r) {
          std::vector<float> dequantised(m.k);
          for (int64_t k = 0; k < m.k; ++k) {
            dequantised[k] =
                static_cast<float>(int8_code_at(in.q[r], k)) * in.scale[r][k / m.group_k];
          }
          for (int64_t n = 0; n < ldy; ++n) {
            const double bound = abs_dot(m, n, &x[r * m.k]);
            ASSERT_NEAR(y[r * ldy + n], naive_dot(m, n, dequantised.data()), 1e-6 * bound + 1e-30)
                << "rows " << rows << " row " << r << " n " << n << " K " << m.k;
            double half_steps = 0.0;
            for (int64_t k = 0; k < m.k; ++k) {
              half_steps += 0.5 * in.scale[r][k / m.group_k] * std::abs(cpu::panel_value(m, n, k));
            }
            ASSERT_NEAR(y[r * ldy + n], naive_dot(m, n, &x[r * m.k]),
                        half_steps + 1e-6 * bound + 1e-30);
          }
        }
      }
    }
  }
}

// Every code at its largest (15) against every activation at +-127 over one long step: the
// largest partial sums the kernel keeps, which must not wrap.
TEST(Int8StreamingKernelLimits, SumsTheLargestProductsExactly) {
  if (!has_avx2()) GTEST_SKIP() << "this machine has no AVX2+FMA+F16C";
  constexpr int64_t K = 512;
  std::vector<uint8_t> codes(K * cpu::kPanelRows / 2, 0xFF);
  std::vector<float> scale(cpu::kPanelRows, 1.0f);
  PanelMatrix w;
  w.dtype = DType::i4;
  w.data = codes.data();
  w.n = cpu::kPanelRows;
  w.k = K;
  w.group_k = K;
  w.scale = scale.data();
  for (const float value : {1.0f, -1.0f}) {
    const std::vector<float> x(K, value);
    std::vector<int8_t> q(K);
    float x_scale = 0.0f, x_sum = 0.0f;
    cpu::quantize_int8(x.data(), K, K, q.data(), &x_scale, &x_sum);
    ASSERT_EQ(q[0], value > 0 ? 127 : -127);
    for (int m = 1; m <= cpu::kStreamRows; ++m) {
      cpu::Int8Rows in;
      in.m = m;
      for (int r = 0; r < m; ++r) {
        in.q[r] = q.data();
        in.scale[r] = &x_scale;
        in.sums[r] = &x_sum;
      }
      for (const cpu::Int8Dot dot : int8_dots()) {
        std::vector<float> y(m * cpu::kPanelRows, std::numeric_limits<float>::quiet_NaN());
        cpu::stream_panels_int8(w, 0, 1, in, y.data(), cpu::kPanelRows, dot);
        // Each weight is (15 - 8) * 1.
        for (float v : y) EXPECT_FLOAT_EQ(v, 7.0f * K * value) << "rows " << m;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Int4Formats, Int8StreamingKernel,
                         ::testing::ValuesIn(format_shapes(/*w4a16_only=*/true)),
                         format_shape_name);

struct KernelChoiceCase {
  const char* name;
  QuantParams format;
  int64_t hidden;
  int64_t intermediate;
  DType activations;
  bool avx512_bf16;
  Int4Rows int4_rows;
  bool bf16_gemm;
};

// Which rows may take the kernels that compute below f32: int16 only for activations that came
// in as bf16 or f16, int8 wherever the format quantises activations to int8, and only shapes the
// integer kernels can sum exactly.
TEST(KernelChoice, FollowsTheFormatTheActivationsDtypeAndTheShape) {
  using enum Int4Rows;
  const QuantParams int4 = QuantParams::Int4Group(128, DType::bf16, false);
  const QuantParams a8 = QuantParams::Int4GroupA8(128, DType::bf16, false);
  const QuantParams bf16 = QuantParams::Unquantized(WeightFormat::bf16);
  const KernelChoiceCase cases[] = {
      {"int4, bf16 activations", int4, 2048, 768, DType::bf16, true, int16, true},
      {"int4, bf16 activations, no AVX-512 BF16", int4, 2048, 768, DType::bf16, false, int16,
       false},
      {"int4 with zero points, bf16 activations", QuantParams::Int4Group(128, DType::bf16, true),
       2048, 768, DType::bf16, true, int16, false},
      {"int4-a8, bf16 activations, AVX-512 BF16", a8, 2048, 768, DType::bf16, true, int8, false},
      {"fp8-block, bf16 activations", QuantParams::Fp8Block(128), 2048, 768, DType::bf16, true, f32,
       true},
      {"fp8-tensor, bf16 activations, K odd", QuantParams::Fp8Tensor(), 2047, 767, DType::bf16,
       true, f32, true},
      {"fp8-block, f32 activations", QuantParams::Fp8Block(128), 2048, 768, DType::f32, true, f32,
       false},
      {"fp8-block of 127: a pair of k across two groups", QuantParams::Fp8Block(127), 2048, 768,
       DType::bf16, true, f32, false},
      {"int4 in groups of 30 along a K of 2040 (pairs stay in groups)",
       QuantParams::Int4Group(30, DType::bf16, false), 2040, 780, DType::bf16, true, f32, true},
      {"f16 weights, bf16 activations", QuantParams::Unquantized(WeightFormat::f16), 2048, 768,
       DType::bf16, true, f32, false},
      {"int4, f16 activations", int4, 2048, 768, DType::f16, false, int16, false},
      {"int4, f32 activations", int4, 2048, 768, DType::f32, true, f32, false},
      {"int4, groups of 30 end inside a block", QuantParams::Int4Group(30, DType::bf16, false),
       2040, 780, DType::bf16, false, f32, false},
      {"int4, K % 4 == 2", int4, 2048, 770, DType::bf16, false, f32, false},
      {"int4, a group too long for exact int32 sums of int16",
       QuantParams::Int4Group(4096, DType::bf16, false), 4096, 768, DType::bf16, false, f32, false},
      {"int4-a8, bf16 activations", a8, 2048, 768, DType::bf16, false, int8, false},
      {"int4-a8, f32 activations", a8, 2048, 768, DType::f32, false, int8, false},
      {"int4-a8, a group of 4096", QuantParams::Int4GroupA8(4096, DType::bf16, false), 4096, 768,
       DType::bf16, false, int8, false},
      {"int4-a8, groups of 30 end inside a block", QuantParams::Int4GroupA8(30, DType::f16, true),
       2040, 780, DType::bf16, false, f32, false},
      {"int4-a8, K % 4 == 2", a8, 2048, 770, DType::f32, false, f32, false},
      {"bf16, bf16 activations, AVX-512 BF16", bf16, 2048, 768, DType::bf16, true, f32, true},
      {"bf16, bf16 activations, no AVX-512 BF16", bf16, 2048, 768, DType::bf16, false, f32, false},
      {"bf16, f16 activations (finer than bf16)", bf16, 2048, 768, DType::f16, true, f32, false},
      {"bf16, f32 activations", bf16, 2048, 768, DType::f32, true, f32, false},
  };
  for (const KernelChoiceCase& c : cases) {
    const CpuKernels k = planned_kernels(c.format, c.hidden, c.intermediate, c.avx512_bf16);
    EXPECT_EQ(k.routed_int4.of(c.activations), c.int4_rows) << c.name;
    EXPECT_EQ(k.bf16_rows(c.activations), c.bf16_gemm) << c.name;
  }
}

// int4-group-a8's GEMM rows take the int8 GEMM wherever every K is in whole int4 blocks with
// groups of at most 256, on vpdpbusd with AVX-512 VNNI and on pmaddubsw without; otherwise the
// f32 GEMM, with the reason.
TEST(KernelChoice, Int4A8GemmRowsTakeTheInt8GemmOnVnniOrAvx2) {
  const QuantParams a8 = QuantParams::Int4GroupA8(128, DType::bf16, false);
  const CpuKernels vnni = planned_kernels(a8, 2048, 768, false, true);
  EXPECT_TRUE(vnni.int8_gemm && vnni.avx512_vnni);
  EXPECT_NE(vnni.gemm_reason.find("vpdpbusd"), std::string::npos) << vnni.gemm_reason;
  EXPECT_TRUE(planned_kernels(QuantParams::Int4GroupA8(32, DType::f16, true), 2048, 768, true, true)
                  .int8_gemm);
  const CpuKernels avx2 = planned_kernels(a8, 2048, 768, true, false);
  EXPECT_TRUE(avx2.int8_gemm && !avx2.avx512_vnni);
  EXPECT_NE(avx2.gemm_reason.find("pmaddubsw"), std::string::npos) << avx2.gemm_reason;
  const CpuKernels wide = planned_kernels(QuantParams::Int4GroupA8(512), 2048, 1024, false, true);
  EXPECT_FALSE(wide.int8_gemm);
  EXPECT_NE(wide.gemm_reason.find("groups of 512"), std::string::npos) << wide.gemm_reason;
  EXPECT_FALSE(planned_kernels(QuantParams::Int4Group(128), 2048, 768, true, true).int8_gemm);
}

// The e4m3 rounding of fp8 GEMM inputs takes the widest vectors the CPU has (each gives the
// scalar reference's values, tests/runner/test_e4m3_rows.cpp).
TEST(KernelChoice, E4m3RoundingTakesTheWidestVectors) {
  Platform platform = Platform::cpu_only(1);
  const QuantParams fp8 = QuantParams::Fp8Block(128);
  EXPECT_EQ(cpu::choose_cpu_kernels(platform, ModelSpec::demo(), fp8).e4m3, E4m3Rounding::scalar);
  platform.avx2 = platform.fma = platform.f16c = true;
  EXPECT_EQ(cpu::choose_cpu_kernels(platform, ModelSpec::demo(), fp8).e4m3, E4m3Rounding::avx2);
  platform.avx512f = true;
  EXPECT_EQ(cpu::choose_cpu_kernels(platform, ModelSpec::demo(), fp8).e4m3, E4m3Rounding::avx512);
}

// Streamed e4m3 rows take AVX-512F vectors where the CPU has them; other weights never do.
TEST(KernelChoice, E4m3RowsStreamOnAvx512fWhereTheCpuHasIt) {
  Platform platform = Platform::cpu_only(1);
  platform.avx2 = platform.fma = platform.f16c = true;
  const QuantParams fp8 = QuantParams::Fp8Block(128);
  EXPECT_FALSE(cpu::choose_cpu_kernels(platform, ModelSpec::demo(), fp8).e4m3_stream_avx512);
  platform.avx512f = true;
  const CpuKernels k = cpu::choose_cpu_kernels(platform, ModelSpec::demo(), fp8);
  EXPECT_TRUE(k.e4m3_stream_avx512);
  EXPECT_NE(cpu::describe(k).find("e4m3 rows streamed on AVX-512F"), std::string::npos);
  EXPECT_FALSE(cpu::choose_cpu_kernels(platform, ModelSpec::demo(),
                                       QuantParams::Unquantized(WeightFormat::bf16))
                   .e4m3_stream_avx512);
}

// One or two streamed 16-bit or int8 rows prefetch closer on the family that was measured faster
// so (Zen 2), the int8 rows into L2 as well, and 2 KB into L1 everywhere else, Intel's Xeon
// (measured slower with 768 bytes) among them.
TEST(KernelChoice, StreamPrefetchIsShorterOnZen2Alone) {
  struct Case {
    const char* vendor;
    int family;
    StreamPrefetch panel, int8;
  };
  const StreamPrefetch l1_2k{.l1_bytes = 2048, .l2_bytes = 0};
  const Case cases[] = {
      {"AuthenticAMD", 0x17, {.l1_bytes = 768}, {.l1_bytes = 512, .l2_bytes = 4096}},
      {"AuthenticAMD", 0x19, l1_2k, l1_2k},
      {"AuthenticAMD", 0x1A, l1_2k, l1_2k},
      {"GenuineIntel", 6, l1_2k, l1_2k},
      {"", 0, l1_2k, l1_2k}};
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("{} family {:x}h", c.vendor, c.family));
    Platform platform = Platform::cpu_only(2);
    platform.avx2 = platform.fma = platform.f16c = true;
    platform.cpu_vendor = c.vendor;
    platform.cpu_family = c.family;
    const CpuKernels k = cpu::choose_cpu_kernels(platform, ModelSpec::demo(),
                                                 QuantParams::Unquantized(WeightFormat::bf16));
    EXPECT_EQ(k.panel_prefetch.l1_bytes, c.panel.l1_bytes);
    EXPECT_EQ(k.panel_prefetch.l2_bytes, c.panel.l2_bytes);
    EXPECT_EQ(k.int8_prefetch.l1_bytes, c.int8.l1_bytes);
    EXPECT_EQ(k.int8_prefetch.l2_bytes, c.int8.l2_bytes);
    const bool zen2 = c.panel.l1_bytes == 768;
    EXPECT_NE(cpu::describe(k).find(zen2 ? "768 bytes ahead" : "2 KB ahead"), std::string::npos)
        << cpu::describe(k);
  }
}

TEST(KernelChoice, IsPortableWithoutAvx2FmaAndF16c) {
  const CpuKernels k = cpu::choose_cpu_kernels(Platform::cpu_only(2), ModelSpec::demo(),
                                               QuantParams::Int4Group(128, DType::bf16, false));
  EXPECT_EQ(k.set, CpuKernelSet::portable);
  EXPECT_FALSE(k.bf16_gemm);
  EXPECT_EQ(k.routed_int4.half, Int4Rows::f32);
}

// Shared experts computed apart get a choice of their own: their I may allow what the routed
// experts' does not.
TEST(KernelChoice, SharedExpertsOfAnotherWidthAreChosenApart) {
  ModelSpec spec = ModelSpec::demo();
  spec.intermediate = 770;  // K % 4 == 2: no integer rows for the routed experts
  spec.shared_intermediate = 1536;
  Platform platform = Platform::cpu_only(2);
  platform.avx2 = platform.fma = platform.f16c = true;
  const CpuKernels k =
      cpu::choose_cpu_kernels(platform, spec, QuantParams::Int4Group(128, DType::bf16, false));
  EXPECT_EQ(k.routed_int4.half, Int4Rows::f32);
  EXPECT_EQ(k.shared_int4.half, Int4Rows::int16);
}

// The grouped path: rows for one expert from 1 to 8 (streamed, in passes of up to four rows)
// and 20 (the GEMM), with another expert's rows and an idle expert around them, each row's
// result weighted into a token row.
struct GroupCase {
  KernelFormat format;
  Activation activation;
  int64_t rows;
  // bf16: int4 decode takes int16 rows, and bf16 weights the AVX-512 BF16 GEMM where present.
  DType activations = DType::f32;
};

std::vector<GroupCase> group_cases() {
  std::vector<GroupCase> cases;
  for (const KernelFormat& f : kernel_formats()) {
    // fp8 formats also round the GEMM inputs; the layer tests check those against the oracle.
    if (f.params.quantizes_activations()) continue;
    for (int64_t rows : {1, 2, 3, 4, 5, 7, 8, 20}) {
      cases.push_back({f, Activation::SiluGated(), rows});
      const DType w = f.params.weight_dtype;
      if (w == DType::i4 || (w == DType::bf16 && (rows == 3 || rows == 20))) {
        cases.push_back({f, Activation::SiluGated(), rows, DType::bf16});
      }
    }
  }
  for (const Activation& a : {Activation::GeluGated(), Activation::SwigluOai()}) {
    cases.push_back({kernel_formats()[1], a, 3});
    cases.push_back({kernel_formats()[1], a, 20});
  }
  return cases;
}

std::string group_case_name(const ::testing::TestParamInfo<GroupCase>& info) {
  const GroupCase& c = info.param;
  const char* activation = c.activation.kind == ActivationKind::silu_gated   ? "silu"
                           : c.activation.kind == ActivationKind::gelu_gated ? "gelu"
                                                                             : "swiglu_oai";
  return fmt::format("{}_{}_rows{}_{}", c.format.name, activation, c.rows,
                     dtype_name(c.activations));
}

class GroupedRows : public ::testing::TestWithParam<GroupCase> {
 protected:
  void SetUp() override {
    if (!has_avx2()) GTEST_SKIP() << "this machine has no AVX2+FMA+F16C";
  }
};

TEST_P(GroupedRows, AddWeightedExpertOutputsIntoTheirTokenRows) {
  const GroupCase& c = GetParam();
  const int64_t H = 72, I = 20, tokens = 5;
  const int slots = 3;  // slot 0: c.rows rows, slot 1: none, slot 2: two rows
  const int64_t n_rows = c.rows + 2;
  const ExpertsProblem problem{.hidden = H,
                               .intermediate = I,
                               .activation = c.activation,
                               .slots = slots,
                               .columns = 1,
                               .max_tokens = n_rows,
                               .threads = 2,
                               .quant = c.format.params};
  const Platform here = Platform::probe();
  const CpuKernels kernels =
      planned_kernels(c.format.params, H, I, here.avx512_bf16, here.avx512_vnni);
  const TwoLayouts w(c.format.params, slots, H, I, 13);
  const CoreWeights packed = w.packed.apply();

  std::vector<float> x = random_rows(n_rows, H, 17);
  const std::vector<float> x_given = x;
  const std::vector<int64_t> offsets = {0, c.rows, c.rows, n_rows};
  std::vector<int32_t> out_row(n_rows);
  std::vector<float> weight(n_rows);
  for (int64_t r = 0; r < n_rows; ++r) {
    out_row[r] = static_cast<int32_t>(r * 3 % tokens);
    weight[r] = 0.25f + 0.125f * static_cast<float>(r % 4);
  }
  std::vector<float> out(tokens * H, std::numeric_limits<float>::quiet_NaN());
  cpu::PanelMoe moe(problem, kernels, kernels.routed_int4);
  std::vector<std::byte> scratch(moe.scratch_bytes() + kScratchAlignment);
  void* aligned = reinterpret_cast<void*>(scratch_align(reinterpret_cast<int64_t>(scratch.data())));
  ThreadPool pool(2);
  moe.run({x.data(), n_rows, offsets.data(), out_row.data(), weight.data(), out.data(), tokens,
           c.activations},
          packed, aligned, pool);

  std::vector<double> want(tokens * H, 0.0), bound(tokens * H, 0.0);
  for (int slot = 0; slot < slots; ++slot) {
    const PanelMatrix w13 = cpu::panel_weights(packed).w13.slot(slot),
                      w2 = cpu::panel_weights(packed).w2.slot(slot);
    for (int64_t r = offsets[slot]; r < offsets[slot + 1]; ++r) {
      std::vector<float> act(I);
      double act_bound = 0.0;
      for (int64_t i = 0; i < I; ++i) {
        const int64_t gate_n = i / 8 * 16 + i % 8;
        const double gate = naive_dot(w13, gate_n, &x_given[r * H]);
        const double up = naive_dot(w13, gate_n + 8, &x_given[r * H]);
        act[i] = static_cast<float>(kernels::activate(c.activation, gate, up));
        act_bound += std::abs(act[i]);
      }
      for (int64_t h = 0; h < H; ++h) {
        want[out_row[r] * H + h] += weight[r] * naive_dot(w2, h, act.data());
        bound[out_row[r] * H + h] += weight[r] * (abs_dot(w2, h, act.data()) + act_bound * 1e-2);
      }
    }
  }
  // int16 rows carry up to 2^-16 of each step's largest magnitude as error, in both GEMMs; bf16
  // rounding (bf16 weights, or any GEMM whose rows are rounded to bf16) up to 2^-9 of each input.
  const bool bf16_rounding =
      c.format.params.weight_dtype == DType::bf16 || kernels.bf16_rows(c.activations);
  const double relative = c.activations == DType::f32 ? 1e-4 : bf16_rounding ? 1e-2 : 1e-3;
  for (int64_t i = 0; i < tokens * H; ++i) {
    ASSERT_NEAR(out[i], want[i], relative * bound[i] + 1e-30)
        << "token " << i / H << " column " << i % H;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, GroupedRows, ::testing::ValuesIn(group_cases()), group_case_name);

struct Int16Case {
  const char* name;
  std::vector<float> x;
  int64_t group_k;
};

// quantize_int16 per step: the largest magnitude becomes +-32767, every value is within half a
// step of scale of x, the sums are the sums of q; zeros give scale 0, NaN or infinity a NaN
// scale (so the outputs the row reaches are NaN, not a number made up).
TEST(QuantizeInt16, KeepsEveryValueWithinHalfAStepAndFlagsNonFinite) {
  if (!has_avx2()) GTEST_SKIP() << "this machine has no AVX2+FMA+F16C";
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> ramp(40);
  for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = 0.37f * static_cast<float>(i) - 5.1f;
  const Int16Case cases[] = {
      {"ramp, steps of 16 and a partial last", ramp, 16},
      {"one step, odd tail", {1.5f, -3.0f, 0.25f, 2.0f, 7.0f}, 8},
      {"zeros", std::vector<float>(12, 0.0f), 4},
      {"nan", {1.0f, kNan, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 9.0f}, 10},
      {"infinity in the tail", {1.0f, 2.0f, std::numeric_limits<float>::infinity()}, 4},
  };
  for (const Int16Case& c : cases) {
    SCOPED_TRACE(c.name);
    const auto k = static_cast<int64_t>(c.x.size());
    const int64_t steps = (k + c.group_k - 1) / c.group_k;
    std::vector<int16_t> q(c.x.size(), 12345);
    std::vector<float> scale(steps, -1.0f), sums(steps, -1.0f);
    cpu::quantize_int16(c.x.data(), k, c.group_k, q.data(), scale.data(), sums.data());
    for (int64_t g = 0; g < steps; ++g) {
      const int64_t k0 = g * c.group_k, k1 = std::min(k, k0 + c.group_k);
      bool finite = true;
      float top = 0.0f;
      int64_t sum = 0;
      for (int64_t i = k0; i < k1; ++i) {
        finite = finite && std::isfinite(c.x[i]);
        top = std::max(top, std::fabs(c.x[i]));
        sum += q[i];
      }
      if (!finite) {
        EXPECT_TRUE(std::isnan(scale[g])) << "step " << g;
        continue;
      }
      EXPECT_EQ(sums[g], static_cast<float>(sum)) << "step " << g;
      if (top == 0.0f) {
        EXPECT_EQ(scale[g], 0.0f);
        for (int64_t i = k0; i < k1; ++i) EXPECT_EQ(q[i], 0);
        continue;
      }
      EXPECT_FLOAT_EQ(scale[g], top / 32767.0f);
      int16_t largest = 0;
      for (int64_t i = k0; i < k1; ++i) {
        EXPECT_LE(std::fabs(q[i] * scale[g] - c.x[i]), 0.5001 * scale[g]) << "x[" << i << "]";
        largest = std::max<int16_t>(largest, static_cast<int16_t>(std::abs(q[i])));
      }
      EXPECT_EQ(largest, 32767);
    }
  }
}

struct Int8Case {
  const char* name;
  std::vector<float> x;
  int64_t group_k;
};

// quantize_int8 per step stores exactly the codes, scales and sums of the int8 activation format
// (quantize_activation_row), in the order of Int8Rows; the same again from rows that already hold
// the format's q * scale; and a NaN scale for a step with NaN or infinity. round_to_int8 gives the
// format's q * scale, NaN for such a step.
TEST(QuantizeInt8, StoresTheFormatsCodesInBlockOrderAndFlagsNonFinite) {
  if (!has_avx2()) GTEST_SKIP() << "this machine has no AVX2+FMA+F16C";
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> ramp(44);
  for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = 0.37f * static_cast<float>(i) - 5.1f;
  // amax 127: scale 1, so x.5 lies exactly between two codes and rounds to the even one.
  std::vector<float> ties = {127.0f, 2.5f, 3.5f, -2.5f, -0.5f, 0.5f, 1.5f, -126.5f};
  const Int8Case cases[] = {
      {"ramp, steps of 16 and a last of 12 (a block after whole eights)", ramp, 16},
      {"halves round to even", ties, 8},
      {"steps of 4", ramp, 4},
      {"zeros and values below the amax floor",
       {0.0f, 0.0f, 0.0f, 0.0f, 1e-12f, -3e-11f, 0.0f, 2e-11f},
       4},
      {"nan", {1.0f, kNan, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 9.0f, 1.0f, 2.0f}, 12},
      {"infinity in the last block",
       {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 9.0f, 1.0f,
        std::numeric_limits<float>::infinity(), 2.0f},
       12},
  };
  const QuantParams format = QuantParams::Int4GroupA8(4, DType::bf16, false);
  for (const Int8Case& c : cases) {
    SCOPED_TRACE(c.name);
    const auto k = static_cast<int64_t>(c.x.size());
    const int64_t steps = (k + c.group_k - 1) / c.group_k;
    std::vector<int8_t> q(c.x.size(), 99), again(c.x.size(), 99);
    std::vector<float> scale(steps, -1.0f), sums(steps, -1.0f);
    cpu::quantize_int8(c.x.data(), k, c.group_k, q.data(), scale.data(), sums.data());
    QuantParams grouped = format;
    grouped.activation_group = c.group_k;
    std::vector<float> dequantised(c.x.size());
    quantize_activation_row(grouped, 0.0f, c.x.data(), k, dequantised.data());
    std::vector<float> scale_again(steps), sums_again(steps);
    cpu::quantize_int8(dequantised.data(), k, c.group_k, again.data(), scale_again.data(),
                       sums_again.data());
    std::vector<float> rounded = c.x;
    cpu::round_to_int8(rounded.data(), k, c.group_k);
    for (int64_t g = 0; g < steps; ++g) {
      const int64_t k0 = g * c.group_k, k1 = std::min(k, k0 + c.group_k);
      bool finite = true;
      float top = 0.0f;
      for (int64_t i = k0; i < k1; ++i) {
        finite = finite && std::isfinite(c.x[i]);
        top = std::max(top, std::fabs(c.x[i]));
      }
      if (!finite) {
        EXPECT_TRUE(std::isnan(scale[g])) << "step " << g;
        for (int64_t i = k0; i < k1; ++i) EXPECT_TRUE(std::isnan(rounded[i])) << "x[" << i << "]";
        continue;
      }
      const float want_scale = std::max(top, kActivationAmaxFloor) / kInt8Max;
      for (int64_t i = k0; i < k1; ++i) EXPECT_EQ(rounded[i], dequantised[i]) << "x[" << i << "]";
      EXPECT_EQ(scale[g], want_scale) << "step " << g;
      int64_t sum = 0;
      for (int64_t i = k0; i < k1; ++i) {
        const int8_t code = int8_code_at(q.data(), i);
        EXPECT_EQ(code, static_cast<int8_t>(int8_code(c.x[i], want_scale))) << "x[" << i << "]";
        EXPECT_EQ(dequantised[i], static_cast<float>(code) * want_scale) << "x[" << i << "]";
        EXPECT_EQ(int8_code_at(again.data(), i), code) << "requantised x[" << i << "]";
        sum += code;
      }
      EXPECT_EQ(sums[g], static_cast<float>(sum)) << "step " << g;
      EXPECT_EQ(sums_again[g], sums[g]) << "step " << g;
    }
  }
  const std::vector<int8_t> want_ties = {127, 2, 4, -2, 0, 0, 2, -126};
  std::vector<int8_t> q(8);
  std::vector<float> scale(1), sums(1);
  cpu::quantize_int8(ties.data(), 8, 8, q.data(), scale.data(), sums.data());
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(int8_code_at(q.data(), i), want_ties[i]) << i;
}

}  // namespace
}  // namespace moekit::test
