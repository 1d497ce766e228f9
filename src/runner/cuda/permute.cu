#include <cuda_fp8.h>

#include <algorithm>
#include <string>

#include "core/cuda_common.cuh"
#include "core/cuda_launch.cuh"
#include "runner/cuda/permute.hpp"
#include "runner/cuda/tiny_sort.cuh"

// The sort is a counting sort by slot with a stable placement: a warp walks its entries 32 at a
// time, and __match_any_sync gives each entry its rank among the earlier entries of the same
// slot in that step, so every row lands where a serial scan in entry order would put it.
// Small batches (decode) do the whole sort in one block; larger ones split the entries into
// chunks: a histogram per chunk, one block that turns them into per-chunk starting rows, and a
// placement per chunk.

namespace moekit::runner::cuda {
namespace {

using cuda_common::kFullMask;

constexpr int64_t kSmallEntries = 8192;  // sorted by one block
constexpr int kTinyTable = 2048;         // global -> local tables it copies to shared memory
constexpr int kChunkEntries = 512;       // per warp in the chunked sort
constexpr int kChunkWarps = 8;           // warps (chunks) per block
constexpr int kSharedLimit = 48 * 1024;
constexpr int kScanThreads = 1024;

struct SortParams {
  const int32_t* ids;
  const int32_t* global_to_local;
  int n_global;
  int64_t entries;
  int n_slots;
  int tile;
  int capacity;
  int32_t* counts;
  int32_t* offsets;
  int32_t* row_source;
  int32_t* entry_row;
};

// An entry's id as a local slot, or -1; `table` is p.global_to_local or a copy of it.
__device__ int local_slot(const SortParams& p, int id, const int32_t* table) {
  return tiny_local_slot(id, p.global_to_local != nullptr ? table : nullptr, p.n_global, p.n_slots);
}

__device__ int slot_of(const SortParams& p, int64_t entry) {
  return local_slot(p, p.ids[entry], p.global_to_local);
}

__device__ int padded(const SortParams& p, int count) {
  return p.capacity > 0 ? p.capacity : (count + p.tile - 1) / p.tile * p.tile;
}

// Exclusive prefix sum over the block's threads; *total gets the sum. Every thread must call it.
__device__ int block_exclusive_scan(int value, int* total) {
  __shared__ int warp_totals[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warps = (blockDim.x + 31) / 32;
  int inclusive = value;
  for (int offset = 1; offset < 32; offset *= 2) {
    const int other = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int sum = lane < warps ? warp_totals[lane] : 0;
    for (int offset = 1; offset < 32; offset *= 2) {
      const int other = __shfl_up_sync(kFullMask, sum, offset);
      if (lane >= offset) sum += other;
    }
    if (lane < warps) warp_totals[lane] = sum;  // inclusive over warps
  }
  __syncthreads();
  const int before = (warp > 0 ? warp_totals[warp - 1] : 0) + inclusive - value;
  *total = warp_totals[warps - 1];
  __syncthreads();  // warp_totals is reused by the next call
  return before;
}

// From the true counts in `count` (shared, [n_slots]): writes counts and offsets, marks the
// padding rows, and leaves each slot's first row in `count`. One block; every thread calls it.
__device__ void lay_out_slots(const SortParams& p, int* count) {
  const int per_thread = (p.n_slots + blockDim.x - 1) / blockDim.x;
  const int first = threadIdx.x * per_thread;
  const int last = min(p.n_slots, first + per_thread);
  int mine = 0;
  for (int s = first; s < last; ++s) mine += padded(p, count[s]);
  int total = 0;
  int row = block_exclusive_scan(mine, &total);
  for (int s = first; s < last; ++s) {
    const int n = p.capacity > 0 ? min(count[s], p.capacity) : count[s];
    const int rows = padded(p, count[s]);
    p.counts[s] = n;
    p.offsets[s] = row;
    for (int r = row + n; r < row + rows && p.capacity == 0; ++r) p.row_source[r] = -1;
    count[s] = row;
    row += rows;
  }
  if (threadIdx.x == 0) p.offsets[p.n_slots] = total;
  __syncthreads();
}

// One warp places entries [begin, end) in order, `cursor` ([n_slots]) holding the next row of
// each slot. In the masked layout an entry past its slot's capacity is dropped (entry_row -1);
// with capacity >= tokens only a row that names one slot twice can do that.
__device__ void place(const SortParams& p, int64_t begin, int64_t end, int* cursor) {
  const int lane = threadIdx.x % 32;
  for (int64_t base = begin; base < end; base += 32) {
    const int64_t e = base + lane;
    const int s = e < end ? slot_of(p, e) : -1;
    const unsigned peers = __match_any_sync(kFullMask, s);
    const int rank = __popc(peers & ((1u << lane) - 1));
    int row = -1;
    if (s >= 0) {
      row = cursor[s] + rank;
      if (p.capacity > 0 && row - s * p.capacity >= p.capacity) row = -1;
    }
    __syncwarp();
    if (s >= 0 && lane == __ffs(peers) - 1) cursor[s] += __popc(peers);
    __syncwarp();
    if (e < end) {
      p.entry_row[e] = row;
      if (row >= 0) p.row_source[row] = static_cast<int32_t>(e);
    }
  }
}

// The small sort in one block: warp w takes the w-th contiguous chunk of the entries, counts
// them per slot in its own histogram, the histograms become each warp's starting row per slot,
// and every warp places its chunk at once (a single warp placing every entry took 32 steps per
// thousand entries).
__global__ void sort_small_kernel(SortParams p, int warps) {
  cuda_launch::wait_for_inputs();
  cuda_launch::release_dependents();
  extern __shared__ int shared[];
  int* count = shared;               // [n_slots]
  int* cursor = shared + p.n_slots;  // [warps][n_slots]
  const int n = p.n_slots;
  for (int i = threadIdx.x; i < (warps + 1) * n; i += blockDim.x) shared[i] = 0;
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t chunk = (p.entries + warps - 1) / warps;
  const int64_t begin = min(p.entries, warp * chunk), end = min(p.entries, begin + chunk);
  if (warp < warps) {
    for (int64_t e = begin + lane; e < end; e += 32) {
      const int s = slot_of(p, e);
      if (s >= 0) atomicAdd(&cursor[warp * n + s], 1);
    }
  }
  __syncthreads();
  for (int s = threadIdx.x; s < n; s += blockDim.x) {
    int running = 0;
    for (int w = 0; w < warps; ++w) {
      const int c = cursor[w * n + s];
      cursor[w * n + s] = running;
      running += c;
    }
    count[s] = running;
  }
  __syncthreads();
  lay_out_slots(p, count);
  for (int i = threadIdx.x; i < warps * n; i += blockDim.x) cursor[i] += count[i % n];
  __syncthreads();
  if (warp < warps) place(p, begin, end, cursor + warp * n);
}

__global__ void chunk_histogram_kernel(SortParams p, int* chunk_counts) {
  cuda_launch::wait_for_inputs();
  cuda_launch::release_dependents();
  extern __shared__ int histogram[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * kChunkWarps + warp;
  const int64_t begin = chunk * kChunkEntries;
  if (begin >= p.entries) return;
  const int64_t end = min(p.entries, begin + kChunkEntries);
  int* mine = histogram + warp * p.n_slots;
  for (int s = lane; s < p.n_slots; s += 32) mine[s] = 0;
  __syncwarp();
  for (int64_t e = begin + lane; e < end; e += 32) {
    const int s = slot_of(p, e);
    if (s >= 0) atomicAdd(&mine[s], 1);
  }
  __syncwarp();
  for (int s = lane; s < p.n_slots; s += 32) chunk_counts[chunk * p.n_slots + s] = mine[s];
}

// chunk_counts[c][s] becomes the number of slot-s entries in chunks before c.
__global__ void chunk_scan_kernel(SortParams p, int* chunk_counts, int64_t chunks) {
  cuda_launch::wait_for_inputs();
  cuda_launch::release_dependents();
  extern __shared__ int count[];
  for (int s = threadIdx.x; s < p.n_slots; s += blockDim.x) {
    int running = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const int n = chunk_counts[c * p.n_slots + s];
      chunk_counts[c * p.n_slots + s] = running;
      running += n;
    }
    count[s] = running;
  }
  __syncthreads();
  lay_out_slots(p, count);
}

__global__ void chunk_place_kernel(SortParams p, const int* chunk_counts) {
  cuda_launch::wait_for_inputs();
  cuda_launch::release_dependents();
  extern __shared__ int cursors[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * kChunkWarps + warp;
  const int64_t begin = chunk * kChunkEntries;
  if (begin >= p.entries) return;
  int* cursor = cursors + warp * p.n_slots;
  for (int s = lane; s < p.n_slots; s += 32) {
    cursor[s] = p.offsets[s] + chunk_counts[chunk * p.n_slots + s];
  }
  __syncwarp();
  place(p, begin, min(p.entries, begin + kChunkEntries), cursor);
}

struct GatherParams {
  const void* hidden;
  DType hidden_dtype;
  int64_t hidden_size;
  int columns;
  const int32_t* row_source;
  const int32_t* offsets;
  const int32_t* counts;
  int n_slots;
  int capacity;
  void* rows;
  DType rows_dtype;
  float* scales;
  int quant_group;
  int64_t groups_per_row;
  // hidden_size % 8 == 0 and both row arrays 16-byte aligned: whole pieces move as vectors.
  bool vec;
  const float* static_scale;
  // e4m3 with dynamic scales per 128 columns on vector rows: a warp quantises each group
  // (gather_groups_e4m3), and a row can be split across blocks (kSegmentCols).
  bool warp_groups;
};

constexpr int kGatherThreads = 256;
constexpr int kPiece = 8;  // consecutive columns one thread moves at a time

// Columns [c, c + 8) of a row from `index`, as floats; past the row's end zeros.
__device__ void load_piece(const GatherParams& p, int64_t index, int64_t c, float (&v)[kPiece]) {
  if (p.vec) {
    if (p.hidden_dtype == DType::f32) {
      const auto* at = reinterpret_cast<const float4*>(static_cast<const float*>(p.hidden) + index);
      const float4 a = __ldg(at), b = __ldg(at + 1);
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
      v[7] = b.w;
      return;
    }
    const uint4 raw =
        __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.hidden) + index));
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < kPiece; ++i) {
      const auto bits = static_cast<uint16_t>(words[i / 2] >> (16 * (i % 2)));
      v[i] = p.hidden_dtype == DType::bf16 ? __bfloat162float(__ushort_as_bfloat16(bits))
                                           : __half2float(__ushort_as_half(bits));
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kPiece; ++i) {
    v[i] =
        c + i < p.hidden_size ? cuda_common::load_float(p.hidden, p.hidden_dtype, index + i) : 0.0f;
  }
}

// Each thread moves pieces of 8 columns, every load of the row issued before any store (the
// rows' arrays may not alias, but the compiler cannot know: a load after a store would wait
// for it). For e4m3, a first pass takes each group's amax into shared memory (a max of
// non-negative floats is a max of their bits, exact in any order; NaN is ignored as
// quantize_activation_row's std::max ignores it), and a second pass, from the L1, divides by
// the scale (IEEE), rounds to nearest even and saturates to +-448; a static scale needs only
// the second pass.
// Row r of the grouped layout from entry `entry` (-1: a padding row of zeros), by the whole
// block (kGatherThreads threads; every thread calls it).
// A decode step's few rows are split across blocks of this many columns (a multiple of the
// 128-column groups and of the pieces) where the row's format allows, so that more SMs load
// them (sort_and_gather).
constexpr int kSegmentCols = 1024;

// Columns [c0, c1) of row r, c0 a multiple of 128, e4m3 per 128 columns (GatherParams::
// warp_groups): a warp per group, 4 columns a lane, the group's amax by shuffles; no shared
// memory, no block barrier. The same values, amax, scale and rounding as gather_row's passes.
__device__ void gather_groups_e4m3(const GatherParams& p, int64_t r, int64_t source, int c0,
                                   int c1) {
  const int hidden = static_cast<int>(p.hidden_size);
  const int lane = threadIdx.x % 32;
  auto* out = static_cast<__nv_fp8_storage_t*>(p.rows) + r * p.hidden_size;
  for (int g0 = c0 + threadIdx.x / 32 * 128; g0 < c1; g0 += kGatherThreads / 32 * 128) {
    const int c = g0 + 4 * lane;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (source >= 0 && c < hidden) {  // H % 8 == 0: four columns are whole or past the row
      if (p.hidden_dtype == DType::f32) {
        const float4 a = __ldg(
            reinterpret_cast<const float4*>(static_cast<const float*>(p.hidden) + source + c));
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
      } else {
        const uint2 raw = __ldg(
            reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p.hidden) + source + c));
        const uint32_t words[2] = {raw.x, raw.y};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const auto bits = static_cast<uint16_t>(words[i / 2] >> (16 * (i % 2)));
          v[i] = p.hidden_dtype == DType::bf16 ? __bfloat162float(__ushort_as_bfloat16(bits))
                                               : __half2float(__ushort_as_half(bits));
        }
      }
    }
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    for (int d = 16; d > 0; d >>= 1) amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, d));
    const float scale = fmaxf(amax, 1e-10f) / 448.0f;
    if (lane == 0) p.scales[r * p.groups_per_row + g0 / 128] = scale;
    if (c < hidden) {
      uint32_t word = 0u;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        word |=
            static_cast<uint32_t>(__nv_cvt_float_to_fp8(v[i] / scale, __NV_SATFINITE, __NV_E4M3))
            << (8 * i);
      }
      *reinterpret_cast<uint32_t*>(out + c) = word;
    }
  }
}

