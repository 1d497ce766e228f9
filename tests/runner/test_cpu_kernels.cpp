// The cpu runner's AVX2 pieces one at a time: the quant method's panel16 packing against the
// canonical weights it replaces, the streaming kernel and the grouped GEMM1 -> activation ->
// GEMM2 -> weighted sum against double-precision loops over the same packed values.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "core/thread_pool.hpp"
#include "quant/dequantize.hpp"
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

std::vector<FormatShape> format_shapes() {
  std::vector<FormatShape> cases;
  for (const KernelFormat& f : kernel_formats()) {
    for (const KernelShape& s : kernel_shapes()) cases.push_back({f, s});
  }
  return cases;
}

std::string format_shape_name(const ::testing::TestParamInfo<FormatShape>& info) {
  return info.param.format.name + "_" + info.param.shape.name;
}

constexpr int kSlots = 3;

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
  EXPECT_EQ(check(canonical.w13, packed.w13_panels, cpu::PanelOrder::gate_up_interleaved, 2 * I, H),
            0);
  EXPECT_EQ(check(canonical.w2, packed.w2_panels, cpu::PanelOrder::rows, H, I), 0);
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

class StreamingKernel : public ::testing::TestWithParam<FormatShape> {
 protected:
  void SetUp() override {
    if (!has_avx2()) GTEST_SKIP() << "this machine has no AVX2+FMA+F16C";
  }
};

// Rows 1..kStreamRows through one pass, over w13 (K = H) and w2 (K = I), every panel.
TEST_P(StreamingKernel, MatchesADoubleLoopForEachRowCount) {
  const auto& [format, shape] = GetParam();
  const TwoLayouts w(format.params, 1, shape.hidden, shape.intermediate, 7);
  const CoreWeights packed = w.packed.apply();
  for (const PanelMatrix& m : {packed.w13_panels.slot(0), packed.w2_panels.slot(0)}) {
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
      cpu::stream_panels(m, 0, m.panels(), in, y.data(), ldy);
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

INSTANTIATE_TEST_SUITE_P(Formats, StreamingKernel, ::testing::ValuesIn(format_shapes()),
                         format_shape_name);

// The grouped path: rows for one expert from 1 to 8 (streamed, in passes of up to four rows)
// and 20 (the GEMM), with another expert's rows and an idle expert around them, each row's
// result weighted into a token row.
struct GroupCase {
  KernelFormat format;
  Activation activation;
  int64_t rows;
};

std::vector<GroupCase> group_cases() {
  std::vector<GroupCase> cases;
  for (const KernelFormat& f : kernel_formats()) {
    // fp8 formats also round the GEMM inputs; the layer tests check those against the oracle.
    if (f.params.quantizes_activations()) continue;
    for (int64_t rows : {1, 2, 3, 4, 5, 7, 8, 20}) {
      cases.push_back({f, Activation::SiluGated(), rows});
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
  return fmt::format("{}_{}_rows{}", c.format.name, activation, c.rows);
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
  ExpertsProblem problem{H, I, c.activation, slots, 1, n_rows, 2};
  problem.kernels = CpuKernels::avx2_panels;
  problem.quant = c.format.params;
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
  cpu::PanelMoe moe(problem);
  std::vector<std::byte> scratch(moe.scratch_bytes() + kScratchAlignment);
  void* aligned = reinterpret_cast<void*>(scratch_align(reinterpret_cast<int64_t>(scratch.data())));
  ThreadPool pool(2);
  moe.run({x.data(), n_rows, offsets.data(), out_row.data(), weight.data(), out.data(), tokens},
          packed, aligned, pool);

  std::vector<double> want(tokens * H, 0.0), bound(tokens * H, 0.0);
  for (int slot = 0; slot < slots; ++slot) {
    const PanelMatrix w13 = packed.w13_panels.slot(slot), w2 = packed.w2_panels.slot(slot);
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
  for (int64_t i = 0; i < tokens * H; ++i) {
    ASSERT_NEAR(out[i], want[i], 1e-4 * bound[i] + 1e-30)
        << "token " << i / H << " column " << i % H;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, GroupedRows, ::testing::ValuesIn(group_cases()), group_case_name);

}  // namespace
}  // namespace moekit::test
