#pragma once
// The stages of forward() that live in the block layer, as interfaces: forward is the straight
// pipeline
//   checks -> router -> [shared experts start] -> routed experts (dispatch, runner, combine)
//          -> [shared experts finish] -> output sum
// Each stage has one implementation per device (the stage table, block/stage_table.cpp), which
// resolve() picks for the plan's device and records (Plan::stages); the shared experts have one
// strategy per block form. Each stage declares its scratch (scratch_bytes) and receives it, with
// the ExecContext, on every call: MoeLayer allocates all of it once, on the plan's device.

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "contracts/exec.hpp"
#include "experts/experts_layer.hpp"
#include "moekit/plan.hpp"
#include "moekit/tensor.hpp"

namespace moekit {

// Refuses non-finite hidden states and router logits, naming the tensor, row and column. On the
// CPU run() throws; on a GPU it records what it finds on the device, and report() (called by
// MoeLayer::synchronize, once the stream is done) throws for what the forwards since the last
// report found.
class FiniteChecks {
 public:
  virtual ~FiniteChecks() = default;
  virtual int64_t scratch_bytes() const = 0;
  virtual void run(const ExecContext& ctx, const TensorView& hidden, const TensorView& logits,
                   void* scratch) const = 0;
  virtual void report() = 0;
  // Plan::fusions.checks_in_router: the device statuses the router records the checks into
  // (the GPU's; run() then launches nothing). Null where the checks cannot be taken in.
  virtual void* statuses_for_router() { return nullptr; }
};

// One batch's routing, in the router's scratch: logical ids and weights [T, top_k] (what
// RoutingResult reports), the physical ids and weights the experts receive [T, columns] (the
// source rank's replica of each expert, then the fused shared slots), and the shared experts'
// per-token gate (Qwen2-MoE; null without one).
struct Routing {
  const int32_t* logical_ids = nullptr;
  const float* logical_weights = nullptr;
  const int32_t* physical_ids = nullptr;
  const float* physical_weights = nullptr;
  const float* shared_gate = nullptr;
  // Plan::fusions.route_in_runner, at one token: the router kernel's arguments, left to the
  // runner's one-token kernel, which writes the arrays above (DispatchOutput::route). Null: the
  // arrays are written.
  const routing::cuda::RouteArgs* deferred = nullptr;
};

class RouterStage {
 public:
  virtual ~RouterStage() = default;
  virtual int64_t scratch_bytes() const = 0;
  // The weights the router reads: the correction bias [E] f32 (refused if not finite) and the
  // shared experts' gate [1, H], each when the spec has one.
  virtual void load(const TensorView& correction_bias, const TensorView& shared_gate) = 0;
  virtual Routing run(const ExecContext& ctx, const TensorView& hidden, const TensorView& logits,
                      void* scratch) = 0;
  // Plan::fusions.checks_in_router: run() also checks hidden and logits into these statuses
  // (FiniteChecks::statuses_for_router). Whether a router can is its own: the GPU's can.
  virtual bool take_finite_checks(void* /*statuses*/) { return false; }
};

// The shared experts computed apart from the routed ones, in the plan's block form: after them
// (standard) or beside them (overlapped). The fused-slot form has none: they are routed slots.
class SharedExperts {
 public:
  virtual ~SharedExperts() = default;
  virtual void load(int index, const MatrixSource& gate, const MatrixSource& up,
                    const MatrixSource& down) = 0;
  virtual void set_input_scales(float w13, float w2) = 0;
  // start() before the routed experts run, finish() after; finish returns their output [T, H]
  // f32, unscaled (the output stage applies a shared gate).
  virtual void start(const ExecContext& ctx, const TensorView& hidden) = 0;
  virtual const float* finish(const ExecContext& ctx) = 0;
};

// output = routed (+ gate * shared), in the output's dtype. `routed` is the layer's scratch,
// which the stage may sum into; shared_gate [T] is null where the spec has no shared gate.
class OutputSum {
 public:
  virtual ~OutputSum() = default;
  virtual void run(const ExecContext& ctx, float* routed, const float* shared,
                   const float* shared_gate, const TensorView& output) const = 0;
};

// One device's block stages.
struct StageEntry {
  DeviceKind device;
  std::string_view name;
  std::unique_ptr<FiniteChecks> (*checks)(const Plan&);
  std::unique_ptr<RouterStage> (*router)(const Plan&);
  std::unique_ptr<OutputSum> (*output)(const Plan&);
};
const std::vector<StageEntry>& stage_table();
const StageEntry* find_stages(DeviceKind device);

// The shared experts' strategy for the plan's form (Plan::shared_strategy); null for none.
std::unique_ptr<SharedExperts> make_shared_experts(const Plan& plan);

// The cpu stages, block/cpu/.
std::unique_ptr<FiniteChecks> make_cpu_finite_checks(const Plan& plan);
std::unique_ptr<RouterStage> make_cpu_router(const Plan& plan);
std::unique_ptr<OutputSum> make_cpu_output_sum(const Plan& plan);
#ifdef MOEKIT_WITH_CUDA
// The cuda stages, block/cuda/.
std::unique_ptr<FiniteChecks> make_cuda_finite_checks(const Plan& plan);
std::unique_ptr<RouterStage> make_cuda_router(const Plan& plan);
std::unique_ptr<OutputSum> make_cuda_output_sum(const Plan& plan);
std::unique_ptr<SharedExperts> make_cuda_shared_overlapped(const Plan& plan);
#endif

}  // namespace moekit
