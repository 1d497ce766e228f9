// One token's experts in one kernel (one_token.hpp): each warp streams whole weight rows with
// 16-byte loads against the token's vector in shared memory.
//   1. GEMM1: the rows of every entry's gate and up, spread over all the grid's warps in
//      order (consecutive warps, consecutive rows); each row's sum goes to `gate_up`.
//   2. The barrier: every CTA waits until every CTA has stored its sums.
//   3. Every CTA computes the whole activation [columns, I] from `gate_up` into shared memory
//      (a few thousand values: cheaper than a second exchange), then GEMM2 for its own slice
//      of the output's columns, every entry's row of those columns, and their weighted sum in
//      entry order.

#include "runner/cuda/gemm/one_token.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <stdexcept>

#include "core/cuda_common.cuh"
#include "core/cuda_launch.cuh"
#include "runner/cuda/gemm/gemm_device.cuh"

namespace moekit::cuda_gemm {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// 16-byte loads each lane has in flight per row before it multiplies: enough bytes in flight
// per SM to keep HBM busy with a few warps.
constexpr int kLoadsInFlight = 8;
// A barrier that waits longer than this has lost a CTA (it cannot happen with a cooperative
// launch); the kernel traps rather than hang the stream.
constexpr unsigned long long kBarrierTimeoutNs = 10'000'000'000ull;

struct OneTokenParams {
  const void* hidden;
  const int32_t* ids;
  const int32_t* table;
  const float* weights;
  const uint4* w13;
  const uint4* w2;
  float* gate_up;
  uint32_t* counters;
  void* output;
  DType hidden_dtype;
  DType output_dtype;
  int hidden_size;
  int intermediate;
  int n_global;
  int columns;
  int cols_per_cta;  // GEMM2's output columns per CTA
  int staged_elems;  // 16-bit elements of the staged vector region (x, then the activation)
  Activation activation;
};

template <bool kBf16>
__device__ __forceinline__ float2 widen(uint32_t pair) {
  if constexpr (kBf16) {
    return make_float2(__uint_as_float(pair << 16), __uint_as_float(pair & 0xFFFF0000u));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(&pair));
  }
}

template <bool kBf16>
__device__ __forceinline__ uint16_t narrow(float v) {
  if constexpr (kBf16) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  } else {
    return __half_as_ushort(__float2half_rn(v));
  }
}

// Four independent sums, so a warp's multiplies are not one chain of dependent FMAs.
template <bool kBf16>
__device__ __forceinline__ void fma8(float (&acc)[4], const uint4& w, const uint4& x) {
  const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
  const uint32_t xv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = widen<kBf16>(wv[i]);
    const float2 b = widen<kBf16>(xv[i]);
    acc[i] = fmaf(a.x, b.x, acc[i]);
    acc[i] = fmaf(a.y, b.y, acc[i]);
  }
}

// The warp's sum of row . vec over `n16` 16-byte chunks (lane l takes chunks l, l + 32, ...),
// reduced to every lane. The weights are read once: no L1 allocation.
template <bool kBf16>
__device__ __forceinline__ float row_dot(const uint4* __restrict__ row,
                                         const uint4* __restrict__ vec, int n16, int lane) {
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int base = 0; base < n16; base += 32 * kLoadsInFlight) {
    uint4 w[kLoadsInFlight];
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int at = base + u * 32 + lane;
      if (at < n16) {
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(w[u].x), "=r"(w[u].y), "=r"(w[u].z), "=r"(w[u].w)
                     : "l"(row + at));
      }
    }
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int at = base + u * 32 + lane;
      if (at < n16) fma8<kBf16>(acc, w[u], vec[at]);
    }
  }
  return cuda_common::warp_sum((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// Every CTA's stores before the barrier are visible to every CTA after it. counters[0] counts
// the arrivals; the last CTA to leave (counters[1]) zeroes both for the next launch.
__device__ void grid_barrier(uint32_t* counters) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(&counters[0], 1u);
    const unsigned long long start = global_ns();
    while (*static_cast<volatile uint32_t*>(&counters[0]) < gridDim.x) {
      __nanosleep(64);
      if (global_ns() - start > kBarrierTimeoutNs) __trap();
    }
    __threadfence();
  }
  __syncthreads();
}

__device__ void leave_barrier(uint32_t* counters) {
  if (threadIdx.x == 0 && atomicAdd(&counters[1], 1u) == gridDim.x - 1) {
    atomicExch(&counters[0], 0u);
    atomicExch(&counters[1], 0u);
  }
}

