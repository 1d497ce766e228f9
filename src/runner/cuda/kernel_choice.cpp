#include "runner/cuda/kernel_choice.hpp"

#include <fmt/format.h>

namespace moekit::cuda {
namespace {

CudaGemmKernel from_gemm(cuda_gemm::GemmKernel kernel) {
  switch (kernel) {
    case cuda_gemm::GemmKernel::decode:
      return CudaGemmKernel::decode;
    case cuda_gemm::GemmKernel::prefill:
      return CudaGemmKernel::prefill;
    case cuda_gemm::GemmKernel::wgmma:
      return CudaGemmKernel::wgmma;
    case cuda_gemm::GemmKernel::one_token:
      return CudaGemmKernel::one_token;
  }
  return CudaGemmKernel::decode;
}

CudaGemmChoice from_gemm(const cuda_gemm::GemmChoice& c, int64_t up_to) {
  return {.up_to_tokens = up_to,
          .kernel = from_gemm(c.kernel),
          .token_tile = c.token_tile,
          .gemm1_slices = c.gemm1_slices,
          .gemm2_slices = c.gemm2_slices,
          .gemm1_cols = c.gemm1_cols,
          .gemm2_cols = c.gemm2_cols,
          .gemm1_splits = c.gemm1_splits,
          .gemm2_splits = c.gemm2_splits,
          .rows_from_hidden = c.rows_from_hidden};
}

bool same(const CudaGemmChoice& a, const CudaGemmChoice& b) {
  return a.kernel == b.kernel && a.token_tile == b.token_tile && a.gemm1_slices == b.gemm1_slices &&
         a.gemm2_slices == b.gemm2_slices && a.gemm1_cols == b.gemm1_cols &&
         a.gemm2_cols == b.gemm2_cols && a.gemm1_splits == b.gemm1_splits &&
         a.gemm2_splits == b.gemm2_splits && a.rows_from_hidden == b.rows_from_hidden;
}

// The runs of batch sizes 1..max_tokens with the same choice for `experts` experts of
// intermediate I, each token bringing `columns` rows.
std::vector<CudaGemmChoice> runs(const Plan& plan, int experts, int columns, int64_t I,
                                 int64_t max_tokens, int sm_count, int compute_capability) {
  std::vector<CudaGemmChoice> out;
  cuda_gemm::GemmProblem problem{.dtype = plan.quant.weight_dtype,
                                 .rows = 0,
                                 .num_experts = experts,
                                 .hidden = static_cast<int>(plan.spec.hidden),
                                 .intermediate = static_cast<int>(I),
                                 .sm_count = sm_count,
                                 .compute_capability = compute_capability};
  for (int64_t T = 1; T <= max_tokens; ++T) {
    problem.rows = T * columns;
    problem.tokens = T;
    const CudaGemmChoice c = from_gemm(cuda_gemm::choose_gemm(problem), T);
    if (!out.empty() && same(out.back(), c)) {
      out.back().up_to_tokens = T;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string describe_runs(const std::vector<CudaGemmChoice>& runs) {
  std::string text;
  int64_t from = 1;
  for (const CudaGemmChoice& c : runs) {
    text += fmt::format("{}T {}-{}: {}", text.empty() ? "" : "; ", from, c.up_to_tokens,
                        cuda_gemm_kernel_name(c.kernel));
    if (c.kernel == CudaGemmKernel::one_token) {
      text += " (both GEMMs and the combine in one kernel of CUDA-core dot products)";
      from = c.up_to_tokens + 1;
      continue;
    }
    text += fmt::format(" tile {}", c.token_tile);
    if (c.kernel == CudaGemmKernel::decode) {
      text += fmt::format(" ({}/{} slices)", c.gemm1_slices, c.gemm2_slices);
    }
    if (c.kernel == CudaGemmKernel::wgmma && (c.gemm1_cols != 0 || c.gemm2_cols != 0)) {
      const auto cols = [](int n) { return n == 0 ? std::string("widest") : std::to_string(n); };
      text += fmt::format(" ({}/{} weight rows per CTA)", cols(c.gemm1_cols), cols(c.gemm2_cols));
    }
    if (c.gemm1_splits != 1 || c.gemm2_splits != 1) {
      text += fmt::format(" (K split in {}/{})", c.gemm1_splits, c.gemm2_splits);
    }
    if (c.rows_from_hidden) text += " (rows from the hidden states)";
    from = c.up_to_tokens + 1;
  }
  return text;
}

}  // namespace

CudaKernels choose_cuda_kernels(const Plan& plan) {
  CudaKernels k;
  k.device_index = plan.options.device.index;
  int compute_capability = 0;
  for (const GpuInfo& gpu : plan.platform.gpus) {
    if (gpu.index == k.device_index) {
      k.sm_count = gpu.sm_count;
      compute_capability = gpu.compute_major * 10 + gpu.compute_minor;
    }
  }
  const ModelSpec& spec = plan.spec;
  k.routed =
      runs(plan, plan.local_routed + plan.shared_slots, spec.routing.top_k + plan.shared_slots,
           spec.intermediate, plan.max_received_tokens, k.sm_count, compute_capability);
  if (plan.adds_shared_output) {
    k.shared = runs(plan, spec.n_shared, spec.n_shared, spec.shared_intermediate,
                    plan.options.max_tokens, k.sm_count, compute_capability);
  }
  return k;
}

cuda_gemm::GemmChoice to_gemm(const CudaGemmChoice& c) {
  cuda_gemm::GemmKernel kernel = cuda_gemm::GemmKernel::decode;
  switch (c.kernel) {
    case CudaGemmKernel::decode:
      break;
    case CudaGemmKernel::prefill:
      kernel = cuda_gemm::GemmKernel::prefill;
      break;
    case CudaGemmKernel::wgmma:
      kernel = cuda_gemm::GemmKernel::wgmma;
      break;
    case CudaGemmKernel::one_token:
      kernel = cuda_gemm::GemmKernel::one_token;
      break;
  }
  return {.kernel = kernel,
          .token_tile = c.token_tile,
          .gemm1_slices = c.gemm1_slices,
          .gemm2_slices = c.gemm2_slices,
          .gemm1_cols = c.gemm1_cols,
          .gemm2_cols = c.gemm2_cols,
          .gemm1_splits = c.gemm1_splits,
          .gemm2_splits = c.gemm2_splits,
          .rows_from_hidden = c.rows_from_hidden};
}

std::string describe(const CudaKernels& k) {
  std::string text = "routed experts: " + describe_runs(k.routed);
  if (!k.shared.empty()) text += "; shared experts: " + describe_runs(k.shared);
  return text + fmt::format(" (GPU {}, {} SMs)", k.device_index, k.sm_count);
}

}  // namespace moekit::cuda
