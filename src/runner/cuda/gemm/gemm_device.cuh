#pragma once
// Device pieces shared by the decode and prefill kernels: the tensor-core instructions, e4m3
// conversion for GPUs without e4m3 mma, the activation, the fp8 scale grid and the search for
// a CTA's tile of rows.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "moekit/spec.hpp"

#include "core/cuda_launch.cuh"

namespace moekit::cuda_gemm::detail {

enum class Elem : uint8_t { bf16, f16, e4m3 };

template <Elem kElem>
inline constexpr int kElemBytes = kElem == Elem::e4m3 ? 1 : 2;

// The K step of the prefill and wgmma kernels: 64 elements of 16 bits or 128 e4m3 (one fp8 scale
// block), one 128-byte row of the shared-memory swizzle pattern.
inline constexpr int kStepBytes = 128;

// e4m3 mma.sync runs on Ada's fp8 tensor cores (sm_89). On sm_90 ptxas accepts it but lowers it
// to f16 mma with conversions of its own (Hopper's fp8 tensor cores are reached by wgmma only,
// the `hopper` runner's business), and sm_80 has no e4m3 at all: there the kernels convert
// each fragment to f16 once (not once per mma it feeds) and run f16 mma.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && __CUDA_ARCH__ < 900
#define MOEKIT_GEMM_E4M3_MMA 1
#else
#define MOEKIT_GEMM_E4M3_MMA 0
#endif

// sm_80's e4m3 -> f16 conversion gives 2^-8 times the value (e4m3x2_as_f16x2).
inline constexpr float kE4m3AsF16Product = 65536.0f;

struct Params {
  const uint8_t* a;  // GEMM input rows [rows, K]
  const uint8_t* w;  // [E, rows_per_expert, K]
  const int32_t* offsets;
  const float* w_scale;
  const float* a_scale;
  const float* route_weight;
  void* out;
  int num_experts;
  int n;  // output columns: I for GEMM1 (gated), H for GEMM2
  int k;
  // fp8 scale grid: index of weight row n's scale for K block kb is
  // ((e * parts + part) * ws_per_part + n / ws_block_rows) * ws_cols + kb * ws_kb_step.
  int ws_block_rows;  // 0: one per matrix
  int ws_per_part;
  int ws_cols;
  int ws_kb_step;
  int as_cols;     // activation scales per row (0: one static scale)
  int as_kb_step;  // 1 for per row per 128 columns
  int parts;       // 2 for w13 (gate, up), 1 for w2
  int slices;      // decode: slices of 32 weight rows per CTA
  bool out_f32;
  Activation activation;
  // GEMM1 of an fp8 format where the kernel quantises its output for GEMM2 in its epilogue
  // (gemm1_quantizes): e4m3 codes [rows, n] and, for dynamic scales, one scale per row per 128
  // columns [rows, ceil(n / 128)], as quantize_rows_e4m3 writes them; q_static: the static
  // scale instead. q_out null: `out` takes the f32 activation.
  uint8_t* q_out;
  float* q_scales;
  const float* q_static;
  // Split K (the wgmma decode tiles, SplitK in expert_gemm.hpp): `splits` CTAs per tile
  // (blockIdx.y), each over its share of the K steps; 1 where K is not split.
  int splits;
  float* split_partials;
  uint32_t* split_counters;
  // A decode step's entries straight from the router (DecodeEntries in expert_gemm.hpp; the wgmma
  // decode tiles of 16-bit formats): each CTA places them itself (tiny_place) instead of reading
  // a sort's offsets. GEMM1's `a` is then the hidden states [e_tokens, K], one tile of every token
  // per hit expert, each token's output stored at its entries' rows; e_ids null: offsets.
  const int32_t* e_ids;
  const int32_t* e_table;
  int e_n_global;
  int e_tokens;
  int e_columns;
  int32_t* e_entry_row;  // GEMM1: the entries' rows out, as sort_by_slot's entry_row
};

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mma_16x8x16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1, bool bf16) {
  if (bf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// e4m3 bytes 0,1 (lo) or 2,3 (hi) of a word as an f16 pair. sm_89 and later convert in one
// instruction. sm_80 moves the 7 exponent and mantissa bits under the f16 exponent: exact for
// every finite e4m3 value (subnormals included) and 2^-8 times it, so a product of two is
// 2^-16 times the true one, which e4m3_product_factor puts back.
__device__ __forceinline__ uint32_t e4m3x2_as_f16x2(uint32_t word, bool hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const uint16_t pair = static_cast<uint16_t>(hi ? word >> 16 : word & 0xFFFFu);
  uint32_t d;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(d) : "h"(pair));
  return d;
#else
  const uint32_t p = __byte_perm(word, 0u, hi ? 0x3424u : 0x1404u);
  return (p & 0x80008000u) | ((p >> 1) & 0x3F803F80u);
#endif
}

// What the accumulators of an e4m3 GEMM must be multiplied by besides the scales.
__device__ __forceinline__ float e4m3_product_factor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return 1.0f;
#else
  return kE4m3AsF16Product;
#endif
}

