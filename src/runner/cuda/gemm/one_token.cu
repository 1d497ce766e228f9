// One token's experts in one kernel (one_token.hpp): each warp streams two weight rows at a time
// with 16-byte loads against vectors in shared memory.
//   1. GEMM1: an entry's gate row j and up row j per warp, the pairs spread over all the grid's
//      warps; the warp applies the activation and stores it, rounded to the weights' dtype, in
//      `act`.
//   2. The barrier: every CTA waits until every CTA has stored its activations.
//   3. Every CTA reads the whole activation [columns, I] into shared memory, then runs GEMM2 for
//      its own slice of the output's columns, every entry's row of each, and their weighted sum
//      in entry order.

#include "runner/cuda/gemm/one_token.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <stdexcept>

#include "core/cuda_common.cuh"
#include "core/cuda_finite.cuh"
#include "routing/cuda/route_warp.cuh"
#include "runner/cuda/gemm/gemm_device.cuh"

namespace moekit::cuda_gemm {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// 16-byte loads each lane has in flight per row before it multiplies; a warp streams two rows
// at once, so 8 per lane: enough bytes in flight per SM to keep HBM busy.
constexpr int kLoadsPerRow = 4;
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
  uint16_t* act;
  uint32_t* counters;
  void* output;
  DType hidden_dtype;
  DType output_dtype;
  int hidden_size;
  int intermediate;
  int n_global;
  int columns;
  int cols_per_cta;  // GEMM2's output columns per CTA
  int partials_at;   // byte offsets in shared memory: GEMM2's sums, the router's warp
  int route_at;
  Activation activation;
  // OneTokenArgs::route: the router kernel's parameters (one token, the physical columns).
  bool routes;
  routing::cuda::RouteParams route;
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

__device__ __forceinline__ uint4 load_streaming(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
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

// The warp's sums of row_a . vec_a and row_b . vec_b over `n16` 16-byte chunks each (lane l
// takes chunks l, l + 32, ...), reduced to every lane; both rows' loads are issued before the
// multiplies. The weights are read once: no L1 allocation.
template <bool kBf16>
__device__ __forceinline__ float2 two_row_dots(const uint4* __restrict__ row_a,
                                               const uint4* __restrict__ vec_a,
                                               const uint4* __restrict__ row_b,
                                               const uint4* __restrict__ vec_b, int n16, int lane) {
  float acc_a[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc_b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int base = 0; base < n16; base += 32 * kLoadsPerRow) {
    uint4 a[kLoadsPerRow], b[kLoadsPerRow];
#pragma unroll
    for (int u = 0; u < kLoadsPerRow; ++u) {
      const int at = base + u * 32 + lane;
      if (at < n16) {
        a[u] = load_streaming(row_a + at);
        b[u] = load_streaming(row_b + at);
      }
    }
#pragma unroll
    for (int u = 0; u < kLoadsPerRow; ++u) {
      const int at = base + u * 32 + lane;
      if (at < n16) {
        fma8<kBf16>(acc_a, a[u], vec_a[at]);
        fma8<kBf16>(acc_b, b[u], vec_b[at]);
      }
    }
  }
  return make_float2(cuda_common::warp_sum((acc_a[0] + acc_a[1]) + (acc_a[2] + acc_a[3])),
                     cuda_common::warp_sum((acc_b[0] + acc_b[1]) + (acc_b[2] + acc_b[3])));
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

// Loads a thread has in flight while staging a vector into shared memory: all of them are
// issued before any is stored, so staging costs one round trip to memory per pass, where a load
// per iteration cost one each (6 us of the kernel for Qwen3-30B-A3B's activations, 3 us for its
// hidden state, measured on an H100). Elements of the hidden state; 16-byte chunks of the
// activation (4 of them hold 16 registers: 8 spilled at 3 CTAs an SM).
constexpr int kHiddenLoads = 8;
constexpr int kActivationLoads = 4;

// The token's hidden state [H] into `vec`, rounded to the weights' dtype.
template <bool kBf16>
__device__ __forceinline__ void stage_hidden(const void* hidden, DType dtype, int H,
                                             uint16_t* vec) {
  for (int base = threadIdx.x; base < H; base += kThreads * kHiddenLoads) {
    float v[kHiddenLoads];
#pragma unroll
    for (int i = 0; i < kHiddenLoads; ++i) {
      const int k = base + i * kThreads;
      v[i] = k < H ? cuda_common::load_float(hidden, dtype, k) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kHiddenLoads; ++i) {
      const int k = base + i * kThreads;
      if (k < H) vec[k] = narrow<kBf16>(v[i]);
    }
  }
}

// GEMM1's output [columns, I] from global memory (L2: it was just written) into `staged`, 16
// bytes at a time; an entry off this rank was never written and is not read (I % 8 == 0, so a
// 16-byte chunk lies in one entry).
__device__ __forceinline__ void stage_activation(const uint4* act, int chunks, int chunks_per_entry,
                                                 const int32_t* slot_of, uint4* staged) {
  for (int base = threadIdx.x; base < chunks; base += kThreads * kActivationLoads) {
    uint4 v[kActivationLoads];
#pragma unroll
    for (int i = 0; i < kActivationLoads; ++i) {
      const int at = base + i * kThreads;
      if (at < chunks && slot_of[at / chunks_per_entry] >= 0) v[i] = __ldcg(act + at);
    }
#pragma unroll
    for (int i = 0; i < kActivationLoads; ++i) {
      const int at = base + i * kThreads;
      if (at < chunks && slot_of[at / chunks_per_entry] >= 0) staged[at] = v[i];
    }
  }
}

template <bool kBf16>
__global__ void __launch_bounds__(kThreads, 3)
    one_token_kernel(const __grid_constant__ OneTokenParams p) {
  extern __shared__ uint4 staged[];  // x [H], then the activation [columns, I]: 16-bit
  __shared__ int32_t slot_of[kOneTokenMaxColumns];
  __shared__ float weight_of[kOneTokenMaxColumns];
  const int H = p.hidden_size, I = p.intermediate, C = p.columns;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint16_t* const vec = reinterpret_cast<uint16_t*>(staged);
  unsigned char* const bytes = reinterpret_cast<unsigned char*>(staged);
  float* const partial = reinterpret_cast<float*>(bytes + p.partials_at);
  const auto slot_of_id = [&](int32_t id) {
    if (p.table == nullptr) return id;
    return id >= 0 && id < p.n_global ? p.table[id] : -1;
  };
  if (p.routes) {
    // Warp 0 routes the token as the router kernel would (CTA 0 writes its outputs) while the
    // other warps stage x; every CTA runs its share of the router's finite checks.
    if (warp == 0) {
      const routing::cuda::Pick pick =
          routing::cuda::route_token(p.route, 0, bytes + p.route_at, blockIdx.x == 0);
      if (lane < C) {
        slot_of[lane] = slot_of_id(pick.physical);
        weight_of[lane] = pick.physical_weight;
      }
    }
    cuda_finite::check_elements(p.route.check_first, p.route.check_second,
                                int64_t{blockIdx.x} * kThreads + threadIdx.x,
                                int64_t{gridDim.x} * kThreads);
  } else {
    for (int c = threadIdx.x; c < C; c += kThreads) {
      slot_of[c] = slot_of_id(p.ids[c]);
      weight_of[c] = p.weights[c];
    }
  }
  stage_hidden<kBf16>(p.hidden, p.hidden_dtype, H, vec);
  __syncthreads();

  // GEMM1: a warp takes an entry's gate row j and up row j, so it applies the activation
  // itself. Warps are numbered across the CTAs first, so each CTA (and SM) gets an equal share
  // of the pairs when they do not divide evenly.
  const int pairs = C * I;
  const int warps = gridDim.x * kWarps;
  for (int u = warp * gridDim.x + blockIdx.x; u < pairs; u += warps) {
    const int c = u / I, j = u - c * I;
    const int32_t slot = slot_of[c];
    if (slot < 0) continue;
    const uint4* gate = p.w13 + (int64_t{slot} * 2 * I + j) * (H / 8);
    const float2 sums =
        two_row_dots<kBf16>(gate, staged, gate + int64_t{I} * (H / 8), staged, H / 8, lane);
    if (lane == 0) p.act[u] = narrow<kBf16>(detail::activate(p.activation, sums.x, sums.y));
  }
  grid_barrier(p.counters);

  // The activation of every entry, [columns, I], into shared memory (over x: every warp of
  // this CTA is past GEMM1).
  stage_activation(reinterpret_cast<const uint4*>(p.act), C * I / 8, I / 8, slot_of, staged);
  __syncthreads();
  leave_barrier(p.counters);

  // GEMM2: this CTA's output columns [h0, h0 + n), every entry's row of each, two at a time.
  const int h0 = blockIdx.x * p.cols_per_cta;
  const int n = max(0, min(H - h0, p.cols_per_cta));
  const int rows = C * n;
  for (int r = 2 * warp; r < rows; r += 2 * kWarps) {
    const int ra = r, rb = min(r + 1, rows - 1);
    const int ca = ra / n, cb = rb / n;
    const int32_t sa = slot_of[ca], sb = slot_of[cb];
    if (sa < 0 && sb < 0) continue;
    // An entry off this rank reads the other row again and its sum is never used.
    const int64_t row_a = int64_t{sa < 0 ? sb : sa} * H + h0 + (ra - ca * n);
    const int64_t row_b = int64_t{sb < 0 ? sa : sb} * H + h0 + (rb - cb * n);
    const float2 sums =
        two_row_dots<kBf16>(p.w2 + row_a * (I / 8), staged + int64_t{ca} * I / 8,
                            p.w2 + row_b * (I / 8), staged + int64_t{cb} * I / 8, I / 8, lane);
    if (lane == 0) {
      partial[ra] = sums.x;
      partial[rb] = sums.y;
    }
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

// The shared memory of a launch: the staged vector, GEMM2's sums, the router's warp.
struct SharedLayout {
  int64_t partials_at = 0;
  int64_t route_at = 0;
  int64_t bytes = 0;
};
SharedLayout shared_layout(int64_t hidden, int64_t intermediate, int64_t columns,
                           int64_t cols_per_cta, int64_t route_bytes) {
  const int64_t partials_at = staged_elems(hidden, intermediate, columns) * 2;
  const int64_t route_at = (partials_at + columns * cols_per_cta * 4 + 15) / 16 * 16;
  return {.partials_at = partials_at, .route_at = route_at, .bytes = route_at + route_bytes};
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
  const int64_t staged = staged_elems(hidden, intermediate, columns) * 2;
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

int64_t one_token_scratch_bytes(int64_t intermediate, int64_t columns) {
  return 2 * intermediate * columns;
}

OneTokenGrid one_token_grid(DType dtype, int64_t hidden, int64_t intermediate, int64_t columns,
                            int route_bytes) {
  if (one_token_unsupported(dtype, hidden, intermediate, columns)) return {};
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    throw std::runtime_error("one_token: no current CUDA device");
  }
  // Enough shared memory for the widest slice of GEMM2's columns a grid of one CTA per SM has.
  const size_t shared = static_cast<size_t>(
      shared_layout(hidden, intermediate, columns, (hidden + sms - 1) / sms, route_bytes).bytes);
  void* kernel = kernel_of(dtype);
  // The kernel's limit is the device's, not this layer's: the attribute belongs to the kernel,
  // so a second core with a smaller layer (shared experts) must not lower it for the first.
  int most = 0;
  cudaFuncAttributes attributes{};
  if (cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess ||
      cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess ||
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           most - static_cast<int>(attributes.sharedSizeBytes)) != cudaSuccess ||
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
  if (a.hidden == nullptr || a.act == nullptr || a.counters == nullptr || a.output == nullptr) {
    bad("an input, scratch or output pointer is null");
  }
  if (!aligned16(a.w13) || !aligned16(a.w2) || !aligned16(a.act)) {
    bad("w13, w2 and act must be 16-byte aligned, non-null");
  }
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
  routing::cuda::RouteParams route{};
  if (a.route != nullptr) {
    if (a.route->tokens != 1 || a.route->physical == nullptr ||
        a.route->physical->top_k + a.route->physical->shared_slots != a.columns) {
      bad("route: one token, with the physical columns, as many as the kernel's columns");
    }
    route = routing::cuda::route_params(*a.route);
  } else if (a.ids == nullptr || a.weights == nullptr) {
    bad("ids and weights are null and the kernel does not route");
  }
  const SharedLayout layout = shared_layout(a.hidden_size, a.intermediate, a.columns, cols_per_cta,
                                            a.route ? route.warp_bytes : 0);
  if (static_cast<size_t>(layout.bytes) > a.grid.shared_bytes) {
    bad("the grid's shared memory is sized for another layer");
  }
  const OneTokenParams p{.hidden = a.hidden,
                         .ids = a.ids,
                         .table = a.global_to_local,
                         .weights = a.weights,
                         .w13 = static_cast<const uint4*>(a.w13),
                         .w2 = static_cast<const uint4*>(a.w2),
                         .act = static_cast<uint16_t*>(a.act),
                         .counters = a.counters,
                         .output = a.output,
                         .hidden_dtype = a.hidden_dtype,
                         .output_dtype = a.output_dtype,
                         .hidden_size = a.hidden_size,
                         .intermediate = a.intermediate,
                         .n_global = a.n_global,
                         .columns = a.columns,
                         .cols_per_cta = cols_per_cta,
                         .partials_at = static_cast<int>(layout.partials_at),
                         .route_at = static_cast<int>(layout.route_at),
                         .activation = a.activation,
                         .routes = a.route != nullptr,
                         .route = route};
  // Cooperative: the runtime starts the grid only where every CTA is resident at once, which
  // the barrier needs (a launch beside it on another stream waits rather than deadlock). Not a
  // programmatic dependent launch: a CUDA graph capture refuses the two together ("invalid
  // argument" on an H100, CUDA 13).
  cudaLaunchAttribute attrs[1]{};
  attrs[0].id = cudaLaunchAttributeCooperative;
  attrs[0].val.cooperative = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(a.grid.blocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = a.grid.shared_bytes;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = 1;
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
