#pragma once
// The Hopper decode kernel (sm_90a): the wgmma kernel's TMA pipeline with the operands swapped.
// The weight rows are wgmma's M side (slabs of 64) and a tile of kTokens rows of one expert its
// N side (n8 or n16), where the 64-row kernel multiplies 64 token rows of which a decode step
// fills one or two: its tensor work per K step (~0.5k cycles) then set the pace of a stream that
// TMA alone delivers at the read bandwidth (bench/cuda/tma_read_bench.cu: DeepSeek-V3 fp8 GEMM1
// 57 us of copies against 68 us for the kernel). Here a step's wgmma are an eighth of that, and
// the K loop waits on the copies alone.
//
// A CTA takes 256 weight rows (or 128, with one warpgroup), in the boxes and stages of the
// 64 x 256 tile (the producer is the wgmma kernel's): each warpgroup two slabs of 64 rows, for
// GEMM1 its 64 gate rows and the 64 up rows of the same columns (so gate and up of an output meet
// in one thread, in the same accumulator of each slab), for GEMM2 128 consecutive rows. A thread's
// accumulators are weight rows (warp * 16 + lane / 4, and 8 below) by tokens (2 * (lane % 4), +1,
// and 8 on for n16). Tokens of the N box past the tile's end belong to the next expert or lie past
// the buffer (zeros): their columns are multiplied and never stored.
//
// Split K (Params::splits > 1): a tile's K steps are shared by `splits` CTAs (blockIdx.y), for
// batches of a few tiles that each stream megabytes (Mixtral-8x7B T = 1: GEMM2's 32 tiles on 132
// SMs, each SM streaming only so fast; choose_gemm says where). Each CTA
// leaves its f32 accumulators in split_partials; the last of the tile's CTAs to arrive on its
// counter adds them all in split order and runs the epilogue (sum_splits).

#include "runner/cuda/gemm/wgmma_gemm.cuh"
#include "runner/cuda/tiny_sort.cuh"

namespace moekit::cuda_gemm::detail {

template <int kTokens_, int kCols_, int kStages_, int kPerSm_>
struct WgmmaDecodeShape {
  static constexpr int kTokens = kTokens_, kCols = kCols_, kStages = kStages_;
  static constexpr int kRows = kTokens;  // token rows per tile (the A box of `produce`)
  static constexpr int kPerSm = kPerSm_;
  static constexpr int kGroupCols = 128;  // weight rows per warpgroup: two slabs of 64
  static constexpr int kGroups = kCols / kGroupCols;
  static constexpr int kConsumers = 128 * kGroups;
  static constexpr int kThreads = kConsumers + 32;
  static constexpr int kStageA = kTokens * kStepBytes, kStageB = kCols * kStepBytes;
  static constexpr int kStageBytes = kStageA + kStageB;
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;
  __host__ __device__ static constexpr int box_rows(bool gated) {
    return gated ? kGroupCols / 2 : kGroupCols;
  }
  static_assert(kTokens == 8 || kTokens == 16);
  static_assert(kCols == 128 || kCols == 256);
  // Each stage's token box starts on the swizzle's 1024-byte pattern.
  static_assert(kStageA % 1024 == 0);
  static_assert(kPerSm * (kSmemBytes + 1024) <= 228 * 1024, "an SM has 228 KB of shared memory");
};
// 256 weight rows (two warpgroups), one CTA to an SM.
using WgmmaDecode8 = WgmmaDecodeShape<8, 256, 6, 1>;
using WgmmaDecode16 = WgmmaDecodeShape<16, 256, 6, 1>;
// 128 weight rows (one warpgroup), two to an SM: twice the CTAs over the same weights, for
// experts too small to give every SM a CTA of 256 rows.
using WgmmaDecode8x128 = WgmmaDecodeShape<8, 128, 6, 2>;
using WgmmaDecode16x128 = WgmmaDecodeShape<16, 128, 6, 2>;

// Split K's meeting of a tile's CTAs, by its kConsumers threads (the producer warp has left):
// this CTA's accumulators go to its slot of split_partials (value j of thread t at j * kConsumers
// + t, so each store and load of a warp is one line), then one thread counts the CTA in on the
// tile's counter. The last to arrive replaces `acc` with the sum of every split's, always in
// split order (so the bits are the same whichever CTA is last), and resets the counter for the
// next launch; the others return false and leave.
template <int kConsumers, int kAcc>
__device__ __forceinline__ bool sum_splits(const Params& p, float (&acc)[2][kAcc], int tid) {
  __shared__ int last;
  constexpr int kValues = 2 * kAcc;
  const int item = static_cast<int>(blockIdx.x), split = static_cast<int>(blockIdx.y);
  const auto slot = [&](int j) {
    return p.split_partials + (static_cast<int64_t>(item) * p.splits + j) * kValues * kConsumers +
           tid;
  };
  float* mine = slot(split);
#pragma unroll
  for (int v = 0; v < kValues; ++v) __stcg(mine + v * kConsumers, acc[v / kAcc][v % kAcc]);
  // Each thread's stores before the count (the pattern of CUDA's threadFenceReduction sample).
  __threadfence();
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers) : "memory");
  if (tid == 0) {
    const bool is_last =
        atomicAdd(p.split_counters + item, 1u) == static_cast<uint32_t>(p.splits - 1);
    if (is_last) atomicExch(p.split_counters + item, 0u);
    last = is_last;
  }
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers) : "memory");
  if (!last) return false;
  __threadfence();
  float sum[kValues];
  for (int j = 0; j < p.splits; ++j) {
    const float* part = slot(j);
#pragma unroll
    for (int v = 0; v < kValues; ++v) {
      const float x = j == split ? acc[v / kAcc][v % kAcc] : __ldcg(part + v * kConsumers);
      sum[v] = j == 0 ? x : sum[v] + x;
    }
  }
