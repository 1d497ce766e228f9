#include "bench/cuda/cublaslt_peak.hpp"

#include <cublasLt.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace moekit::bench {
namespace {

constexpr int64_t kSize = 8192;
constexpr size_t kWorkspaceBytes = size_t{64} << 20;

// The entry points used, looked up in the shared library; declared by cublasLt.h, never linked.
struct Lt {
  void* library = nullptr;
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;

  ~Lt() {
    if (library) dlclose(library);
  }
  template <typename F>
  bool find(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(library, name));
    return f != nullptr;
  }
  // Empty when every entry point was found, else what is missing.
  std::string open() {
    for (const char* name : {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so",
                             "/usr/local/cuda/lib64/libcublasLt.so"}) {
      library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (library) break;
    }
    if (!library) return "no libcublasLt.so found by the dynamic loader";
    const bool all = find(create, "cublasLtCreate") && find(destroy, "cublasLtDestroy") &&
                     find(desc_create, "cublasLtMatmulDescCreate") &&
                     find(desc_destroy, "cublasLtMatmulDescDestroy") &&
                     find(desc_set, "cublasLtMatmulDescSetAttribute") &&
                     find(layout_create, "cublasLtMatrixLayoutCreate") &&
                     find(layout_destroy, "cublasLtMatrixLayoutDestroy") &&
                     find(pref_create, "cublasLtMatmulPreferenceCreate") &&
                     find(pref_destroy, "cublasLtMatmulPreferenceDestroy") &&
                     find(pref_set, "cublasLtMatmulPreferenceSetAttribute") &&
                     find(heuristic, "cublasLtMatmulAlgoGetHeuristic") &&
                     find(matmul, "cublasLtMatmul");
    return all ? std::string() : "libcublasLt.so lacks an entry point";
  }
};

}  // namespace

LibraryPeak cublaslt_peak(bool fp8, int passes, cudaStream_t stream) {
  Lt lt;
  if (std::string missing = lt.open(); !missing.empty()) return {0.0, missing};
  const cudaDataType in = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  const size_t in_bytes = fp8 ? 1 : 2;
  void *a = nullptr, *b = nullptr, *d = nullptr, *workspace = nullptr;
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  LibraryPeak result;
  const auto fail = [&](std::string why) {
    result = {0.0, std::move(why)};
    return false;
  };
  const auto run = [&]() -> bool {
    const size_t n = static_cast<size_t>(kSize * kSize);
    if (cudaMalloc(&a, n * in_bytes) != cudaSuccess ||
        cudaMalloc(&b, n * in_bytes) != cudaSuccess || cudaMalloc(&d, n * 2) != cudaSuccess ||
        cudaMalloc(&workspace, kWorkspaceBytes) != cudaSuccess) {
      return fail("cudaMalloc of the matmul's operands failed");
    }
    // Small finite values (0x3c3c is about 0.011 in bf16, 0x30 is 0.5 in e4m3): the rate does
    // not depend on them.
    cudaMemsetAsync(a, fp8 ? 0x30 : 0x3c, n * in_bytes, stream);
    cudaMemsetAsync(b, fp8 ? 0x30 : 0x3c, n * in_bytes, stream);
    if (lt.create(&handle) != CUBLAS_STATUS_SUCCESS) return fail("cublasLtCreate failed");
    if (lt.desc_create(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) {
      return fail("cublasLtMatmulDescCreate failed");
    }
    // A transposed, B not: the TN layout Hopper's fp8 kernels need.
    const cublasOperation_t transpose = CUBLAS_OP_T;
    lt.desc_set(op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose));
    if (lt.layout_create(&la, in, kSize, kSize, kSize) != CUBLAS_STATUS_SUCCESS ||
        lt.layout_create(&lb, in, kSize, kSize, kSize) != CUBLAS_STATUS_SUCCESS ||
        lt.layout_create(&ld, CUDA_R_16BF, kSize, kSize, kSize) != CUBLAS_STATUS_SUCCESS) {
      return fail("cublasLtMatrixLayoutCreate failed");
    }
    lt.pref_create(&pref);
    lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspaceBytes,
                sizeof(kWorkspaceBytes));
    cublasLtMatmulHeuristicResult_t best{};
    int found = 0;
    if (lt.heuristic(handle, op, la, lb, ld, ld, pref, 1, &best, &found) != CUBLAS_STATUS_SUCCESS ||
        found == 0) {
      return fail(fmt::format("cuBLASLt has no {} matmul algorithm here", fp8 ? "e4m3" : "bf16"));
    }
    const float alpha = 1.0f, beta = 0.0f;
    const auto once = [&] {
      return lt.matmul(handle, op, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &best.algo, workspace,
                       kWorkspaceBytes, stream);
    };
    if (once() != CUBLAS_STATUS_SUCCESS) return fail("cublasLtMatmul failed");
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    std::vector<double> seconds;
    for (int i = 0; i < passes; ++i) {
      cudaEventRecord(start, stream);
      once();
      cudaEventRecord(stop, stream);
      if (cudaEventSynchronize(stop) != cudaSuccess) return fail("the cuBLASLt matmul failed");
      float ms = 0.0f;
      cudaEventElapsedTime(&ms, start, stop);
      seconds.push_back(ms * 1e-3);
    }
    std::sort(seconds.begin(), seconds.end());
    result.flops_per_s = 2.0 * kSize * kSize * kSize / seconds[seconds.size() / 2];
    return true;
  };
  run();
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  if (pref) lt.pref_destroy(pref);
  for (cublasLtMatrixLayout_t l : {la, lb, ld}) {
    if (l) lt.layout_destroy(l);
  }
  if (op) lt.desc_destroy(op);
  if (handle) lt.destroy(handle);
  for (void* p : {a, b, d, workspace}) cudaFree(p);
  return result;
}

}  // namespace moekit::bench
