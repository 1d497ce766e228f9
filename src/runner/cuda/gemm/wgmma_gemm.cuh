#pragma once
// The Hopper kernel (sm_90a): warpgroup MMA (wgmma) fed by the tensor memory accelerator (TMA).
// A producer warp copies each K step's tiles of rows and weights into shared memory with bulk
// tensor copies (128-byte swizzle, the layout wgmma's 128-byte swizzle mode reads), signalling an
// mbarrier per stage; two consumer warpgroups multiply from shared memory with wgmma and hand
// each stage back through a second mbarrier. No CTA-wide barrier in the K loop, every stage in
// flight, no loads issued by the threads that multiply, and e4m3 on the fp8 tensor cores at
// twice the 16-bit rate, which mma.sync cannot reach on sm_90.
//
// A CTA is kRows token rows x kCols weight rows. With 128 rows each consumer warpgroup takes 64
// rows and all kCols; with 64 rows both take the same rows and half of the columns each. For
// GEMM1 each warpgroup's weight rows in shared memory are its gate rows followed by the up rows
// of the same columns, so gate and up of an output meet in one thread. K runs in steps of 128
// bytes (a scale block for e4m3): four wgmma per step. Rows of the A box past the tile's end
// belong to the next expert (or lie past the buffer, which TMA fills with zeros): they are
// multiplied like the others and never stored, and each output row reads only its own input row.
//
// e4m3 sums are promoted: Hopper's fp8 tensor cores add in less than f32 precision (measured
// here: 2e-4 relative error on a K of 384 without promotion, against 1e-7 for mma.sync on f16),
// so each K step's four wgmma sum into registers of their own, which are then added to the f32
// accumulators (with the K block's scales for fp8-block), as DeepSeek-V3's kernels do.

#include <cuda.h>
#include <cuda_fp8.h>

#include "runner/cuda/gemm/gemm_device.cuh"
#include "runner/cuda/gemm/wgmma_ops.cuh"

