#include <algorithm>
#include <string>

#include "core/cuda_common.cuh"
#include "core/cuda_finite.cuh"
#include "core/cuda_launch.cuh"
#include "routing/cuda/route.hpp"
#include "routing/cuda/route_warp.cuh"

// The router kernel: a warp per token (route_warp.cuh), and blocks of their own for the finite
// checks; the logical -> physical kernel; the launchers' checks.

namespace moekit::routing::cuda {
namespace {

constexpr int kMaxTopK = 32;  // one lane keeps each pick
constexpr int kMaxWarpsPerBlock = 4;
constexpr int kSharedLimit = 48 * 1024;

__global__ void route_kernel(RouteParams p) {
  cuda_launch::wait_for_inputs();
  cuda_launch::release_dependents();
  if (blockIdx.x >= p.route_blocks) {
    const unsigned block = blockIdx.x - p.route_blocks, blocks = gridDim.x - p.route_blocks;
    cuda_finite::check_elements(p.check_first, p.check_second,
                                static_cast<int64_t>(block) * blockDim.x + threadIdx.x,
                                static_cast<int64_t>(blocks) * blockDim.x);
    return;
  }
  extern __shared__ __align__(16) unsigned char shared[];
  const int warp = threadIdx.x / 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + warp;
  if (t >= p.tokens) return;
  route_token(p, t, shared + warp * p.warp_bytes, true);
}

struct PhysicalParams {
  const int32_t* logical_ids;
  const float* logical_weights;
  int64_t tokens;
  int top_k;
  const int32_t* rank_table;
  int n_logical;
  int ep_size;
  int columns;
  int first_shared_id;
  float shared_slot_weight;
  const float* shared_gate;
  int32_t* ids;
  float* weights;
};

__global__ void to_physical_kernel(PhysicalParams p) {
  cuda_launch::wait_for_inputs();
  cuda_launch::release_dependents();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.tokens * p.columns) return;
  const int64_t t = i / p.columns;
  const int c = static_cast<int>(i % p.columns);
  int32_t id;
  float weight;
  if (c < p.top_k) {
    const int64_t source_rank = t * p.ep_size / p.tokens;
    const int32_t logical = p.logical_ids[t * p.top_k + c];
    // A logical id out of range (never written by route()) maps to "not here" rather than
    // reading outside the table.
    id = logical >= 0 && logical < p.n_logical ? p.rank_table[source_rank * p.n_logical + logical]
                                               : -1;
    weight = p.logical_weights[t * p.top_k + c];
  } else {
    id = p.first_shared_id + (c - p.top_k);
    weight = p.shared_slot_weight * (p.shared_gate ? p.shared_gate[t] : 1.0f);
  }
  p.ids[i] = id;
  p.weights[i] = weight;
}

std::string str(int64_t value) {
  return std::to_string(value);
}

void check_grouping(const RoutingSpec& spec, int n) {
  if (spec.n_group < 1) cuda_errors::internal("route: n_group " + str(spec.n_group) + " < 1");
  if (spec.n_group == 1) return;
  const int size = n / spec.n_group;
  const bool fits = n % spec.n_group == 0 && spec.topk_group >= 1 &&
                    spec.topk_group <= spec.n_group && spec.top_k <= spec.topk_group * size &&
                    (spec.group_score != GroupScore::top2_sum || size >= 2);
  if (!fits) {
    cuda_errors::internal("route: " + str(n) + " experts in " + str(spec.n_group) +
                          " groups keeping " + str(spec.topk_group) + " cannot route top_k " +
                          str(spec.top_k) + " (top2_sum needs groups of 2 or more)");
  }
}

void check_physical(const ToPhysicalArgs& args) {
  if (args.tokens < 0 || args.top_k < 1 || args.shared_slots < 0 || args.ep_size < 1 ||
      args.n_logical < 1) {
    cuda_errors::invalid_argument("to_physical: bad sizes (tokens " + str(args.tokens) +
                                  ", top_k " + str(args.top_k) + ", shared_slots " +
                                  str(args.shared_slots) + ", ep_size " + str(args.ep_size) +
                                  ", n_logical " + str(args.n_logical) + ")");
  }
  if (args.tokens == 0) return;
  if (args.logical_ids == nullptr || args.logical_weights == nullptr ||
      args.rank_table == nullptr || args.ids == nullptr || args.weights == nullptr) {
    cuda_errors::invalid_argument("to_physical: ids, weights and rank_table must not be null");
  }
}

}  // namespace

int route_warp_bytes(int n_experts, const RoutingSpec& spec, bool physical) {
  // Scores, choices (with a bias), group values, sort keys, physical ids (with the physical
  // columns), sorted ids (16 bits), kept groups (bytes).
  const int n = n_experts;
  const int words = n * (spec.correction_bias ? 2 : 1) + spec.n_group + n + (physical ? n : 0);
  return (words * 4 + n * 2 + spec.n_group + 15) / 16 * 16;
}