#pragma unroll
  for (int v = 0; v < kValues; ++v) acc[v / kAcc][v % kAcc] = sum[v];
  return true;
}

// A decode step's entries as the CTA placed them (Params::e_ids): each entry's slot and row.
struct EntryPlaces {
  int slot[runner::cuda::kTinyEntries];
  int row[runner::cuda::kTinyEntries];
};
constexpr int kEntryTable = 512;  // global -> local tables up to this size come to shared memory

// The tile of CTA `item` where the CTA places a decode step's entries itself (Params::e_ids):
// the hit slots in increasing order, as find_tile enumerates them over a sort's offsets. With
// tile_rows > 0 (GEMM2) the tiles are find_tile's own, tile_rows of each slot's grouped rows from
// the slot's offset (its first entry's row); with tile_rows 0 (GEMM1) one tile per hit slot of
// every token, its rows the hidden states from token 0. Every thread calls it; `places` gets each
// entry's slot and row. The table comes to shared memory while warp 0 loads the ids, so mapping
// an id is no second memory round trip after the first. One token's entries are placed by their
// column instead, tile e and row e for entry e (the grid has a tile per entry: grid_row_tiles).
template <int kThreads>
__device__ Tile tile_from_entries(const Params& p, int item, int tile_rows, int col_tiles,
                                  EntryPlaces& places, int* table, int* scratch) {
  const int tid = static_cast<int>(threadIdx.x);
  const int entries = p.e_tokens * p.e_columns;
  const bool table_here = p.e_table != nullptr && p.e_n_global <= kEntryTable;
  if (table_here) {
    for (int g = tid; g < p.e_n_global; g += kThreads) table[g] = p.e_table[g];
  }
  const int id = tid < entries ? p.e_ids[tid] : -1;
  __syncthreads();
  if (p.e_tokens == 1) {
    // One token: entry e is row e (of the activations and GEMM2's output) and the column tiles
    // of tile e, so no CTA ranks anything (tiny_place's shuffles held every CTA's first loads by
    // 1-2 us, bench/cuda/NOTES.md v16). The sort's rows need not be these: at one token the
    // whole forward reads its rows from here (the combine from GEMM1's entry_row), and an entry
    // that repeats another's slot only computes the same tile twice.
    if (tid < 32) {
      const int lane = tid;
      const int slot = lane < entries
                           ? runner::cuda::tiny_local_slot(id, table_here ? table : p.e_table,
                                                           p.e_n_global, p.num_experts)
                           : -1;
      places.slot[lane] = slot;
      places.row[lane] = slot >= 0 ? lane : -1;
    }
    __syncthreads();
    const int entry = item / col_tiles;
    const int slot = entry < entries ? places.slot[entry] : -1;
    return {slot, tile_rows == 0 ? 0 : entry, 1, item % col_tiles};
  }
  if (tid < 32) {
    const int lane = tid;
    const int slot = lane < entries
                         ? runner::cuda::tiny_local_slot(id, table_here ? table : p.e_table,
                                                         p.e_n_global, p.num_experts)
                         : -1;
    const runner::cuda::TinyPlace place = runner::cuda::tiny_place(slot, entries, lane);
    places.slot[lane] = slot;
    places.row[lane] = place.row;
    // Each hit slot's first entry stands for the slot: its items, and the items of the hit
    // slots below it.
    const unsigned same = __match_any_sync(0xFFFFFFFFu, slot);
    const bool first = slot >= 0 && __ffs(static_cast<int>(same)) - 1 == lane;
    const int count = __popc(same);
    const int row_tiles = tile_rows == 0 ? 1 : (count + tile_rows - 1) / tile_rows;
    const int items = first ? row_tiles * col_tiles : 0;
    int before = 0;
    for (int j = 0; j < 32; ++j) {
      const int other = __shfl_sync(0xFFFFFFFFu, slot, j);
      const int other_items = __shfl_sync(0xFFFFFFFFu, items, j);
      if (other < slot) before += other_items;
    }
    if (lane == 0) scratch[0] = -1;
    __syncwarp();
    if (items > 0 && item >= before && item < before + items) {
      const int t = item - before, row_tile = t % row_tiles;
      scratch[0] = slot;
      scratch[1] = tile_rows == 0 ? 0 : place.row + row_tile * tile_rows;
      scratch[2] = tile_rows == 0 ? p.e_tokens : min(tile_rows, count - row_tile * tile_rows);
      scratch[3] = t / row_tiles;
    }
  }
  __syncthreads();
  return {scratch[0], scratch[1], scratch[2], scratch[3]};
}

