#include <algorithm>
#include <string>

#include "core/cuda_common.cuh"
#include "core/cuda_finite.cuh"
#include "core/cuda_launch.cuh"
#include "routing/cuda/route.hpp"

// One warp routes one token: the scores live in the warp's slice of shared memory, and each of
// the top-k (and top-group) picks is a warp-wide arg-max, so no block-wide barrier is needed and
// a block holds several tokens. For the top-k, each lane first sorts its own experts (e = lane,
// lane + 32, ...) by one unsigned key; a pick is then two warp reductions over the lanes' heads
// (the highest key, then the lowest id holding it) and the owner's step to its next expert, so a
// decode batch's latency is not E/32 shared-memory reads per pick.

namespace moekit::routing::cuda {
namespace {

using cuda_common::kFullMask;

constexpr int kMaxTopK = 32;  // one lane keeps each pick
constexpr int kMaxWarpsPerBlock = 4;
constexpr int kSharedLimit = 48 * 1024;

struct RouteParams {
  const void* logits;
  DType dtype;
  int64_t tokens;
  int n_experts;
  Scoring scoring;
  int top_k;
  int n_group;
  int topk_group;
  GroupScore group_score;
  bool renormalize;
  float scaling;
  const float* bias;
  int32_t* ids;
  float* weights;
  int warp_bytes;  // shared memory per warp
  // The physical columns in the same launch (RouteArgs::physical); physical_ids null: none.
  const int32_t* rank_table;
  int ep_size;
  int columns;  // top_k + fused shared slots
  int first_shared_id;
  float shared_slot_weight;
  int32_t* physical_ids;
  float* physical_weights;
  // The finite checks in the same launch (RouteArgs::check_first/second): blocks from
  // route_blocks on run them.
  unsigned route_blocks;
  cuda_finite::FiniteTensor check_first;
  cuda_finite::FiniteTensor check_second;
};

// (a_value, a_id) is ranked ahead of the best so far (b_value, b_id): higher value, ties to the
// lower id; an id of -1 is no candidate. With NaN values this is no order, and the caller
// broadcasts lane 0's answer so the warp still agrees on one pick.
__device__ bool ahead(float a_value, int a_id, float b_value, int b_id) {
  if (a_id < 0) return false;
  if (b_id < 0) return true;
  return a_value > b_value || (a_value == b_value && a_id < b_id);
}

__device__ int warp_pick(float value, int id) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other_value = __shfl_xor_sync(kFullMask, value, offset);
    const int other_id = __shfl_xor_sync(kFullMask, id, offset);
    if (ahead(other_value, other_id, value, id)) {
      value = other_value;
      id = other_id;
    }
  }
  return __shfl_sync(kFullMask, id, 0);
}

__device__ float score_of(Scoring scoring, float x) {
  switch (scoring) {
    case Scoring::sigmoid:
      return 1.0f / (1.0f + expf(-x));
    case Scoring::sqrt_softplus:
      return sqrtf(fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))));
    default:
      return x;  // softmax is normalised by the caller
  }
}

// As routing/topk.cpp's group_value: a value equal to the best still counts as the second best.
__device__ float group_value(GroupScore rule, const float* choice, int size) {
  if (rule == GroupScore::max) {
    float best = choice[0];
    for (int i = 1; i < size; ++i) best = fmaxf(best, choice[i]);
    return best;
  }
  float first = fmaxf(choice[0], choice[1]);
  float second = fminf(choice[0], choice[1]);
  for (int i = 2; i < size; ++i) {
    if (choice[i] > first) {
      second = first;
      first = choice[i];
    } else if (choice[i] > second) {
      second = choice[i];
    }
  }
  return first + second;
}

constexpr int kLoadBatch = 8;  // experts a lane loads before using any: 256 in one round trip

// Logits e0, e0 + 32, ... (kLoadBatch of them) of the row starting at `row`; past n zeros. The
// dtype is switched on once, outside the loads.
__device__ __forceinline__ void load_logits(const void* logits, DType dtype, int64_t row, int e0,
                                            int n, float (&x)[kLoadBatch]) {
  const auto load = [&]<class T>(const T* base, auto convert) {
#pragma unroll
    for (int i = 0; i < kLoadBatch; ++i) {
      const int e = e0 + 32 * i;
      x[i] = e < n ? convert(base[row + e]) : 0.0f;
    }
  };
  switch (dtype) {
    case DType::bf16:
      load(static_cast<const __nv_bfloat16*>(logits),
           [](__nv_bfloat16 v) { return __bfloat162float(v); });
      return;
    case DType::f16:
      load(static_cast<const __half*>(logits), [](__half v) { return __half2float(v); });
      return;
    default:
      load(static_cast<const float*>(logits), [](float v) { return v; });
  }
}

