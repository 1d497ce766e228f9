// Pre- and post-permutes between the standard dispatch format and the cores' formats.

#include <algorithm>

#include "core/scratch.hpp"
#include "core/thread_pool.hpp"
#include "runner/kernels.hpp"
#include "runner/registry.hpp"

namespace moekit {
namespace {

class PassThroughPre final : public PrePermute {
 public:
  int64_t scratch_bytes() const override { return 0; }
  void run(const ExecContext&, const DispatchOutput& input, RunnerBatch& batch,
           void*) const override {
    batch.standard = &input;
  }
};

class PassThroughPost final : public PostPermute {
 public:
  void run(const ExecContext&, const RunnerBatch&, const DispatchOutput&) const override {}
};

// Counting sort of the (token, column) entries by slot, then a parallel gather of the rows.
// Within a slot rows keep token order, so results do not depend on the thread count.
class GroupByExpert final : public PrePermute {
 public:
  explicit GroupByExpert(const ExpertsProblem& problem) : p_(problem) {}

  int64_t scratch_bytes() const override {
    ScratchCarver counter;
    carve(counter);
    return counter.bytes();
  }

  void run(const ExecContext& ctx, const DispatchOutput& input, RunnerBatch& batch,
           void* scratch) const override {
    ScratchCarver carver(scratch);
    const Arrays a = carve(carver);
    const int64_t entries = input.tokens * input.columns;
    std::fill(a.offsets, a.offsets + p_.slots + 1, 0);
    for (int64_t e = 0; e < entries; ++e) {
      if (input.slots[e] >= 0) ++a.offsets[input.slots[e] + 1];
    }
    for (int s = 0; s < p_.slots; ++s) a.offsets[s + 1] += a.offsets[s];
    std::copy(a.offsets, a.offsets + p_.slots, a.cursor);
    for (int64_t e = 0; e < entries; ++e) {
      a.row_of_entry[e] =
          input.slots[e] >= 0 ? static_cast<int32_t>(a.cursor[input.slots[e]]++) : -1;
    }
    ctx.threads().parallel_for(entries, [&](int64_t begin, int64_t end) {
      for (int64_t e = begin; e < end; ++e) {
        if (a.row_of_entry[e] < 0) continue;
        kernels::activation_row(input.hidden, e / input.columns,
                                a.rows + a.row_of_entry[e] * p_.hidden);
      }
    });
    batch.standard = &input;
    batch.contiguous = {ActivationRows::Float(a.rows, DType::f32, a.offsets[p_.slots], p_.hidden),
                        a.row_out, a.offsets, a.row_of_entry, input.hidden.dtype};
  }

 private:
  struct Arrays {
    float* rows;
    float* row_out;
    int64_t* offsets;
    int64_t* cursor;
    int32_t* row_of_entry;
  };
  Arrays carve(ScratchCarver& carver) const {
    return {carver.take<float>(p_.max_rows() * p_.hidden),
            carver.take<float>(p_.max_rows() * p_.hidden), carver.take<int64_t>(p_.slots + 1),
            carver.take<int64_t>(p_.slots), carver.take<int32_t>(p_.max_rows())};
  }

  ExpertsProblem p_;
};

class WeightedSumToTokens final : public PostPermute {
 public:
  explicit WeightedSumToTokens(const ExpertsProblem& problem) : hidden_(problem.hidden) {}

  void run(const ExecContext& ctx, const RunnerBatch& batch,
           const DispatchOutput& input) const override {
    const ContiguousRows& rows = batch.contiguous;
    ctx.threads().parallel_for(input.tokens, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* out = input.sum + t * hidden_;
        std::fill(out, out + hidden_, 0.0f);
        for (int j = 0; j < input.columns; ++j) {
          const int64_t e = t * input.columns + j;
          if (rows.row_of_entry[e] < 0) continue;
          const float weight = input.weights[e];
          const float* y = rows.row_out + rows.row_of_entry[e] * hidden_;
          for (int64_t h = 0; h < hidden_; ++h) out[h] += weight * y[h];
        }
      }
    });
  }

 private:
  int64_t hidden_;
};

}  // namespace

std::unique_ptr<PrePermute> make_pass_through_pre(const ExpertsProblem&) {
  return std::make_unique<PassThroughPre>();
}
std::unique_ptr<PostPermute> make_pass_through_post(const ExpertsProblem&) {
  return std::make_unique<PassThroughPost>();
}
std::unique_ptr<PrePermute> make_group_by_expert(const ExpertsProblem& problem) {
  return std::make_unique<GroupByExpert>(problem);
}
std::unique_ptr<PostPermute> make_weighted_sum_to_tokens(const ExpertsProblem& problem) {
  return std::make_unique<WeightedSumToTokens>(problem);
}

}  // namespace moekit
