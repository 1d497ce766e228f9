#pragma once
// Layer 3: do these rows leave this rank, and how do results come back? dispatch() turns routed
// global expert ids (and, for an all-to-all, the rows themselves) into what this rank's runner
// reads; combine() returns the runner's weighted sums to the ranks and token order they came
// from. The dispatcher table maps each a2a kind to a dispatcher, its dispatch format and its
// capability check, in the style of the runner's tables.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.hpp"
#include "contracts/exec.hpp"
#include "contracts/rows.hpp"
#include "core/scratch.hpp"
#include "moekit/plan.hpp"
#include "plan/capability.hpp"

namespace moekit {

// What a dispatcher is sized for, fixed when the layer is built.
struct DispatcherProblem {
  int64_t hidden = 0;
  int columns = 0;                       // entries per token (top-k, plus fused shared slots)
  int64_t max_tokens = 0;                // this rank's largest batch
  int64_t max_received_tokens = 0;       // the most tokens whose rows this rank computes per batch
  std::vector<int32_t> global_to_local;  // local slot of each global physical id, or -1
  Device device = Device::cpu();
  // Across processes: the communicator (nullptr within one), how long each exchange may wait,
  // and the all-to-all's mode. Global ids below `physical` belong to rank id / per_rank, at
  // slot id % per_rank there; ids from `physical` on (fused shared slots) stay on this rank.
  Communicator* comm = nullptr;
  int64_t timeout_ms = 30000;
  A2AMode mode = A2AMode::normal;
  // e4m3: rows travel as e4m3 with the scales `quant` (the routed experts' format) gives
  // GEMM1's inputs, for f32 and bf16 hidden states; other dtypes, and `activations`, as they are.
  A2AWire wire = A2AWire::activations;
  QuantParams quant = WeightFormat::f32;
  int physical = 0;
  int per_rank = 0;
  // Plan::fusions.map_in_sort: dispatch() leaves the global ids as they are and hands the runner
  // the table (DispatchOutput::global_to_local); the GPU's standard dispatcher only.
  bool map_in_runner = false;
};

class Dispatcher {
 public:
  virtual ~Dispatcher() = default;
  virtual int64_t scratch_bytes() const = 0;
  // hidden [T, H] with global ids and weights [T, columns]. `combined` [T, H] f32 is where
  // combine() leaves the weighted sum in token order; a dispatcher whose rows stay here lets the
  // runner write it there directly.
  virtual DispatchOutput dispatch(const ExecContext& ctx, const TensorView& hidden,
                                  const int32_t* global_ids, const float* weights, float* combined,
                                  void* scratch) = 0;
  virtual void combine(const ExecContext& ctx, const DispatchOutput& dispatched, float* combined,
                       void* scratch) = 0;
  // Whether dispatch() exchanges with other ranks, which then wait for this one: a rank with no
  // tokens must still take part.
  virtual bool collective() const { return false; }
  // This rank's input failed before dispatch(): the exchange the other ranks wait in carries the
  // failure instead of rows, so that each of them fails too (Errc::comm, naming this rank)
  // rather than waiting out its timeout.
  virtual void abandon(const ExecContext&, void*) {}
  // Waits for what dispatch() and combine() left running on ctx.stream, against the exchanges'
  // deadline, and reports (throws) what the device found wrong in what other ranks sent: a
  // dispatcher that never waits on the host in forward() (the GPU's low-latency mode) checks
  // there. The others have waited already and found nothing left to report.
  virtual void synchronize(const ExecContext&, void*) {}
};

struct DispatcherEntry {
  A2AKind a2a;
  DispatcherKind kind;
  DispatchFormat format;
  Capability (*supports)(const Deployment&);
  // The most tokens whose rows a rank's experts compute per batch (its own, plus arrivals).
  int64_t (*max_received_tokens)(const Options&);
  std::unique_ptr<Dispatcher> (*create)(const DispatcherProblem&);
  // Decisions of the dispatcher's own (its mode, its wire format), recorded in the plan; or none.
  void (*decide)(Plan&);
};

const std::vector<DispatcherEntry>& dispatcher_table();
const DispatcherEntry* find_dispatcher(A2AKind a2a);

// The dispatchers' own declarations, one group per file in this folder.
Capability standard_supports(const Deployment& deployment);
int64_t standard_max_received_tokens(const Options& options);
std::unique_ptr<Dispatcher> make_standard_dispatcher(const DispatcherProblem& problem);
Capability all_to_all_supports(const Deployment& deployment);
// The all-to-all's capability over `comm` (MPI: host memory; NCCL: device memory), spanning
// every rank the launcher started; `what` names the ranks in its reason ("GPU(s)").
Capability all_to_all_supports_over(const Deployment& deployment, CommKind comm,
                                    std::string_view what);
int64_t all_to_all_max_received_tokens(const Options& options);
std::unique_ptr<Dispatcher> make_all_to_all_dispatcher(const DispatcherProblem& problem);
// The one heuristic that picks the all-to-all's mode where the options leave it to auto, and its
// reason.
struct A2AModeChoice {
  A2AMode mode;
  std::string reason;
};
A2AModeChoice choose_a2a_mode(const Options& options);
// The one heuristic that picks the rows on the wire: e4m3 where the weight format quantises
// GEMM1's inputs to e4m3 with dynamic scales anyway and the ranks span hosts; the activations as
// they are otherwise, or where asked. An Error(config_refused) where e4m3 is asked of a format
// that does not quantise so.
struct A2AWireChoice {
  A2AWire wire;
  std::string reason;
};
A2AWireChoice choose_a2a_wire(const Options& options, const QuantParams& quant,
                              const Platform& platform);
void all_to_all_decide(Plan& plan);
// What the all-to-all dispatchers, on the CPU and the GPU alike, make of what each source rank
// said it sends: the errors of a rank whose input failed or whose dtype differs, and where each
// source's rows start in the runner's input (this rank's own first, then every other rank's in
// rank order).
[[noreturn]] void fail_refused_input(int me, const std::string& ranks, std::string_view step);
[[noreturn]] void fail_dtype_mismatch(int me, DType mine, DType theirs, int rank);
void rows_by_source(const std::vector<int64_t>& got, int me, std::vector<int64_t>& offsets);
// The reduce form's first exchange, the standard dispatchers' on the CPU and the GPU alike: every
// rank sends every rank its (status, tokens) pair before any rank computes, so that a rank whose
// input failed, or whose tokens differ, fails every rank at once. prepare_agreement fills the
// arrays and this rank's pairs [2 x size] (each rank's copy); check_agreement reads what came
// [2 x size] and throws naming the ranks.
inline constexpr int64_t kRankReady = 0;
inline constexpr int64_t kRankFailed = 1;
inline constexpr std::string_view kAgreementStep = "dispatch: ranks agree on their tokens";
inline constexpr std::string_view kReduceStep = "combine: sum of the ranks' partial outputs";
void prepare_agreement(ExchangeArrays& arrays, int64_t* pairs_out, int64_t status, int64_t tokens);
void check_agreement(const Communicator& comm, const int64_t* pairs_in, int64_t tokens,
                     const CommStep& step);
// The standard dispatchers' scratch, on the CPU and the GPU alike: the local ids, and in the
// reduce form the (status, tokens) pairs going out and coming in ([size][2] each, in the
// communicator's buffers) and the sum's scratch.
struct StandardScratch {
  int32_t* local_ids;
  int64_t* pairs_out;
  int64_t* pairs_in;
  float* reduce;
  float* idle_rows;  // enqueued_reduce: the rows a rank whose input failed sums with the others