template <class S, Elem kElem, bool kGated, bool kPerBlock>
__global__ void __launch_bounds__(S::kThreads, S::kPerSm)
    wgmma_decode_kernel(const __grid_constant__ WgmmaArgs args) {
  const Params& p = args.p;
  constexpr int kBytes = kElemBytes<kElem>;
  constexpr bool kFp8 = kElem == Elem::e4m3;
  constexpr int kT = S::kTokens, kAcc = kT / 2;                // accumulators per slab and thread
  constexpr int kTileCols = kGated ? S::kCols / 2 : S::kCols;  // output columns per CTA
  constexpr int kGroupOut = kGated ? 64 : 128;                 // output columns per warpgroup
  extern __shared__ uint4 smem[];
  __shared__ int scratch[S::kThreads / 32 + 4];
  __shared__ uint64_t full[S::kStages], empty[S::kStages];
  // fp8-block: each stage's scales, copied with its boxes by the producer warp (a load issued by
  // the consumers at each step waited out a memory round trip per K step under the stream of
  // weights, which paced the whole kernel): slots 2g and 2g + 1 warpgroup g's weight scales
  // (gate and up; GEMM2 the first alone), slot 4 + t token t's activation scale.
  constexpr int kScaleSlots = 4 + kT;
  __shared__ float stage_scales[kPerBlock ? S::kStages : 1][kScaleSlots];
  static_assert(kScaleSlots <= 32, "a lane of the producer warp copies each scale");
  // Entries placed by the CTA itself (Params::e_ids; 16-bit formats only).
  __shared__ EntryPlaces places;
  __shared__ int entry_table[kFp8 ? 1 : kEntryTable];
  const bool own_entries = !kFp8 && p.e_ids != nullptr;

  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    for (int s = 0; s < S::kStages; ++s) {
      // The TMA copies' arrival, and with the scales each producer lane's cp.async arrival.
      mbarrier_init(smem_address(&full[s]), kPerBlock ? 1 + 32 : 1);
      // fp8-block: every consumer thread hands the stage back itself (kPerBlock's note at
      // `release`); otherwise one lane per warp.
      mbarrier_init(smem_address(&empty[s]), kPerBlock ? S::kConsumers : S::kConsumers / 32);
    }
    fence_mbarrier_init();
  }
  // As in the wgmma kernel: GEMM1 waits before it reads the sort's offsets and lets GEMM2 be
  // scheduled; GEMM2 finds its tile and loads its first weights before it waits.
  if constexpr (kGated) {
    cuda_launch::wait_for_inputs();
    cuda_launch::release_dependents();
  }
  const int col_tiles = (p.n + kTileCols - 1) / kTileCols;
  const int item = static_cast<int>(blockIdx.x);
  const Tile tile =
      own_entries
          ? tile_from_entries<S::kThreads>(p, item, kGated ? 0 : S::kRows, col_tiles, places,
                                           entry_table, scratch)
          : find_tile<S::kThreads>(p.offsets, p.num_experts, item, S::kRows, col_tiles, scratch);
  // GEMM1's first CTA hands the entries' rows to the combine, as the sort would have.
  if (kGated && own_entries && item == 0 && blockIdx.y == 0 && tid < p.e_tokens * p.e_columns) {
    p.e_entry_row[tid] = places.row[tid];
  }
  if (tile.expert < 0) return;
  const int64_t row_bytes = static_cast<int64_t>(p.k) * kBytes;
  const int all_steps = static_cast<int>((row_bytes + kStepBytes - 1) / kStepBytes);
  // This CTA's share of K (all of it unless K is split): steps [first_step, first_step + steps).
  const int split = static_cast<int>(blockIdx.y);
  const int first_step = all_steps * split / p.splits;
  const int steps = all_steps * (split + 1) / p.splits - first_step;
  const int n0 = tile.col * kTileCols;
  const uint32_t a_smem = (smem_address(smem) + 1023u) & ~1023u;
  const uint32_t b_smem = a_smem + S::kStages * S::kStageA;

  if (tid >= S::kConsumers) {
    const int lane = tid - S::kConsumers;
    if constexpr (kPerBlock) {
      const auto copy_scales = [&](int step, int stage, uint32_t bar) {
        const uint32_t slot = smem_address(&stage_scales[stage][lane]);
        if (lane < 2 * S::kGroups) {
          const int g = lane / 2, part = lane % 2;
          if (kGated || part == 0) {
            const int col = min(n0 + g * kGroupOut, p.n - 1);
            cp_async_4(slot, p.w_scale +
                                 weight_scale_base(p, kGated ? 2 : 1, tile.expert, part, col) +
                                 step * p.ws_kb_step);
          }
        } else if (lane >= 4 && lane - 4 < tile.rows) {
          const int64_t row = tile.row0 + lane - 4;
          cp_async_4(slot, p.a_scale + row * p.as_cols + step * p.as_kb_step);
        }
        cp_async_mbarrier_arrive(bar);
      };
      produce<S, kGated>(args, tile, n0, first_step, steps, a_smem, b_smem, full, empty, lane,
                         copy_scales);
    } else if (lane == 0) {
      produce<S, kGated>(args, tile, n0, first_step, steps, a_smem, b_smem, full, empty, lane,
                         [](int, int, uint32_t) {});
    }
    return;
  }
  if constexpr (!kGated) cuda_launch::wait_for_inputs();  // the consumers read GEMM1's scales

  const int group = tid / 128, lane = tid & 31, warp_in_group = (tid >> 5) & 3, q = lane & 3;
  // The first output column of this warpgroup, and of slab s.
  const int group_col0 = n0 + group * kGroupOut;
  const auto slab_col0 = [&](int s) { return kGated ? group_col0 : group_col0 + s * 64; };
  // Accumulator i of a slab: weight row weight_row(i) of the slab, token token(i) of the tile.
  const auto weight_row = [&](int i) {
    return warp_in_group * 16 + (lane >> 2) + 8 * ((i / 2) % 2);
  };
  const auto token = [&](int i) { return (i / 4) * 8 + 2 * q + (i % 2); };

  float acc[2][kAcc];
