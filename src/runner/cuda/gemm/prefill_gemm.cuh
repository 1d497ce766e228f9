#pragma once
// The prefill kernel: a CTA computes kRows rows of one expert against kCols weight rows (for
// GEMM1 kCols / 2 gate rows and the up rows of the same columns), over K in steps of 128 bytes
// (64 elements of 16 bits, or 128 e4m3: one scale block) through a cp.async pipeline of kStages
// steps into XOR-swizzled shared memory, read by ldmatrix into mma.sync. The CTAs run expert by
// expert, a column tile at a time for all of the expert's row tiles (find_tile), so weights and
// rows are read from memory about once. fp8-block promotes each K step's partial sums with its
// scales into the f32 accumulators, as DeepSeek-V3's kernels do.

#include "runner/cuda/gemm/gemm_device.cuh"

namespace moekit::cuda_gemm::detail {

// A tile shape: kRows tokens x kCols weight rows per CTA, kWarpsM x kWarpsN warps (each
// kMt m16 tiles x kFrags n8 fragments), kStages K steps in flight, kMinBlocks CTAs per SM.
template <int kRows_, int kCols_, int kWarpsM_, int kWarpsN_, int kStages_, int kMinBlocks_>
struct PrefillShape {
  static constexpr int kRows = kRows_, kCols = kCols_, kWarpsM = kWarpsM_, kWarpsN = kWarpsN_;
  static constexpr int kStages = kStages_, kMinBlocks = kMinBlocks_;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kMt = kRows / kWarpsM / 16;
  static constexpr int kFrags = kCols / kWarpsN / 8;
  static constexpr int kSmemBytes = kStages * (kRows + kCols) * kStepBytes;
  static_assert(kMt >= 1 && kFrags % 2 == 0 && kRows % (kThreads / 8) == 0 &&
                kCols % (kThreads / 8) == 0);
};
// Tiles of 64 rows: warps of 32 x 64, two CTAs per SM.
using Prefill64 = PrefillShape<64, 128, 2, 2, 4, 2>;
// Tiles of 128 rows: warps of 64 x 64 (half the shared-memory reads per mma of 32 x 64), two
// CTAs per SM in 3 stages each.
using Prefill128 = PrefillShape<128, 128, 2, 2, 3, 2>;
// fp8-block at 128 rows: a second set of accumulators (the K block's partial sums) leaves
// registers for warps of 64 x 32 only, 8 of them.
using Prefill128Block = PrefillShape<128, 128, 2, 4, 3, 1>;

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// Byte offset of 16-byte piece c of row r in a stage: pieces XOR-swizzled by the row, so that
// the 8 rows one ldmatrix phase reads fall on different banks.
__device__ __forceinline__ uint32_t swizzled(int r, int c) {
  return static_cast<uint32_t>(r * kStepBytes + ((c ^ (r & 7)) << 4));
}

template <class S, Elem kElem, bool kGated, bool kPerBlock>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks) prefill_kernel(const Params p) {
  // No early release of the next kernel: a GEMM runs for many microseconds, so there is no gap
  // worth closing, and with the release Mixtral-8x7B at T = 1 measured 13% slower (docs/CUDA.md).
  cuda_launch::wait_for_inputs();
  constexpr int kBytes = kElemBytes<kElem>;
  constexpr bool kFp8 = kElem == Elem::e4m3;
  constexpr int kMt = S::kMt, kF = S::kFrags, kHalf = S::kFrags / 2;
  constexpr int kTileCols = kGated ? S::kCols / 2 : S::kCols;  // output columns per CTA
  extern __shared__ uint4 smem[];
  __shared__ int scratch[S::kThreads / 32 + 4];

  const int col_tiles = (p.n + kTileCols - 1) / kTileCols;
  const Tile tile = find_tile<S::kThreads>(p.offsets, p.num_experts, static_cast<int>(blockIdx.x),
                                           S::kRows, col_tiles, scratch);
  if (tile.expert < 0) return;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int wm = warp % S::kWarpsM, wn = warp / S::kWarpsM;
  const int g = lane >> 2, q = lane & 3;
  const int64_t row_bytes = static_cast<int64_t>(p.k) * kBytes;
  const int steps = static_cast<int>((row_bytes + kStepBytes - 1) / kStepBytes);
  const int n0 = tile.col * kTileCols;
  const uint8_t* expert_w =
      p.w + static_cast<int64_t>(tile.expert) * (kGated ? 2 : 1) * p.n * row_bytes;
  // A warp whose rows all lie past a short tile's end skips its mma, leaving the tensor cores to
  // the SM's other warps. (Skipping single m16 tiles, a branch inside the unrolled k loop,
  // measured 9% slower for bf16 and 47% for e4m3 at DeepSeek-V3 T = 4096: it breaks the
  // interleaving of loads, conversions and mma.)
  const bool warp_live = wm * kMt * 16 < tile.rows;

  constexpr int kStageA = S::kRows * kStepBytes, kStageB = S::kCols * kStepBytes;
  const uint32_t a_smem = smem_address(smem);
  const uint32_t b_smem = a_smem + S::kStages * kStageA;

  // Each thread copies piece `piece` of rows r0 + kRowStep j.
  constexpr int kRowStep = S::kThreads / 8;
  const int piece = tid & 7, r0 = tid >> 3;
  const auto load_step = [&](int step, int stage) {
    const int64_t byte = static_cast<int64_t>(step) * kStepBytes + piece * 16;
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
      const int col = n0 + (kGated ? r % (S::kCols / 2) : r);
      const bool valid = in_k && col < p.n;
      const int row = kGated ? (r < S::kCols / 2 ? col : p.n + col) : col;
      const uint8_t* src = expert_w + (valid ? row * row_bytes + byte : 0);
      cp_async16(b_smem + stage * kStageB + swizzled(r, piece), src, valid);
    }
  };

  // Weight rows (in shared memory) of the warp's column fragments: for GEMM1 the first half
  // gate rows, the second the up rows of the same columns.
  const auto frag_row = [&](int f) {
    if constexpr (kGated) {
      return (f < kHalf ? 0 : S::kCols / 2) + wn * kHalf * 8 + (f % kHalf) * 8;
    }
    return wn * kF * 8 + f * 8;
  };
  const auto warp_row = [&](int mt, int h) { return wm * kMt * 16 + mt * 16 + g + 8 * h; };

  float acc[kMt][kF][4], part[kPerBlock ? kMt : 1][kPerBlock ? kF : 1][4];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
    for (int f = 0; f < kF; ++f)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mt][f][c] = 0.0f;
  if constexpr (kPerBlock) {
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
      for (int f = 0; f < kF; ++f)
#pragma unroll
        for (int c = 0; c < 4; ++c) part[mt][f][c] = 0.0f;
  }
  // The accumulators the mma adds into: the K block's partial sums for fp8-block.
  const auto sum = [&](int mt, int f) -> float(&)[4] {
    if constexpr (kPerBlock) return part[mt][f];
    return acc[mt][f];
  };

  // fp8-block: the warp's rows' activation scale offsets and the CTA's weight scale blocks.
  int64_t as_row[kMt][2] = {};
  bool row_valid[kMt][2] = {};
  int64_t ws_first = 0, ws_second = 0;
  if constexpr (kFp8) {
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = warp_row(mt, h);
        row_valid[mt][h] = r < tile.rows;
        as_row[mt][h] = tile.row0 + (row_valid[mt][h] ? r : 0);
      }
    ws_first = weight_scale_base(p, kGated ? 2 : 1, tile.expert, 0, n0);
    ws_second = kGated ? weight_scale_base(p, 2, tile.expert, 1, n0) : ws_first;
  }

