#pragma once
// The decode kernel: few rows per expert, so the weights are the traffic. A CTA takes 32 weight
// rows of one expert (for GEMM1 16 gate rows and the 16 up rows of the same columns, so that
// the activation sees both in one thread) over all of K, and a tile of up to 8 of the expert's
// rows. The weight rows are the mma's M side and the tokens its N side (8 per mma),
// so a row of weights is read once per tile. The CTA's 8 warps split K between them, each
// loading 16 bytes per row per thread straight into registers (the mma's k order within a
// 16-byte piece is permuted the same way for both operands, so any contiguous 16 bytes make
// a fragment), and sum their partial results in shared memory in a fixed order.

#include "runner/cuda/gemm/gemm_device.cuh"

namespace moekit::cuda_gemm::detail {

inline constexpr int kDecodeThreads = 256;
inline constexpr int kDecodeWarps = kDecodeThreads / 32;
// One mma N tile of 8 rows per CTA: wider tiles (16, 32 rows) measured slower at every batch
// size where decode is the faster kernel (bench/cuda/NOTES.md); more rows take more tiles.
inline constexpr int kDecodeTokenTiles = 1;
inline constexpr int kDecodeRows = 8 * kDecodeTokenTiles;
// A CTA takes 1 to 4 slices of 32 weight rows in turn (Params::slices), its warps' loads running
// on from one slice into the next: more bytes per CTA for its fixed costs (finding its tile,
// summing the warps' parts) where the batch gives many CTAs.
inline constexpr int kDecodeMaxSlices = 4;

__device__ __forceinline__ uint4 load_weights16(const uint8_t* ptr) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(ptr));
  return v;
}

