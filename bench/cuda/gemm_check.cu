// The checks of tests/cuda/test_cuda_gemm_cases.cu as one executable, for the device machine
// where GoogleTest may be missing: exits 1 when a case fails or cannot run.
//
//   gemm_check [PART]     only the cases whose name contains PART

#include <cstdio>
#include <string>

#include "cuda/test_cuda_gemm_cases.hpp"

int main(int argc, char** argv) {
  using namespace moekit::test::cuda_gemm;
  const std::string part = argc > 1 ? argv[1] : "";
  int failed = 0, passed = 0;
  for (const GemmCase& c : all_cases()) {
    if (c.name.find(part) == std::string::npos) continue;
    const CaseResult r = run_case(c);
    if (!r.ran) {
      std::printf("cannot run: %s\n", r.skip_reason.c_str());
      return 1;
    }
    for (const std::string& f : r.failures) std::printf("FAIL %s\n", f.c_str());
    std::printf("%-4s %-34s %s\n", r.failures.empty() ? "ok" : "FAIL", c.name.c_str(),
                r.summary.c_str());
    (r.failures.empty() ? passed : failed) += 1;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