// A choice value as a key whose unsigned order is the float order (-0 counts as +0, as the
// float compare has them equal); 0 is kept for "no candidate" (only one NaN pattern maps there,
// and NaN has no order anyway).
__device__ unsigned order_key(float value) {
  const unsigned bits = __float_as_uint(value + 0.0f);
  return max(bits & 0x80000000u ? ~bits : bits | 0x80000000u, 1u);
}

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
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + warp;
  if (t >= p.tokens) return;
  const int n = p.n_experts;
  unsigned char* mine = shared + warp * p.warp_bytes;
  float* score = reinterpret_cast<float*>(mine);
  float* choice = p.bias ? score + n : score;
  float* groups = choice + n;
  // Lane l's sorted experts: keys[i * 32 + l] and ids[i * 32 + l], best first.
  unsigned* keys = reinterpret_cast<unsigned*>(groups + p.n_group);
  // With the physical columns: each expert's physical id for this token's source rank, loaded
  // with the logits (a load after the picks was one more memory round trip in the chain).
  const bool physical = p.physical_ids != nullptr;
  int32_t* physical_of = reinterpret_cast<int32_t*>(keys + n);
  uint16_t* ids = reinterpret_cast<uint16_t*>(physical_of + (physical ? n : 0));
  unsigned char* group_kept = reinterpret_cast<unsigned char*>(ids + n);

  const int64_t row = t * n;
  const int32_t* table = physical ? p.rank_table + t * p.ep_size / p.tokens * n : nullptr;
  float local_max = -INFINITY;
  // The lane's logits (and bias) are all loaded before any is used: one memory round trip per
  // kLoadBatch * 32 experts, where a load per iteration waited for each in turn (most of a
  // decode step's routing time, 10 us for DeepSeek-V3's 256 experts).
  for (int e0 = lane; e0 < n; e0 += 32 * kLoadBatch) {
    float x[kLoadBatch], b[kLoadBatch];
    int32_t to[kLoadBatch];
    load_logits(p.logits, p.dtype, row, e0, n, x);
#pragma unroll
    for (int i = 0; i < kLoadBatch; ++i) {
      const int e = e0 + 32 * i;
      b[i] = p.bias != nullptr && e < n ? __ldg(p.bias + e) : 0.0f;
      to[i] = physical && e < n ? __ldg(table + e) : -1;
    }
#pragma unroll
    for (int i = 0; i < kLoadBatch; ++i) {
      const int e = e0 + 32 * i;
      if (e >= n) break;
      score[e] = x[i];
      local_max = fmaxf(local_max, x[i]);
      if (p.bias != nullptr) choice[e] = b[i];
      if (physical) physical_of[e] = to[i];
    }
  }
  // Scored apart from the unrolled loads: one copy of the scoring's code, not one per load (the
  // kernel runs once per decode step, its code cold, so its size is fetch time).
  if (p.scoring != Scoring::softmax) {
    for (int e = lane; e < n; e += 32) score[e] = score_of(p.scoring, score[e]);
  }
  if (p.scoring == Scoring::softmax) {
    const float max = cuda_common::warp_max(local_max);
    float local_sum = 0.0f;
    for (int e = lane; e < n; e += 32) {
      score[e] = expf(score[e] - max);
      local_sum += score[e];
    }
    const float sum = cuda_common::warp_sum(local_sum);
    for (int e = lane; e < n; e += 32) score[e] /= sum;
  }
  if (p.bias) {
    for (int e = lane; e < n; e += 32) choice[e] = score[e] + choice[e];
  }
  __syncwarp();

  const int group_size = n / p.n_group;
  if (p.n_group > 1) {
    for (int g = lane; g < p.n_group; g += 32) {
      groups[g] = group_value(p.group_score, choice + g * group_size, group_size);
      group_kept[g] = 0;
    }
    __syncwarp();
    for (int pick = 0; pick < p.topk_group; ++pick) {
      float best = 0.0f;
      int best_id = -1;
      for (int g = lane; g < p.n_group; g += 32) {
        if (!group_kept[g] && ahead(groups[g], g, best, best_id)) {
          best = groups[g];
          best_id = g;
        }
      }
      const int kept = warp_pick(best, best_id);
      if (lane == 0) group_kept[kept] = 1;
      __syncwarp();
    }
  }

  // Insertion sort of the lane's allowed experts, in id order, each placed after the keys that
  // are not lower than its own: equal keys keep the lower id first.
  int listed = 0;
  for (int e = lane; e < n; e += 32) {
    if (p.n_group > 1 && !group_kept[e / group_size]) continue;
    const unsigned key = order_key(choice[e]);
    int at = listed++;
    for (; at > 0 && keys[(at - 1) * 32 + lane] < key; --at) {
      keys[at * 32 + lane] = keys[(at - 1) * 32 + lane];
      ids[at * 32 + lane] = ids[(at - 1) * 32 + lane];
    }
    keys[at * 32 + lane] = key;
    ids[at * 32 + lane] = static_cast<uint16_t>(e);
  }
  int head = 0;
  int my_id = 0;
  for (int j = 0; j < p.top_k; ++j) {
    const unsigned key = head < listed ? keys[head * 32 + lane] : 0u;
    const unsigned best = __reduce_max_sync(kFullMask, key);
    const unsigned id = __reduce_min_sync(
        kFullMask,
        key == best && key != 0u ? static_cast<unsigned>(ids[head * 32 + lane]) : 0xffffffffu);
    if (static_cast<int>(id % 32) == lane) ++head;
    if (lane == j) my_id = static_cast<int>(id);
  }

  const bool routed = lane < p.top_k;
  float weight = routed ? score[my_id] : 0.0f;
  const float sum = cuda_common::warp_sum(weight);
  // Scores are never negative, so a zero sum means every routed score underflowed; dividing
  // would turn those zero weights into NaN.
  if (p.renormalize && sum > 0.0f) weight /= sum;
  const float scaled = weight * p.scaling;
  if (routed) {
    p.ids[t * p.top_k + lane] = my_id;
    p.weights[t * p.top_k + lane] = scaled;
  }
  if (!physical) return;
  // As to_physical_kernel computes them, from the same values.
  if (routed) {
    p.physical_ids[t * p.columns + lane] = my_id >= 0 && my_id < n ? physical_of[my_id] : -1;
    p.physical_weights[t * p.columns + lane] = scaled;
  }
  for (int c = p.top_k + lane; c < p.columns; c += 32) {
    p.physical_ids[t * p.columns + c] = p.first_shared_id + (c - p.top_k);
    p.physical_weights[t * p.columns + c] = p.shared_slot_weight * 1.0f;
  }
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

