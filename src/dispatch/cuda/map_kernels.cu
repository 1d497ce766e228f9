#include "core/cuda_common.cuh"
#include "core/cuda_launch.cuh"
#include "dispatch/cuda/map_kernels.hpp"

namespace moekit::dispatch::cuda {
namespace {

__global__ void map_kernel(MapToLocalArgs a) {
  cuda_launch::wait_for_inputs();
  cuda_launch::release_dependents();
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < a.entries;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int32_t id = a.global_ids[e];
    a.local_ids[e] = id >= 0 && id < a.n_global ? a.global_to_local[id] : -1;
  }
}

}  // namespace

void map_to_local(const MapToLocalArgs& args, cudaStream_t stream) {
  if (args.entries == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (args.entries + kThreads - 1) / kThreads;
  cuda_launch::launch(map_kernel, static_cast<unsigned>(blocks < 65536 ? blocks : 65536), kThreads,
                      0, stream, args);
  cuda_common::check_launch("map_to_local");
}

}  // namespace moekit::dispatch::cuda
