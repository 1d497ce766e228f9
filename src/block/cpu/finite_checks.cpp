// The cpu stage that refuses NaN and Inf in the inputs: a pass over each row in f32.

#include <cmath>

#include <fmt/format.h>

#include "block/stages.hpp"
#include "core/scratch.hpp"
#include "moekit/error.hpp"

namespace moekit {
namespace {

class CpuFiniteChecks final : public FiniteChecks {
 public:
  explicit CpuFiniteChecks(const Plan& plan)
      : width_(std::max<int64_t>(plan.spec.hidden, plan.spec.n_experts)) {}

  int64_t scratch_bytes() const override {
    ScratchCarver counter;
    counter.take<float>(width_);
    return counter.bytes();
  }

  void run(const ExecContext&, const TensorView& hidden, const TensorView& logits,
           void* scratch) const override {
    ScratchCarver carver(scratch);
    float* row = carver.take<float>(width_);
    check_rows(hidden, "hidden_states", row);
    check_rows(logits, "router_logits", row);
  }
  void report() override {}

 private:
  static void check_rows(const TensorView& t, const char* name, float* row) {
    const int64_t cols = t.dim(1);
    for (int64_t r = 0; r < t.dim(0); ++r) {
      convert_to_f32(static_cast<const char*>(t.data) + dtype_storage_bytes(t.dtype, r * cols),
                     t.dtype, cols, row);
      for (int64_t c = 0; c < cols; ++c) {
        if (!std::isfinite(row[c])) {
          fail(Errc::invalid_argument, "{}: row {} has a non-finite value ({}) at column {}", name,
               r, row[c], c);
        }
      }
    }
  }

  int64_t width_;
};

}  // namespace

std::unique_ptr<FiniteChecks> make_cpu_finite_checks(const Plan& plan) {
  return std::make_unique<CpuFiniteChecks>(plan);
}

}  // namespace moekit
