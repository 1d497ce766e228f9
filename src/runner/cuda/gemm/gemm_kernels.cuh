#pragma once
// The launches of every kernel variant of one element type; gemm_<type>.cu instantiates them,
// one translation unit per type so that the builds of the three run in parallel.

#include "runner/cuda/gemm/decode_gemm.cuh"
#include "runner/cuda/gemm/prefill_gemm.cuh"

namespace moekit::cuda_gemm::detail {

struct Variant {
  bool gated;
  bool vec;        // rows 16-byte aligned
  bool per_block;  // fp8 scales per 128 columns of K
};

template <Elem kElem, bool kGated, bool kVec>
void launch_decode_variant(const Params& p, bool per_block, dim3 grid, cudaStream_t stream) {
  if constexpr (kElem == Elem::e4m3) {
    if (per_block) {
      cuda_launch::launch(decode_kernel<kElem, kGated, kVec, true>, grid, kDecodeThreads, 0, stream,
                          p);
      return;
    }
  }
  cuda_launch::launch(decode_kernel<kElem, kGated, kVec, false>, grid, kDecodeThreads, 0, stream,
                      p);
}

template <Elem kElem>
void launch_decode(const Params& p, const Variant& v, dim3 grid, cudaStream_t stream) {
  // Rows that are not 16-byte aligned (odd shapes only) take element-wise loads.
  if (v.gated) {
    v.vec ? launch_decode_variant<kElem, true, true>(p, v.per_block, grid, stream)
          : launch_decode_variant<kElem, true, false>(p, v.per_block, grid, stream);
  } else {
    v.vec ? launch_decode_variant<kElem, false, true>(p, v.per_block, grid, stream)
          : launch_decode_variant<kElem, false, false>(p, v.per_block, grid, stream);
  }
}

template <class S, Elem kElem, bool kGated, bool kPerBlock>
void launch_prefill_shape(const Params& p, unsigned grid, cudaStream_t stream) {
  const auto kernel = prefill_kernel<S, kElem, kGated, kPerBlock>;
  // Set once per variant: the attribute outlives the call and is no stream operation.
  static const cudaError_t attribute =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes);
  (void)attribute;
  cuda_launch::launch(kernel, dim3(grid), S::kThreads, S::kSmemBytes, stream, p);
}

// The grid: one CTA per work item of find_tile (row tiles x column tiles, an upper bound).
template <Elem kElem, bool kGated, bool kPerBlock>
void launch_prefill_variant(const Params& p, int token_tile, unsigned grid, cudaStream_t stream) {
  if (token_tile == Prefill64::kRows) {
    launch_prefill_shape<Prefill64, kElem, kGated, kPerBlock>(p, grid, stream);
  } else if constexpr (kPerBlock) {
    launch_prefill_shape<Prefill128Block, kElem, kGated, kPerBlock>(p, grid, stream);
  } else {
    launch_prefill_shape<Prefill128, kElem, kGated, kPerBlock>(p, grid, stream);
  }
}

template <Elem kElem>
void launch_prefill(const Params& p, const Variant& v, int token_tile, unsigned grid,
                    cudaStream_t stream) {
  if constexpr (kElem == Elem::e4m3) {
    if (v.per_block) {
      if (v.gated) {
        launch_prefill_variant<kElem, true, true>(p, token_tile, grid, stream);
      } else {
        launch_prefill_variant<kElem, false, true>(p, token_tile, grid, stream);
      }
      return;
    }
  }
  if (v.gated) {
    launch_prefill_variant<kElem, true, false>(p, token_tile, grid, stream);
  } else {
    launch_prefill_variant<kElem, false, false>(p, token_tile, grid, stream);
  }
}

// The Hopper kernels, built for sm_90a alone in gemm_wgmma_sm90a.cu: wgmma_gemm.cuh for tiles of
// 64 or 128 token rows, wgmma_decode_gemm.cuh (weights on wgmma's M side) for tiles of 8 or 16.
// A CTA's tile is `rows` token rows x `cols` weight rows; the shapes built are 64 x 256,
// 64 x 128, 128 x 256 (16-bit), 128 x 128 (e4m3), 8 or 16 x 256 or 128. The launch's
// `rows` are the rows the GEMM input buffer holds, which its tensor map spans.
struct WgmmaTile {
  int rows = 64;
  int cols = 256;
};
// The widest tile of `rows` token rows: 256 weight rows, 128 for e4m3's 128 rows (whose second
// set of accumulators leaves room for no more).
inline constexpr int wgmma_widest_cols(bool e4m3, int rows) {
  return rows == 128 && e4m3 ? 128 : 256;
}
bool wgmma_builds(bool e4m3, WgmmaTile tile);
// Whether an e4m3 GEMM1 CTA of this tile covers 128 whole output columns of its rows (for the
// 64-row tile: both warpgroups on the same 64 rows), so that its epilogue can quantise them for
// GEMM2 (gemm1_quantizes): 64 x 256, and the decode tiles of 256 weight rows.
inline constexpr bool wgmma_quantizes(WgmmaTile tile) {
  return tile.cols == 256 && (tile.rows == 64 || tile.rows == 8 || tile.rows == 16);
}
// The grid: x the tiles, y the splits of K (decode tiles; 1 for the others).
template <Elem kElem>
void launch_wgmma(const Params& p, const Variant& v, WgmmaTile tile, int64_t rows, dim3 grid,
                  cudaStream_t stream);
extern template void launch_wgmma<Elem::bf16>(const Params&, const Variant&, WgmmaTile, int64_t,
                                              dim3, cudaStream_t);
extern template void launch_wgmma<Elem::f16>(const Params&, const Variant&, WgmmaTile, int64_t,
                                             dim3, cudaStream_t);
extern template void launch_wgmma<Elem::e4m3>(const Params&, const Variant&, WgmmaTile, int64_t,
                                              dim3, cudaStream_t);

extern template void launch_decode<Elem::bf16>(const Params&, const Variant&, dim3, cudaStream_t);
extern template void launch_decode<Elem::f16>(const Params&, const Variant&, dim3, cudaStream_t);
extern template void launch_decode<Elem::e4m3>(const Params&, const Variant&, dim3, cudaStream_t);
extern template void launch_prefill<Elem::bf16>(const Params&, const Variant&, int, unsigned,
                                                cudaStream_t);
extern template void launch_prefill<Elem::f16>(const Params&, const Variant&, int, unsigned,
                                               cudaStream_t);
extern template void launch_prefill<Elem::e4m3>(const Params&, const Variant&, int, unsigned,
                                                cudaStream_t);

#define MOEKIT_GEMM_INSTANTIATE(ELEM)                                                   \
  template void launch_decode<ELEM>(const Params&, const Variant&, dim3, cudaStream_t); \
  template void launch_prefill<ELEM>(const Params&, const Variant&, int, unsigned, cudaStream_t);

}  // namespace moekit::cuda_gemm::detail
