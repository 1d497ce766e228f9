#include <algorithm>
#include <string>

#include "block/cuda/block_kernels.hpp"
#include "core/cuda_common.cuh"
#include "core/cuda_finite.cuh"
#include "core/cuda_launch.cuh"

namespace moekit::block::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;  // grid-stride beyond this: enough to fill any GPU

using cuda_finite::FiniteTensor;

// Tensor 0's elements, then tensor 1's, in one grid-stride loop.
__global__ void check_finite_kernel(FiniteTensor a, FiniteTensor b) {
  cuda_launch::wait_for_inputs();
  cuda_launch::release_dependents();
  cuda_finite::check_elements(a, b, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
                              static_cast<int64_t>(gridDim.x) * blockDim.x);
}

__global__ void shared_gate_kernel(const void* hidden, DType dtype, int64_t hidden_size,
                                   const float* gate, float* out) {
  cuda_launch::wait_for_inputs();
  cuda_launch::release_dependents();
  __shared__ double partial[kThreads / 32];
  const int64_t t = blockIdx.x;
  double dot = 0.0;
  for (int64_t h = threadIdx.x; h < hidden_size; h += kThreads) {
    dot += static_cast<double>(cuda_common::load_float(hidden, dtype, t * hidden_size + h)) *
           static_cast<double>(gate[h]);
  }
  dot = cuda_common::warp_sum(dot);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = dot;
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (int w = 0; w < kThreads / 32; ++w) sum += partial[w];
    out[t] = static_cast<float>(1.0 / (1.0 + exp(-sum)));
  }
}

void check_dtype(DType dtype, const char* kernel, const char* input) {
  if (!cuda_common::is_activation_dtype(dtype)) {
    cuda_errors::invalid_argument(std::string(kernel) + ": " + input + " dtype " +
                                  std::string(dtype_name(dtype)) +
                                  " is not supported (f32, bf16 or f16)");
  }
}

FiniteTensor checked(const FiniteCheckArgs& args) {
  check_dtype(args.dtype, "check_finite", "the tensor's");
  if (args.rows < 0 || args.columns < 0 || args.columns >= (int64_t{1} << 32) ||
      args.rows >= (int64_t{1} << 32)) {
    cuda_errors::invalid_argument("check_finite: shape [" + std::to_string(args.rows) + ", " +
                                  std::to_string(args.columns) + "] is out of range");
  }
  const int64_t n = args.rows * args.columns;
  if (n > 0 && (args.data == nullptr || args.status == nullptr)) {
    cuda_errors::invalid_argument("check_finite: data and status must not be null");
  }
  return {args.data, args.dtype, args.columns, n, n > 0 ? &args.status->first : nullptr};
}

void launch_check(const FiniteTensor& a, const FiniteTensor& b, cudaStream_t stream) {
  const int64_t n = a.elements + b.elements;
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>(cuda_common::blocks_for(n, kThreads), kMaxBlocks);
  cuda_launch::launch(check_finite_kernel, static_cast<unsigned>(blocks), kThreads, 0, stream, a,
                      b);
  cuda_common::check_launch("check_finite");
}

}  // namespace

void reset_finite_status(FiniteStatus* status, int count, cudaStream_t stream) {
  if (count <= 0) return;
  // All bytes 0xff is kAllFinite.
  const cudaError_t result =
      cudaMemsetAsync(status, 0xff, sizeof(FiniteStatus) * static_cast<size_t>(count), stream);
  if (result != cudaSuccess) {
    cudaGetLastError();
    cuda_errors::internal(std::string("reset_finite_status: ") + cudaGetErrorString(result));
  }
}

void check_finite(const FiniteCheckArgs& args, cudaStream_t stream) {
  launch_check(checked(args), FiniteTensor{}, stream);
}

void check_finite(const FiniteCheckArgs& first, const FiniteCheckArgs& second,
                  cudaStream_t stream) {
  launch_check(checked(first), checked(second), stream);
}

std::array<cuda_finite::FiniteTensor, 2> finite_check_tensors(const FiniteCheckArgs& first,
                                                              const FiniteCheckArgs& second) {
  return {checked(first), checked(second)};
}

void shared_gate(const SharedGateArgs& args, cudaStream_t stream) {
  check_dtype(args.hidden_dtype, "shared_gate", "hidden_states");
  if (args.tokens < 0 || args.hidden_size < 1) {
    cuda_errors::invalid_argument("shared_gate: bad sizes (tokens " + std::to_string(args.tokens) +
                                  ", hidden " + std::to_string(args.hidden_size) + ")");
  }
  if (args.tokens == 0) return;
  if (args.hidden == nullptr || args.gate == nullptr || args.out == nullptr) {
    cuda_errors::invalid_argument("shared_gate: hidden, gate and out must not be null");
  }
  cuda_launch::launch(shared_gate_kernel, static_cast<unsigned>(args.tokens), kThreads, 0, stream,
                      args.hidden, args.hidden_dtype, args.hidden_size, args.gate, args.out);
  cuda_common::check_launch("shared_gate");
}

}  // namespace moekit::block::cuda
