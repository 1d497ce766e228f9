// The cpu output stage: routed + gate * shared in f32, then converted to the output's dtype.

#include "block/stages.hpp"

namespace moekit {
namespace {

class CpuOutputSum final : public OutputSum {
 public:
  explicit CpuOutputSum(const Plan& plan) : hidden_(plan.spec.hidden) {}

  void run(const ExecContext&, float* routed, const float* shared, const float* shared_gate,
           const TensorView& output) const override {
    const int64_t T = output.dim(0), n = T * hidden_;
    if (shared != nullptr) {
      for (int64_t t = 0; t < T; ++t) {
        const float gate = shared_gate != nullptr ? shared_gate[t] : 1.0f;
        for (int64_t h = 0; h < hidden_; ++h)
          routed[t * hidden_ + h] += gate * shared[t * hidden_ + h];
      }
    }
    convert_from_f32(routed, n, output.data, output.dtype);
  }

 private:
  int64_t hidden_;
};

}  // namespace

std::unique_ptr<OutputSum> make_cpu_output_sum(const Plan& plan) {
  return std::make_unique<CpuOutputSum>(plan);
}

}  // namespace moekit
