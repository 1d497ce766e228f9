#pragma once
// The kernels that measure a GPU's ceilings for the benchmark (gpu_kernels.cu).

#include <cuda_runtime.h>

#include <cstdint>

namespace moekit::bench {

// Throws internal naming `what` and CUDA's message unless `status` is cudaSuccess (defined in
// gpu_bench.cpp: fmt's compile-time format checks do not build under nvcc).
void check_cuda(cudaError_t status, const char* what);

// Bytes per second of one read-only sweep over `bytes` of device memory (16-byte loads, no
// writes), the median of `passes` after one warm-up sweep.
double gpu_read_bandwidth(int64_t bytes, int passes, int sm_count, cudaStream_t stream);

// Dense tensor-core FLOPs per second of mma.sync (bf16 m16n8k16, or e4m3 m16n8k32 where
// `fp8`), f32 accumulation, independent chains in registers that never touch memory, on every
// SM; the median of `passes`. fp8 needs compute capability 8.9 or later (0 is returned below).
double gpu_mma_peak(bool fp8, int passes, int sm_count, cudaStream_t stream);

}  // namespace moekit::bench