namespace moekit::cuda_gemm::detail {

template <int kRows_, int kCols_, int kStages_, int kPerSm_ = 1>
struct WgmmaShape {
  static constexpr int kRows = kRows_, kCols = kCols_, kStages = kStages_;
  static constexpr int kPerSm = kPerSm_;  // CTAs an SM holds (shared memory and registers)
  // Two consumer warpgroups (warps 0-7, as wgmma wants warpgroups aligned to 4 warps), then the
  // producer warp. ptxas gives a thread of this CTA up to 168 registers (as for 384 threads):
  // room for 128 accumulators, not for two sets of 64 beside 64 (bench/cuda/NOTES.md v5).
  static constexpr int kConsumers = 256;
  static constexpr int kThreads = kConsumers + 32;
  static constexpr int kGroupsM = kRows / 64;              // warpgroups along the rows
  static constexpr int kGroupCols = kCols * kGroupsM / 2;  // the n of each warpgroup's wgmma
  static constexpr int kStageA = kRows * kStepBytes, kStageB = kCols * kStepBytes;
  static constexpr int kStageBytes = kStageA + kStageB;
  // One more KB to align the stages to the swizzle's 1024-byte pattern.
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;
  // Weight rows per TMA box: for GEMM1 a warpgroup's gate rows, then its up rows, one box each.
  __host__ __device__ static constexpr int box_rows(bool gated) {
    return gated ? kGroupCols / 2 : kGroupCols;
  }
  static_assert(kGroupsM == 1 || kGroupsM == 2);
  static_assert(kGroupCols == 64 || kGroupCols == 128 || kGroupCols == 256);
  static_assert(kPerSm * (kSmemBytes + 1024) <= 228 * 1024, "an SM has 228 KB of shared memory");
};
// 16-bit: warpgroups of 64 x 256 (128 accumulators a thread).
using Wgmma128x256 = WgmmaShape<128, 256, 4>;
// e4m3's second set of accumulators (a K step's partial sums) leaves room for 64 x 128.
using Wgmma128x128 = WgmmaShape<128, 128, 6>;
// Fewer rows per expert: both warpgroups on 64 rows, 128 weight rows each.
using Wgmma64x256 = WgmmaShape<64, 256, 5>;
// Twice the CTAs of 64 x 256 over the same weights, two to an SM: for grids that 64 x 256
// leaves short of the SMs (a decode step's few experts), where the weights' stream is all the
// time and more CTAs keep more of it in flight.
using Wgmma64x128 = WgmmaShape<64, 128, 4, 2>;

// What the kernel takes: the tensor maps of the GEMM input rows [rows, K] and of the weights
// [E * parts * N, K], both as bytes, boxes of 128 bytes x (kRows, box_rows) with the 128-byte
// swizzle, then the common parameters. Passed as a __grid_constant__: TMA reads the maps from
// the kernel's parameter space.
struct WgmmaArgs {
  CUtensorMap a_map;
  CUtensorMap w_map;
  Params p;
};

template <Elem kElem, int kN>
__device__ __forceinline__ void wgmma(float (&d)[kN / 2], uint64_t a, uint64_t b, int accumulate) {
  if constexpr (kElem == Elem::bf16 && kN == 256) wgmma_bf16_n256(d, a, b, accumulate);
  if constexpr (kElem == Elem::bf16 && kN == 128) wgmma_bf16_n128(d, a, b, accumulate);
  if constexpr (kElem == Elem::f16 && kN == 256) wgmma_f16_n256(d, a, b, accumulate);
  if constexpr (kElem == Elem::f16 && kN == 128) wgmma_f16_n128(d, a, b, accumulate);
  if constexpr (kElem == Elem::e4m3 && kN == 256) wgmma_e4m3_n256(d, a, b, accumulate);
  if constexpr (kElem == Elem::e4m3 && kN == 128) wgmma_e4m3_n128(d, a, b, accumulate);
  if constexpr (kElem == Elem::bf16 && kN == 64) wgmma_bf16_n64(d, a, b, accumulate);
  if constexpr (kElem == Elem::f16 && kN == 64) wgmma_f16_n64(d, a, b, accumulate);
  if constexpr (kElem == Elem::e4m3 && kN == 64) wgmma_e4m3_n64(d, a, b, accumulate);
  if constexpr (kElem == Elem::bf16 && kN == 16) wgmma_bf16_n16(d, a, b, accumulate);
  if constexpr (kElem == Elem::f16 && kN == 16) wgmma_f16_n16(d, a, b, accumulate);
  if constexpr (kElem == Elem::e4m3 && kN == 16) wgmma_e4m3_n16(d, a, b, accumulate);
  if constexpr (kElem == Elem::bf16 && kN == 8) wgmma_bf16_n8(d, a, b, accumulate);
  if constexpr (kElem == Elem::f16 && kN == 8) wgmma_f16_n8(d, a, b, accumulate);
  if constexpr (kElem == Elem::e4m3 && kN == 8) wgmma_e4m3_n8(d, a, b, accumulate);
}

// The producer warp: every copy of a CTA's K loop (`steps` K steps from `first_step`, which a
// split K sets) into S's stages. Lane 0 issues the TMA copies
// (the A box of S::kRows token rows, then the weight boxes: for GEMM1 a warpgroup's gate rows,
// then its up rows of the same columns), each stage's completing on its `full` barrier, and
// reuses a stage once the consumer warps have handed it back on `empty`. `also(step, stage,
// bar)` runs on every lane that calls this, after that lane has seen the stage handed back and
// after the kernel's inputs are ready: copies of its own into the stage (the decode kernel's
// scales), which must arrive on `bar` as `full`'s count expects; `step` is the K step of the
// whole row (first_step on), `stage` the ring's.
template <class S, bool kGated, class Also>
__device__ __forceinline__ void produce(const WgmmaArgs& args, const Tile& tile, int n0,
                                        int first_step, int steps, uint32_t a_smem, uint32_t b_smem,
                                        uint64_t* full, uint64_t* empty, int lane,
                                        const Also& also) {
  const Params& p = args.p;
  constexpr int kBoxRows = S::box_rows(kGated);
  constexpr int kHalf = S::kGroupCols / 2;
  const int expert_row0 = tile.expert * (kGated ? 2 : 1) * p.n;
  const auto load_weights = [&](int step, uint32_t bar) {
    const int stage = step % S::kStages;
#pragma unroll
    for (int b = 0; b < S::kCols / kBoxRows; ++b) {
      int row = n0 + b * kBoxRows;
      if constexpr (kGated) {
        // Box b holds the gate or the up rows of warpgroup column block b / 2.
        const int col = n0 + (b / 2) * kHalf;
        row = b % 2 == 0 ? col : p.n + col;
      }
      tma_load_2d(b_smem + stage * S::kStageB + b * kBoxRows * kStepBytes, &args.w_map,
                  (first_step + step) * kStepBytes, expert_row0 + row, bar);
    }
  };
  // GEMM2: the first stages' weights before the wait, while GEMM1 finishes elsewhere.
  const int early = kGated ? 0 : min(steps, S::kStages);
  if (lane == 0) {
    for (int step = 0; step < early; ++step) {
      const uint32_t bar = smem_address(&full[step]);
      mbarrier_add_tx(bar, S::kStageB);
      load_weights(step, bar);
    }
  }
  if constexpr (!kGated) cuda_launch::wait_for_inputs();
  for (int step = 0; step < steps; ++step) {
    const int stage = step % S::kStages;
    if (step >= S::kStages) {
      mbarrier_wait(smem_address(&empty[stage]), (step / S::kStages - 1) & 1);
    }
    const uint32_t bar = smem_address(&full[stage]);
    if (lane == 0) {
      mbarrier_expect_tx(bar, step < early ? S::kStageA : S::kStageBytes);
      tma_load_2d(a_smem + stage * S::kStageA, &args.a_map, (first_step + step) * kStepBytes,
                  tile.row0, bar);
      if (step >= early) load_weights(step, bar);
    }
    also(first_step + step, stage, bar);
  }
}

template <class S, Elem kElem, bool kGated, bool kPerBlock>
__global__ void __launch_bounds__(S::kThreads, S::kPerSm)
    wgmma_kernel(const __grid_constant__ WgmmaArgs args) {
  const Params& p = args.p;
  constexpr int kBytes = kElemBytes<kElem>;
  constexpr bool kFp8 = kElem == Elem::e4m3;
  constexpr int kN = S::kGroupCols, kAcc = kN / 2, kHalf = kN / 2;
  constexpr int kTileCols = kGated ? S::kCols / 2 : S::kCols;  // output columns per CTA
  // A warpgroup's weight rows (kN, or kN / 2 gate and up rows) lie in one 128-row scale block.
  static_assert(!kFp8 || kN <= 128, "e4m3 promotes within one 128-row scale block per step");
  extern __shared__ uint4 smem[];
  __shared__ int scratch[S::kThreads / 32 + 4];
  __shared__ uint64_t full[S::kStages], empty[S::kStages];

  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    for (int s = 0; s < S::kStages; ++s) {
      mbarrier_init(smem_address(&full[s]), 1);
      mbarrier_init(smem_address(&empty[s]), S::kConsumers / 32);
    }
    fence_mbarrier_init();
  }
  // GEMM1 waits for its inputs before it reads the sort's offsets (the one-launch sort + gather
  // writes them in the kernel before it), then lets GEMM2 be scheduled: GEMM2's CTAs take the
  // SMs GEMM1's CTAs leave (neither fits beside the other) and start loading weights there.
  // GEMM2 finds its tile before the wait: its offsets come from the sort, which completed
  // before GEMM1 could pass its own wait.
  if constexpr (kGated) {
    cuda_launch::wait_for_inputs();
    cuda_launch::release_dependents();
  }
  const int col_tiles = (p.n + kTileCols - 1) / kTileCols;
  // Its block barriers also publish the mbarriers' initialisation.
  const Tile tile = find_tile<S::kThreads>(p.offsets, p.num_experts, static_cast<int>(blockIdx.x),
                                           S::kRows, col_tiles, scratch);
  if (tile.expert < 0) return;
  const int64_t row_bytes = static_cast<int64_t>(p.k) * kBytes;
  const int steps = static_cast<int>((row_bytes + kStepBytes - 1) / kStepBytes);
  const int n0 = tile.col * kTileCols;
  const uint32_t a_smem = (smem_address(smem) + 1023u) & ~1023u;
  const uint32_t b_smem = a_smem + S::kStages * S::kStageA;

