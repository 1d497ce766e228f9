#pragma once
// How the user wants a layer deployed: the three axes (runner, a2a, weight format), the block
// form, expert parallelism and the limits that size scratch memory.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/quant.hpp"
#include "moekit/tensor.hpp"

namespace moekit {

enum class RunnerKind { auto_, reference, cpu, cuda, hopper };
enum class A2AKind { none, mpi, nccl };
enum class BlockForm { auto_, standard, overlapped, fused_slot };
enum class FusedOps { auto_, off };
// How the all-to-all dispatchers exchange rows (docs/EXPERT_PARALLEL.md): normal (a round of
// counts, then rows of exact sizes; prefill) or low-latency (one round into fixed slots; decode).
enum class A2AMode { auto_, normal, low_latency };
// What rows an all-to-all sends (docs/EXPERT_PARALLEL.md): the hidden states as they came
// (`activations`: bf16 rows for bf16), or e4m3 codes with the activation scales the weight
// format's GEMM1 would compute from them anyway (fp8-block, dynamic fp8-tensor).
enum class A2AWire { auto_, activations, e4m3 };

std::string_view runner_name(RunnerKind kind);
std::optional<RunnerKind> parse_runner(std::string_view name);
std::string_view a2a_name(A2AKind kind);
std::optional<A2AKind> parse_a2a(std::string_view name);
std::string_view block_form_name(BlockForm form);
std::optional<BlockForm> parse_block_form(std::string_view name);
std::string_view a2a_mode_name(A2AMode mode);
std::optional<A2AMode> parse_a2a_mode(std::string_view name);
std::string_view a2a_wire_name(A2AWire wire);
std::optional<A2AWire> parse_a2a_wire(std::string_view name);

inline constexpr RunnerKind kAllRunners[] = {RunnerKind::auto_, RunnerKind::reference,
                                             RunnerKind::cpu, RunnerKind::cuda, RunnerKind::hopper};
inline constexpr A2AKind kAllA2A[] = {A2AKind::none, A2AKind::mpi, A2AKind::nccl};
inline constexpr BlockForm kAllBlockForms[] = {BlockForm::auto_, BlockForm::standard,
                                               BlockForm::overlapped, BlockForm::fused_slot};

// Expert parallelism: rank r of `size` owns physical experts [r*L, (r+1)*L), L = physical/size.
// `redundant` extra physical slots hold replicas of the hottest (here: the first) experts.
struct ExpertParallel {
  int size = 1;
  int rank = 0;
  int redundant = 0;

  static ExpertParallel Single() { return {}; }
  static ExpertParallel Rank(int size, int rank, int redundant = 0) {
    return {size, rank, redundant};
  }
};

// MoE tensor parallelism: rank r of `size` holds columns [r*I/size, (r+1)*I/size) of every
// routed expert's intermediate dimension (gate/up rows, down columns); the ranks' partial
// outputs add up to the layer's output. With expert parallelism the launcher's rank is
// ep.rank * size + rank.
struct TensorParallel {
  int size = 1;
  int rank = 0;
};

struct Options {
  RunnerKind runner = RunnerKind::auto_;
  A2AKind a2a = A2AKind::none;
  QuantParams weights = WeightFormat::bf16;  // the format and its parameters
  BlockForm form = BlockForm::auto_;
  // off: no fused op (the cpu runner's decode op), and on the GPU every stage its own kernel
  // (no Plan::fusions).
  FusedOps fused_ops = FusedOps::auto_;
  ExpertParallel ep;
  TensorParallel tp;
  Device device = Device::cpu();
  bool strict = false;        // any fallback is an error
  bool check_finite = true;   // refuse NaN/Inf in router logits and hidden states
  int64_t max_tokens = 4096;  // the largest batch forward() accepts; sizes scratch memory
  int threads = 0;            // CPU threads; 0 = all hardware threads
  A2AMode a2a_mode = A2AMode::auto_;
  A2AWire a2a_wire = A2AWire::auto_;
  // How long any exchange with the other ranks may wait before it fails naming the rank and the
  // step it waited for.
  int64_t comm_timeout_ms = 30000;
};

// Whether each rank holds its own tokens (an all-to-all sends their rows to the experts' ranks),
// rather than every rank seeing every token.
inline bool owns_its_tokens(const Options& options) {
  return options.a2a == A2AKind::mpi || options.a2a == A2AKind::nccl;
}

}  // namespace moekit
