#pragma once
// The checks of the cuda expert GEMMs (src/runner/cuda/gemm), shared by the GoogleTest suite
// (test_cuda_gemm.cu) and the standalone device check (bench/cuda/gemm_check.cu), which runs
// where GoogleTest may be missing.

#include <string>
#include <vector>

#include "moekit/spec.hpp"
#include "runner/cuda/gemm/expert_gemm.hpp"

namespace moekit::test::cuda_gemm {

enum class Format { bf16, f16, fp8_block, fp8_tensor, fp8_channel, fp8_static };

struct GemmCase {
  std::string name;
  Format format = Format::bf16;
  int hidden = 256;
  int intermediate = 128;
  std::vector<int> counts;  // rows per expert (the number of experts is its size)
  Activation activation = Activation::SiluGated();
  // Unset: choose_gemm's pick.
  bool forced = false;
  moekit::cuda_gemm::GemmChoice choice;
};

struct CaseResult {
  bool ran = false;  // false: no GPU (skip_reason says why)
  std::string skip_reason;
  std::vector<std::string> failures;  // empty: passed
  std::string summary;                // the errors measured
};

// Empty when a GPU is present; otherwise why the GPU checks cannot run.
std::string gpu_missing();

// GEMM1, the quantisation of its output (fp8), GEMM2, each against float64 on its own inputs,
// and the whole against float64; outputs poisoned first, rows past the groups untouched, two
// runs bit-identical.
CaseResult run_case(const GemmCase& c);

// The table of cases both suites run.
std::vector<GemmCase> all_cases();

}  // namespace moekit::test::cuda_gemm
