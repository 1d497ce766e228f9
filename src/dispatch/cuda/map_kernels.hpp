#pragma once
// The standard dispatcher's map on the GPU: each entry's global physical expert id to this
// rank's local slot (-1: held elsewhere). An id outside [0, n_global) maps to -1 as well (the
// router never writes one). Enqueues on `stream`; every pointer is device memory.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moekit::dispatch::cuda {

struct MapToLocalArgs {
  const int32_t* global_ids = nullptr;       // [entries]
  const int32_t* global_to_local = nullptr;  // [n_global]
  int n_global = 0;
  int64_t entries = 0;
  int32_t* local_ids = nullptr;  // [entries] out
};
void map_to_local(const MapToLocalArgs& args, cudaStream_t stream);

}  // namespace moekit::dispatch::cuda
