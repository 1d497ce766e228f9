#pragma once
// What a stage runs on. Every stage of forward() receives one ExecContext: the thread pool for
// CPU stages, the caller's CUDA stream for GPU stages, and the device both are bound to. A stage
// never picks its own pool or stream, so a caller can run two layers on two streams, or a layer
// on a stream an inference server owns.

#include "moekit/tensor.hpp"

namespace moekit {

class ThreadPool;
using GpuStream = CUstream_st*;

struct ExecContext {
  Device device = Device::cpu();
  ThreadPool* pool = nullptr;  // CPU stages
  GpuStream stream = nullptr;  // GPU stages: the stream forward() enqueues its work on

  ThreadPool& threads() const;  // the pool; an internal error when a CPU stage has none
};

// Waits until `stream` has run everything enqueued on it (internal error naming the CUDA error
// otherwise; invalid_argument in a build without CUDA).
void synchronize_stream(GpuStream stream);

}  // namespace moekit
