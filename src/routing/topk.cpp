#include "routing/topk.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "core/thread_pool.hpp"
#include "moekit/error.hpp"

// With check_finite false a NaN or Inf logit is not detected: the ids and weights of its row are
// then unspecified (the ids are still distinct experts of the row's range, and nothing is read or
// written outside the given arrays).

namespace moekit::routing {
namespace {

// a is ranked ahead of b: higher value, ties to the lower id.
bool ahead(float a_value, int32_t a_id, float b_value, int32_t b_id) {
  return a_value > b_value || (a_value == b_value && a_id < b_id);
}

// The best `capacity` offers so far, best first. Written by hand rather than with
// std::partial_sort: an unchecked NaN breaks the strict weak ordering the standard algorithms
// rely on, while this insertion stays inside its slots whatever the comparisons answer, and it
// fills all of them as soon as `capacity` offers were made.
class BestK {
 public:
  BestK(float* values, int32_t* ids, int capacity)
      : values_(values), ids_(ids), capacity_(capacity) {}

  void offer(float value, int32_t id) {
    int slot;
    if (size_ < capacity_) {
      slot = size_++;
    } else if (ahead(value, id, values_[capacity_ - 1], ids_[capacity_ - 1])) {
      slot = capacity_ - 1;
    } else {
      return;
    }
    for (; slot > 0 && ahead(value, id, values_[slot - 1], ids_[slot - 1]); --slot) {
      values_[slot] = values_[slot - 1];
      ids_[slot] = ids_[slot - 1];
    }
    values_[slot] = value;
    ids_[slot] = id;
  }

