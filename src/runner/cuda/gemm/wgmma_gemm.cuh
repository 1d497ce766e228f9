#pragma once
// The Hopper kernel (sm_90a): the prefill kernel's tiles, pipeline and tile search, with the
// multiplies on warpgroup MMA (wgmma) instead of mma.sync. wgmma reads both operands straight
// from the shared memory the cp.async pipeline fills (the 128-byte XOR swizzle of
// prefill_gemm.cuh is the layout wgmma's 128-byte swizzle mode reads), so no ldmatrix and no
// fragments in registers, and e4m3 runs on the fp8 tensor cores at twice the 16-bit rate, which
// mma.sync cannot reach on sm_90.
//
// A CTA is two warpgroups over kRows token rows x kCols weight rows. With 128 rows each
// warpgroup takes 64 rows and all kCols; with 64 rows both take the same rows and half of the
// columns each. For GEMM1 each warpgroup's weight rows in shared memory are its gate rows
// followed by the up rows of the same columns, so gate and up of an output meet in one thread.
// K runs in steps of 128 bytes (a scale block for e4m3): four wgmma per step.
//
// e4m3 sums are promoted: Hopper's fp8 tensor cores add in less than f32 precision (measured
// here: 2e-4 relative error on a K of 384 without promotion, against 1e-7 for mma.sync on f16),
// so each K step's four wgmma sum into registers of their own, which are then added to the f32
// accumulators (with the K block's scales for fp8-block), as DeepSeek-V3's kernels do.

#include "runner/cuda/gemm/prefill_gemm.cuh"
#include "runner/cuda/gemm/wgmma_ops.cuh"

namespace moekit::cuda_gemm::detail {

template <int kRows_, int kCols_, int kStages_>
struct WgmmaShape {
  static constexpr int kRows = kRows_, kCols = kCols_, kStages = kStages_;
  static constexpr int kThreads = 256;
  static constexpr int kGroupsM = kRows / 64;              // warpgroups along the rows
  static constexpr int kGroupCols = kCols * kGroupsM / 2;  // the n of each warpgroup's wgmma
  static constexpr int kStageBytes = (kRows + kCols) * kPrefillStepBytes;
  // One more KB to align the stages to the swizzle's 1024-byte pattern.
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;
  static_assert(kGroupsM == 1 || kGroupsM == 2);
  static_assert(kGroupCols == 128 || kGroupCols == 256);
  // A prefetch distance of kStages - 2: one stage is being multiplied, one is drained.
  static_assert(kStages >= 3);
};
// 16-bit: warpgroups of 64 x 256 (128 accumulators a thread).
using Wgmma128x256 = WgmmaShape<128, 256, 4>;
// e4m3's second set of accumulators (a K step's partial sums) leaves room for 64 x 128.
using Wgmma128x128 = WgmmaShape<128, 128, 6>;
// Fewer rows per expert: both warpgroups on 64 rows, 128 weight rows each.
using Wgmma64x256 = WgmmaShape<64, 256, 5>;

template <Elem kElem, int kN>
__device__ __forceinline__ void wgmma(float (&d)[kN / 2], uint64_t a, uint64_t b, int accumulate) {
  if constexpr (kElem == Elem::bf16 && kN == 256) wgmma_bf16_n256(d, a, b, accumulate);
  if constexpr (kElem == Elem::bf16 && kN == 128) wgmma_bf16_n128(d, a, b, accumulate);
  if constexpr (kElem == Elem::f16 && kN == 256) wgmma_f16_n256(d, a, b, accumulate);
  if constexpr (kElem == Elem::f16 && kN == 128) wgmma_f16_n128(d, a, b, accumulate);
  if constexpr (kElem == Elem::e4m3 && kN == 256) wgmma_e4m3_n256(d, a, b, accumulate);
  if constexpr (kElem == Elem::e4m3 && kN == 128) wgmma_e4m3_n128(d, a, b, accumulate);
}

template <class S, Elem kElem, bool kGated, bool kPerBlock>
__global__ void __launch_bounds__(S::kThreads, 1) wgmma_kernel(const Params p) {
  cuda_launch::wait_for_inputs();
  constexpr int kBytes = kElemBytes<kElem>;
  constexpr bool kFp8 = kElem == Elem::e4m3;
  constexpr int kN = S::kGroupCols, kAcc = kN / 2, kHalf = kN / 2;
  constexpr int kTileCols = kGated ? S::kCols / 2 : S::kCols;  // output columns per CTA
  static_assert(!kFp8 || kN == 128, "e4m3 promotes a 128-column scale block per step");
  extern __shared__ uint4 smem[];
  __shared__ int scratch[S::kThreads / 32 + 4];

  const int col_tiles = (p.n + kTileCols - 1) / kTileCols;
  const Tile tile = find_tile<S::kThreads>(p.offsets, p.num_experts, static_cast<int>(blockIdx.x),
                                           S::kRows, col_tiles, scratch);
  if (tile.expert < 0) return;
  const int tid = static_cast<int>(threadIdx.x);
  const int group = tid / 128, lane = tid & 31, warp_in_group = (tid & 127) >> 5;
  const int gm = group % S::kGroupsM, gn = group / S::kGroupsM;
  const int64_t row_bytes = static_cast<int64_t>(p.k) * kBytes;
  const int steps = static_cast<int>((row_bytes + kPrefillStepBytes - 1) / kPrefillStepBytes);
  const int n0 = tile.col * kTileCols;
  // The first output column of this warpgroup.
  const int group_col0 = n0 + gn * (kGated ? kHalf : kN);
  const uint8_t* expert_w =
      p.w + static_cast<int64_t>(tile.expert) * (kGated ? 2 : 1) * p.n * row_bytes;
  // A warpgroup whose rows all lie past a short tile's end leaves the tensor cores to the other.
  const bool group_live = gm * 64 < tile.rows;

  constexpr int kStageA = S::kRows * kPrefillStepBytes, kStageB = S::kCols * kPrefillStepBytes;
  const uint32_t a_smem = (smem_address(smem) + 1023u) & ~1023u;
  const uint32_t b_smem = a_smem + S::kStages * kStageA;

  // Each thread copies piece `piece` of rows r0 + 32 j.
  constexpr int kRowStep = S::kThreads / 8;
  const int piece = tid & 7, r0 = tid >> 3;
  const auto load_step = [&](int step, int stage) {
    const int64_t byte = static_cast<int64_t>(step) * kPrefillStepBytes + piece * 16;
    const bool in_k = byte < row_bytes;
#pragma unroll
    for (int j = 0; j < S::kRows / kRowStep; ++j) {
      const int r = r0 + kRowStep * j;
      const bool valid = in_k && r < tile.rows;
      const uint8_t* src = p.a + (valid ? (tile.row0 + r) * row_bytes + byte : 0);
      cp_async16(a_smem + stage * kStageA + swizzled(r, piece), src, valid);
    }
#pragma unroll
    for (int j = 0; j < S::kCols / kRowStep; ++j) {
      const int r = r0 + kRowStep * j;
      // Shared row r belongs to warpgroup column block r / kN: gate rows, then up rows.
      const int i = r % kN;
      const int col = kGated ? n0 + (r / kN) * kHalf + i % kHalf : n0 + r;
      const bool valid = in_k && col < p.n;
      const int row = kGated && i >= kHalf ? p.n + col : col;
      const uint8_t* src = expert_w + (valid ? row * row_bytes + byte : 0);
      cp_async16(b_smem + stage * kStageB + swizzled(r, piece), src, valid);
    }
  };

  float acc[kAcc], part[kFp8 ? kAcc : 1];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  if constexpr (kFp8) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) part[i] = 0.0f;
  }

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