// An e4m3 k32 A fragment (rows g and g + 8 at k 4q..4q+3 in a[0], a[1] and at 16+4q.. in a[2],
// a[3]) as two f16 k16 fragments over a permutation of its k; e4m3_b_as_f16 permutes a B
// fragment's k the same way, so the sums are the same.
__device__ __forceinline__ void e4m3_a_as_f16(const uint32_t (&a)[4], uint32_t (&first)[4],
                                              uint32_t (&second)[4]) {
  first[0] = e4m3x2_as_f16x2(a[0], false);
  first[1] = e4m3x2_as_f16x2(a[1], false);
  first[2] = e4m3x2_as_f16x2(a[0], true);
  first[3] = e4m3x2_as_f16x2(a[1], true);
  second[0] = e4m3x2_as_f16x2(a[2], false);
  second[1] = e4m3x2_as_f16x2(a[3], false);
  second[2] = e4m3x2_as_f16x2(a[2], true);
  second[3] = e4m3x2_as_f16x2(a[3], true);
}

// The B half of e4m3_a_as_f16: b0 (k 4q..4q+3) gives the first k16 fragment, b1 the second.
__device__ __forceinline__ void e4m3_b_as_f16(uint32_t b0, uint32_t b1, uint32_t (&b)[2][2]) {
  b[0][0] = e4m3x2_as_f16x2(b0, false);
  b[0][1] = e4m3x2_as_f16x2(b0, true);
  b[1][0] = e4m3x2_as_f16x2(b1, false);
  b[1][1] = e4m3x2_as_f16x2(b1, true);
}

// One k32 step of e4m3 on Ada's fp8 tensor cores.
__device__ __forceinline__ void mma_e4m3_k32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float activate(const Activation& act, float gate, float up) {
  switch (act.kind) {
    case ActivationKind::silu_gated:
      return gate / (1.0f + expf(-gate)) * up;
    case ActivationKind::gelu_gated:
      return 0.5f * gate * (1.0f + erff(gate * 0.70710678118654752f)) * up;
    case ActivationKind::swiglu_oai: {
      const float g = fminf(gate, act.limit);
      const float u = fmaxf(fminf(up, act.limit), -act.limit);
      return (u + 1.0f) * g / (1.0f + expf(-act.alpha * g));
    }
  }
  return 0.0f;
}

// The scale index of weight row `row` of part `part` of expert e, for K block 0.
__device__ __forceinline__ int64_t weight_scale_base(const Params& p, int parts, int e, int part,
                                                     int row) {
  const int block = p.ws_block_rows == 0 ? 0 : row / p.ws_block_rows;
  return ((static_cast<int64_t>(e) * parts + part) * p.ws_per_part + block) * p.ws_cols;
}

// The scale of GEMM input row `row` for K block kb.
__device__ __forceinline__ float activation_scale(const Params& p, int64_t row, int kb) {
  return p.as_cols == 0 ? __ldg(p.a_scale) : __ldg(p.a_scale + row * p.as_cols + kb * p.as_kb_step);
}

__device__ __forceinline__ void store_activation(const Params& p, int64_t at, float v, bool bf16) {
  if (p.out_f32) {
    static_cast<float*>(p.out)[at] = v;
  } else if (bf16) {
    static_cast<__nv_bfloat16*>(p.out)[at] = __float2bfloat16_rn(v);
  } else {
    static_cast<__half*>(p.out)[at] = __float2half_rn(v);
  }
}

