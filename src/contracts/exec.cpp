#include "contracts/exec.hpp"
#include "contracts/rows.hpp"

#ifdef MOEKIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "moekit/error.hpp"

namespace moekit {

float* ActivationRows::f32() const {
  if (dtype != DType::f32) {
    fail(Errc::internal, "rows of {} handed to a stage that reads f32 rows", dtype_name(dtype));
  }
  return static_cast<float*>(data);
}

ThreadPool& ExecContext::threads() const {
  if (pool == nullptr) fail(Errc::internal, "a CPU stage was given no thread pool");
  return *pool;
}

void synchronize_stream(GpuStream stream) {
#ifdef MOEKIT_WITH_CUDA
  if (const cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
    fail(Errc::internal, "the GPU stream failed: {}", cudaGetErrorString(e));
  }
#else
  (void)stream;
  fail(Errc::invalid_argument, "this build of moekit has no CUDA");
#endif
}

}  // namespace moekit