// Columns [c0, c1) of the row: a segment where the format allows (16-bit rows, or
// GatherParams::warp_groups), else the whole row.
__device__ void gather_row(const GatherParams& p, int64_t r, int32_t entry,
                           unsigned int* group_amax, int c0, int c1) {
  const int64_t H = p.hidden_size;
  const int64_t source = entry >= 0 ? static_cast<int64_t>(entry / p.columns) * H : -1;
  if (p.warp_groups) {
    gather_groups_e4m3(p, r, source, c0, c1);
    return;
  }
  const int64_t pieces = (H + kPiece - 1) / kPiece;
  const auto values = [&](int64_t c, float(&v)[kPiece]) {
    if (source >= 0) {
      load_piece(p, source + c, c, v);
    } else {
#pragma unroll
      for (int i = 0; i < kPiece; ++i) v[i] = 0.0f;
    }
  };
  if (p.rows_dtype != DType::f8e4m3) {
    const int64_t last = min(pieces, (static_cast<int64_t>(c1) + kPiece - 1) / kPiece);
    for (int64_t piece = c0 / kPiece + threadIdx.x; piece < last; piece += kGatherThreads) {
      const int64_t c = piece * kPiece;
      float v[kPiece];
      values(c, v);
      if (p.vec) {
        uint32_t words[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint16_t lo = p.rows_dtype == DType::bf16
                                  ? __bfloat16_as_ushort(__float2bfloat16_rn(v[2 * i]))
                                  : __half_as_ushort(__float2half_rn(v[2 * i]));
          const uint16_t hi = p.rows_dtype == DType::bf16
                                  ? __bfloat16_as_ushort(__float2bfloat16_rn(v[2 * i + 1]))
                                  : __half_as_ushort(__float2half_rn(v[2 * i + 1]));
          words[i] = lo | (static_cast<uint32_t>(hi) << 16);
        }
        *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.rows) + r * H + c) =
            make_uint4(words[0], words[1], words[2], words[3]);
      } else {
        for (int i = 0; i < kPiece && c + i < H; ++i) {
          cuda_common::store_float(p.rows, p.rows_dtype, r * H + c + i, v[i]);
        }
      }
    }
    return;
  }
  // The columns of a piece lie in at most two groups (groups are at least 8 columns or the whole
  // row): the lower one and, from `split` on, the next. Found once per piece, in 32-bit integers
  // (H < 2^31): a 64-bit division per element made this loop the gather's whole cost (16 us for
  // one DeepSeek-V3 row).
  const int hidden = static_cast<int>(H), group_cols = p.quant_group;
  struct PieceGroups {
    int first, split;
  };
  const auto groups_of = [&](int c) {
    const int first = c / group_cols;
    return PieceGroups{first, (first + 1) * group_cols - c};
  };
  const bool dynamic = p.static_scale == nullptr;
  for (int g = threadIdx.x; dynamic && g < p.groups_per_row; g += kGatherThreads) {
    group_amax[g] = 0u;
  }
  __syncthreads();
  for (int piece = threadIdx.x; dynamic && piece < pieces; piece += kGatherThreads) {
    const int c = piece * kPiece;
    float v[kPiece];
    values(c, v);
    const PieceGroups groups = groups_of(c);
    float amax[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < kPiece; ++i) {
      if (c + i < hidden) amax[i >= groups.split] = fmaxf(amax[i >= groups.split], fabsf(v[i]));
    }
    atomicMax(&group_amax[groups.first], __float_as_uint(amax[0]));
    if (groups.split < kPiece && c + groups.split < hidden) {
      atomicMax(&group_amax[groups.first + 1], __float_as_uint(amax[1]));
    }
  }
  __syncthreads();
  const float fixed = dynamic ? 0.0f : __ldg(p.static_scale);
  const auto scale_of = [&](int g) {
    return dynamic ? fmaxf(__uint_as_float(group_amax[g]), 1e-10f) / 448.0f : fixed;
  };
  for (int g = threadIdx.x; dynamic && g < p.groups_per_row; g += kGatherThreads) {
    p.scales[r * p.groups_per_row + g] = scale_of(g);
  }
  auto* out = static_cast<__nv_fp8_storage_t*>(p.rows) + r * H;
  for (int piece = threadIdx.x; piece < pieces; piece += kGatherThreads) {
    const int c = piece * kPiece;
    float v[kPiece];
    values(c, v);
    const PieceGroups groups = groups_of(c);
    const int last_group = static_cast<int>(p.groups_per_row) - 1;
    const float scale[2] = {scale_of(groups.first), scale_of(min(groups.first + 1, last_group))};
    __nv_fp8_storage_t codes[kPiece];
#pragma unroll
    for (int i = 0; i < kPiece; ++i) {
      codes[i] = __nv_cvt_float_to_fp8(v[i] / scale[i >= groups.split], __NV_SATFINITE, __NV_E4M3);
    }
    if (p.vec) {
      uint32_t words[2] = {0u, 0u};
#pragma unroll
      for (int i = 0; i < kPiece; ++i)
        words[i / 4] |= static_cast<uint32_t>(codes[i]) << (8 * (i % 4));
      *reinterpret_cast<uint2*>(out + c) = make_uint2(words[0], words[1]);
    } else {
      for (int i = 0; i < kPiece && c + i < hidden; ++i) out[c + i] = codes[i];
    }
  }
}

