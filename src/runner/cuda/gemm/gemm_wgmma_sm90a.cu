// The Hopper kernel's launches (wgmma_gemm.cuh). This file alone is built for sm_90a (the
// arch-specific target that wgmma needs, src/CMakeLists.txt); choose_gemm picks the kernel only
// on a GPU of compute capability 9.0.

#include "runner/cuda/gemm/gemm_kernels.cuh"
#include "runner/cuda/gemm/wgmma_gemm.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "gemm_wgmma_sm90a.cu is built for sm_90a alone (-gencode arch=compute_90a,code=sm_90a)"
#endif

namespace moekit::cuda_gemm::detail {
namespace {

template <class S, Elem kElem, bool kGated, bool kPerBlock>
void launch_shape(const Params& p, unsigned grid, cudaStream_t stream) {
  const auto kernel = wgmma_kernel<S, kElem, kGated, kPerBlock>;
  // Set once per variant: the attribute outlives the call and is no stream operation.
  static const cudaError_t attribute =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes);
  (void)attribute;
  cuda_launch::launch(kernel, dim3(grid), S::kThreads, S::kSmemBytes, stream, p);
}

template <Elem kElem, bool kGated, bool kPerBlock>
void launch_variant(const Params& p, int token_tile, unsigned grid, cudaStream_t stream) {
  if (token_tile == Wgmma64x256::kRows) {
    launch_shape<Wgmma64x256, kElem, kGated, kPerBlock>(p, grid, stream);
  } else if constexpr (kElem == Elem::e4m3) {
    launch_shape<Wgmma128x128, kElem, kGated, kPerBlock>(p, grid, stream);
  } else {
    launch_shape<Wgmma128x256, kElem, kGated, kPerBlock>(p, grid, stream);
  }
}

}  // namespace

int wgmma_cols(bool e4m3, int token_tile) {
  if (token_tile == Wgmma64x256::kRows) return Wgmma64x256::kCols;
  return e4m3 ? Wgmma128x128::kCols : Wgmma128x256::kCols;
}

template <Elem kElem>
void launch_wgmma(const Params& p, const Variant& v, int token_tile, unsigned grid,
                  cudaStream_t stream) {
  if constexpr (kElem == Elem::e4m3) {
    if (v.per_block) {
      v.gated ? launch_variant<kElem, true, true>(p, token_tile, grid, stream)
              : launch_variant<kElem, false, true>(p, token_tile, grid, stream);
      return;
    }
  }
  v.gated ? launch_variant<kElem, true, false>(p, token_tile, grid, stream)
          : launch_variant<kElem, false, false>(p, token_tile, grid, stream);
}

template void launch_wgmma<Elem::bf16>(const Params&, const Variant&, int, unsigned, cudaStream_t);
template void launch_wgmma<Elem::f16>(const Params&, const Variant&, int, unsigned, cudaStream_t);
template void launch_wgmma<Elem::e4m3>(const Params&, const Variant&, int, unsigned, cudaStream_t);

}  // namespace moekit::cuda_gemm::detail