void route(const RouteArgs& args, cudaStream_t stream) {
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
  if (args.tokens == 0) return;
  if (args.logits == nullptr || args.ids == nullptr || args.weights == nullptr) {
    cuda_errors::invalid_argument("route: logits, ids and weights must not be null");
  }
  const ToPhysicalArgs* physical = args.physical;
  // Per warp: scores, choices (with a bias), group values, sort keys, physical ids (with the
  // physical columns), sorted ids (16 bits), kept groups (bytes).
  const int words = n * (args.correction_bias ? 2 : 1) + spec.n_group + n + (physical ? n : 0);
  const int warp_bytes = (words * 4 + n * 2 + spec.n_group + 15) / 16 * 16;
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
  const int warps = std::min(kMaxWarpsPerBlock, kSharedLimit / warp_bytes);
  const unsigned route_blocks = cuda_common::blocks_for(args.tokens, warps);
  // The checks' blocks: as many as their elements need, up to as many threads as the check
  // kernel's grid has (4096 blocks of 256), grid-stride beyond.
  const int64_t to_check = args.check_first.elements + args.check_second.elements;
  for (const cuda_finite::FiniteTensor* c : {&args.check_first, &args.check_second}) {
    if (c->elements < 0 ||
        (c->elements > 0 && (c->data == nullptr || c->first == nullptr || c->columns < 1))) {
      cuda_errors::invalid_argument("route: a finite check needs data, a status and columns");
    }
  }
  const unsigned check_blocks =
      to_check == 0
          ? 0u
          : static_cast<unsigned>(std::min<int64_t>(cuda_common::blocks_for(to_check, warps * 32),
                                                    int64_t{4096} * 256 / (warps * 32)));
  const RouteParams params{args.logits,
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
                           route_blocks,
                           args.check_first,
                           args.check_second};
  cuda_launch::launch(route_kernel, route_blocks + check_blocks, warps * 32, warp_bytes * warps,
                      stream, params);
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
