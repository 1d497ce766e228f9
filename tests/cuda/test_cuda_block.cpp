// The block layer's device kernels: the finite checks name the first bad element as the CPU
// check does, and the shared gate matches float64.

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "block/cuda/block_kernels.hpp"
#include "cuda/cuda_support.hpp"

namespace moekit {
namespace {

using namespace cuda_testing;
using block::cuda::FiniteStatus;

block::cuda::NonFiniteAt checked(const Tensor& data, int64_t rows, int64_t columns) {
  Tensor status = poisoned(DType::i8, {static_cast<int64_t>(sizeof(FiniteStatus))});
  auto* s = static_cast<FiniteStatus*>(status.view().data);
  block::cuda::reset_finite_status(s, 1, nullptr);
  block::cuda::check_finite({.data = data.view().data,
                             .dtype = data.view().dtype,
                             .rows = rows,
                             .columns = columns,
                             .status = s},
                            nullptr);
  FiniteStatus host;
  copy(TensorView::contiguous(&host, DType::i8, {static_cast<int64_t>(sizeof host)}), status);
  return block::cuda::decode_finite_status(host);
}

class CudaFiniteCheck : public ::testing::TestWithParam<DType> {};

TEST_P(CudaFiniteCheck, NamesTheFirstBadRowAndColumn) {
  MOEKIT_REQUIRE_GPU();
  const DType dtype = GetParam();
  const int64_t rows = 257, columns = 1000;
  std::vector<float> x = normal(rows * columns, 1);
  x[200 * columns + 999] = std::nanf("");
  x[131 * columns + 17] = -INFINITY;
  x[131 * columns + 4] = std::nanf("");
  x[131 * columns + 900] = INFINITY;
  const Tensor bad = upload(as_dtype(x, dtype).bytes, dtype, {rows, columns});
  const block::cuda::NonFiniteAt at = checked(bad, rows, columns);
  EXPECT_TRUE(at.found);
  EXPECT_EQ(at.row, 131);
  EXPECT_EQ(at.column, 4);
}

TEST_P(CudaFiniteCheck, FindsNothingInFiniteDataIncludingTheLargestValues) {
  MOEKIT_REQUIRE_GPU();
  const DType dtype = GetParam();
  std::vector<float> x = normal(3 * 77, 2);
  x[5] = dtype == DType::f16 ? 65504.0f : dtype == DType::bf16 ? 3.3895314e38f : 3.4028235e38f;
  x[6] = -x[5];
  const Tensor good = upload(as_dtype(x, dtype).bytes, dtype, {3, 77});
  EXPECT_FALSE(checked(good, 3, 77).found);
  EXPECT_FALSE(checked(good, 0, 77).found);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaFiniteCheck,
                         ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         [](const auto& test) { return std::string(dtype_name(test.param)); });

TEST(CudaFiniteStatus, KeepsTheEarlierElementAcrossChecksUntilReset) {
  MOEKIT_REQUIRE_GPU();
  std::vector<float> a(4 * 8, 1.0f), b(4 * 8, 1.0f);
  a[3 * 8 + 1] = INFINITY;
  b[1 * 8 + 6] = std::nanf("");
  const Tensor da = upload(a, DType::f32, {4, 8});
  const Tensor db = upload(b, DType::f32, {4, 8});
  Tensor status = poisoned(DType::i8, {static_cast<int64_t>(sizeof(FiniteStatus))});
  auto* s = static_cast<FiniteStatus*>(status.view().data);
  block::cuda::reset_finite_status(s, 1, nullptr);
  for (const Tensor* t : {&da, &db}) {
    block::cuda::check_finite({.data = t->view().data, .rows = 4, .columns = 8, .status = s},
                              nullptr);
  }
  FiniteStatus host;
  const TensorView host_view =
      TensorView::contiguous(&host, DType::i8, {static_cast<int64_t>(sizeof host)});
  copy(host_view, status);
  const block::cuda::NonFiniteAt at = block::cuda::decode_finite_status(host);
  EXPECT_TRUE(at.found);
  EXPECT_EQ(at.row, 1);
  EXPECT_EQ(at.column, 6);
  block::cuda::reset_finite_status(s, 1, nullptr);
  copy(host_view, status);
  EXPECT_FALSE(block::cuda::decode_finite_status(host).found);
}

class CudaSharedGate : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(CudaSharedGate, IsTheSigmoidOfTheDotInFloat64) {
  MOEKIT_REQUIRE_GPU();
  const auto [dtype, T] = GetParam();
  const int64_t H = 1000;
  const Activations hidden = as_dtype(normal(T * H, 4, 0.2f), dtype);
  const std::vector<float> gate = normal(H, 6, 0.1f);
  const Tensor d_hidden = upload(hidden.bytes, dtype, {T, H});
  const Tensor d_gate = upload(gate, DType::f32, {H});
  Tensor out = poisoned(DType::f32, {T});
  block::cuda::shared_gate({.hidden = d_hidden.view().data,
                            .hidden_dtype = dtype,
                            .tokens = T,
                            .hidden_size = H,
                            .gate = d_gate.data<float>(),
                            .out = out.data<float>()},
                           nullptr);
  const std::vector<float> got = download<float>(out);
  for (int64_t t = 0; t < T; ++t) {
    double dot = 0.0;
    for (int64_t h = 0; h < H; ++h) dot += double{hidden.values[t * H + h]} * gate[h];
    const double want = 1.0 / (1.0 + std::exp(-dot));
    ASSERT_NEAR(got[t], want, 1e-6) << "token " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaSharedGate,
                         ::testing::Combine(::testing::Values(DType::f32, DType::bf16, DType::f16),
                                            ::testing::Values(int64_t{0}, int64_t{1}, int64_t{3},
                                                              int64_t{257})),
                         [](const auto& test) {
                           return std::string(dtype_name(std::get<0>(test.param))) + "_T" +
                                  std::to_string(std::get<1>(test.param));
                         });

}  // namespace
}  // namespace moekit