 private:
  float* values_;
  int32_t* ids_;
  int capacity_;
  int size_ = 0;
};

struct RouteParams {
  const RoutingSpec& spec;
  int n_experts;
  int group_size;  // n_experts when ungrouped
  const float* bias;
};

// One thread's working memory, sized when the Router is built.
struct Scratch {
  explicit Scratch(const RouteParams& router)
      : converted(router.n_experts),
        score(router.n_experts),
        choice(router.bias ? router.n_experts : 0),
        group_value(router.spec.n_group),
        group_id(router.spec.n_group),
        top_value(router.spec.top_k) {}
  std::vector<float> converted;
  std::vector<float> score;
  std::vector<float> choice;
  std::vector<float> group_value;
  std::vector<int32_t> group_id;
  std::vector<float> top_value;
};

void compute_scores(Scoring scoring, const float* x, int n, float* score) {
  switch (scoring) {
    case Scoring::softmax: {
      float max = x[0];
      for (int e = 1; e < n; ++e) max = std::max(max, x[e]);
      float sum = 0.0f;
      for (int e = 0; e < n; ++e) {
        score[e] = std::exp(x[e] - max);
        sum += score[e];
      }
      for (int e = 0; e < n; ++e) score[e] /= sum;
      return;
    }
    case Scoring::sigmoid:
      for (int e = 0; e < n; ++e) score[e] = 1.0f / (1.0f + std::exp(-x[e]));
      return;
    case Scoring::sqrt_softplus:
      // max(x, 0) + log1p(exp(-|x|)) neither overflows for large x nor loses small values for
      // very negative x.
      for (int e = 0; e < n; ++e) {
        const float softplus = std::max(x[e], 0.0f) + std::log1p(std::exp(-std::abs(x[e])));
        score[e] = std::sqrt(softplus);
      }
      return;
  }
  fail(Errc::internal, "select_experts: unknown scoring {}", static_cast<int>(scoring));
}

float group_value(GroupScore rule, const float* choice, int group_size) {
  if (rule == GroupScore::max) {
    float best = choice[0];
    for (int i = 1; i < group_size; ++i) best = std::max(best, choice[i]);
    return best;
  }
  // top2_sum: a value equal to the best still counts as the second best, as torch.topk(2) does.
  float first = std::max(choice[0], choice[1]);
  float second = std::min(choice[0], choice[1]);
  for (int i = 2; i < group_size; ++i) {
    if (choice[i] > first) {
      second = first;
      first = choice[i];
    } else if (choice[i] > second) {
      second = choice[i];
    }
  }
  return first + second;
}

void route_row(const RouteParams& router, const float* x, Scratch& scratch, int32_t* ids,
               float* weights) {
  const RoutingSpec& spec = router.spec;
  const int n = router.n_experts;
  float* score = scratch.score.data();
  compute_scores(spec.scoring, x, n, score);
  const float* choice = score;
  if (router.bias) {
    for (int e = 0; e < n; ++e) scratch.choice[e] = score[e] + router.bias[e];
    choice = scratch.choice.data();
  }

  BestK experts(scratch.top_value.data(), ids, spec.top_k);
  if (spec.n_group > 1) {
    const int size = router.group_size;
    BestK groups(scratch.group_value.data(), scratch.group_id.data(), spec.topk_group);
    for (int g = 0; g < spec.n_group; ++g) {
      groups.offer(group_value(spec.group_score, choice + g * size, size), g);
    }
    for (int i = 0; i < spec.topk_group; ++i) {
      const int first = scratch.group_id[i] * size;
      for (int e = first; e < first + size; ++e) experts.offer(choice[e], e);
    }
  } else {
    for (int e = 0; e < n; ++e) experts.offer(choice[e], e);
  }

  float sum = 0.0f;
  for (int j = 0; j < spec.top_k; ++j) {
    weights[j] = score[ids[j]];
    sum += weights[j];
  }
  // Scores are never negative, so a zero sum means every routed score underflowed; dividing would
  // turn those zero weights into NaN.
  const bool divide = spec.renormalize && sum > 0.0f;
  for (int j = 0; j < spec.top_k; ++j) {
    if (divide) weights[j] /= sum;
    weights[j] *= spec.routed_scaling_factor;
  }
}

void check_logits(const TensorView& logits, int n_experts) {
  if (logits.device.kind != DeviceKind::cpu) {
    fail(Errc::invalid_argument, "router_logits: must be on the CPU, got {}", logits.describe());
  }
  if (logits.dtype != DType::f32 && logits.dtype != DType::bf16 && logits.dtype != DType::f16) {
    fail(Errc::invalid_argument, "router_logits: dtype {} is not supported (f32, bf16 or f16)",
         dtype_name(logits.dtype));
  }
  if (logits.rank() != 2 || logits.dim(1) != n_experts || logits.dim(0) < 0) {
    fail(Errc::invalid_argument, "router_logits: shape {} does not match [T, n_experts] = [T, {}]",
         logits.shape.str(), n_experts);
  }
  if (!logits.is_contiguous()) {
    fail(Errc::invalid_argument,
         "router_logits: must be row-major contiguous, got strides [{}, {}] for shape {}",
         logits.strides[0], logits.strides[1], logits.shape.str());
  }
  if (logits.data == nullptr && logits.dim(0) > 0) {
    fail(Errc::invalid_argument, "router_logits: data is null for {} rows", logits.dim(0));
  }
}

// Broken invariants of a validated spec; each one would otherwise index out of bounds.
void check_spec(const RoutingSpec& spec, int n_experts) {
  if (n_experts < 1 || spec.top_k < 1 || spec.top_k > n_experts) {
    fail(Errc::internal, "select_experts: top_k {} is outside [1, n_experts = {}]", spec.top_k,
         n_experts);
  }
  if (spec.n_group < 1) fail(Errc::internal, "select_experts: n_group {} < 1", spec.n_group);
  if (spec.n_group == 1) return;
  const int size = n_experts / spec.n_group;
  const bool fits = n_experts % spec.n_group == 0 && spec.topk_group >= 1 &&
                    spec.topk_group <= spec.n_group && spec.top_k <= spec.topk_group * size &&
                    (spec.group_score != GroupScore::top2_sum || size >= 2);
  if (!fits) {
    fail(Errc::internal,
         "select_experts: {} experts in {} groups keeping {} cannot route top_k {} (top2_sum "
         "needs groups of 2 or more)",
         n_experts, spec.n_group, spec.topk_group, spec.top_k);
  }
}

struct NonFinite {
  int64_t row = -1;
  int expert = 0;
  float value = 0.0f;
};

}  // namespace

struct Router::Workspace {
  RouteParams params;
  std::vector<Scratch> scratch;  // one per thread
};

Router::Router(const RoutingSpec& spec, int n_experts, const float* correction_bias, int threads)
    : spec_(spec), n_experts_(n_experts) {
  check_spec(spec_, n_experts);
  if (spec_.correction_bias != (correction_bias != nullptr)) {
    fail(Errc::invalid_argument, "correction_bias: {} but spec.correction_bias is {}",
         correction_bias ? "given" : "null", spec_.correction_bias);
  }
  const RouteParams params{spec_, n_experts, n_experts / spec_.n_group, correction_bias};
  workspace_ = std::make_unique<Workspace>(Workspace{
      params, std::vector<Scratch>(static_cast<size_t>(std::max(1, threads)), Scratch(params))});
}

Router::~Router() = default;

void Router::select(const TensorView& logits, bool check_finite, int32_t* ids, float* weights,
                    ThreadPool* pool) {
  check_logits(logits, n_experts_);
  const int64_t rows = logits.dim(0);
  if (rows == 0) return;
  if (ids == nullptr || weights == nullptr) {
    fail(Errc::invalid_argument, "select_experts: the ids and weights outputs must not be null");
  }
  if (pool != nullptr && pool->size() > static_cast<int>(workspace_->scratch.size())) {
    fail(Errc::internal, "router built for {} threads, run on {}", workspace_->scratch.size(),
         pool->size());
  }

  const RouteParams& router = workspace_->params;
  const int n_experts = n_experts_;
  const auto* bytes = static_cast<const char*>(logits.data);
  const int64_t row_bytes = dtype_storage_bytes(logits.dtype, n_experts);
  // Each chunk stops at its first non-finite row; the lowest of those is the first in the batch,
  // so the error is the same however the rows were split.
  std::mutex bad_mutex;
  NonFinite bad;

  auto route_rows = [&](int64_t begin, int64_t end, int worker) {
    Scratch& scratch = workspace_->scratch[worker];
    for (int64_t r = begin; r < end; ++r) {
      const void* row = bytes + r * row_bytes;
      const float* x = static_cast<const float*>(row);
      if (logits.dtype != DType::f32) {
        convert_to_f32(row, logits.dtype, n_experts, scratch.converted.data());
        x = scratch.converted.data();
      }
      if (check_finite) {
        const float* found =
            std::find_if(x, x + n_experts, [](float v) { return !std::isfinite(v); });
        if (found != x + n_experts) {
          std::lock_guard lock(bad_mutex);
          if (bad.row < 0 || r < bad.row) bad = {r, static_cast<int>(found - x), *found};
          return;
        }
      }
      route_row(router, x, scratch, ids + r * spec_.top_k, weights + r * spec_.top_k);
    }
  };
  if (pool) {
    pool->parallel_chunks(rows, route_rows);
  } else {
    route_rows(0, rows, 0);
  }
  if (bad.row >= 0) {
    fail(Errc::invalid_argument, "router_logits: row {} has a non-finite value ({}) at expert {}",
         bad.row, bad.value, bad.expert);
  }
}

void select_experts(const RoutingSpec& spec, int n_experts, const TensorView& logits,
                    const float* correction_bias, bool check_finite, int32_t* ids, float* weights,
                    ThreadPool* pool) {
  Router router(spec, n_experts, correction_bias, pool ? pool->size() : 1);
  router.select(logits, check_finite, ids, weights, pool);
}

}  // namespace moekit::routing
