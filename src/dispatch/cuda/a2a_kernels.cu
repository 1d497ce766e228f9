#include <cub/block/block_scan.cuh>

#include <algorithm>

#include "core/cuda_common.cuh"
#include "core/cuda_launch.cuh"
#include "dispatch/cuda/a2a_kernels.hpp"

namespace moekit::dispatch::cuda {
namespace {

constexpr int kPlanThreads = 256;
constexpr int kCopyThreads = 128;

__device__ int destination(const A2APlanArgs& a, int32_t id) {
  return id >= a.physical ? a.me : id / a.per_rank;
}
__device__ int32_t slot_there(const A2APlanArgs& a, int32_t id) {
  return id >= a.physical ? a.global_to_local[id] : id % a.per_rank;
}

// Block r scans the tokens in chunks of its threads: a token that sends to r takes the next row
// there, in token order.
__global__ void plan_kernel(A2APlanArgs a) {
  using Scan = cub::BlockScan<int, kPlanThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int bad_id;
  __shared__ int found_bad;
  cuda_launch::wait_for_inputs();
  const int r = static_cast<int>(blockIdx.x);
  if (threadIdx.x == 0) found_bad = 0;
  __syncthreads();
  int rows = 0;
  for (int64_t t0 = 0; t0 < a.tokens; t0 += kPlanThreads) {
    const int64_t t = t0 + threadIdx.x;
    const int32_t* ids = a.global_ids + t * a.columns;
    int sends = 0;
    if (t < a.tokens) {
      for (int k = 0; k < a.columns; ++k) {
        const int32_t id = ids[k];
        if (id < 0 || id >= a.n_global) {
          if (atomicExch(&found_bad, 1) == 0) bad_id = id;
        } else if (destination(a, id) == r) {
          sends = 1;
        }
      }
    }
    int index = 0, total = 0;
    Scan(scan).ExclusiveSum(sends, index, total);
    if (t < a.tokens) {
      const int64_t i = rows + index;
      a.index_of[r * a.max_tokens + t] = sends ? static_cast<int32_t>(i) : -1;
      if (sends) {
        a.token_of[r * a.max_tokens + i] = static_cast<int32_t>(t);
        const bool own = r == a.me;
        for (int k = 0; k < a.columns; ++k) {
          const int32_t id = ids[k];
          const bool here = id >= 0 && id < a.n_global && destination(a, id) == r;
          const WirePair pair{here ? slot_there(a, id) : -1, a.weights[t * a.columns + k]};
          if (own) {
            a.own_slots[i * a.columns + k] = pair.slot;
            a.own_weights[i * a.columns + k] = pair.weight;
          } else {
            a.send_pairs[r * a.pairs_stride + i * a.columns + k] = pair;
          }
        }
      }
    }
    rows += total;
    __syncthreads();  // the scan's storage is reused by the next chunk
  }
  if (threadIdx.x == 0) {
    *header_at(a.headers, a.header_stride, r) = {found_bad ? kWireFailed : kWireOk, rows, a.dtype,
                                                 found_bad ? bad_id : 0};
  }
}

// One block per (row, destination); rows move in units of Unit bytes.
template <typename Unit>
__global__ void pack_kernel(PackRowsArgs a) {
  cuda_launch::wait_for_inputs();
  const int r = static_cast<int>(blockIdx.y);
  const int64_t rows = header_at(a.headers, a.header_stride, r)->rows;
  const int64_t units = a.row_bytes / static_cast<int64_t>(sizeof(Unit));
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const int64_t t = a.token_of[r * a.max_tokens + i];
    const auto* from = reinterpret_cast<const Unit*>(a.hidden + t * a.row_bytes);
    std::byte* to_bytes = r == a.me ? a.own_rows + i * a.row_bytes
                                    : a.send_rows + (r * a.max_tokens + i) * a.row_bytes;
    auto* to = reinterpret_cast<Unit*>(to_bytes);
    for (int64_t u = threadIdx.x; u < units; u += blockDim.x) to[u] = from[u];
  }
}

__device__ void report(WireProblem* problem, int32_t kind, int32_t detail) {
  if (atomicCAS(&problem->kind, 0, kind) == 0) problem->detail = detail;
}

__global__ void unpack_kernel(UnpackPairsArgs a) {
  cuda_launch::wait_for_inputs();
  cuda_launch::release_dependents();
  const int64_t entries = a.rows * a.columns, first = a.first_row * a.columns;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < entries;
       e += int64_t{gridDim.x} * blockDim.x) {
    const WirePair pair = a.pairs[e];
    const bool valid = pair.slot >= -1 && pair.slot < a.slots;
    a.slots_out[first + e] = valid ? pair.slot : -1;
    a.weights_out[first + e] = pair.weight;
    if (!valid) report(a.problem, kWireSlot, pair.slot);
  }
}