  if (tid >= S::kConsumers) {
    // The producer: one thread issues every copy.
    if (tid == S::kConsumers) {
      produce<S, kGated>(args, tile, n0, 0, steps, a_smem, b_smem, full, empty, 0,
                         [](int, int, uint32_t) {});
    }
    return;
  }
  if constexpr (!kGated) cuda_launch::wait_for_inputs();  // the consumers read GEMM1's scales

  const int group = tid / 128, lane = tid & 31, warp = tid >> 5, warp_in_group = warp & 3;
  const int gm = group % S::kGroupsM, gn = group / S::kGroupsM;
  // The first output column of this warpgroup.
  const int group_col0 = n0 + gn * (kGated ? kHalf : kN);
  // A warpgroup whose rows all lie past a short tile's end leaves the tensor cores to the other
  // (it still takes each stage in turn, to hand it back).
  const bool group_live = gm * 64 < tile.rows;

  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;

  // This thread's two rows (of the accumulator layout: row warp * 16 + lane / 4, and 8 below).
  const int row_in_tile[2] = {gm * 64 + warp_in_group * 16 + (lane >> 2),
                              gm * 64 + warp_in_group * 16 + (lane >> 2) + 8};
  // fp8-block: the rows' activation scale offsets and the warpgroup's weight scale blocks.
  int64_t as_row[2] = {};
  bool row_valid[2] = {};
  int64_t ws_first = 0, ws_second = 0;
  if constexpr (kPerBlock) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_valid[h] = row_in_tile[h] < tile.rows;
      as_row[h] = tile.row0 + (row_valid[h] ? row_in_tile[h] : 0);
    }
    ws_first = weight_scale_base(p, kGated ? 2 : 1, tile.expert, 0, min(group_col0, p.n - 1));
    ws_second =
        kGated ? weight_scale_base(p, 2, tile.expert, 1, min(group_col0, p.n - 1)) : ws_first;
  }
  // Hands a stage back to the producer once this warp's wgmma reading it are complete.
  const auto release = [&](int stage) {
    if (lane == 0) mbarrier_arrive(smem_address(&empty[stage]));
  };
  if (!group_live) {
    // (A branch inside the K loop instead makes ptxas serialise the wgmma: C7515.)
    for (int step = 0; step < steps; ++step) {
      mbarrier_wait(smem_address(&full[step % S::kStages]), (step / S::kStages) & 1);
      release(step % S::kStages);
    }
    return;
  }

  // Waits for K step `step`'s stage and multiplies it into `sum` (e4m3: from zero, to promote).
  const auto issue = [&](int step, float(&sum)[kAcc]) {
    const int stage = step % S::kStages;
    mbarrier_wait(smem_address(&full[stage]), (step / S::kStages) & 1);
    const uint64_t a_desc = smem_desc_sw128(a_smem + stage * S::kStageA + gm * 64 * kStepBytes);
    const uint64_t b_desc = smem_desc_sw128(b_smem + stage * S::kStageB + gn * kN * kStepBytes);
    wgmma_fence();
    fence_registers(sum);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      wgmma<kElem, kN>(sum, a_desc + 2 * k, b_desc + 2 * k, kFp8 && k == 0 ? 0 : 1);
    }
    wgmma_commit();
  };

  if constexpr (kFp8) {
    // The scales a K step's partial sums are promoted with (fp8-block: the K block's; else 1).
    struct StepScales {
      float first = 1.0f, second = 1.0f, row[2] = {1.0f, 1.0f};
    };
    const auto scales_of = [&](int step) {
      StepScales sc;
      if constexpr (kPerBlock) {
        sc.first = __ldg(p.w_scale + ws_first + step * p.ws_kb_step);
        sc.second = __ldg(p.w_scale + ws_second + step * p.ws_kb_step);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          sc.row[h] = row_valid[h] ? activation_scale(p, as_row[h], step) : 0.0f;
        }
      }
      return sc;
    };
    const auto promote = [&](const float(&part)[kAcc], const StepScales& sc) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) {
        if constexpr (kPerBlock) {
          // DeepSeek-V3's accumulation: the K block's partial sums times its scales.
          const int chunk = i / 4, h = (i / 2) % 2;
          const float w = kGated && chunk >= kN / 16 ? sc.second : sc.first;
          acc[i] += part[i] * (sc.row[h] * w);
        } else {
          acc[i] += part[i];
        }
      }
    };
    // (Two sets of partial sums, one multiplied while the other is promoted, make ptxas
    // serialise the wgmma (C7514) and spill; the two warpgroups overlap each other's promotion.)
    float part[kAcc];
    for (int step = 0; step < steps; ++step) {
      const StepScales sc = scales_of(step);
      issue(step, part);
      wgmma_wait<0>();
      fence_registers(part);
      release(step % S::kStages);
      promote(part, sc);
    }
  } else {
    for (int step = 0; step < steps; ++step) {
      issue(step, acc);
      // One group stays in flight: the previous step's is complete, so its stage goes back.
      wgmma_wait<1>();
      if (step > 0) release((step - 1) % S::kStages);
    }
  }
  wgmma_wait<0>();
  fence_registers(acc);

  // Per-matrix or per-channel fp8 scales, applied once.
  const auto tensor_scale = [&](int part_index, int col, int64_t row) {
    if constexpr (kFp8 && !kPerBlock) {
      return __ldg(p.w_scale + weight_scale_base(p, kGated ? 2 : 1, tile.expert, part_index, col)) *
             activation_scale(p, row, 0);
    }
    return 1.0f;
  };
  const int q = lane & 3;
  if constexpr (kGated && kFp8 && S::kGroupsM == 1 && kTileCols == 128) {
    if (p.q_out != nullptr) {
      // GEMM2's e4m3 input, quantised here as quantize_rows_e4m3 would quantise the f32 values
      // this epilogue otherwise stores (the same values, amax, scale and rounding): both
      // warpgroups hold the same 64 rows and 64 columns each of the CTA's 128, one scale group.
      __shared__ float half_amax[2][64];
      float v[2][kN / 16][2];
      float amax[2] = {0.0f, 0.0f};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = tile.row0 + row_in_tile[h];
#pragma unroll
        for (int chunk = 0; chunk < kN / 16; ++chunk) {
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int col = group_col0 + chunk * 8 + 2 * q + j;
            float value = 0.0f;
            if (row_in_tile[h] < tile.rows && col < p.n) {
              const float gate = acc[chunk * 4 + 2 * h + j] * tensor_scale(0, col, row);
              const float up = acc[(chunk + kN / 16) * 4 + 2 * h + j] * tensor_scale(1, col, row);
              value = activate(p.activation, gate, up);
            }
            v[h][chunk][j] = value;
            amax[h] = fmaxf(amax[h], fabsf(value));
          }
        }
        // The quad's four threads hold the row's 64 columns of this warpgroup.
        amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xFFFFFFFFu, amax[h], 1));
        amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xFFFFFFFFu, amax[h], 2));
        if (q == 0) half_amax[gn][row_in_tile[h]] = amax[h];
      }
      // The two consumer warpgroups alone (the producer warp has left): named barrier 1.
      asm volatile("bar.sync 1, %0;\n" ::"n"(S::kConsumers) : "memory");
      const int groups = (p.n + 127) / 128;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row_in_tile[h];
        if (r >= tile.rows) continue;
        const int64_t row = tile.row0 + r;
        const float scale = p.q_static != nullptr
                                ? __ldg(p.q_static)
                                : fmaxf(fmaxf(half_amax[0][r], half_amax[1][r]), 1e-10f) / 448.0f;
        if (p.q_static == nullptr && gn == 0 && q == 0) p.q_scales[row * groups + n0 / 128] = scale;
