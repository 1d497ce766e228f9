#pragma once
// Kernel launches that overlap with the kernel before them (programmatic dependent launch,
// sm_90 and newer): a forward is a chain of small kernels, and at decode sizes each one's launch
// and ramp cost as much as its work. A kernel launched this way may be scheduled while its
// predecessor on the stream still runs; it must call wait_for_inputs() before it reads anything
// an earlier kernel wrote or writes anything an earlier kernel reads, and it calls
// release_dependents() to let its own successor be scheduled early. Every kernel of the forward
// path calls wait_for_inputs() first thing, and the short ones release_dependents() right after
// it, so the order of the stream is what it was, minus the gaps. The
// attribute is captured into CUDA graphs as programmatic edges. Header-only: the expert GEMMs
// and their stand-alone benchmark use it too.

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <utility>

namespace moekit::cuda_launch {

// Waits until the kernels this one depends on have finished and their writes are visible; a
// no-op where the launch had no programmatic dependency (or the GPU is older than sm_90).
__device__ __forceinline__ void wait_for_inputs() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel on the stream be scheduled once every block of this one has called it
// (its blocks then wait in wait_for_inputs() until this kernel has finished).
__device__ __forceinline__ void release_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// Whether the current device takes programmatic dependent launches (sm_90 and newer); asked of
// the runtime once per device (no stream operation, so it is safe during a capture).
inline bool overlapping_launches() {
  static std::array<std::atomic<int>, 64> known{};  // 0 unknown, 1 no, 2 yes
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return false;
  int state = known[static_cast<size_t>(device)].load(std::memory_order_relaxed);
  if (state == 0) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      return false;
    }
    state = major >= 9 ? 2 : 1;
    known[static_cast<size_t>(device)].store(state, std::memory_order_relaxed);
  }
  return state == 2;
}

// kernel<<<grid, block, shared, stream>>>(args...), overlapped where the GPU allows. A failed
// launch is left for the caller's cudaGetLastError(), as with <<<>>>.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared, cudaStream_t stream,
            Args&&... args) {
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  config.attrs = &overlap;
  config.numAttrs = overlapping_launches() ? 1 : 0;
  (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace moekit::cuda_launch
