// A build without CUDA: the GPU bench's entry points refuse, as resolve() refuses the cuda
// runner there, so that callers need no #ifdef.
#ifndef MOEKIT_WITH_CUDA

#include "bench/gpu_bench.hpp"
#include "moekit/error.hpp"

namespace moekit::bench {
namespace {
[[noreturn]] void no_cuda() {
  fail(Errc::config_refused, "this build of moekit has no CUDA (configure with -DMOEKIT_CUDA=ON)");
}
}  // namespace

GpuCeilings measure_gpu_ceilings(int, int64_t, int) {
  no_cuda();
}
void run_gpu_cases(const std::vector<BenchCase>&, const Options&, const Platform&,
                   const BenchSettings&, const BenchLog&, GpuReport&,
                   const std::function<void(const GpuReport&)>&) {
  no_cuda();
}
std::vector<double> time_on_gpu(int, int, int, const std::function<void(CUstream_st*)>&) {
  no_cuda();
}

}  // namespace moekit::bench

#endif
