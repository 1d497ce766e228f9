#include <algorithm>
#include <string>

#include "block/cuda/block_kernels.hpp"
#include "core/cuda_common.cuh"
#include "core/cuda_launch.cuh"

namespace moekit::block::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;  // grid-stride beyond this: enough to fill any GPU

// An element is NaN or Inf exactly when its exponent bits are all ones.
__device__ bool non_finite(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::f32:
      return (static_cast<const uint32_t*>(data)[i] & 0x7f800000u) == 0x7f800000u;
    case DType::bf16:
      return (static_cast<const uint16_t*>(data)[i] & 0x7f80u) == 0x7f80u;
    default:
      return (static_cast<const uint16_t*>(data)[i] & 0x7c00u) == 0x7c00u;
  }
}

struct CheckedTensor {
  const void* data;
  DType dtype;
  int64_t columns;
  int64_t elements;
  unsigned long long* first;
};

// Tensor 0's elements, then tensor 1's, in one grid-stride loop.
__global__ void check_finite_kernel(CheckedTensor a, CheckedTensor b) {
  cuda_launch::wait_for_inputs();
  cuda_launch::release_dependents();
  const int64_t n = a.elements + b.elements;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const bool in_a = i < a.elements;
    const CheckedTensor& t = in_a ? a : b;
    const int64_t at = in_a ? i : i - a.elements;
    if (non_finite(t.data, t.dtype, at)) {
      const auto row = static_cast<unsigned long long>(at / t.columns);
      const auto column = static_cast<unsigned long long>(at % t.columns);
      atomicMin(t.first, (row << 32) | column);
    }
  }
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

CheckedTensor checked(const FiniteCheckArgs& args) {
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

void launch_check(const CheckedTensor& a, const CheckedTensor& b, cudaStream_t stream) {
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
  launch_check(checked(args), CheckedTensor{nullptr, DType::f32, 1, 0, nullptr}, stream);
}

void check_finite(const FiniteCheckArgs& first, const FiniteCheckArgs& second,
                  cudaStream_t stream) {
  launch_check(checked(first), checked(second), stream);
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