__global__ void gather_kernel(GatherParams p) {
  cuda_launch::wait_for_inputs();
  cuda_launch::release_dependents();
  extern __shared__ unsigned int group_amax[];  // e4m3: [groups_per_row], float bits
  const int64_t r = blockIdx.x;
  if (p.capacity > 0) {
    if (r % p.capacity >= p.counts[r / p.capacity]) return;
  } else if (r >= p.offsets[p.n_slots]) {
    return;
  }
  gather_row(p, r, p.row_source[r], group_amax, 0, static_cast<int>(p.hidden_size));
}

// sort_by_slot then gather_rows for a batch of at most kTinyEntries entries, contiguous layout,
// tile 1: block r first sorts every entry with one warp (tiny_place), block 0 writes the sort's
// outputs as sort_by_slot does, and block r gathers row r as gather_kernel does. One launch instead
// of two; each block's sort is 32 steps of a warp.
__global__ void sort_gather_tiny_kernel(SortParams s, GatherParams p) {
  cuda_launch::wait_for_inputs();
  cuda_launch::release_dependents();
  extern __shared__ unsigned int group_amax[];  // e4m3: [groups_per_row], float bits
  __shared__ int slot_of_entry[kTinyEntries];
  __shared__ int row_of_entry[kTinyEntries];
  __shared__ int rows_used;
  // The global -> local table comes into shared memory while warp 0 loads the ids, so mapping an
  // id is no second memory round trip after the first.
  __shared__ int32_t table[kTinyTable];
  const bool table_here = s.global_to_local != nullptr && s.n_global <= kTinyTable;
  if (table_here) {
    for (int g = threadIdx.x; g < s.n_global; g += blockDim.x) table[g] = s.global_to_local[g];
  }
  const int entries = static_cast<int>(s.entries);
  const int id = threadIdx.x < entries ? s.ids[threadIdx.x] : -1;
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const int slot =
        lane < entries ? local_slot(s, id, table_here ? table : s.global_to_local) : -1;
    const TinyPlace place = tiny_place(slot, entries, lane);
    slot_of_entry[lane] = slot;
    row_of_entry[lane] = place.row;
    if (lane == 0) rows_used = place.used;
  }
  __syncthreads();
  if (blockIdx.x == 0 && blockIdx.y == 0) {
    for (int e = threadIdx.x; e < entries; e += blockDim.x) {
      s.entry_row[e] = row_of_entry[e];
      if (row_of_entry[e] >= 0) s.row_source[row_of_entry[e]] = e;
    }
    for (int slot = threadIdx.x; slot < s.n_slots; slot += blockDim.x) {
      int count = 0, before = 0;
      for (int e = 0; e < entries; ++e) {
        count += slot_of_entry[e] == slot;
        before += slot_of_entry[e] >= 0 && slot_of_entry[e] < slot;
      }
      s.counts[slot] = count;
      s.offsets[slot] = before;
    }
    if (threadIdx.x == 0) s.offsets[s.n_slots] = rows_used;
  }
  const int r = static_cast<int>(blockIdx.x);
  if (r >= rows_used) return;
  int entry = -1;
  for (int e = 0; e < entries; ++e) {
    if (row_of_entry[e] == r) entry = e;
  }
  // Segment blockIdx.y of the row (a grid of one segment where the row is not split).
  const int c0 = static_cast<int>(blockIdx.y) * kSegmentCols;
  const int c1 = gridDim.y == 1 ? static_cast<int>(p.hidden_size)
                                : min(c0 + kSegmentCols, static_cast<int>(p.hidden_size));
  gather_row(p, r, entry, group_amax, c0, c1);
}

