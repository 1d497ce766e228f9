#include "bench/cuda/gpu_kernels.hpp"

#include <algorithm>
#include <vector>

namespace moekit::bench {
namespace {

void check(cudaError_t status, const char* what) {
  check_cuda(status, what);
}

// A value no sweep produces (the array is zero): the store that keeps the loads alive never runs.
constexpr unsigned kNever = 0x9E3779B9u;

__global__ void read_sweep(const uint4* __restrict__ data, int64_t n, unsigned* sink) {
  constexpr int kUnroll = 4;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  unsigned acc = 0;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(data + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldcs(data + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == kNever) *sink = acc;
}

constexpr int kChains = 8;  // independent accumulators per warp: enough to hide mma latency

template <bool Fp8>
__global__ void mma_chains(int iterations, uint32_t b_bits, float* sink) {
#if __CUDA_ARCH__ >= 800
  // a = 1.0 in every element, b from the caller (0): the accumulators stay finite.
  const uint32_t a = Fp8 ? 0x38383838u : 0x3F803F80u;
  float acc[kChains][4] = {};
  for (int it = 0; it < iterations; ++it) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      if constexpr (Fp8) {
#if __CUDA_ARCH__ >= 890
        asm volatile(
            "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
            : "r"(a), "r"(a), "r"(a), "r"(a), "r"(b_bits), "r"(b_bits));
#endif
      } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
            : "r"(a), "r"(a), "r"(a), "r"(a), "r"(b_bits), "r"(b_bits));
      }
    }
  }
  float sum = 0.0f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) sum += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  if (sum == 1.0f) *sink = sum;
#endif
}

// Seconds of each of `passes` launches, after one warm-up, timed with events.
template <typename Launch>
double median_seconds(int passes, cudaStream_t stream, const Launch& launch) {
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  launch();
  std::vector<double> seconds;
  for (int p = 0; p < passes; ++p) {
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    launch();
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "the ceiling kernel");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    seconds.push_back(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

}  // namespace

double gpu_read_bandwidth(int64_t bytes, int passes, int sm_count, cudaStream_t stream) {
  const int64_t n = bytes / 16;
  void* data = nullptr;
  unsigned* sink = nullptr;
  check(cudaMalloc(&data, static_cast<size_t>(n * 16)), "cudaMalloc of the bandwidth array");
  check(cudaMalloc(&sink, sizeof(unsigned)), "cudaMalloc");
  check(cudaMemsetAsync(data, 0, static_cast<size_t>(n * 16), stream), "cudaMemsetAsync");
  const double seconds = median_seconds(passes, stream, [&] {
    read_sweep<<<sm_count * 4, 512, 0, stream>>>(static_cast<const uint4*>(data), n, sink);
    check(cudaGetLastError(), "read_sweep launch");
  });
  cudaFree(data);
  cudaFree(sink);
  return static_cast<double>(n * 16) / seconds;
}

double gpu_mma_peak(bool fp8, int passes, int sm_count, cudaStream_t stream) {
  int device = 0, major = 0, minor = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (fp8 && major * 10 + minor < 89) return 0.0;
  constexpr int kIterations = 40000, kWarps = 8, kBlocksPerSm = 4;
  float* sink = nullptr;
  check(cudaMalloc(&sink, sizeof(float)), "cudaMalloc");
  const int blocks = sm_count * kBlocksPerSm;
  const double seconds = median_seconds(passes, stream, [&] {
    if (fp8) {
      mma_chains<true><<<blocks, 32 * kWarps, 0, stream>>>(kIterations, 0u, sink);
    } else {
      mma_chains<false><<<blocks, 32 * kWarps, 0, stream>>>(kIterations, 0u, sink);
    }
    check(cudaGetLastError(), "mma_chains launch");
  });
  cudaFree(sink);
  // m16n8k16: 16 * 8 * 16 multiply-adds; m16n8k32 twice as many.
  const double flops_per_mma = 2.0 * 16 * 8 * (fp8 ? 32 : 16);
  return flops_per_mma * kChains * kIterations * kWarps * blocks / seconds;
}

}  // namespace moekit::bench
