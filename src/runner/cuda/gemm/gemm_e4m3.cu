// The e4m3 kernels (see gemm_kernels.cuh).
#include "runner/cuda/gemm/gemm_kernels.cuh"

namespace moekit::cuda_gemm::detail {
MOEKIT_GEMM_INSTANTIATE(Elem::e4m3)
}  // namespace moekit::cuda_gemm::detail