struct CombineParams {
  const void* rows;
  DType rows_dtype;
  const int32_t* entry_row;
  bool apply_weights;
  const float* weights;
  const void* shared;
  DType shared_dtype;
  int columns;
  int64_t hidden_size;
  void* output;
  DType output_dtype;
};

constexpr int kCombineThreads = 256;
constexpr int kCombinePerThread = 4;
constexpr int kCombineMaxColumns = 64;  // top-k (at most 32 on the GPU) and fused shared slots
constexpr int kCombineChunk = 8;        // columns whose values are loaded before any is added

// A token's rows and weights go to shared memory first, and the values of 8 columns are loaded
// before any is added, so those loads do not wait on one another (a row's address would
// otherwise hang on the load of its entry, and each load on the previous sum). One kernel per
// rows dtype: a dtype switch in each of the 32 unrolled loads made the kernel 29 KB of code,
// fetched cold at every decode step.
template <DType kRows>
__device__ __forceinline__ float load_row_value(const void* rows, int64_t index) {
  if constexpr (kRows == DType::bf16) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(rows)[index]);
  } else if constexpr (kRows == DType::f16) {
    return __half2float(static_cast<const __half*>(rows)[index]);
  } else {
    return static_cast<const float*>(rows)[index];
  }
}

template <DType kRows>
__global__ void combine_kernel(CombineParams p) {
  cuda_launch::wait_for_inputs();
  cuda_launch::release_dependents();
  __shared__ int32_t token_rows[kCombineMaxColumns];
  __shared__ float token_weights[kCombineMaxColumns];
  const int64_t t = blockIdx.x;  // x: a grid's y and z stop at 65535
  const int64_t H = p.hidden_size;
  for (int j = threadIdx.x; j < p.columns; j += kCombineThreads) {
    const int64_t entry = t * p.columns + j;
    token_rows[j] = p.entry_row[entry];
    token_weights[j] = p.apply_weights ? p.weights[entry] : 1.0f;
  }
  __syncthreads();
  const int64_t first =
      static_cast<int64_t>(blockIdx.y) * kCombineThreads * kCombinePerThread + threadIdx.x;
  float sum[kCombinePerThread] = {};
  for (int j0 = 0; j0 < p.columns; j0 += kCombineChunk) {
    float y[kCombineChunk][kCombinePerThread];
#pragma unroll
    for (int c = 0; c < kCombineChunk; ++c) {
      const int64_t row = j0 + c < p.columns ? token_rows[j0 + c] : -1;
#pragma unroll
      for (int i = 0; i < kCombinePerThread; ++i) {
        const int64_t h = first + i * kCombineThreads;
        y[c][i] = row >= 0 && h < H ? load_row_value<kRows>(p.rows, row * H + h) : 0.0f;
      }
    }
#pragma unroll
    for (int c = 0; c < kCombineChunk; ++c) {
      if (j0 + c >= p.columns || token_rows[j0 + c] < 0) continue;
      const float weight = token_weights[j0 + c];
#pragma unroll
      for (int i = 0; i < kCombinePerThread; ++i) {
        sum[i] += weight * y[c][i];  // weight is 1 where GEMM2 applied it
      }
    }
  }
  for (int i = 0; i < kCombinePerThread; ++i) {
    const int64_t h = first + i * kCombineThreads;
    if (h >= H) continue;
    float out = sum[i];
    if (p.shared) out += cuda_common::load_float(p.shared, p.shared_dtype, t * H + h);
    cuda_common::store_float(p.output, p.output_dtype, t * H + h, out);
  }
}

