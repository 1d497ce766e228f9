#include "comm/nccl/segment_sum.hpp"
#include "core/cuda_common.cuh"

namespace moekit::comm::cuda {
namespace {

__global__ void segment_sum_kernel(float* out, const float* parts, int64_t stride, int n_parts,
                                   int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float sum = parts[i];
    for (int p = 1; p < n_parts; ++p) sum += parts[p * stride + i];
    out[i] = sum;
  }
}

}  // namespace

void segment_sum(float* out, const float* parts, int64_t stride, int n_parts, int64_t n,
                 cudaStream_t stream) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  segment_sum_kernel<<<cuda_common::blocks_for(n, kThreads), kThreads, 0, stream>>>(
      out, parts, stride, n_parts, n);
  cuda_common::check_launch("segment_sum");
}

}  // namespace moekit::comm::cuda
