// The cpu core: rows grouped by expert (contiguous format), so each expert's weights are read
// once per batch, widened to f32 a row at a time, and applied to all of that expert's rows.
// Work is split over (expert, block of output rows) across the pool. Correct and parallel; the
// SIMD-tuned kernels are a later issue.

#include <algorithm>

#include "core/thread_pool.hpp"
#include "runner/kernels.hpp"
#include "runner/registry.hpp"
#include "runner/scratch.hpp"

namespace moekit {
namespace {

constexpr int64_t kGateUpBlock = 32;  // intermediate rows per work item in GEMM1
constexpr int64_t kDownBlock = 64;    // hidden rows per work item in GEMM2

class CpuCore final : public RunnerCore {
 public:
  explicit CpuCore(const ExpertsProblem& problem) : p_(problem) {
    ScratchCarver shared;
    shared.take<float>(p_.max_rows() * p_.intermediate);
    shared_bytes_ = shared.bytes();
    ScratchCarver worker;
    carve_worker(worker);
    worker_bytes_ = worker.bytes();
  }

  RunnerFormat format() const override { return RunnerFormat::contiguous; }
  int64_t scratch_bytes() const override { return shared_bytes_ + worker_bytes_ * p_.threads; }

  void run(RunnerBatch& batch, const CoreWeights& weights, void* scratch,
           ThreadPool& pool) const override {
    const ContiguousRows& rows = batch.contiguous;
    auto* act = static_cast<float*>(scratch);
    void* workers = static_cast<char*>(scratch) + shared_bytes_;
    const int64_t H = p_.hidden;
    const int64_t I = p_.intermediate;

    const int64_t up_blocks = (I + kGateUpBlock - 1) / kGateUpBlock;
    pool.parallel_chunks(p_.slots * up_blocks, [&](int64_t begin, int64_t end, int worker) {
      ScratchCarver carver(worker_scratch(workers, worker_bytes_, worker));
      const WorkerRows w = carve_worker(carver);
      for (int64_t item = begin; item < end; ++item) {
        const int64_t slot = item / up_blocks;
        const int64_t first = rows.offsets[slot];
        const int64_t count = rows.offsets[slot + 1] - first;
        if (count == 0) continue;
        const int64_t i_end = std::min(I, (item % up_blocks + 1) * kGateUpBlock);
        for (int64_t i = item % up_blocks * kGateUpBlock; i < i_end; ++i) {
          kernels::weight_row(weights.w13, slot, i, w.a);
          kernels::weight_row(weights.w13, slot, I + i, w.b);
          for (int64_t r = first; r < first + count; ++r) {
            const float* x = rows.rows + r * H;
            act[r * I + i] =
                kernels::activate(p_.activation, kernels::dot(w.a, x, H), kernels::dot(w.b, x, H));
          }
        }
      }
    });

    const int64_t down_blocks = (H + kDownBlock - 1) / kDownBlock;
    pool.parallel_chunks(p_.slots * down_blocks, [&](int64_t begin, int64_t end, int worker) {
      ScratchCarver carver(worker_scratch(workers, worker_bytes_, worker));
      const WorkerRows w = carve_worker(carver);
      for (int64_t item = begin; item < end; ++item) {
        const int64_t slot = item / down_blocks;
        const int64_t first = rows.offsets[slot];
        const int64_t count = rows.offsets[slot + 1] - first;
        if (count == 0) continue;
        const int64_t h_end = std::min(H, (item % down_blocks + 1) * kDownBlock);
        for (int64_t h = item % down_blocks * kDownBlock; h < h_end; ++h) {
          kernels::weight_row(weights.w2, slot, h, w.a);
          for (int64_t r = first; r < first + count; ++r) {
            rows.row_out[r * H + h] = kernels::dot(w.a, act + r * I, I);
          }
        }
      }
    });
  }

 private:
  struct WorkerRows {
    float* a;  // a weight row widened to f32
    float* b;
  };
  WorkerRows carve_worker(ScratchCarver& carver) const {
    const int64_t width = std::max(p_.hidden, p_.intermediate);
    return {carver.take<float>(width), carver.take<float>(width)};
  }

  ExpertsProblem p_;
  int64_t shared_bytes_ = 0;
  int64_t worker_bytes_ = 0;
};

}  // namespace

Capability cpu_supports(const Deployment& deployment) {
  if (deployment.options.device.kind != DeviceKind::cpu) {
    return Capability::No("the cpu core computes on the CPU; tensors on a GPU need a GPU runner");
  }
  return Capability::Yes("rows grouped by expert, each expert's weights read once, all threads");
}

std::unique_ptr<RunnerCore> make_cpu_core(const ExpertsProblem& problem) {
  return std::make_unique<CpuCore>(problem);
}

}  // namespace moekit