std::string str(int64_t value) {
  return std::to_string(value);
}

int64_t chunk_count(int64_t entries) {
  return (entries + kChunkEntries - 1) / kChunkEntries;
}

void check_activation(DType dtype, const char* kernel, const char* name) {
  if (!cuda_common::is_activation_dtype(dtype)) {
    cuda_errors::invalid_argument(std::string(kernel) + ": " + name + " dtype " +
                                  std::string(dtype_name(dtype)) +
                                  " is not supported (f32, bf16 or f16)");
  }
}

}  // namespace

int64_t sort_max_rows(int64_t entries, int n_slots, int tile, int capacity) {
  if (capacity > 0) return int64_t{n_slots} * capacity;
  return entries + int64_t{n_slots} * (std::max(tile, 1) - 1);
}

int64_t sort_scratch_bytes(int64_t entries, int n_slots) {
  if (entries <= kSmallEntries) return 0;
  return chunk_count(entries) * n_slots * static_cast<int64_t>(sizeof(int));
}

namespace {

// sort_by_slot's argument checks; its kernels' parameters.
SortParams checked_sort(const SortArgs& args) {
  const int64_t entries = args.tokens * args.columns;
  if (args.tokens < 0 || args.columns < 1 || args.n_slots < 1 || args.tile < 1 ||
      args.capacity < 0) {
    cuda_errors::invalid_argument("sort_by_slot: bad sizes (tokens " + str(args.tokens) +
                                  ", columns " + str(args.columns) + ", slots " +
                                  str(args.n_slots) + ", tile " + str(args.tile) + ", capacity " +
                                  str(args.capacity) + ")");
  }
  if (args.capacity > 0 && args.capacity < args.tokens) {
    cuda_errors::invalid_argument("sort_by_slot: the masked layout's capacity " +
                                  str(args.capacity) + " is below the batch's " + str(args.tokens) +
                                  " tokens");
  }
  const int64_t max_rows = sort_max_rows(entries, args.n_slots, args.tile, args.capacity);
  if (max_rows >= (int64_t{1} << 31)) {
    cuda_errors::invalid_argument("sort_by_slot: the grouped layout would exceed 2^31 rows");
  }
  if ((args.global_to_local != nullptr) != (args.n_global > 0)) {
    cuda_errors::invalid_argument("sort_by_slot: global_to_local and n_global go together");
  }
  const int64_t slot_bytes = int64_t{args.n_slots} * static_cast<int64_t>(sizeof(int));
  if (slot_bytes * kChunkWarps > kSharedLimit) {
    cuda_errors::invalid_argument("sort_by_slot: " + str(args.n_slots) +
                                  " slots are more than the GPU sort handles (" +
                                  str(kSharedLimit / kChunkWarps / 4) + ")");
  }
  // An empty batch still writes counts and offsets (all rows unused); ids, entry_row and
  // row_source may then be empty.
  if (args.counts == nullptr || args.offsets == nullptr ||
      (entries > 0 && (args.ids == nullptr || args.entry_row == nullptr)) ||
      (max_rows > 0 && args.row_source == nullptr)) {
    cuda_errors::invalid_argument("sort_by_slot: ids and the outputs must not be null");
  }
  return {args.ids,      args.global_to_local, args.n_global, entries,      args.n_slots,
          args.tile,     args.capacity,        args.counts,   args.offsets, args.row_source,
          args.entry_row};
}

}  // namespace

