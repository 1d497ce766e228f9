#pragma once
// The kernels of the all-to-all over NCCL (all_to_all_cuda.cpp): which rows go to which rank
// with which (slot, weight) pairs, the rows packed per destination, the pairs that arrived
// checked into the runner's arrays, and the partial sums that came back added in rank order.
// Each enqueues on `stream`; every pointer is device memory unless it says otherwise.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace moekit::dispatch::cuda {

// Leads the exchange: one per destination rank, 16 bytes.
struct WireHeader {
  int32_t status;  // kWireOk, or kWireFailed: the sender's input failed and no rows follow
  int32_t rows;    // rows this destination gets
  int32_t dtype;   // the rows' DType, which every rank must share
  int32_t bad_id;  // kWireFailed from a routed id out of range: that id
};
inline constexpr int32_t kWireOk = 0;
inline constexpr int32_t kWireFailed = 1;

// Where destination r's header is: headers are `stride` bytes apart (16 in normal mode, where
// they travel alone; a whole message in low-latency mode, where the pairs follow each).
__host__ __device__ inline WireHeader* header_at(WireHeader* first, int64_t stride, int r) {
  return reinterpret_cast<WireHeader*>(reinterpret_cast<std::byte*>(first) + r * stride);
}
__host__ __device__ inline const WireHeader* header_at(const WireHeader* first, int64_t stride,
                                                       int r) {
  return reinterpret_cast<const WireHeader*>(reinterpret_cast<const std::byte*>(first) +
                                             r * stride);
}

// One column of a row on the wire: the expert's slot on the destination rank (-1: the column's
// expert is held elsewhere), and the column's weight.
struct WirePair {
  int32_t slot;
  float weight;
};

// Every token goes once to each rank that holds one of its columns' experts (its own rank for
// the fused shared slots, ids from `physical` on). Rank r's rows, in token order, are
// token_of[r][0, rows_r); index_of[r][t] is token t's row there or -1. Each row's `columns`
// pairs go to send_pairs + r * pairs_stride + i * columns, or for this rank's own rows straight
// into the runner's arrays (own_slots, own_weights). header_at(headers, header_stride, r) says
// how many rows r gets; an id outside [0, n_global) fails every header. One block per
// destination rank.
struct A2APlanArgs {
  const int32_t* global_ids = nullptr;  // [tokens, columns]
  const float* weights = nullptr;       // [tokens, columns]
  int64_t tokens = 0;
  int columns = 0;
  int size = 1;
  int me = 0;
  int physical = 0;  // global ids below it: rank id / per_rank, slot id % per_rank
  int per_rank = 0;
  const int32_t* global_to_local = nullptr;  // [n_global]: the fused shared slots' local slots
  int n_global = 0;
  int64_t max_tokens = 0;  // the row stride of token_of, index_of and send_pairs
  int32_t dtype = 0;
  int32_t* token_of = nullptr;  // [size][max_tokens]
  int32_t* index_of = nullptr;  // [size][max_tokens]
  WirePair* send_pairs = nullptr;
  int64_t pairs_stride = 0;      // WirePairs from one destination's pairs to the next's
  int32_t* own_slots = nullptr;  // [max_tokens][columns]
  float* own_weights = nullptr;
  WireHeader* headers = nullptr;
  int64_t header_stride = sizeof(WireHeader);  // bytes
};
void plan_all_to_all(const A2APlanArgs& args, cudaStream_t stream);

// Row i of destination r, token token_of[r][i]'s row of `hidden`, into own_rows[i] for this
// rank and send_rows[r][i] for the others, for i < its header's rows (at most most_rows).
struct PackRowsArgs {
  const std::byte* hidden = nullptr;  // [tokens][row_bytes]
  int64_t row_bytes = 0;
  const int32_t* token_of = nullptr;  // [size][max_tokens]
  int64_t max_tokens = 0;
  int size = 1;
  int me = 0;
  const WireHeader* headers = nullptr;
  int64_t header_stride = sizeof(WireHeader);  // bytes
  int64_t most_rows = 0;
  std::byte* send_rows = nullptr;  // [size][max_tokens][row_bytes]
  std::byte* own_rows = nullptr;   // [max_tokens][row_bytes]
};
void pack_rows(const PackRowsArgs& args, cudaStream_t stream);

// What an unpack kernel found wrong in what a source rank sent, in device memory, read by the
// host where it waits anyway (combine in normal mode, synchronize() in low-latency mode).
struct WireProblem {
  int32_t kind;    // one of the kWire* problems below, 0 for none
  int32_t detail;  // kWireDtype: the sender's DType; kWireSlot: the slot
};
inline constexpr int32_t kWireRefused = 1;    // the sender's input failed (abandon)
inline constexpr int32_t kWireMalformed = 2;  // a header of no status or row count known
inline constexpr int32_t kWireDtype = 3;      // rows in another dtype than this rank's
inline constexpr int32_t kWireSlot = 4;       // a slot that is not one of this rank's
inline constexpr int32_t kWireBadId = 5;      // this rank's own: a routed id out of range

// Pairs that came from other ranks, [rows][columns], into the runner's arrays from row
// `first_row` on. A slot outside [-1, slots) becomes -1 (it adds nothing) and is reported in
// *problem (kWireSlot).
struct UnpackPairsArgs {
  const WirePair* pairs = nullptr;
  int64_t rows = 0;
  int columns = 0;
  int slots = 0;
  int64_t first_row = 0;
  int32_t* slots_out = nullptr;
  float* weights_out = nullptr;
  WireProblem* problem = nullptr;
};
void unpack_pairs(const UnpackPairsArgs& args, cudaStream_t stream);

// The low-latency mode's arrivals: source rank r's message (header, then max_tokens rows of
// pairs; this rank's own is own_message, never exchanged) into rows [r * max_tokens,
// (r + 1) * max_tokens) of the runner's arrays: its rows' pairs checked, every row past its
// count masked (every slot -1), and a source whose header is not usable masked whole, with its
// problem in problems[r]. This rank's own rows' pairs are there already (plan_all_to_all).
struct UnpackMessagesArgs {
  const std::byte* messages = nullptr;  // [size][message_bytes]
  const std::byte* own_message = nullptr;
  int64_t message_bytes = 0;
  int64_t max_tokens = 0;
  int columns = 0;
  int slots = 0;
  int size = 1;
  int me = 0;
  int32_t dtype = 0;
  int32_t* slots_out = nullptr;  // [size * max_tokens][columns]
  float* weights_out = nullptr;
  WireProblem* problems = nullptr;  // [size]
};
void unpack_messages(const UnpackMessagesArgs& args, cudaStream_t stream);

// combined[t] = sum over ranks r in order 0, 1, ..., size-1 of the partial sum of token t's row
// there (index_of[r][t] >= 0): own[i] for this rank, back[r][i] for the others; 0 where no rank
// holds any of the token's experts.
struct RankOrderSumArgs {
  const float* own = nullptr;   // [rows][H]
  const float* back = nullptr;  // [size][max_tokens][H]
  const int32_t* index_of = nullptr;
  int64_t tokens = 0;
  int64_t hidden = 0;
  int64_t max_tokens = 0;
  int size = 1;
  int me = 0;
  float* combined = nullptr;  // [tokens][H]
};
void sum_in_rank_order(const RankOrderSumArgs& args, cudaStream_t stream);

}  // namespace moekit::dispatch::cuda