#pragma unroll
  for (int s = 0; s < S::kStages - 1; ++s) {
    if (s < steps) load_step(s, s);
    asm volatile("cp.async.commit_group;\n" ::);
  }

  for (int step = 0; step < steps; ++step) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(S::kStages - 2));
    __syncthreads();
    // fp8-block: this K block's scales, loaded before the step's mma so that their latency
    // hides behind them.
    float w_first = 0.0f, w_second = 0.0f, as[kMt][2] = {};
    if constexpr (kPerBlock) {
      w_first = __ldg(p.w_scale + ws_first + step * p.ws_kb_step) * e4m3_product_factor();
      w_second = __ldg(p.w_scale + ws_second + step * p.ws_kb_step) * e4m3_product_factor();
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          as[mt][h] = row_valid[mt][h] ? activation_scale(p, as_row[mt][h], step) : 0.0f;
    }
    const int next = step + S::kStages - 1;
    if (next < steps) load_step(next, next % S::kStages);
    asm volatile("cp.async.commit_group;\n" ::);

    const int stage = step % S::kStages;
    const uint32_t a_stage = a_smem + stage * kStageA;
    const uint32_t b_stage = b_smem + stage * kStageB;
    const int mi = lane >> 3, r_in = lane & 7;
    if (warp_live) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        uint32_t a[kMt][4], b[kF][2];
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
          const int r = wm * kMt * 16 + mt * 16 + (mi & 1) * 8 + r_in;
          ldmatrix_x4(a[mt], a_stage + swizzled(r, 2 * k + (mi >> 1)));
        }