template <bool kBf16>
__global__ void __launch_bounds__(kThreads, 4)
    one_token_kernel(const __grid_constant__ OneTokenParams p) {
  extern __shared__ uint4 staged[];  // x [H], then the activation [columns, I]: 16-bit
  __shared__ int32_t slot_of[kOneTokenMaxColumns];
  __shared__ float weight_of[kOneTokenMaxColumns];
  cuda_launch::wait_for_inputs();
  const int H = p.hidden_size, I = p.intermediate, C = p.columns;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint16_t* const vec = reinterpret_cast<uint16_t*>(staged);
  float* const partial = reinterpret_cast<float*>(staged + p.staged_elems / 8);
  for (int c = threadIdx.x; c < C; c += kThreads) {
    const int32_t id = p.ids[c];
    int32_t slot = id;
    if (p.table != nullptr) slot = id >= 0 && id < p.n_global ? p.table[id] : -1;
    slot_of[c] = slot;
    weight_of[c] = p.weights[c];
  }
  for (int k = threadIdx.x; k < H; k += kThreads) {
    vec[k] = narrow<kBf16>(cuda_common::load_float(p.hidden, p.hidden_dtype, k));
  }
  __syncthreads();

  const int gemm1_rows = C * 2 * I;
  const int warps = gridDim.x * kWarps;
  for (int r = blockIdx.x * kWarps + warp; r < gemm1_rows; r += warps) {
    const int c = r / (2 * I);
    const int32_t slot = slot_of[c];
    if (slot < 0) continue;
    const int64_t row = int64_t{slot} * 2 * I + (r - c * 2 * I);
    const float sum = row_dot<kBf16>(p.w13 + row * (H / 8), staged, H / 8, lane);
    if (lane == 0) p.gate_up[r] = sum;
  }
  grid_barrier(p.counters);

  for (int i = threadIdx.x; i < C * I; i += kThreads) {
    const int c = i / I, j = i - c * I;
    if (slot_of[c] < 0) continue;
    const float* sums = p.gate_up + int64_t{c} * 2 * I;
    vec[i] = narrow<kBf16>(detail::activate(p.activation, __ldcg(sums + j), __ldcg(sums + I + j)));
  }
  __syncthreads();
  leave_barrier(p.counters);

  const int h0 = blockIdx.x * p.cols_per_cta;
  const int n = max(0, min(H - h0, p.cols_per_cta));
  for (int r = warp; r < C * n; r += kWarps) {
    const int c = r / n, h = h0 + (r - c * n);
    const int32_t slot = slot_of[c];
    if (slot < 0) continue;
    const int64_t row = int64_t{slot} * H + h;
    const float sum =
        row_dot<kBf16>(p.w2 + row * (I / 8), staged + int64_t{c} * I / 8, I / 8, lane);
    if (lane == 0) partial[r] = sum;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += kThreads) {
    float out = 0.0f;
    for (int c = 0; c < C; ++c) {
      if (slot_of[c] >= 0) out += weight_of[c] * partial[c * n + i];
    }
    cuda_common::store_float(p.output, p.output_dtype, h0 + i, out);
  }
}

[[noreturn]] void bad(const std::string& message) {
  throw std::invalid_argument("one_token: " + message);
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

int64_t staged_elems(int64_t hidden, int64_t intermediate, int64_t columns) {
  const int64_t most = std::max(hidden, columns * intermediate);
  return (most + 7) / 8 * 8;
}

size_t shared_bytes(int64_t hidden, int64_t intermediate, int64_t columns, int64_t cols_per_cta) {
  return static_cast<size_t>(staged_elems(hidden, intermediate, columns) * 2 +
                             columns * cols_per_cta * 4);
}

void* kernel_of(DType dtype) {
  return dtype == DType::bf16 ? reinterpret_cast<void*>(&one_token_kernel<true>)
                              : reinterpret_cast<void*>(&one_token_kernel<false>);
}

}  // namespace

std::optional<std::string> one_token_unsupported(DType dtype, int64_t hidden, int64_t intermediate,
                                                 int64_t columns) {
  if (dtype != DType::bf16 && dtype != DType::f16) {
    return std::string("the one-token kernel reads bf16 or f16 weights, not ") +
           std::string(dtype_name(dtype));
  }
  if (hidden % 8 != 0 || intermediate % 8 != 0) {
    return "the one-token kernel reads rows in 16-byte pieces: H " + std::to_string(hidden) +
           " and I " + std::to_string(intermediate) + " must be multiples of 8";
  }
  if (columns < 1 || columns > kOneTokenMaxColumns) {
    return "the one-token kernel takes 1 to " + std::to_string(kOneTokenMaxColumns) +
           " entries per token, not " + std::to_string(columns);
  }
  const int64_t staged = std::max(hidden, columns * intermediate) * 2;
  if (staged > kOneTokenMaxStagedBytes) {
    return "the token's activations or hidden state (" + std::to_string(staged) +
           " bytes) exceed the one-token kernel's " + std::to_string(kOneTokenMaxStagedBytes) +
           " bytes of shared memory";
  }
  if (2 * intermediate * columns > INT32_MAX || hidden > INT32_MAX / 2) {
    return std::string("the one-token kernel indexes a token's rows with 32-bit integers");
  }
  return std::nullopt;
}

