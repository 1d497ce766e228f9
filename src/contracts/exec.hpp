#pragma once
// What a stage runs on. Every stage of forward() receives one ExecContext: the thread pool for
// CPU stages, the caller's CUDA stream for GPU stages, and the device both are bound to. A stage
// never picks its own pool or stream, so a caller can run two layers on two streams, or a layer
// on a stream an inference server owns.

#include "moekit/tensor.hpp"

struct CUstream_st;  // cudaStream_t is CUstream_st*; named here so no CUDA header is needed

namespace moekit {

class ThreadPool;
using GpuStream = CUstream_st*;

struct ExecContext {
  Device device = Device::cpu();
  ThreadPool* pool = nullptr;  // CPU stages
  GpuStream stream = nullptr;  // GPU stages: the stream forward() enqueues its work on

  ThreadPool& threads() const;  // the pool; an internal error when a CPU stage has none
};

}  // namespace moekit