void sort_by_slot(const SortArgs& args, cudaStream_t stream) {
  const SortParams p = checked_sort(args);
  const int64_t entries = p.entries;
  const int64_t slot_bytes = int64_t{args.n_slots} * static_cast<int64_t>(sizeof(int));
  const auto shared = static_cast<size_t>(slot_bytes);
  if (entries <= kSmallEntries) {
    // As many placing warps (up to the block's 32) as have a histogram in shared memory.
    const int warps =
        static_cast<int>(std::min<int64_t>(kScanThreads / 32, kSharedLimit / slot_bytes - 1));
    cuda_launch::launch(sort_small_kernel, 1, kScanThreads,
                        static_cast<size_t>((warps + 1) * slot_bytes), stream, p, warps);
    cuda_common::check_launch("sort_by_slot");
    return;
  }
  if (args.scratch == nullptr) {
    cuda_errors::invalid_argument("sort_by_slot: " + str(entries) + " entries need " +
                                  str(sort_scratch_bytes(entries, args.n_slots)) +
                                  " bytes of scratch, got none");
  }
  auto* chunk_counts = static_cast<int*>(args.scratch);
  const int64_t chunks = chunk_count(entries);
  const unsigned blocks = cuda_common::blocks_for(chunks, kChunkWarps);
  cuda_launch::launch(chunk_histogram_kernel, blocks, kChunkWarps * 32, shared * kChunkWarps,
                      stream, p, chunk_counts);
  cuda_launch::launch(chunk_scan_kernel, 1, kScanThreads, shared, stream, p, chunk_counts, chunks);
  cuda_launch::launch(chunk_place_kernel, blocks, kChunkWarps * 32, shared * kChunkWarps, stream, p,
                      chunk_counts);
  cuda_common::check_launch("sort_by_slot");
}

