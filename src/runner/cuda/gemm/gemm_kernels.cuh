#pragma once
// The launches of every kernel variant of one element type; gemm_<type>.cu instantiates them,
// one translation unit per type so that the builds of the three run in parallel.

#include "runner/cuda/gemm/decode_gemm.cuh"
#include "runner/cuda/gemm/prefill_gemm.cuh"

namespace moekit::cuda_gemm::detail {

struct Variant {
  bool gated;
  bool vec;         // rows 16-byte aligned
  bool per_block;   // fp8 scales per 128 columns of K
  int token_tiles;  // decode: 1, 2 or 4 tiles of 8 rows
};

template <Elem kElem, int kNT, bool kGated, bool kVec>
void launch_decode_nt(const Params& p, bool per_block, dim3 grid, cudaStream_t stream) {
  if constexpr (kElem == Elem::e4m3) {
    if (per_block) {
      decode_kernel<kElem, kNT, kGated, kVec, true><<<grid, kDecodeThreads, 0, stream>>>(p);
      return;
    }
  }
  decode_kernel<kElem, kNT, kGated, kVec, false><<<grid, kDecodeThreads, 0, stream>>>(p);
}

template <Elem kElem, bool kGated>
void launch_decode_gated(const Params& p, const Variant& v, dim3 grid, cudaStream_t stream) {
  if (!v.vec) {
    // Rows that are not 16-byte aligned: odd shapes only, one tile width.
    launch_decode_nt<kElem, 1, kGated, false>(p, v.per_block, grid, stream);
  } else if (v.token_tiles == 1) {
    launch_decode_nt<kElem, 1, kGated, true>(p, v.per_block, grid, stream);
  } else if (v.token_tiles == 2) {
    launch_decode_nt<kElem, 2, kGated, true>(p, v.per_block, grid, stream);
  } else {
    launch_decode_nt<kElem, 4, kGated, true>(p, v.per_block, grid, stream);
  }
}

template <Elem kElem>
void launch_decode(const Params& p, const Variant& v, dim3 grid, cudaStream_t stream) {
  if (v.gated) {
    launch_decode_gated<kElem, true>(p, v, grid, stream);
  } else {
    launch_decode_gated<kElem, false>(p, v, grid, stream);
  }
}

template <Elem kElem, bool kGated, bool kPerBlock>
void launch_prefill_variant(const Params& p, dim3 grid, cudaStream_t stream) {
  const auto kernel = prefill_kernel<kElem, kGated, kPerBlock>;
  // Set once per variant: the attribute outlives the call and is no stream operation.
  static const cudaError_t attribute =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kPrefillSmemBytes);
  (void)attribute;
  kernel<<<grid, kPrefillThreads, kPrefillSmemBytes, stream>>>(p);
}

template <Elem kElem>
void launch_prefill(const Params& p, const Variant& v, dim3 grid, cudaStream_t stream) {
  if constexpr (kElem == Elem::e4m3) {
    if (v.per_block) {
      if (v.gated) {
        launch_prefill_variant<kElem, true, true>(p, grid, stream);
      } else {
        launch_prefill_variant<kElem, false, true>(p, grid, stream);
      }
      return;
    }
  }
  if (v.gated) {
    launch_prefill_variant<kElem, true, false>(p, grid, stream);
  } else {
    launch_prefill_variant<kElem, false, false>(p, grid, stream);
  }
}

extern template void launch_decode<Elem::bf16>(const Params&, const Variant&, dim3, cudaStream_t);
extern template void launch_decode<Elem::f16>(const Params&, const Variant&, dim3, cudaStream_t);
extern template void launch_decode<Elem::e4m3>(const Params&, const Variant&, dim3, cudaStream_t);
extern template void launch_prefill<Elem::bf16>(const Params&, const Variant&, dim3, cudaStream_t);
extern template void launch_prefill<Elem::f16>(const Params&, const Variant&, dim3, cudaStream_t);
extern template void launch_prefill<Elem::e4m3>(const Params&, const Variant&, dim3, cudaStream_t);

#define MOEKIT_GEMM_INSTANTIATE(ELEM)                                                   \
  template void launch_decode<ELEM>(const Params&, const Variant&, dim3, cudaStream_t); \
  template void launch_prefill<ELEM>(const Params&, const Variant&, dim3, cudaStream_t);

}  // namespace moekit::cuda_gemm::detail