// Two adjacent GEMM1 outputs: f32 for the e4m3 formats, else the weights' 16-bit type.
template <Elem kElem>
__device__ __forceinline__ void store_activation_pair(const Params& p, int64_t at, float v0,
                                                      float v1) {
  if (p.out_f32) {
    *reinterpret_cast<float2*>(static_cast<float*>(p.out) + at) = make_float2(v0, v1);
  } else if constexpr (kElem == Elem::bf16) {
    *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p.out) + at) =
        __floats2bfloat162_rn(v0, v1);
  } else {
    *reinterpret_cast<__half2*>(static_cast<__half*>(p.out) + at) = __floats2half2_rn(v0, v1);
  }
}

struct Tile {
  int expert;  // -1: no work for this CTA
  int row0;
  int rows;
  int col;  // the column tile, for grids that enumerate them with the row tiles
};

// Work item `item` of a grid that visits the experts in order and, within an expert, each of
// its `col_tiles` column tiles for all of its row tiles (row tiles fastest): expert e has
// ceil(count_e / tile_rows) * col_tiles items. The CTAs that run together then share one column
// tile of the weights and the expert's rows, both in L2, so that each is read from memory about
// once however many row tiles an expert has. kThreads threads each sum a run of experts, and a
// block scan finds the run that holds the item. One round of loads from offsets; `scratch` holds
// kThreads / 32 + 4 ints of shared memory.
template <int kThreads>
__device__ Tile find_tile(const int32_t* __restrict__ offsets, int num_experts, int item,
                          int tile_rows, int col_tiles, int* scratch) {
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int per = (num_experts + kThreads - 1) / kThreads;
  const int e0 = min(num_experts, tid * per), e1 = min(num_experts, e0 + per);
  int local = 0;
  for (int e = e0; e < e1; ++e) {
    const int count = __ldg(offsets + e + 1) - __ldg(offsets + e);
    local += (count + tile_rows - 1) / tile_rows * col_tiles;
  }
  int inclusive = local;
  for (int d = 1; d < 32; d <<= 1) {
    const int v = __shfl_up_sync(0xFFFFFFFFu, inclusive, d);
    if (lane >= d) inclusive += v;
  }
  if (tid == 0) scratch[kThreads / 32] = -1;
  if (lane == 31) scratch[warp] = inclusive;
  __syncthreads();
  int before = 0;
  for (int w = 0; w < warp; ++w) before += scratch[w];
  const int first = before + inclusive - local;
  if (item >= first && item < first + local) {
    int t = item - first;
    for (int e = e0; e < e1; ++e) {
      const int begin = __ldg(offsets + e), count = __ldg(offsets + e + 1) - begin;
      const int tiles = (count + tile_rows - 1) / tile_rows;
      if (t < tiles * col_tiles) {
        const int row_tile = t % tiles;
        scratch[kThreads / 32] = e;
        scratch[kThreads / 32 + 1] = begin + row_tile * tile_rows;
        scratch[kThreads / 32 + 2] = min(tile_rows, count - row_tile * tile_rows);
        scratch[kThreads / 32 + 3] = t / tiles;
        break;
      }
      t -= tiles * col_tiles;
    }
  }
  __syncthreads();
  return {scratch[kThreads / 32], scratch[kThreads / 32 + 1], scratch[kThreads / 32 + 2],
          scratch[kThreads / 32 + 3]};
}

// Upper bound of the tiles over all experts: sum ceil(c_e / t) <= rows / t + min(E, rows).
inline int64_t max_tiles(int64_t rows, int num_experts, int tile_rows) {
  return rows / tile_rows + (rows < num_experts ? rows : num_experts);
}

// The row tiles a wgmma grid launches: max_tiles, or where the CTAs take the router's entries
// themselves (Params::e_ids) at least one per row, since one token's tile e is entry e
// (tile_from_entries) whether or not its slots repeat; the GEMMs' rows are at least the entries.
inline int64_t grid_row_tiles(int64_t rows, int num_experts, int tile_rows, bool own_entries) {
  const int64_t tiles = max_tiles(rows, num_experts, tile_rows);
  return own_entries && rows > tiles ? rows : tiles;
}

}  // namespace moekit::cuda_gemm::detail
