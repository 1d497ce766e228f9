#pragma once
// The tensor cores' peak as the vendor's library reaches it: an 8192^3 cuBLASLt matmul (bf16, or
// e4m3 with bf16 output), the figure the floors are defined against. cuBLASLt is loaded
// when the benchmark runs (dlopen), not linked: moekit binaries start on machines without it.

#include <cuda_runtime.h>

#include <string>

namespace moekit::bench {

struct LibraryPeak {
  double flops_per_s = 0.0;  // 0: not measured, `why` says why
  std::string why;
};

LibraryPeak cublaslt_peak(bool fp8, int passes, cudaStream_t stream);

}  // namespace moekit::bench
