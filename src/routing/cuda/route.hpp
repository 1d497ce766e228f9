#pragma once
// Routing on the GPU: router logits -> logical top-k ids and weights, then logical -> physical
// ids with the fused shared-expert columns. The same numbers as the CPU router
// (routing/topk.hpp): ids equal, weights to rounding. Launchers enqueue on `stream`, allocate
// nothing and never wait, so they can be captured in a CUDA graph; every pointer is device
// memory.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/cuda_finite.hpp"
#include "moekit/dtype.hpp"
#include "moekit/spec.hpp"

namespace moekit::routing::cuda {

struct ToPhysicalArgs {
  const int32_t* logical_ids = nullptr;  // [tokens, top_k]
  const float* logical_weights = nullptr;
  int64_t tokens = 0;
  int top_k = 0;
  // [ep_size, n_logical] row-major: the physical expert that serves logical expert e for tokens
  // of source rank r (ExpertLocation::rank_table). Token t's source rank is t * ep_size / tokens.
  const int32_t* rank_table = nullptr;
  int n_logical = 0;
  int ep_size = 1;
  // Fused shared slots: column top_k + s holds physical id first_shared_id + s (the physical
  // expert count) with weight shared_slot_weight, times shared_gate[t] where given.
  int shared_slots = 0;
  int first_shared_id = 0;
  float shared_slot_weight = 1.0f;
  const float* shared_gate = nullptr;  // [tokens] or null
  int32_t* ids = nullptr;              // [tokens, top_k + shared_slots] out
  float* weights = nullptr;            // [tokens, top_k + shared_slots] out
};

struct RouteArgs {
  const void* logits = nullptr;     // [tokens, n_experts], row-major
  DType logits_dtype = DType::f32;  // f32, bf16 or f16
  int64_t tokens = 0;
  int n_experts = 0;
  RoutingSpec spec;
  const float* correction_bias = nullptr;  // [n_experts]; null exactly when !spec.correction_bias
  int32_t* ids = nullptr;                  // [tokens, top_k] out
  float* weights = nullptr;                // [tokens, top_k] out
  // Optional: to_physical(*physical) in the same launch, from the ids and weights just picked
  // (bit for bit what to_physical writes). Its logical_ids, logical_weights, tokens and top_k
  // must be this call's ids, weights, tokens and spec.top_k, n_logical its n_experts, and its
  // shared_gate null (a shared gate is computed by a kernel of its own, after this one).
  const ToPhysicalArgs* physical = nullptr;
  // Optional: the NaN/Inf checks of two tensors (the batch's hidden states and logits) in the
  // same launch, by blocks of their own beside the routing ones, with the check kernel's loop
  // (core/cuda_finite.cuh): the same statuses as block::cuda::check_finite would leave. Tensors
  // with no elements are not checked.
  cuda_finite::FiniteTensor check_first{};
  cuda_finite::FiniteTensor check_second{};
};

// Within a row the k ids are in decreasing order of choice score (score + bias), ties to the
// lower id, as select_experts orders them. A row with a NaN or Inf logit gets distinct ids in
// range and unspecified weights; check_finite (block/cuda/finite_check.hpp) reports such rows.
// Throws invalid_argument for arguments the kernel cannot route (and internal for a grouping
// resolve() would refuse).
void route(const RouteArgs& args, cudaStream_t stream);

void to_physical(const ToPhysicalArgs& args, cudaStream_t stream);

// Bytes of shared memory the router's warp code (route_warp.cuh) needs to route one token of
// `n_experts` under `spec`, with the physical columns or without.
int route_warp_bytes(int n_experts, const RoutingSpec& spec, bool physical);

}  // namespace moekit::routing::cuda
