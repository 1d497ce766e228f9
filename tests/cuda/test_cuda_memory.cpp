// Device memory, copies and the GPU probe. The tests of absent devices run on every machine:
// without a GPU they check the "no CUDA device" refusal, with one the refusal of an index past
// the last GPU.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <numeric>

#include "cuda/cuda_support.hpp"
#include "moekit/error.hpp"
#include "moekit/platform.hpp"
#include "moekit/tensor.hpp"

namespace moekit {
namespace {

using cuda_testing::download;
using cuda_testing::no_gpu_reason;

int gpu_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

void expect_error(Errc code, std::initializer_list<const char*> words, auto&& action) {
  try {
    action();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const char* word : words) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos)
          << "'" << word << "' not in: " << e.what();
    }
  }
}

TEST(CudaMemory, AllocatingOnAnAbsentGpuNamesTheDeviceAndTheReason) {
  const int absent = gpu_count();  // cuda:0 on a machine without GPUs
  const Device device = Device::cuda(absent);
  const char* reason = absent == 0 ? "no CUDA device" : "CUDA device";
  expect_error(Errc::invalid_argument, {device.str().c_str(), reason},
               [&] { Buffer::allocate(device, 256); });
}

TEST(CudaMemory, AnAllocationTooLargeIsOutOfMemoryNamingBytesAndDevice) {
  MOEKIT_REQUIRE_GPU();
  const int64_t bytes = int64_t{1} << 50;
  expect_error(Errc::out_of_memory, {"1125899906842624", "cuda:0"},
               [&] { Buffer::allocate(Device::cuda(0), bytes); });
}

TEST(CudaMemory, FillBytesWritesEveryByteOnTheDevice) {
  MOEKIT_REQUIRE_GPU();
  Tensor t = Tensor::empty(DType::i8, {3, 1001}, Device::cuda(0));
  EXPECT_EQ(t.view().device, Device::cuda(0));
  t.fill_bytes(0xA7);
  for (uint8_t byte : download<uint8_t>(t)) ASSERT_EQ(byte, 0xA7);
}

TEST(CudaMemory, CopiesRoundTripBetweenHostAndDevice) {
  MOEKIT_REQUIRE_GPU();
  std::vector<float> host(777);
  std::iota(host.begin(), host.end(), -300.5f);
  const Shape shape{7, 111};
  Tensor a = Tensor::empty(DType::f32, shape, Device::cuda(0));
  Tensor b = Tensor::empty(DType::f32, shape, Device::cuda(0));
  copy(a, TensorView::contiguous(host.data(), DType::f32, shape));
  copy(b, a);  // device to device
  EXPECT_EQ(download<float>(b), host);
}

TEST(CudaMemory, CopyAsyncRunsOnTheGivenStream) {
  MOEKIT_REQUIRE_GPU();
  std::vector<int32_t> host(4096);
  std::iota(host.begin(), host.end(), 1);
  std::vector<int32_t> back(host.size(), 0);
  const Shape shape{4096};
  Tensor d = Tensor::empty(DType::i32, shape, Device::cuda(0));
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  copy_async(d, TensorView::contiguous(host.data(), DType::i32, shape), stream);
  copy_async(TensorView::contiguous(back.data(), DType::i32, shape), d, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
  EXPECT_EQ(back, host);
}

TEST(CudaMemory, CopyRefusesTensorsThatDoNotMatch) {
  float host[6] = {};
  const TensorView a = TensorView::contiguous(host, DType::f32, {2, 3});
  const TensorView b = TensorView::contiguous(host, DType::f32, {3, 2});
  expect_error(Errc::invalid_argument, {"copy", "[2, 3]", "[3, 2]"}, [&] { copy(a, b); });
  TensorView strided = a;
  strided.strides = {1, 2};
  expect_error(Errc::invalid_argument, {"contiguous"}, [&] { copy(strided, a); });
}

TEST(CudaPlatform, ProbeReportsEachGpuOrWhyThereIsNone) {
  const Platform platform = Platform::probe();
  EXPECT_TRUE(platform.cuda_runtime);
  if (!no_gpu_reason().empty()) {
    EXPECT_TRUE(platform.gpus.empty());
    EXPECT_FALSE(platform.gpu_note.empty());
    EXPECT_NE(platform.summary().find("no GPU"), std::string::npos) << platform.summary();
    return;
  }
  ASSERT_EQ(static_cast<int>(platform.gpus.size()), gpu_count());
  for (size_t i = 0; i < platform.gpus.size(); ++i) {
    const GpuInfo& gpu = platform.gpus[i];
    EXPECT_EQ(gpu.index, static_cast<int>(i));
    EXPECT_FALSE(gpu.name.empty());
    EXPECT_GE(gpu.compute_major, 1);
    EXPECT_GT(gpu.sm_count, 0);
    EXPECT_GT(gpu.memory_bytes, int64_t{1} << 30);
    EXPECT_GT(gpu.l2_bytes, 0);
    EXPECT_NE(platform.summary().find(gpu.name), std::string::npos) << platform.summary();
  }
}

}  // namespace
}  // namespace moekit