#pragma unroll
        for (int f = 0; f < kF; f += 2) {
          uint32_t t[4];
          const int r = frag_row(f + (mi >> 1)) + r_in;
          ldmatrix_x4(t, b_stage + swizzled(r, 2 * k + (mi & 1)));
          b[f][0] = t[0];
          b[f][1] = t[1];
          b[f + 1][0] = t[2];
          b[f + 1][1] = t[3];
        }
        if constexpr (kFp8 && !MOEKIT_GEMM_E4M3_MMA) {
          uint32_t a16[kMt][2][4];
#pragma unroll
          for (int mt = 0; mt < kMt; ++mt) {
            e4m3_a_as_f16(a[mt], a16[mt][0], a16[mt][1]);
          }
#pragma unroll
          for (int f = 0; f < kF; ++f) {
            uint32_t b16[2][2];
            e4m3_b_as_f16(b[f][0], b[f][1], b16);
#pragma unroll
            for (int mt = 0; mt < kMt; ++mt) {
              mma_16x8x16(sum(mt, f), a16[mt][0], b16[0][0], b16[0][1], false);
              mma_16x8x16(sum(mt, f), a16[mt][1], b16[1][0], b16[1][1], false);
            }
          }
        } else {
#pragma unroll
          for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
            for (int f = 0; f < kF; ++f) {
              if constexpr (kFp8) {
                mma_e4m3_k32(sum(mt, f), a[mt], b[f][0], b[f][1]);
              } else {
                mma_16x8x16(sum(mt, f), a[mt], b[f][0], b[f][1], kElem == Elem::bf16);
              }
            }
          }
        }
      }
    }

    if constexpr (kPerBlock) {
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
        for (int f = 0; f < kF; ++f) {
          const float w = kGated && f >= kHalf ? w_second : w_first;
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            acc[mt][f][c] += part[mt][f][c] * (as[mt][c >> 1] * w);
            part[mt][f][c] = 0.0f;
          }
        }
    }
  }
  asm volatile("cp.async.wait_group 0;\n" ::);

  // Per-matrix or per-channel fp8 scales, applied once.
  const auto tensor_scale = [&](int part_index, int col, int64_t row) {
    if constexpr (kFp8 && !kPerBlock) {
      return __ldg(p.w_scale + weight_scale_base(p, kGated ? 2 : 1, tile.expert, part_index, col)) *
             activation_scale(p, row, 0) * e4m3_product_factor();
    }
    return 1.0f;
  };
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp_row(mt, h);
      if (r >= tile.rows) continue;
      const int64_t row = tile.row0 + r;
      if constexpr (kGated) {
#pragma unroll
        for (int f = 0; f < kHalf; ++f) {
          const int col = n0 + wn * kHalf * 8 + f * 8 + 2 * q;
          if (col >= p.n) continue;
          float v[2];
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const float gate = acc[mt][f][2 * h + j] * tensor_scale(0, col + j, row);
            const float up = acc[mt][f + kHalf][2 * h + j] * tensor_scale(1, col + j, row);
            v[j] = activate(p.activation, gate, up);
          }
          store_activation_pair<kElem>(p, row * p.n + col, v[0], v[1]);
        }
      } else {
        const float weight = p.route_weight == nullptr ? 1.0f : __ldg(p.route_weight + row);
#pragma unroll
        for (int f = 0; f < kF; ++f) {
          const int col = n0 + wn * kF * 8 + f * 8 + 2 * q;
          if (col >= p.n) continue;
          const float v0 = weight * (acc[mt][f][2 * h] * tensor_scale(0, col, row));
          const float v1 = weight * (acc[mt][f][2 * h + 1] * tensor_scale(0, col + 1, row));
          *reinterpret_cast<float2*>(static_cast<float*>(p.out) + row * p.n + col) =
              make_float2(v0, v1);
        }
      }
    }
  }
}

}  // namespace moekit::cuda_gemm::detail
