#pragma once
// The NCCL communicator's fixed-order sum on the GPU: out[i] = parts[0][i] + ... +
// parts[n_parts - 1][i], added in part order (the same bits as host_segment_sum), part p at
// parts + p * stride. Enqueues on `stream`; every pointer is device memory.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moekit::comm::cuda {

void segment_sum(float* out, const float* parts, int64_t stride, int n_parts, int64_t n,
                 cudaStream_t stream);

}  // namespace moekit::comm::cuda