namespace {

// gather_rows's argument checks; its kernel's parameters and shared memory. `empty`: nothing to
// gather (no tokens or no rows).
struct GatherLaunch {
  GatherParams p;
  size_t shared;
  bool empty;
};

GatherLaunch checked_gather(const GatherArgs& args) {
  check_activation(args.hidden_dtype, "gather_rows", "hidden_states");
  const DType out = args.rows_dtype;
  if (out != DType::bf16 && out != DType::f16 && out != DType::f8e4m3) {
    cuda_errors::invalid_argument("gather_rows: rows dtype " + std::string(dtype_name(out)) +
                                  " is not supported (bf16, f16 or f8e4m3)");
  }
  if (args.tokens < 0 || args.hidden_size < 1 || args.columns < 1 || args.n_slots < 1 ||
      args.capacity < 0 || args.max_rows < 0 || args.quant_group < 1) {
    cuda_errors::invalid_argument(
        "gather_rows: bad sizes (tokens " + str(args.tokens) + ", hidden " + str(args.hidden_size) +
        ", columns " + str(args.columns) + ", slots " + str(args.n_slots) + ", max_rows " +
        str(args.max_rows) + ", quant_group " + str(args.quant_group) + ")");
  }
  if (args.tokens == 0 || args.max_rows == 0) return {{}, 0, true};
  if (args.hidden == nullptr || args.row_source == nullptr || args.offsets == nullptr ||
      args.counts == nullptr || args.rows == nullptr ||
      (out == DType::f8e4m3 && args.scales == nullptr && args.static_scale == nullptr)) {
    cuda_errors::invalid_argument("gather_rows: inputs and outputs must not be null");
  }
  if (out == DType::f8e4m3 && args.quant_group < kPiece && args.quant_group < args.hidden_size) {
    cuda_errors::invalid_argument("gather_rows: e4m3 groups of " + str(args.quant_group) +
                                  " columns; the GPU gather takes groups of 8 or more, or the row");
  }
  const int64_t groups = (args.hidden_size + args.quant_group - 1) / args.quant_group;
  const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  const bool vec = args.hidden_size % kPiece == 0 && aligned(args.hidden) && aligned(args.rows);
  const GatherParams p{
      args.hidden,
      args.hidden_dtype,
      args.hidden_size,
      args.columns,
      args.row_source,
      args.offsets,
      args.counts,
      args.n_slots,
      args.capacity,
      args.rows,
      out,
      args.scales,
      args.quant_group,
      groups,
      vec,
      args.static_scale,
      out == DType::f8e4m3 && vec && args.static_scale == nullptr && args.quant_group == 128};
  const auto shared = out == DType::f8e4m3 ? static_cast<size_t>(groups) * sizeof(unsigned) : 0;
  if (shared > static_cast<size_t>(kSharedLimit)) {
    cuda_errors::invalid_argument("gather_rows: " + str(groups) + " e4m3 groups per row are more " +
                                  "than the GPU gather holds");
  }
  return {p, shared, false};
}

}  // namespace

