// The oracle: plain loops, float64 accumulation, one token at a time in the standard format.
// Every other core is tested against it; it is written for obviousness, not speed. Quantised
// weights are read as their format defines them (exact in float64), and GEMM inputs are
// quantised where the format says so, so it computes what the model's own inference code does.

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "core/scratch.hpp"
#include "core/thread_pool.hpp"
#include "quant/activation_quant.hpp"
#include "quant/dequantize.hpp"
#include "runner/kernels.hpp"
#include "runner/registry.hpp"

namespace moekit {
namespace {

class ReferenceCore final : public RunnerCore {
 public:
  explicit ReferenceCore(const ExpertsProblem& problem) : p_(problem) {
    ScratchCarver counter;
    carve(counter);
    worker_bytes_ = counter.bytes();
  }

  RunnerFormat format() const override { return RunnerFormat::standard; }

  int64_t scratch_bytes() const override { return worker_bytes_ * p_.threads; }

  void run(const ExecContext& ctx, RunnerBatch& batch, const CoreWeights& weights,
           void* scratch) const override {
    const DispatchOutput& in = *batch.standard;
    ctx.threads().parallel_chunks(in.tokens, [&](int64_t begin, int64_t end, int worker) {
      ScratchCarver carver(worker_scratch(scratch, worker_bytes_, worker));
      const Buffers buffers = carve(carver);
      for (int64_t t = begin; t < end; ++t) run_token(in, t, weights, buffers, in.sum);
    });
  }

 private:
  struct Buffers {
    float* row;   // a hidden or activation row in f32, as it enters a GEMM
    double* w;    // one weight row
    double* x;    // [H]
    double* act;  // [I]
    double* acc;  // [H]
  };

  Buffers carve(ScratchCarver& scratch) const {
    const int64_t width = std::max(p_.hidden, p_.intermediate);
    return {scratch.take<float>(width), scratch.take<double>(width),
            scratch.take<double>(p_.hidden), scratch.take<double>(p_.intermediate),
            scratch.take<double>(p_.hidden)};
  }

  void run_token(const DispatchOutput& in, int64_t t, const CoreWeights& w, const Buffers& b,
                 float* combined) const {
    const int64_t H = p_.hidden;
    const int64_t I = p_.intermediate;
    kernels::activation_row(in.hidden, t, b.row);
    quantize_activation_row(w.quant, w.w13_input_scale, b.row, H, b.x);
    std::fill(b.acc, b.acc + H, 0.0);
    for (int j = 0; j < in.columns; ++j) {
      const int32_t slot = in.slots[t * in.columns + j];
      if (slot < 0) continue;
      for (int64_t i = 0; i < I; ++i) {
        const double gate = dot_row(w, slot, i, b);
        const double up = dot_row(w, slot, I + i, b);
        b.act[i] = kernels::activate(p_.activation, gate, up);
      }
      if (w.quant.quantizes_activations()) {
        // The format quantises GEMM2's input from f32 values, as a core computes them.
        for (int64_t i = 0; i < I; ++i) b.row[i] = static_cast<float>(b.act[i]);
        quantize_activation_row(w.quant, w.w2_input_scale, b.row, I, b.act);
      }
      const double weight = in.weights[t * in.columns + j];
      for (int64_t h = 0; h < H; ++h) {
        dequantize_row(w.quant, w.w2, slot, h, b.w);
        double y = 0.0;
        for (int64_t i = 0; i < I; ++i) y += b.w[i] * b.act[i];
        b.acc[h] += weight * y;
      }
    }
    for (int64_t h = 0; h < H; ++h) combined[t * H + h] = static_cast<float>(b.acc[h]);
  }

  double dot_row(const CoreWeights& w, int32_t slot, int64_t row, const Buffers& b) const {
    dequantize_row(w.quant, w.w13, slot, row, b.w);
    double sum = 0.0;
    for (int64_t h = 0; h < p_.hidden; ++h) sum += b.w[h] * b.x[h];
    return sum;
  }

  ExpertsProblem p_;
  int64_t worker_bytes_ = 0;
};

}  // namespace

Capability reference_supports(const Deployment& deployment) {
  if (deployment.options.device.kind != DeviceKind::cpu) {
    return Capability::No("the reference core runs on the CPU only");
  }
  return Capability::Yes("plain loops with float64 accumulation: the oracle");
}

Capability reference_reads(const QuantParams& quant) {
  return Capability::Yes(
      fmt::format("reads {} as the format defines its values, in float64", quant.name()));
}

std::unique_ptr<RunnerCore> make_reference_core(const Plan&, const ExpertsProblem& problem) {
  return std::make_unique<ReferenceCore>(problem);
}

}  // namespace moekit