  // Declares (a counting carver) or hands out (one over the scratch) the same layout.
  static StandardScratch carve(ScratchCarver& carver, const DispatcherProblem& problem);
  static int64_t bytes(const DispatcherProblem& problem);
};
// Whether the reduce form's exchanges are enqueued without waiting (the GPU's low-latency mode:
// a communicator that enqueues, NCCL): the agreement is then checked on the device and reported
// at synchronize(), and every rank sums max_tokens rows, whatever its batch, so that the sizes
// of the exchanges never depend on a batch (a rank whose input failed joins with idle rows).
bool enqueued_reduce(const DispatcherProblem& problem);
// The reduce form's exchanges on the GPU: waited for, or, where --a2a-mode low-latency asks,
// enqueued, so that a CUDA graph captures them. Nothing elsewhere.
void standard_decide(Plan& plan);
#ifdef MOEKIT_WITH_CUDA
std::unique_ptr<Dispatcher> make_cuda_standard_dispatcher(const DispatcherProblem& problem);
// The all-to-all over NCCL (cuda/all_to_all_cuda.cpp): all_to_all.cpp's protocol on the GPU, in
// both modes, with the rows as they came; its decide refuses the e4m3 wire, not built there.
Capability nccl_all_to_all_supports(const Deployment& deployment);
std::unique_ptr<Dispatcher> make_nccl_all_to_all_dispatcher(const DispatcherProblem& problem);
void nccl_all_to_all_decide(Plan& plan);
#endif

}  // namespace moekit
