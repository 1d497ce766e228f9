#pragma once
// The GPU router's per-token code (route.hpp): one warp routes one token. The scores live in the
// warp's slice of shared memory, and each of the top-k (and top-group) picks is a warp-wide
// arg-max, so no block-wide barrier is needed and a block holds several tokens. For the top-k,
// each lane first sorts its own experts (e = lane, lane + 32, ...) by one unsigned key; a pick
// is then two warp reductions over the lanes' heads (the highest key, then the lowest id holding
// it) and the owner's step to its next expert, so a decode batch's latency is not E/32
// shared-memory reads per pick. A header of its own so that a kernel that routes its token
// itself (the one-token kernel, Plan::fusions.route_in_runner) runs the same code: the same ids
// and bits as the router kernel.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda_common.cuh"
#include "core/cuda_finite.hpp"
#include "moekit/dtype.hpp"
#include "moekit/spec.hpp"
#include "routing/cuda/route.hpp"

namespace moekit::routing::cuda {

using cuda_common::kFullMask;

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
__device__ inline bool ahead(float a_value, int a_id, float b_value, int b_id) {
  if (a_id < 0) return false;
  if (b_id < 0) return true;
  return a_value > b_value || (a_value == b_value && a_id < b_id);
}

__device__ inline int warp_pick(float value, int id) {
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

__device__ inline float score_of(Scoring scoring, float x) {
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
__device__ inline float group_value(GroupScore rule, const float* choice, int size) {
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
__device__ inline unsigned order_key(float value) {
  const unsigned bits = __float_as_uint(value + 0.0f);
  return max(bits & 0x80000000u ? ~bits : bits | 0x80000000u, 1u);
}

// Pick `lane` of a routed token: lane j < top_k holds the j-th expert and its weight (and,
// with the physical columns, its physical id); lanes from top_k to the physical columns hold
// the fused shared slots' physical ids and weights; -1 where a lane holds none.
struct Pick {
  int id;
  float weight;
  int physical;
  float physical_weight;
};

// Routes token t with the calling warp (every lane), in `mine`: p.warp_bytes of shared memory.
// Writes the token's ids and weights (and physical columns) where `write`, and returns each
// lane's pick either way.
__device__ inline Pick route_token(const RouteParams& p, int64_t t, unsigned char* mine,
                                   bool write) {
  const int lane = threadIdx.x % 32;
  const int n = p.n_experts;
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
  // As to_physical_kernel computes them, from the same values.
  Pick pick{-1, 0.0f, -1, 0.0f};
  if (routed) {
    pick = {my_id, scaled, physical && my_id >= 0 && my_id < n ? physical_of[my_id] : -1, scaled};
  } else if (physical && lane < p.columns) {
    pick.physical = p.first_shared_id + (lane - p.top_k);
    pick.physical_weight = p.shared_slot_weight * 1.0f;
  }
  if (!write) return pick;
  if (routed) {
    p.ids[t * p.top_k + lane] = my_id;
    p.weights[t * p.top_k + lane] = scaled;
  }
  if (!physical) return pick;
  if (routed) {
    p.physical_ids[t * p.columns + lane] = pick.physical;
    p.physical_weights[t * p.columns + lane] = scaled;
  }
  for (int c = p.top_k + lane; c < p.columns; c += 32) {
    p.physical_ids[t * p.columns + c] = p.first_shared_id + (c - p.top_k);
    p.physical_weights[t * p.columns + c] = p.shared_slot_weight * 1.0f;
  }
  return pick;
}

// The router kernel's parameters for `args`, checked (invalid_argument for what it cannot
// route, internal for a grouping resolve() would refuse); route_blocks and the finite checks
// are the caller's. tokens > 0.
RouteParams route_params(const RouteArgs& args);

}  // namespace moekit::routing::cuda
