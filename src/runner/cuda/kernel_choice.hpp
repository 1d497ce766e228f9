#pragma once
// The one function that decides the cuda runner's expert GEMM kernels (CudaKernels in
// moekit/plan.hpp). resolve() calls it once; the cuda core reads the plan.

#include "moekit/plan.hpp"
#include "runner/cuda/gemm/expert_gemm.hpp"

namespace moekit::cuda {

// For every batch size T in [1, max_tokens]: the kernel and tile the GEMM heuristic
// (cuda_gemm::choose_gemm, measured on the H200: bench/cuda/NOTES.md) picks for T * columns
// grouped rows over the layer's local experts, on the plan's GPU; consecutive sizes with the same
// answer are one run.
CudaKernels choose_cuda_kernels(const Plan& plan);
std::string describe(const CudaKernels& kernels);
// The plan's record of a choice, as the GEMM launches take it.
cuda_gemm::GemmChoice to_gemm(const CudaGemmChoice& choice);

}  // namespace moekit::cuda
