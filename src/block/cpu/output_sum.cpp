// The cpu output stage: routed + shared in f32, then converted to the output's dtype.

#include "block/stages.hpp"

namespace moekit {
namespace {

class CpuOutputSum final : public OutputSum {
 public:
  explicit CpuOutputSum(const Plan& plan) : hidden_(plan.spec.hidden) {}

  void run(const ExecContext&, float* routed, const float* shared,
           const TensorView& output) const override {
    const int64_t n = output.dim(0) * hidden_;
    if (shared == nullptr) {
      convert_from_f32(routed, n, output.data, output.dtype);
      return;
    }
    for (int64_t i = 0; i < n; ++i) routed[i] += shared[i];
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