void gather_rows(const GatherArgs& args, cudaStream_t stream) {
  const GatherLaunch g = checked_gather(args);
  if (g.empty) return;
  cuda_launch::launch(gather_kernel, static_cast<unsigned>(args.max_rows), kGatherThreads, g.shared,
                      stream, g.p);
  cuda_common::check_launch("gather_rows");
}

void sort_and_gather(const SortArgs& sort, const GatherArgs& gather, cudaStream_t stream) {
  if (gather.row_source != sort.row_source || gather.offsets != sort.offsets ||
      gather.counts != sort.counts || gather.tokens != sort.tokens ||
      gather.columns != sort.columns || gather.n_slots != sort.n_slots ||
      gather.capacity != sort.capacity) {
    cuda_errors::invalid_argument(
        "sort_and_gather: the gather must read the sort's outputs, of the same batch and layout");
  }
  const int64_t entries = sort.tokens * sort.columns;
  if (entries < 1 || entries > kTinyEntries || sort.tile != 1 || sort.capacity != 0) {
    sort_by_slot(sort, stream);
    gather_rows(gather, stream);
    return;
  }
  const SortParams s = checked_sort(sort);
  const GatherLaunch g = checked_gather(gather);
  if (gather.max_rows < entries) {
    cuda_errors::invalid_argument("sort_and_gather: max_rows " + str(gather.max_rows) +
                                  " is below the layout's " + str(entries) + " rows");
  }
  // One block per row the layout can hold (tile 1: one per entry) and segment of the row.
  const bool split = g.p.rows_dtype != DType::f8e4m3 || g.p.warp_groups;
  const dim3 grid(static_cast<unsigned>(entries),
                  split ? cuda_common::blocks_for(gather.hidden_size, kSegmentCols) : 1u);
  cuda_launch::launch(sort_gather_tiny_kernel, grid, kGatherThreads, g.shared, stream, s, g.p);
  cuda_common::check_launch("sort_and_gather");
}

void combine(const CombineArgs& args, cudaStream_t stream) {
  check_activation(args.rows_dtype, "combine", "rows");
  check_activation(args.output_dtype, "combine", "output");
  if (args.shared) check_activation(args.shared_dtype, "combine", "shared output");
  if (args.tokens < 0 || args.columns < 1 || args.columns > kCombineMaxColumns ||
      args.hidden_size < 1) {
    cuda_errors::invalid_argument("combine: bad sizes (tokens " + str(args.tokens) + ", columns " +
                                  str(args.columns) + " of at most " + str(kCombineMaxColumns) +
                                  ", hidden " + str(args.hidden_size) + ")");
  }
  if (args.tokens == 0) return;
  if (args.rows == nullptr || args.entry_row == nullptr || args.output == nullptr ||
      (args.apply_weights && args.weights == nullptr)) {
    cuda_errors::invalid_argument("combine: rows, entry_row, weights and output must not be null");
  }
  const CombineParams p{args.rows,        args.rows_dtype, args.entry_row,    args.apply_weights,
                        args.weights,     args.shared,     args.shared_dtype, args.columns,
                        args.hidden_size, args.output,     args.output_dtype};
  const dim3 grid(static_cast<unsigned>(args.tokens),
                  cuda_common::blocks_for(args.hidden_size, kCombineThreads * kCombinePerThread));
  const auto kernel = args.rows_dtype == DType::bf16  ? combine_kernel<DType::bf16>
                      : args.rows_dtype == DType::f16 ? combine_kernel<DType::f16>
                                                      : combine_kernel<DType::f32>;
  cuda_launch::launch(kernel, grid, kCombineThreads, 0, stream, p);
  cuda_common::check_launch("combine");
}

}  // namespace moekit::runner::cuda