#pragma unroll
        for (int chunk = 0; chunk < kN / 16; ++chunk) {
          const int col = group_col0 + chunk * 8 + 2 * q;
          if (col >= p.n) continue;
          const auto lo = static_cast<uint16_t>(
              __nv_cvt_float_to_fp8(v[h][chunk][0] / scale, __NV_SATFINITE, __NV_E4M3));
          const auto hi = static_cast<uint16_t>(
              __nv_cvt_float_to_fp8(v[h][chunk][1] / scale, __NV_SATFINITE, __NV_E4M3));
          *reinterpret_cast<uint16_t*>(p.q_out + row * p.n + col) =
              static_cast<uint16_t>(lo | (hi << 8));
        }
      }
      return;
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row_in_tile[h];
    if (r >= tile.rows) continue;
    const int64_t row = tile.row0 + r;
    if constexpr (kGated) {
#pragma unroll
      for (int chunk = 0; chunk < kN / 16; ++chunk) {
        const int col = group_col0 + chunk * 8 + 2 * q;
        if (col >= p.n) continue;
        float v[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const float gate = acc[chunk * 4 + 2 * h + j] * tensor_scale(0, col + j, row);
          const float up = acc[(chunk + kN / 16) * 4 + 2 * h + j] * tensor_scale(1, col + j, row);
          v[j] = activate(p.activation, gate, up);
        }
        store_activation_pair<kElem>(p, row * p.n + col, v[0], v[1]);
      }
    } else {
      const float weight = p.route_weight == nullptr ? 1.0f : __ldg(p.route_weight + row);
#pragma unroll
      for (int chunk = 0; chunk < kN / 8; ++chunk) {
        const int col = group_col0 + chunk * 8 + 2 * q;
        if (col >= p.n) continue;
        const float v0 = weight * (acc[chunk * 4 + 2 * h] * tensor_scale(0, col, row));
        const float v1 = weight * (acc[chunk * 4 + 2 * h + 1] * tensor_scale(0, col + 1, row));
        *reinterpret_cast<float2*>(static_cast<float*>(p.out) + row * p.n + col) =
            make_float2(v0, v1);
      }
    }
  }
}

}  // namespace moekit::cuda_gemm::detail