RouteParams route_params(const RouteArgs& args) {
  const RoutingSpec& spec = args.spec;
  const int n = args.n_experts;
  if (!cuda_common::is_activation_dtype(args.logits_dtype)) {
    cuda_errors::invalid_argument("route: router_logits dtype " +
                                  std::string(dtype_name(args.logits_dtype)) +
                                  " is not supported (f32, bf16 or f16)");
  }
  if (n < 1 || spec.top_k < 1 || spec.top_k > n) {
    cuda_errors::internal("route: top_k " + str(spec.top_k) +
                          " is outside [1, n_experts = " + str(n) + "]");
  }
  if (spec.top_k > kMaxTopK) {
    cuda_errors::invalid_argument("route: top_k " + str(spec.top_k) +
                                  " is above the GPU router's " + str(kMaxTopK));
  }
  check_grouping(spec, n);
  if (spec.correction_bias != (args.correction_bias != nullptr)) {
    cuda_errors::invalid_argument(
        std::string("route: correction_bias ") + (args.correction_bias ? "given" : "null") +
        " but spec.correction_bias is " + (spec.correction_bias ? "true" : "false"));
  }
  if (args.tokens < 0) cuda_errors::invalid_argument("route: negative token count");
  const ToPhysicalArgs* physical = args.physical;
  const int warp_bytes = route_warp_bytes(n, spec, physical != nullptr);
  if (args.tokens > 0) {
    if (args.logits == nullptr || args.ids == nullptr || args.weights == nullptr) {
      cuda_errors::invalid_argument("route: logits, ids and weights must not be null");
    }
    if (warp_bytes > kSharedLimit || n > 65536) {
      cuda_errors::invalid_argument("route: " + str(n) + " experts need more shared memory (" +
                                    str(warp_bytes) + " bytes per token) than the GPU " +
                                    "router uses (" + str(kSharedLimit) + ")");
    }
    if (physical != nullptr) {
      check_physical(*physical);
      if (physical->logical_ids != args.ids || physical->logical_weights != args.weights ||
          physical->tokens != args.tokens || physical->top_k != spec.top_k ||
          physical->n_logical != n || physical->shared_gate != nullptr) {
        cuda_errors::invalid_argument(
            "route: the physical columns must map this call's ids and weights (tokens, top_k, "
            "n_experts alike) and take no shared gate");
      }
    }
    for (const cuda_finite::FiniteTensor* c : {&args.check_first, &args.check_second}) {
      if (c->elements < 0 ||
          (c->elements > 0 && (c->data == nullptr || c->first == nullptr || c->columns < 1))) {
        cuda_errors::invalid_argument("route: a finite check needs data, a status and columns");
      }
    }
  }
  return RouteParams{args.logits,
                     args.logits_dtype,
                     args.tokens,
                     n,
                     spec.scoring,
                     spec.top_k,
                     spec.n_group,
                     spec.topk_group,
                     spec.group_score,
                     spec.renormalize,
                     spec.routed_scaling_factor,
                     args.correction_bias,
                     args.ids,
                     args.weights,
                     warp_bytes,
                     physical ? physical->rank_table : nullptr,
                     physical ? physical->ep_size : 1,
                     physical ? physical->top_k + physical->shared_slots : spec.top_k,
                     physical ? physical->first_shared_id : 0,
                     physical ? physical->shared_slot_weight : 1.0f,
                     physical ? physical->ids : nullptr,
                     physical ? physical->weights : nullptr,
                     0,
                     args.check_first,
                     args.check_second};
}

void route(const RouteArgs& args, cudaStream_t stream) {
  RouteParams params = route_params(args);
  if (args.tokens == 0) return;
  const int warps = std::min(kMaxWarpsPerBlock, kSharedLimit / params.warp_bytes);
  params.route_blocks = cuda_common::blocks_for(args.tokens, warps);
  // The checks' blocks: as many as their elements need, up to as many threads as the check
  // kernel's grid has (4096 blocks of 256), grid-stride beyond.
  const int64_t to_check = args.check_first.elements + args.check_second.elements;
  const unsigned check_blocks =
      to_check == 0
          ? 0u
          : static_cast<unsigned>(std::min<int64_t>(cuda_common::blocks_for(to_check, warps * 32),
                                                    int64_t{4096} * 256 / (warps * 32)));
  cuda_launch::launch(route_kernel, params.route_blocks + check_blocks, warps * 32,
                      params.warp_bytes * warps, stream, params);
  cuda_common::check_launch("route");
}

void to_physical(const ToPhysicalArgs& args, cudaStream_t stream) {
  check_physical(args);
  if (args.tokens == 0) return;
  const int columns = args.top_k + args.shared_slots;
  const PhysicalParams params{
      args.logical_ids,     args.logical_weights,    args.tokens,      args.top_k,
      args.rank_table,      args.n_logical,          args.ep_size,     columns,
      args.first_shared_id, args.shared_slot_weight, args.shared_gate, args.ids,
      args.weights};
  constexpr int kThreads = 256;
  cuda_launch::launch(to_physical_kernel, cuda_common::blocks_for(args.tokens * columns, kThreads),
                      kThreads, 0, stream, params);
  cuda_common::check_launch("to_physical");
}

}  // namespace moekit::routing::cuda
