#pragma once
// Router: logits -> top-k expert ids and weights, for every scoring and grouping the spec allows.

#include <cstdint>
#include <memory>

#include "moekit/spec.hpp"
#include "moekit/tensor.hpp"

namespace moekit {
class ThreadPool;
}

namespace moekit::routing {

// Routes batches with working memory sized once, when it is built, for up to `threads` threads;
// select() allocates nothing. The spec and the bias must outlive the router.
class Router {
 public:
  // correction_bias: n_experts floats, or nullptr when spec.correction_bias is false; a mismatch
  // throws invalid_argument. A grouping that cannot route top_k throws internal (resolve()
  // refuses such specs first).
  Router(const RoutingSpec& spec, int n_experts, const float* correction_bias, int threads);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // As select_experts below.
  void select(const TensorView& logits, bool check_finite, int32_t* ids, float* weights,
              ThreadPool* pool);

 private:
  struct Workspace;
  const RoutingSpec& spec_;
  int n_experts_;
  std::unique_ptr<Workspace> workspace_;
};

// One batch through a Router built for it (so it allocates; MoeLayer keeps a Router instead).
// logits: [T, n_experts], f32, bf16 or f16, on the CPU, row-major contiguous.
// correction_bias: n_experts floats, or nullptr when spec.correction_bias is false.
// ids: [T, top_k] int32 out; weights: [T, top_k] f32 out. Within a row the k entries are in
// decreasing order of choice score (score + bias), ties broken by the lower expert id.
// check_finite: a NaN or Inf logit throws invalid_argument naming its row and expert; without
// the check, such a row's ids and weights are unspecified (distinct ids in range, nothing read or
// written out of bounds).
void select_experts(const RoutingSpec& spec, int n_experts, const TensorView& logits,
                    const float* correction_bias, bool check_finite, int32_t* ids, float* weights,
                    ThreadPool* pool);

}  // namespace moekit::routing
