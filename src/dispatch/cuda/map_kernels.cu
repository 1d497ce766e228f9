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

__global__ void write_agreement_kernel(int64_t* pairs, int size, int64_t status, int64_t tokens) {
  cuda_launch::wait_for_inputs();
  cuda_launch::release_dependents();
  for (int r = threadIdx.x; r < size; r += blockDim.x) {
    pairs[2 * r] = status;
    pairs[2 * r + 1] = tokens;
  }
}

__global__ void check_agreement_kernel(const int64_t* pairs, int size, int64_t ready,
                                       int64_t tokens, AgreementReport* reports) {
  cuda_launch::wait_for_inputs();
  cuda_launch::release_dependents();
  for (int r = threadIdx.x; r < size; r += blockDim.x) {
    if (reports[r].kind != 0) continue;
    if (pairs[2 * r] != ready) {
      reports[r] = {kAgreementRefused, 0};
    } else if (pairs[2 * r + 1] != tokens) {
      reports[r] = {kAgreementTokens, static_cast<int32_t>(pairs[2 * r + 1])};
    }
  }
}

}  // namespace

void write_agreement(int64_t* pairs, int size, int64_t status, int64_t tokens,
                     cudaStream_t stream) {
  cuda_launch::launch(write_agreement_kernel, 1, 128, 0, stream, pairs, size, status, tokens);
  cuda_common::check_launch("write_agreement");
}

void check_agreement(const int64_t* pairs, int size, int64_t ready, int64_t tokens,
                     AgreementReport* reports, cudaStream_t stream) {
  cuda_launch::launch(check_agreement_kernel, 1, 128, 0, stream, pairs, size, ready, tokens,
                      reports);
  cuda_common::check_launch("check_agreement");
}

void map_to_local(const MapToLocalArgs& args, cudaStream_t stream) {
  if (args.entries == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (args.entries + kThreads - 1) / kThreads;
  cuda_launch::launch(map_kernel, static_cast<unsigned>(blocks < 65536 ? blocks : 65536), kThreads,
                      0, stream, args);
  cuda_common::check_launch("map_to_local");
}

}  // namespace moekit::dispatch::cuda
