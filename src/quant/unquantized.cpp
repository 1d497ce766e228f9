// Unquantized weights: f32, f16 or bf16 stored as the format says; source weights of another
// float type are converted once, at load time (bf16 and f16 round to nearest even).

#include <vector>

#include "moekit/error.hpp"
#include "quant/quant_method.hpp"

namespace moekit {

QuantParams QuantParams::Unquantized(WeightFormat format) {
  QuantParams params;
  params.format = format;
  switch (format) {
    case WeightFormat::f32:
      params.weight_dtype = DType::f32;
      break;
    case WeightFormat::f16:
      params.weight_dtype = DType::f16;
      break;
    case WeightFormat::bf16:
      params.weight_dtype = DType::bf16;
      break;
    default:
      fail(Errc::internal, "QuantParams::Unquantized takes f32, f16 or bf16, not {}",
           weight_format_name(format));
  }
  return params;
}

std::string QuantParams::describe() const {
  return fmt::format("{} weights, activations unquantized", dtype_name(weight_dtype));
}

namespace {

class Unquantized final : public QuantMethod {
 public:
  explicit Unquantized(WeightFormat format) : params_(QuantParams::Unquantized(format)) {}

  QuantParams params() const override { return params_; }

  void create_weights(int slots, int64_t hidden, int64_t intermediate) override {
    hidden_ = hidden;
    intermediate_ = intermediate;
    w13_ = Tensor::empty(params_.weight_dtype, {slots, 2 * intermediate, hidden});
    w2_ = Tensor::empty(params_.weight_dtype, {slots, hidden, intermediate});
    row_.resize(static_cast<size_t>(std::max(hidden, intermediate)));
  }

  void load_expert(int slot, const TensorView& gate, const TensorView& up,
                   const TensorView& down) override {
    for (int64_t i = 0; i < intermediate_; ++i) {
      copy_row(gate, i, w13_.view(), slot, i);
      copy_row(up, i, w13_.view(), slot, intermediate_ + i);
    }
    for (int64_t h = 0; h < hidden_; ++h) copy_row(down, h, w2_.view(), slot, h);
  }

  CoreWeights apply() const override { return {w13_.view(), w2_.view(), params_}; }

 private:
  void copy_row(const TensorView& src, int64_t src_row, const TensorView& dst, int64_t slot,
                int64_t dst_row) {
    const int64_t cols = src.dim(1);
    const auto* from = static_cast<const char*>(src.data) +
                       dtype_storage_bytes(src.dtype, src_row * src.strides[0]);
    auto* to = static_cast<char*>(dst.data) +
               dtype_storage_bytes(dst.dtype, (slot * dst.dim(1) + dst_row) * cols);
    convert_to_f32(from, src.dtype, cols, row_.data());
    convert_from_f32(row_.data(), cols, to, dst.dtype);
  }

  QuantParams params_;
  int64_t hidden_ = 0;
  int64_t intermediate_ = 0;
  Tensor w13_;
  Tensor w2_;
  std::vector<float> row_;  // load time only
};

}  // namespace

Capability unquantized_supports_runner(RunnerKind runner) {
  switch (runner) {
    case RunnerKind::reference:
    case RunnerKind::cpu:
      return Capability::Yes("reads f32/f16/bf16 rows, widened to f32");
    default:
      return Capability::No(
          fmt::format("no {} core is built for unquantized weights", runner_name(runner)));
  }
}

std::unique_ptr<QuantMethod> make_unquantized(WeightFormat format) {
  return std::make_unique<Unquantized>(format);
}

}  // namespace moekit