int64_t one_token_scratch_floats(int64_t intermediate, int64_t columns) {
  return 2 * intermediate * columns;
}

OneTokenGrid one_token_grid(DType dtype, int64_t hidden, int64_t intermediate, int64_t columns) {
  if (one_token_unsupported(dtype, hidden, intermediate, columns)) return {};
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    throw std::runtime_error("one_token: no current CUDA device");
  }
  // Enough shared memory for the widest slice of GEMM2's columns a grid of one CTA per SM has.
  const size_t shared = shared_bytes(hidden, intermediate, columns, (hidden + sms - 1) / sms);
  void* kernel = kernel_of(dtype);
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(shared)) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, shared) !=
          cudaSuccess ||
      per_sm < 1) {
    (void)cudaGetLastError();
    throw std::runtime_error("one_token: the kernel does not fit an SM with " +
                             std::to_string(shared) + " bytes of shared memory");
  }
  return {.blocks = per_sm * sms, .shared_bytes = shared};
}

void launch_one_token(const OneTokenArgs& a, cudaStream_t stream) {
  if (const auto why = one_token_unsupported(a.dtype, a.hidden_size, a.intermediate, a.columns)) {
    bad(*why);
  }
  if (a.hidden == nullptr || a.ids == nullptr || a.weights == nullptr || a.gate_up == nullptr ||
      a.counters == nullptr || a.output == nullptr) {
    bad("an input, scratch or output pointer is null");
  }
  if (!aligned16(a.w13) || !aligned16(a.w2)) bad("w13 and w2 must be 16-byte aligned, non-null");
  if (!cuda_common::is_activation_dtype(a.hidden_dtype) ||
      !cuda_common::is_activation_dtype(a.output_dtype)) {
    bad("hidden states and output are f32, bf16 or f16");
  }
  if (a.global_to_local != nullptr && a.n_global < 1) bad("a table of no ids");
  if (a.grid.blocks < 1) bad("no grid: one_token_grid sizes it when the core is built");
  if (a.activation.kind == ActivationKind::swiglu_oai && !(a.activation.limit > 0.0f)) {
    bad("activation: swiglu_oai needs a positive limit");
  }
  const int cols_per_cta = (a.hidden_size + a.grid.blocks - 1) / a.grid.blocks;
  if (shared_bytes(a.hidden_size, a.intermediate, a.columns, cols_per_cta) > a.grid.shared_bytes) {
    bad("the grid's shared memory is sized for another layer");
  }
  const OneTokenParams p{
      .hidden = a.hidden,
      .ids = a.ids,
      .table = a.global_to_local,
      .weights = a.weights,
      .w13 = static_cast<const uint4*>(a.w13),
      .w2 = static_cast<const uint4*>(a.w2),
      .gate_up = a.gate_up,
      .counters = a.counters,
      .output = a.output,
      .hidden_dtype = a.hidden_dtype,
      .output_dtype = a.output_dtype,
      .hidden_size = a.hidden_size,
      .intermediate = a.intermediate,
      .n_global = a.n_global,
      .columns = a.columns,
      .cols_per_cta = cols_per_cta,
      .staged_elems = static_cast<int>(staged_elems(a.hidden_size, a.intermediate, a.columns)),
      .activation = a.activation};
  // Cooperative: the runtime starts the grid only where every CTA is resident at once, which
  // the barrier needs (a smaller launch beside it on another stream waits rather than deadlock).
  cudaLaunchAttribute attrs[2]{};
  attrs[0].id = cudaLaunchAttributeCooperative;
  attrs[0].val.cooperative = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(a.grid.blocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = a.grid.shared_bytes;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = cuda_launch::overlapping_launches() ? 2 : 1;
  const cudaError_t status = a.dtype == DType::bf16
                                 ? cudaLaunchKernelEx(&config, one_token_kernel<true>, p)
                                 : cudaLaunchKernelEx(&config, one_token_kernel<false>, p);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string("one_token: launch failed: ") +
                             cudaGetErrorString(status));
  }
}

}  // namespace moekit::cuda_gemm