#pragma unroll
  for (int s = 0; s < 2; ++s) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[s][i] = 0.0f;
  }
  // Hands a stage back to the producer. With fp8-block scales each thread arrives for its own
  // reads of the stage's scales, which the producer's cp.async rewrites once the stage is empty:
  // a lane's reads ordered before lane 0's arrival by __syncwarp alone were reported by
  // compute-sanitizer racecheck as hazards once the ring wrapped. The boxes are read by wgmma,
  // which wgmma_wait has retired, so one lane per warp arrives for them.
  const auto release = [&](int stage) {
    if (kPerBlock || lane == 0) mbarrier_arrive(smem_address(&empty[stage]));
  };
  // Waits for K step `step`'s stage and multiplies both slabs by the tokens into `sum`.
  const auto issue = [&](int step, float(&sum)[2][kAcc]) {
    const int stage = step % S::kStages;
    mbarrier_wait(smem_address(&full[stage]), (step / S::kStages) & 1);
    const uint64_t tokens = smem_desc_sw128(a_smem + stage * S::kStageA);
    const uint64_t slab0 =
        smem_desc_sw128(b_smem + stage * S::kStageB + group * S::kGroupCols * kStepBytes);
    const uint64_t slab1 = slab0 + ((64 * kStepBytes) >> 4);
    wgmma_fence();
    fence_registers(sum[0]);
    fence_registers(sum[1]);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int accumulate = kFp8 && k == 0 ? 0 : 1;
      wgmma<kElem, kT>(sum[0], slab0 + 2 * k, tokens + 2 * k, accumulate);
      wgmma<kElem, kT>(sum[1], slab1 + 2 * k, tokens + 2 * k, accumulate);
    }
    wgmma_commit();
  };

  if constexpr (kFp8) {
    // fp8-block: which of the thread's tokens are rows of the tile (the others' scales are 0).
    bool token_valid[kAcc / 2] = {};
#pragma unroll
    for (int t = 0; t < kAcc / 2; ++t) token_valid[t] = (t / 2) * 8 + 2 * q + t % 2 < tile.rows;
    float part[2][kAcc];
    for (int step = 0; step < steps; ++step) {
      issue(step, part);
      // The stage's scales, while the wgmma run (their stage is full, so they have arrived).
      float w_scale[2] = {1.0f, 1.0f}, a_scale[kAcc / 2];
#pragma unroll
      for (int t = 0; t < kAcc / 2; ++t) a_scale[t] = 1.0f;
      if constexpr (kPerBlock) {
        const float* scales = stage_scales[step % S::kStages];
        w_scale[0] = scales[2 * group];
        w_scale[1] = scales[2 * group + (kGated ? 1 : 0)];
#pragma unroll
        for (int t = 0; t < kAcc / 2; ++t) {
          a_scale[t] = token_valid[t] ? scales[4 + (t / 2) * 8 + 2 * q + t % 2] : 0.0f;
        }
      }
      wgmma_wait<0>();
      fence_registers(part[0]);
      fence_registers(part[1]);
      release(step % S::kStages);
#pragma unroll
      for (int s = 0; s < 2; ++s) {
#pragma unroll
        for (int i = 0; i < kAcc; ++i) {
          // Accumulator i's token is the thread's token (i / 4) * 2 + i % 2.
          const float a = kPerBlock ? a_scale[(i / 4) * 2 + i % 2] : 1.0f;
          acc[s][i] += kPerBlock ? part[s][i] * (a * w_scale[s]) : part[s][i];
        }
      }
    }
  } else {
    for (int step = 0; step < steps; ++step) {
      issue(step, acc);
      wgmma_wait<1>();
      if (step > 0) release((step - 1) % S::kStages);
    }
  }
  wgmma_wait<0>();
  fence_registers(acc[0]);
  fence_registers(acc[1]);
  if (p.splits > 1 && !sum_splits<S::kConsumers>(p, acc, tid)) return;

  // Per-matrix or per-channel fp8 scales, applied once.
  const auto tensor_scale = [&](int part_index, int col, int64_t row) {
    if constexpr (kFp8 && !kPerBlock) {
      return __ldg(p.w_scale + weight_scale_base(p, kGated ? 2 : 1, tile.expert, part_index, col)) *
             activation_scale(p, row, 0);
    }
    return 1.0f;
  };

  if constexpr (!kGated) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) {
        const int t = token(i), col = slab_col0(s) + weight_row(i);
        if (t >= tile.rows || col >= p.n) continue;
        const int64_t row = tile.row0 + t;
        const float weight = p.route_weight == nullptr ? 1.0f : __ldg(p.route_weight + row);
        static_cast<float*>(p.out)[row * p.n + col] =
            weight * (acc[s][i] * tensor_scale(0, col, row));
      }
    }
    return;
  } else {
    float v[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const int t = token(i), col = group_col0 + weight_row(i);
      v[i] = 0.0f;
      if (t < tile.rows && col < p.n) {
        const int64_t row = tile.row0 + t;
        v[i] = activate(p.activation, acc[0][i] * tensor_scale(0, col, row),
                        acc[1][i] * tensor_scale(1, col, row));
      }
    }
    // Only where the CTA holds a whole scale group of 128 columns (wgmma_quantizes).
    if constexpr (kFp8 && kTileCols == 128) {
      if (p.q_out != nullptr) {
        // GEMM2's e4m3 input, as quantize_rows_e4m3 would quantise the f32 values stored below:
        // the CTA's 128 output columns are one scale group of each token. A token's amax over
        // a warp's 16 rows is its lanes' (lane / 4 varies, lane % 4 fixed), then the 8 warps'.
        __shared__ float warp_amax[S::kConsumers / 32][kT];
        float amax[kAcc / 2];
#pragma unroll
        for (int t = 0; t < kAcc / 2; ++t) amax[t] = 0.0f;
#pragma unroll
        for (int i = 0; i < kAcc; ++i) {
          amax[(i / 4) * 2 + i % 2] = fmaxf(amax[(i / 4) * 2 + i % 2], fabsf(v[i]));
        }
#pragma unroll
        for (int t = 0; t < kAcc / 2; ++t) {
#pragma unroll
          for (int d = 4; d < 32; d <<= 1) {
            amax[t] = fmaxf(amax[t], __shfl_xor_sync(0xFFFFFFFFu, amax[t], d));
          }
          if (lane < 4) warp_amax[tid >> 5][(t / 2) * 8 + 2 * q + t % 2] = amax[t];
        }
        // The two consumer warpgroups alone (the producer warp has left): named barrier 1.
        asm volatile("bar.sync 1, %0;\n" ::"n"(S::kConsumers) : "memory");
        const int groups = (p.n + 127) / 128;
        float scale[kAcc / 2];
#pragma unroll
        for (int t = 0; t < kAcc / 2; ++t) {
          const int tok = (t / 2) * 8 + 2 * q + t % 2;
          float m = 0.0f;
#pragma unroll
          for (int w = 0; w < S::kConsumers / 32; ++w) m = fmaxf(m, warp_amax[w][tok]);
          scale[t] = p.q_static != nullptr ? __ldg(p.q_static) : fmaxf(m, 1e-10f) / 448.0f;
          if (p.q_static == nullptr && tid < 4 && tok < tile.rows) {
            p.q_scales[(tile.row0 + tok) * groups + n0 / 128] = scale[t];
          }
        }
#pragma unroll
        for (int i = 0; i < kAcc; ++i) {
          const int t = token(i), col = group_col0 + weight_row(i);
          if (t >= tile.rows || col >= p.n) continue;
          p.q_out[(tile.row0 + t) * int64_t{p.n} + col] = static_cast<uint8_t>(
              __nv_cvt_float_to_fp8(v[i] / scale[(i / 4) * 2 + i % 2], __NV_SATFINITE, __NV_E4M3));
        }
        return;
      }
    }
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const int t = token(i), col = group_col0 + weight_row(i);
      if (t >= tile.rows || col >= p.n) continue;
      if (own_entries) {
        // The tile's token t is hidden row t: its output goes to the row of each of its entries
        // on this slot (one, where a token routes to a slot once).
        for (int j = 0; j < p.e_columns; ++j) {
          const int e = t * p.e_columns + j;
          if (places.slot[e] != tile.expert) continue;
          store_activation(p, places.row[e] * int64_t{p.n} + col, v[i], kElem == Elem::bf16);
        }
      } else {
        store_activation(p, (tile.row0 + t) * int64_t{p.n} + col, v[i], kElem == Elem::bf16);
      }
    }
  }
}

}  // namespace moekit::cuda_gemm::detail