#pragma unroll
  for (int s = 0; s < S::kStages - 2; ++s) {
    if (s < steps) load_step(s, s);
    asm volatile("cp.async.commit_group;\n" ::);
  }

  for (int step = 0; step < steps; ++step) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(S::kStages - 3));
    fence_proxy_async();
    // After this barrier every warpgroup has finished the wgmma of step - 2 (each waits for all
    // but its last group below), so that stage can be refilled.
    __syncthreads();
    const int next = step + S::kStages - 2;
    if (next < steps) load_step(next, next % S::kStages);
    asm volatile("cp.async.commit_group;\n" ::);

    const int stage = step % S::kStages;
    // fp8-block: this K block's scales, loaded before waiting on the wgmma.
    float w_first = 0.0f, w_second = 0.0f, as[2] = {};
    if constexpr (kPerBlock) {
      w_first = __ldg(p.w_scale + ws_first + step * p.ws_kb_step);
      w_second = __ldg(p.w_scale + ws_second + step * p.ws_kb_step);
#pragma unroll
      for (int h = 0; h < 2; ++h)
        as[h] = row_valid[h] ? activation_scale(p, as_row[h], step) : 0.0f;
    }
    if (group_live) {
      const uint64_t a_desc =
          smem_desc_sw128(a_smem + stage * kStageA + gm * 64 * kPrefillStepBytes);
      const uint64_t b_desc =
          smem_desc_sw128(b_smem + stage * kStageB + gn * kN * kPrefillStepBytes);
      // e4m3 sums each K step apart, to promote it.
      const auto issue = [&](float(&sum)[kAcc]) {
        wgmma_fence();
        fence_registers(sum);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          wgmma<kElem, kN>(sum, a_desc + 2 * k, b_desc + 2 * k, kFp8 && k == 0 ? 0 : 1);
        }
      };
      if constexpr (kFp8) {
        issue(part);
      } else {
        issue(acc);
      }
      wgmma_commit();
      if constexpr (kPerBlock) {
        // The K block's partial sums, promoted with its scales (DeepSeek-V3's accumulation).
        wgmma_wait<0>();
        fence_registers(part);
#pragma unroll
        for (int i = 0; i < kAcc; ++i) {
          const int chunk = i / 4, h = (i / 2) % 2;
          const float w = kGated && chunk >= kN / 16 ? w_second : w_first;
          acc[i] += part[i] * (as[h] * w);
        }
      } else if constexpr (kFp8) {
        wgmma_wait<0>();
        fence_registers(part);
#pragma unroll
        for (int i = 0; i < kAcc; ++i) acc[i] += part[i];
      } else {
        wgmma_wait<1>();
        fence_registers(acc);
      }
    }
  }
  wgmma_wait<0>();
  fence_registers(acc);
  asm volatile("cp.async.wait_group 0;\n" ::);

  // Per-matrix or per-channel fp8 scales, applied once.
  const auto tensor_scale = [&](int part_index, int col, int64_t row) {
    if constexpr (kFp8 && !kPerBlock) {
      return __ldg(p.w_scale + weight_scale_base(p, kGated ? 2 : 1, tile.expert, part_index, col)) *
             activation_scale(p, row, 0);
    }
    return 1.0f;
  };
  if (!group_live) return;
  const int q = lane & 3;
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
        const int64_t at = row * p.n + col;
        if (p.out_f32) {
          *reinterpret_cast<float2*>(static_cast<float*>(p.out) + at) = make_float2(v[0], v[1]);
        } else if constexpr (kElem == Elem::bf16) {
          *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p.out) + at) =
              __floats2bfloat162_rn(v[0], v[1]);
        } else {
          *reinterpret_cast<__half2*>(static_cast<__half*>(p.out) + at) =
              __floats2half2_rn(v[0], v[1]);
        }
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