// 16 bytes of a row from element k; past K (or for a row that does not exist) zeros. kVec:
// rows are 16-byte aligned, so a piece is either whole or past K.
template <Elem kElem, bool kVec>
__device__ __forceinline__ uint4 load_piece(const uint8_t* row, int k, int K, bool valid,
                                            bool weights) {
  constexpr int kBytes = kElemBytes<kElem>;
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (!valid) return v;
  if constexpr (kVec) {
    if (k < K) {
      const uint8_t* at = row + static_cast<int64_t>(k) * kBytes;
      v = weights ? load_weights16(at) : __ldg(reinterpret_cast<const uint4*>(at));
    }
    return v;
  }
  uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int j = 0; j < 16 / kBytes; ++j) {
    if (k + j >= K) break;
    const int byte = j * kBytes;
    const uint32_t value =
        kBytes == 2 ? static_cast<uint32_t>(__ldg(reinterpret_cast<const uint16_t*>(row) + k + j))
                    : static_cast<uint32_t>(__ldg(row + k + j));
    w[byte / 4] |= value << (8 * (byte % 4));
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

template <int kNT>
struct DecodeUnit {
  uint4 w[2][2][2];  // [piece][m tile][row g, g + 8]
  uint4 x[2][kNT];   // [piece][token tile]
  float ws[2];       // fp8-block: the scales of this K block, loaded with the unit (a 16-row
                     // m tile lies in one 128-row scale block)
  float as[kNT][2];
};

template <Elem kElem, bool kGated, bool kVec, bool kPerBlock>
__global__ void __launch_bounds__(kDecodeThreads, 2) decode_kernel(const Params p) {
  // No early release of the next kernel: a GEMM runs for many microseconds, so there is no gap
  // worth closing, and with the release Mixtral-8x7B at T = 1 measured 13% slower (docs/CUDA.md).
  cuda_launch::wait_for_inputs();
  constexpr int kNT = kDecodeTokenTiles;
  constexpr int kBytes = kElemBytes<kElem>;
  constexpr int kPerPiece = 16 / kBytes;     // elements one thread loads per row
  constexpr int kPiece = 4 * kPerPiece;      // elements a quad of threads covers
  constexpr int kUnit = 2 * kPiece;          // 64 (16-bit) or 128 (e4m3: one scale block)
  constexpr int kValues = 2 * kNT * 4 * 32;  // accumulators of one warp for one slice
  constexpr int kSliceCols = kGated ? 16 : 32;
  constexpr bool kFp8 = kElem == Elem::e4m3;
  __shared__ int scratch[kDecodeWarps + 4];
  __shared__ float partial[kDecodeWarps][kDecodeMaxSlices][kValues];

  const Tile tile = find_tile<kDecodeThreads>(
      p.offsets, p.num_experts, static_cast<int>(blockIdx.y), kDecodeRows, 1, scratch);
  if (tile.expert < 0) return;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int K = p.k;
  const int n0 = static_cast<int>(blockIdx.x) * kSliceCols * p.slices;
  const int64_t row_bytes = static_cast<int64_t>(K) * kBytes;
  const uint8_t* expert_w =
      p.w + static_cast<int64_t>(tile.expert) * (kGated ? 2 : 1) * p.n * row_bytes;
  // Column of this thread's weight row h of m tile mt, in slice 0.
  const auto column = [&](int mt, int h) { return n0 + (kGated ? 0 : 16 * mt) + g + 8 * h; };

  const uint8_t* x_row[kNT];
  bool x_valid[kNT];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    x_valid[nt] = nt * 8 + g < tile.rows;
    x_row[nt] = p.a + (x_valid[nt] ? (tile.row0 + nt * 8 + g) * row_bytes : 0);
  }
  for (int s = 0; s < p.slices; ++s)
    for (int v = lane; v < kValues; v += 32) partial[warp][s][v] = 0.0f;

  float acc[2][kNT][4];
  const auto clear = [&]() {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[mt][nt][c] = 0.0f;
  };
  clear();

  // Job j: K unit j % units of slice j / units (the slice's 32 weight rows start kSliceCols
  // columns after the previous one's).
  const int units = (K + kUnit - 1) / kUnit;
  const int jobs = units * p.slices;
  const auto load = [&](DecodeUnit<kNT>& r, int j) {
    const int u = j % units, shift = j / units * kSliceCols;
#pragma unroll
    for (int piece = 0; piece < 2; ++piece) {
      const int k = u * kUnit + piece * kPiece + q * kPerPiece;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int col = column(mt, h) + shift;
          const bool valid = col < p.n;
          const uint8_t* row = expert_w + (valid ? ((kGated ? mt * p.n : 0) + col) * row_bytes : 0);
          r.w[piece][mt][h] = load_piece<kElem, kVec>(row, k, K, valid, true);
        }
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
        r.x[piece][nt] = load_piece<kElem, kVec>(x_row[nt], k, K, x_valid[nt], false);
    }
    if constexpr (kPerBlock) {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int col = column(mt, 0) + shift;
        r.ws[mt] =
            col < p.n
                ? __ldg(p.w_scale +
                        weight_scale_base(p, kGated ? 2 : 1, tile.expert, kGated ? mt : 0, col) +
                        u * p.ws_kb_step)
                : 0.0f;
      }
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          const int token = nt * 8 + 2 * q + t;
          r.as[nt][t] = token < tile.rows ? activation_scale(p, tile.row0 + token, u) : 0.0f;
        }
    }
  };
  const auto compute = [&](const DecodeUnit<kNT>& r) {
    float part[2][kNT][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) part[mt][nt][c] = 0.0f;
    auto& sum = kPerBlock ? part : acc;
#pragma unroll
    for (int piece = 0; piece < 2; ++piece) {
      // e4m3 without e4m3 mma: each token row's fragments converted once for both m tiles.
      uint32_t x16[kNT][2][2][2];
      if constexpr (kFp8 && !MOEKIT_GEMM_E4M3_MMA) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          const uint4 b = r.x[piece][nt];
          e4m3_b_as_f16(b.x, b.y, x16[nt][0]);
          e4m3_b_as_f16(b.z, b.w, x16[nt][1]);
        }
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const uint4 lo = r.w[piece][mt][0], hi = r.w[piece][mt][1];
        const uint32_t a[2][4] = {{lo.x, hi.x, lo.y, hi.y}, {lo.z, hi.z, lo.w, hi.w}};
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          if constexpr (kFp8 && !MOEKIT_GEMM_E4M3_MMA) {
            uint32_t first[4], second[4];
            e4m3_a_as_f16(a[s], first, second);
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) {
              mma_16x8x16(sum[mt][nt], first, x16[nt][s][0][0], x16[nt][s][0][1], false);
              mma_16x8x16(sum[mt][nt], second, x16[nt][s][1][0], x16[nt][s][1][1], false);
            }
          } else {
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) {
              const uint4 b = r.x[piece][nt];
              const uint32_t b0 = s == 0 ? b.x : b.z, b1 = s == 0 ? b.y : b.w;
              if constexpr (kFp8) {
                mma_e4m3_k32(sum[mt][nt], a[s], b0, b1);
              } else {
                mma_16x8x16(sum[mt][nt], a[s], b0, b1, kElem == Elem::bf16);
              }
            }
          }
        }
      }
    }
    if constexpr (kPerBlock) {
      const float factor = e4m3_product_factor();
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int c = 0; c < 4; ++c)
            acc[mt][nt][c] += part[mt][nt][c] * (r.ws[mt] * (r.as[nt][c & 1] * factor));
    }
  };
  // A warp's jobs go through the slices in order; its sums for a slice go to shared memory when
  // its next job is in another slice.
  int slice = warp / units;
  const auto flush = [&]() {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          partial[warp][slice][((mt * kNT + nt) * 4 + c) * 32 + lane] = acc[mt][nt][c];
    clear();
  };
  const auto consume = [&](const DecodeUnit<kNT>& r, int j) {
    if (j / units != slice) {
      flush();
      slice = j / units;
    }
    compute(r);
  };

  // Two jobs in flight per thread (16 loads of 16 bytes), then both computed. Measured faster
  // than a ring that reloads each unit as soon as it is computed (bench/cuda/NOTES.md).
  int j = warp;
  for (; j + kDecodeWarps < jobs; j += 2 * kDecodeWarps) {
    DecodeUnit<kNT> r0, r1;
    load(r0, j);
    load(r1, j + kDecodeWarps);
    consume(r0, j);
    consume(r1, j + kDecodeWarps);
  }
  if (j < jobs) {
    DecodeUnit<kNT> r;
    load(r, j);
    consume(r, j);
  }
  if (slice < p.slices) flush();
  __syncthreads();

  // Value v of a warp's accumulators for one slice: m tile, token tile, register c, lane.
  const auto where = [&](int v, int s, int& col, int& token) {
    const int l = v & 31, c = (v >> 5) & 3, nt = (v >> 7) % kNT, mt = v / (kNT * 128);
    col = n0 + s * kSliceCols + (kGated ? 0 : 16 * mt) + (l >> 2) + 8 * (c >> 1);
    token = nt * 8 + 2 * (l & 3) + (c & 1);
  };
  const auto total = [&](int s, int v) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) sum += partial[w][s][v];
    return sum;
  };
  const auto tensor_scale = [&](int part_index, int col, int64_t row) {
    if constexpr (kFp8 && !kPerBlock) {
      return __ldg(p.w_scale + weight_scale_base(p, kGated ? 2 : 1, tile.expert, part_index, col)) *
             activation_scale(p, row, 0) * e4m3_product_factor();
    }
    return 1.0f;
  };
  constexpr int kOut = kGated ? kValues / 2 : kValues;  // outputs per slice
  for (int i = tid; i < kOut * p.slices; i += kDecodeThreads) {
    const int s = i / kOut, v = i % kOut;
    int col, token;
    where(v, s, col, token);
    if (col >= p.n || token >= tile.rows) continue;
    const int64_t row = tile.row0 + token;
    if constexpr (kGated) {
      const float gate = total(s, v) * tensor_scale(0, col, row);
      const float up = total(s, v + kValues / 2) * tensor_scale(1, col, row);
      store_activation(p, row * p.n + col, activate(p.activation, gate, up), kElem == Elem::bf16);
    } else {
      const float weight = p.route_weight == nullptr ? 1.0f : __ldg(p.route_weight + row);
      static_cast<float*>(p.out)[row * p.n + col] =
          weight * (total(s, v) * tensor_scale(0, col, row));
    }
  }
}

}  // namespace moekit::cuda_gemm::detail
