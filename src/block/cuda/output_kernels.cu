#include "block/cuda/output_kernels.hpp"
#include "core/cuda_common.cuh"
#include "core/cuda_launch.cuh"

namespace moekit::block::cuda {
namespace {

__global__ void output_sum_kernel(OutputSumArgs a) {
  cuda_launch::wait_for_inputs();
  cuda_launch::release_dependents();
  const int64_t n = a.tokens * a.hidden;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float y = a.routed[i];
    if (a.shared != nullptr) {
      const float gate = a.shared_gate != nullptr ? a.shared_gate[i / a.hidden] : 1.0f;
      y += gate * a.shared[i];
    }
    cuda_common::store_float(a.output, a.output_dtype, i, y);
  }
}

}  // namespace

void output_sum(const OutputSumArgs& args, cudaStream_t stream) {
  const int64_t n = args.tokens * args.hidden;
  if (n == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  cuda_launch::launch(output_sum_kernel, static_cast<unsigned>(blocks < 65536 ? blocks : 65536),
                      kThreads, 0, stream, args);
  cuda_common::check_launch("output_sum");
}

}  // namespace moekit::block::cuda
