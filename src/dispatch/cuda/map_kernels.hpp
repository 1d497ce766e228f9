#pragma once
// The standard dispatcher's kernels on the GPU: the map of each entry's global physical expert
// id to this rank's local slot (-1: held elsewhere; an id outside [0, n_global) maps to -1 as
// well, the router never writes one), and the reduce form's agreement where its exchanges are
// enqueued. Each enqueues on `stream`; every pointer is device memory.

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

// This rank's (status, tokens) pair for every rank: pairs [size][2].
void write_agreement(int64_t* pairs, int size, int64_t status, int64_t tokens, cudaStream_t stream);

// What came, [size][2], against this rank's tokens: reports[r] becomes kAgreementRefused where
// rank r's input failed, kAgreementTokens (detail: its tokens) where it has other tokens; a
// report already set stays.
struct AgreementReport {
  int32_t kind;
  int32_t detail;
};
inline constexpr int32_t kAgreementRefused = 1;
inline constexpr int32_t kAgreementTokens = 2;
void check_agreement(const int64_t* pairs, int size, int64_t ready, int64_t tokens,
                     AgreementReport* reports, cudaStream_t stream);

}  // namespace moekit::dispatch::cuda