__global__ void unpack_messages_kernel(UnpackMessagesArgs a) {
  cuda_launch::wait_for_inputs();
  cuda_launch::release_dependents();
  const int64_t per_source = a.max_tokens * a.columns, entries = a.size * per_source;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < entries;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int r = static_cast<int>(e / per_source);
    const int64_t i = e % per_source / a.columns;
    const std::byte* message = r == a.me ? a.own_message : a.messages + r * a.message_bytes;
    const WireHeader h = *reinterpret_cast<const WireHeader*>(message);
    int32_t problem = 0, detail = 0;
    if (h.status == kWireFailed) {
      problem = r == a.me ? kWireBadId : kWireRefused;
      detail = h.bad_id;
    } else if (h.status != kWireOk || h.rows < 0 || h.rows > a.max_tokens) {
      problem = kWireMalformed;
    } else if (h.dtype != a.dtype) {
      problem = kWireDtype;
      detail = h.dtype;
    }
    if (problem != 0 && e % per_source == 0) report(a.problems + r, problem, detail);
    const int64_t rows = problem != 0 ? 0 : h.rows;
    if (r == a.me && i < rows) continue;  // plan_all_to_all wrote this rank's own pairs
    WirePair pair{-1, 0.0f};
    if (i < rows) {
      pair = reinterpret_cast<const WirePair*>(message + sizeof(WireHeader))[e % per_source];
      if (pair.slot < -1 || pair.slot >= a.slots) {
        report(a.problems + r, kWireSlot, pair.slot);
        pair.slot = -1;
      }
    }
    a.slots_out[e] = pair.slot;
    a.weights_out[e] = pair.weight;
  }
}

// One block per token; its threads over the columns.
__global__ void rank_order_sum_kernel(RankOrderSumArgs a) {
  cuda_launch::wait_for_inputs();
  cuda_launch::release_dependents();
  const int64_t t = blockIdx.x;
  for (int64_t h = threadIdx.x; h < a.hidden; h += blockDim.x) {
    float sum = 0.0f;
    for (int r = 0; r < a.size; ++r) {
      const int64_t i = a.index_of[r * a.max_tokens + t];
      if (i < 0) continue;
      const float* part =
          r == a.me ? a.own + i * a.hidden : a.back + (r * a.max_tokens + i) * a.hidden;
      sum += part[h];
    }
    a.combined[t * a.hidden + h] = sum;
  }
}

template <typename Unit>
bool fits(const PackRowsArgs& a) {
  const auto aligned = [](const void* p) {
    return reinterpret_cast<uintptr_t>(p) % sizeof(Unit) == 0;
  };
  return a.row_bytes % static_cast<int64_t>(sizeof(Unit)) == 0 && aligned(a.hidden) &&
         aligned(a.send_rows) && aligned(a.own_rows);
}

template <typename Unit>
void launch_pack(const PackRowsArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(a.most_rows, 65535)),
                  static_cast<unsigned>(a.size));
  cuda_launch::launch(pack_kernel<Unit>, grid, kCopyThreads, 0, stream, a);
}

}  // namespace

void plan_all_to_all(const A2APlanArgs& args, cudaStream_t stream) {
  if (args.size < 1 || args.me < 0 || args.me >= args.size || args.columns < 1 ||
      args.per_rank < 1 || args.tokens > args.max_tokens) {
    cuda_errors::internal("plan_all_to_all: size " + std::to_string(args.size) + ", rank " +
                          std::to_string(args.me) + ", tokens " + std::to_string(args.tokens) +
                          " of " + std::to_string(args.max_tokens));
  }
  cuda_launch::launch(plan_kernel, static_cast<unsigned>(args.size), kPlanThreads, 0, stream, args);
  cuda_common::check_launch("plan_all_to_all");
}

void pack_rows(const PackRowsArgs& args, cudaStream_t stream) {
  if (args.most_rows == 0 || args.row_bytes == 0) return;
  if (fits<uint4>(args)) {
    launch_pack<uint4>(args, stream);
  } else if (fits<uint32_t>(args)) {
    launch_pack<uint32_t>(args, stream);
  } else if (fits<uint16_t>(args)) {
    launch_pack<uint16_t>(args, stream);
  } else {
    launch_pack<uint8_t>(args, stream);
  }
  cuda_common::check_launch("pack_rows");
}

void unpack_pairs(const UnpackPairsArgs& args, cudaStream_t stream) {
  const int64_t entries = args.rows * args.columns;
  if (entries == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((entries + kThreads - 1) / kThreads, 65536);
  cuda_launch::launch(unpack_kernel, static_cast<unsigned>(blocks), kThreads, 0, stream, args);
  cuda_common::check_launch("unpack_pairs");
}

void unpack_messages(const UnpackMessagesArgs& args, cudaStream_t stream) {
  const int64_t entries = args.size * args.max_tokens * args.columns;
  if (entries == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((entries + kThreads - 1) / kThreads, 65536);
  cuda_launch::launch(unpack_messages_kernel, static_cast<unsigned>(blocks), kThreads, 0, stream,
                      args);
  cuda_common::check_launch("unpack_messages");
}

void sum_in_rank_order(const RankOrderSumArgs& args, cudaStream_t stream) {
  if (args.tokens == 0) return;
  const int threads = static_cast<int>(std::min<int64_t>(256, (args.hidden + 31) / 32 * 32));
  cuda_launch::launch(rank_order_sum_kernel, static_cast<unsigned>(args.tokens), threads, 0, stream,
                      args);
  cuda_common::check_launch("sum_in_rank_order");
}

}  // namespace moekit::dispatch::cuda
