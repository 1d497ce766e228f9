#pragma once
// The decode kernel: few rows per expert, so the weights are the traffic. A CTA takes 32 weight
// rows of one expert (for GEMM1 16 gate rows and the 16 up rows of the same columns, so that
// the activation sees both in one thread) over all of K, and a tile of up to 8 * kNT of the
// expert's rows. The weight rows are the mma's M side and the tokens its N side (8 per mma),
// so a row of weights is read once per tile. The CTA's 8 warps split K between them, each
// loading 16 bytes per row per thread straight into registers (the mma's k order within a
// 16-byte piece is permuted the same way for both operands, so any contiguous 16 bytes make
// a fragment), and sum their partial results in shared memory in a fixed order.

#include "runner/cuda/gemm/gemm_device.cuh"

namespace moekit::cuda_gemm::detail {

inline constexpr int kDecodeThreads = 256;
inline constexpr int kDecodeWarps = kDecodeThreads / 32;

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

template <Elem kElem, int kNT, bool kGated, bool kVec, bool kPerBlock>
__global__ void __launch_bounds__(kDecodeThreads, kNT == 1 ? 2 : 1) decode_kernel(const Params p) {
  constexpr int kBytes = kElemBytes<kElem>;
  constexpr int kPerPiece = 16 / kBytes;     // elements one thread loads per row
  constexpr int kPiece = 4 * kPerPiece;      // elements a quad of threads covers
  constexpr int kUnit = 2 * kPiece;          // 64 (16-bit) or 128 (e4m3: one scale block)
  constexpr int kValues = 2 * kNT * 4 * 32;  // accumulators of one warp
  constexpr bool kFp8 = kElem == Elem::e4m3;
  __shared__ int scratch[kDecodeWarps + 3];
  __shared__ float partial[kDecodeWarps][kValues];

  const Tile tile = find_tile<kDecodeThreads>(p.offsets, p.num_experts,
                                              static_cast<int>(blockIdx.y), 8 * kNT, scratch);
  if (tile.expert < 0) return;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int K = p.k;
  const int n0 = static_cast<int>(blockIdx.x) * (kGated ? 16 : 32);
  const int64_t row_bytes = static_cast<int64_t>(K) * kBytes;
  const uint8_t* expert_w =
      p.w + static_cast<int64_t>(tile.expert) * (kGated ? 2 : 1) * p.n * row_bytes;

  const uint8_t* w_row[2][2];
  bool w_valid[2][2];
  int ws_base[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int col = n0 + (kGated ? 0 : 16 * mt) + g + 8 * h;
      w_valid[mt][h] = col < p.n;
      const int row = kGated ? mt * p.n + col : col;
      w_row[mt][h] = expert_w + (w_valid[mt][h] ? row * row_bytes : 0);
      ws_base[mt][h] = 0;
      if constexpr (kFp8) {
        ws_base[mt][h] = static_cast<int>(
            weight_scale_base(p, kGated ? 2 : 1, tile.expert, kGated ? mt : 0, col));
      }
    }
  }
  const uint8_t* x_row[kNT];
  bool x_valid[kNT];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    x_valid[nt] = nt * 8 + g < tile.rows;
    x_row[nt] = p.a + (x_valid[nt] ? (tile.row0 + nt * 8 + g) * row_bytes : 0);
  }

  float acc[2][kNT][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mt][nt][c] = 0.0f;

  const auto load = [&](DecodeUnit<kNT>& r, int u) {
#pragma unroll
    for (int piece = 0; piece < 2; ++piece) {
      const int k = u * kUnit + piece * kPiece + q * kPerPiece;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          r.w[piece][mt][h] = load_piece<kElem, kVec>(w_row[mt][h], k, K, w_valid[mt][h], true);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
        r.x[piece][nt] = load_piece<kElem, kVec>(x_row[nt], k, K, x_valid[nt], false);
    }
    if constexpr (kPerBlock) {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
        r.ws[mt] = w_valid[mt][0] ? __ldg(p.w_scale + ws_base[mt][0] + u * p.ws_kb_step) : 0.0f;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int token = nt * 8 + 2 * q + j;
          r.as[nt][j] = token < tile.rows ? activation_scale(p, tile.row0 + token, u) : 0.0f;
        }
    }
  };
  const auto compute = [&](const DecodeUnit<kNT>& r, int u) {
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
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const uint4 lo = r.w[piece][mt][0], hi = r.w[piece][mt][1];
        const uint32_t a0[4] = {lo.x, hi.x, lo.y, hi.y};
        const uint32_t a1[4] = {lo.z, hi.z, lo.w, hi.w};
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          const uint4 b = r.x[piece][nt];
          if constexpr (kFp8) {
            mma_e4m3_k32(sum[mt][nt], a0, b.x, b.y);
            mma_e4m3_k32(sum[mt][nt], a1, b.z, b.w);
          } else {
            mma_16x8x16(sum[mt][nt], a0, b.x, b.y, kElem == Elem::bf16);
            mma_16x8x16(sum[mt][nt], a1, b.z, b.w, kElem == Elem::bf16);
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

  const int units = (K + kUnit - 1) / kUnit;
  // Two units in registers, each reloaded as soon as it is computed: the next unit's loads are
  // always in flight while one is computed.
  int u = warp;
  DecodeUnit<kNT> first, second;
  if (u < units) load(first, u);
  if (u + kDecodeWarps < units) load(second, u + kDecodeWarps);
  while (u < units) {
    compute(first, u);
    if (u + 2 * kDecodeWarps < units) load(first, u + 2 * kDecodeWarps);
    u += kDecodeWarps;
    if (u >= units) break;
    compute(second, u);
    if (u + 2 * kDecodeWarps < units) load(second, u + 2 * kDecodeWarps);
    u += kDecodeWarps;
  }

#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        partial[warp][((mt * kNT + nt) * 4 + c) * 32 + lane] = acc[mt][nt][c];
  __syncthreads();

  // Value j of a warp's accumulators: m tile, token tile, register c, lane.
  const auto where = [&](int j, int& col, int& token) {
    const int l = j & 31, c = (j >> 5) & 3, nt = (j >> 7) % kNT, mt = j / (kNT * 128);
    col = n0 + (kGated ? 0 : 16 * mt) + (l >> 2) + 8 * (c >> 1);
    token = nt * 8 + 2 * (l & 3) + (c & 1);
  };
  const auto total = [&](int j) {
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) s += partial[w][j];
    return s;
  };
  const auto tensor_scale = [&](int part_index, int col, int64_t row) {
    if constexpr (kFp8 && !kPerBlock) {
      return __ldg(p.w_scale + weight_scale_base(p, kGated ? 2 : 1, tile.expert, part_index, col)) *
             activation_scale(p, row, 0) * e4m3_product_factor();
    }
    return 1.0f;
  };
  if constexpr (kGated) {
    for (int j = tid; j < kValues / 2; j += kDecodeThreads) {
      int col, token;
      where(j, col, token);
      if (col >= p.n || token >= tile.rows) continue;
      const int64_t row = tile.row0 + token;
      const float gate = total(j) * tensor_scale(0, col, row);
      const float up = total(j + kValues / 2) * tensor_scale(1, col, row);
      store_activation(p, row * p.n + col, activate(p.activation, gate, up), kElem == Elem::bf16);
    }
  } else {
    for (int j = tid; j < kValues; j += kDecodeThreads) {
      int col, token;
      where(j, col, token);
      if (col >= p.n || token >= tile.rows) continue;
      const int64_t row = tile.row0 + token;
      const float weight = p.route_weight == nullptr ? 1.0f : __ldg(p.route_weight + row);
      static_cast<float*>(p.out)[row * p.n + col] = weight * (total(j) * tensor_scale(0, col, row));
    }
  }
}

}  // namespace moekit::cuda_gemm::detail
