#pragma once
// resolve(): every decision about a deployment, made once, before any weight is loaded, with the
// reason for each. Objects are built from the Plan; forward() does not branch on configuration.

#include <optional>
#include <string>
#include <vector>

#include "moekit/expert_location.hpp"
#include "moekit/options.hpp"
#include "moekit/platform.hpp"
#include "moekit/spec.hpp"

namespace moekit {

enum class PlanLayer { model = 0, block = 1, experts = 2, dispatcher = 3, runner = 4, quant = 5 };
std::string_view plan_layer_name(PlanLayer layer);

struct Rejected {
  std::string candidate;
  std::string reason;
};

struct Decision {
  PlanLayer layer = PlanLayer::model;
  std::string topic;   // what was decided, e.g. "form", "core"
  std::string choice;  // what was chosen
  std::string reason;
  std::vector<Rejected> rejected;
  std::optional<std::string> fallback;  // set when the choice is not what the options asked for
};

// The cuda runner's expert GEMMs, chosen once by resolve (choose_cuda_kernels, in
// src/runner/cuda/kernel_choice.cpp, the one function that decides them) for every batch size up
// to max_tokens, kept as runs of batch sizes with the same choice; forward() takes the run its T
// falls in. one_token: a batch of one token runs both GEMMs and the combine in one kernel.
enum class CudaGemmKernel : uint8_t { decode, prefill, wgmma, one_token };
std::string_view cuda_gemm_kernel_name(CudaGemmKernel kernel);
struct CudaGemmChoice {
  int64_t up_to_tokens = 0;  // this choice serves batches of (previous run's, up_to_tokens]
  CudaGemmKernel kernel = CudaGemmKernel::decode;
  int token_tile = 8;    // rows of one expert per CTA
  int gemm1_slices = 1;  // decode: weight-row slices each CTA takes, GEMM1 and GEMM2
  int gemm2_slices = 1;
  int gemm1_cols = 0;  // wgmma: weight rows per CTA, GEMM1 and GEMM2 (0: the tile's widest)
  int gemm2_cols = 0;
  int gemm1_splits = 1;  // wgmma decode tiles: CTAs sharing a tile's K steps, GEMM1 and GEMM2
  int gemm2_splits = 1;
  // The GEMMs can take the router's entries as they are, GEMM1 reading the hidden states itself
  // (GpuFusions::gather_in_gemm1 says whether the plan has them do it).
  bool rows_from_hidden = false;
};
struct CudaKernels {
  std::vector<CudaGemmChoice> routed;  // routed experts (and fused shared slots)
  std::vector<CudaGemmChoice> shared;  // shared experts computed apart
  int device_index = 0;
  int sm_count = 0;
  // The run of `runs` that batches of `tokens` fall in.
  static const CudaGemmChoice& for_tokens(const std::vector<CudaGemmChoice>& runs, int64_t tokens);
};

// Stages of a GPU forward done by one kernel instead of two, decided once by resolve
// (decide_gpu_fusions, src/plan/resolve.cpp) from the plan's other choices and
// Options::fused_ops (off: none), each recorded as a decision with its reason and shown by
// explain. None changes a result: the fused kernel computes what the two did, bit for bit. At
// decode sizes each kernel's launch costs about as much as its work.
struct GpuFusions {
  // block: the router kernel also runs the NaN/Inf checks of hidden states and logits, in
  // blocks of their own beside the routing ones (no check kernel); where the checks are on.
  bool checks_in_router = false;
  // block: the router kernel writes the physical ids and weights too (no logical -> physical
  // kernel); not where a shared gate, computed by a kernel of its own, weights fused shared slots.
  bool route_to_physical = false;
  // dispatcher -> runner: the standard dispatcher hands the runner global ids with its table
  // (DispatchOutput::global_to_local), and the runner's sort maps them (no map kernel).
  bool map_in_sort = false;
  // runner -> block: the routed experts' combine writes the layer's output in its dtype
  // (DispatchOutput::output), so no output kernel runs; only where nothing is added to the
  // routed sum (no shared experts computed apart, no sum over ranks).
  bool combine_to_output = false;
  // runner: for the batches whose kernel choice has rows_from_hidden, GEMM1 reads each token's
  // row straight from the hidden states and every GEMM CTA places the router's entries itself,
  // so no sort + gather kernel runs before GEMM1; where the hidden states come in the weights'
  // dtype (a call with other hidden states sorts and gathers as before).
  bool gather_in_gemm1 = false;
  // block -> runner: a batch of one token is routed by the routed experts' one-token kernel
  // itself (the router kernel's warp code in every CTA, with its finite checks and physical
  // columns; one CTA writes the router's outputs), so no router kernel runs before it; where
  // the plan's choice for one token is the one-token kernel, the router writes the physical
  // columns and runs the checks (route_to_physical, checks_in_router or no checks), and the
  // standard dispatcher hands the runner the global ids (map_in_sort).
  bool route_in_runner = false;
};

// How the shared experts run, when the block form computes them apart from the routed ones.
enum class SharedStrategy { none, after, overlapped };

enum class DispatcherKind { standard, all_to_all };
// The communicator a plan's dispatcher exchanges over: none (one process, or ranks whose caller
// sums), MPI over the ranks mpirun started (host memory), or NCCL over one GPU per rank.
enum class CommKind : uint8_t { none, mpi, nccl };
std::string_view comm_name(CommKind kind);
enum class DispatchFormat { standard };
enum class RunnerFormat { standard, contiguous };
std::string_view dispatcher_name(DispatcherKind kind);
std::string_view runner_format_name(RunnerFormat format);
std::string_view dispatch_format_name(DispatchFormat format);

// The cpu runner's kernels, chosen once by resolve (choose_cpu_kernels, in
// src/runner/cpu/kernel_choice.cpp, the one function that decides them) from the plan's
// platform, spec and weight format. The runner reads them as they are; nothing below resolve
// looks at the machine or decides again. What varies per call (the activations' dtype, the rows
// an expert received) selects among these, it does not change them.
enum class CpuKernelSet : uint8_t { portable, avx2_panels };
// How rows streamed against int4 weights are multiplied: widened to f32, quantised to int16 per
// scale step (16-bit dot products), or the format's int8 activations (8-bit dot products).
enum class Int4Rows : uint8_t { f32, int16, int8 };
struct Int4RowsByActivations {
  Int4Rows f32 = Int4Rows::f32;   // activations that came in as f32
  Int4Rows half = Int4Rows::f32;  // as bf16 or f16
  Int4Rows of(DType activations) const { return activations == DType::f32 ? f32 : half; }
};
// How the cpu runner rounds the fp8 formats' GEMM inputs to e4m3: the scalar reference
// (quant/activation_quant.hpp), or the same values, bit for bit, 8 (AVX2) or 16 (AVX-512F) at a
// time.
enum class E4m3Rounding : uint8_t { scalar, avx2, avx512 };
// How far ahead of its reads a streaming kernel asks for the weights' lines: `l1_bytes` ahead into
// L1, and where `l2_bytes` is not 0, that far ahead into L2 as well.
struct StreamPrefetch {
  int l1_bytes = 2048;
  int l2_bytes = 0;  // 0: none
};

struct CpuKernels {
  CpuKernelSet set = CpuKernelSet::portable;
  E4m3Rounding e4m3 = E4m3Rounding::scalar;
  // The integer kernels use vpdpwssd / vpdpbusd, else AVX2's pmaddwd / pmaddubsw.
  bool avx512_vnni = false;
  // Streamed e4m3 rows widen each panel step in one AVX-512F vector, else in two of AVX2's.
  bool e4m3_stream_avx512 = false;
  // GEMM rows with bf16 activations: AVX-512 BF16 dot products (bf16 weights, or e4m3 and
  // symmetric int4 widened exactly to bf16, their scales on the f32 sums of each group).
  bool bf16_gemm = false;
  // GEMM rows of int4-group-a8: the format's int8 rows times the int4 codes in 8-bit dot
  // products (AVX-512 VNNI or AVX2, as avx512_vnni says).
  bool int8_gemm = false;
  // How far ahead two streaming kernels prefetch for one or two rows, where a machine was
  // measured to want other distances than 2 KB into L1: the f32 and 16-bit panels', and AVX2's
  // int8 rows of int4-group-a8 (three and four rows, and the other kernels, always 2 KB); why.
  StreamPrefetch panel_prefetch;
  StreamPrefetch int8_prefetch;
  std::string prefetch_reason;
  std::string gemm_reason;            // why GEMM rows take the kernel they do
  Int4RowsByActivations routed_int4;  // routed experts (and fused shared slots)
  Int4RowsByActivations shared_int4;  // shared experts computed apart (their I may differ)
  std::string name;

  bool bf16_rows(DType activations) const { return bf16_gemm && activations == DType::bf16; }
};

struct Plan {
  ModelSpec spec;
  Options options;
  Platform platform;

  BlockForm form = BlockForm::standard;  // never auto_ once resolved
  bool adds_shared_output = false;       // standard/overlapped: this rank adds the shared experts
  ExpertLocation location;
  int local_routed = 0;  // physical routed experts held by this rank
  int first_local = 0;   // global physical id of local slot 0
  int shared_slots = 0;  // fused_slot form: shared experts appended as local slots
  // The slice of every routed expert's intermediate dimension this rank holds: [routed_first,
  // routed_first + routed_intermediate) of I; all of it without tensor parallelism.
  int64_t routed_intermediate = 0;
  int64_t routed_first = 0;
  float shared_slot_weight = 1.0f;
  QuantParams quant;  // the weight format and how it is read
  DispatcherKind dispatcher = DispatcherKind::standard;
  DispatchFormat dispatch_format = DispatchFormat::standard;
  RunnerKind runner = RunnerKind::cpu;  // never auto_ once resolved
  std::optional<std::string> fused_op;  // the fused op that replaces permutes and core, if any
  RunnerFormat core_format = RunnerFormat::standard;
  std::optional<CpuKernels> cpu_kernels;    // runner cpu only
  std::optional<CudaKernels> cuda_kernels;  // runner cuda only
  std::string stages;                       // the block stages of the plan's device: "cpu"
  SharedStrategy shared_strategy = SharedStrategy::none;
  GpuFusions fusions;                  // runner cuda only; all off elsewhere
  int64_t max_received_tokens = 0;     // the most tokens whose rows this rank's experts compute
  CommKind comm = CommKind::none;      // a2a mpi, or a2a none summed over the ranks (reduce form)
  A2AMode a2a_mode = A2AMode::normal;  // the all-to-all dispatcher's mode; never auto_
  A2AWire a2a_wire = A2AWire::activations;  // the rows it sends; never auto_
  int threads = 1;
  std::vector<Decision> decisions;

  std::vector<const Decision*> fallbacks() const;
  // The five layers, each with what was chosen and why, rejected candidates and fallbacks.
  std::string explain() const;
};

// Pure: the same inputs give the same plan. Throws Error(config_refused) naming the axes in
// conflict and the legal alternatives, or Error(invalid_argument) for an impossible spec.
Plan resolve(const ModelSpec& spec, const Options& options, const Platform& platform);

struct Resolution {
  std::optional<Plan> plan;
  std::string refusal;  // set when plan is empty
};
Resolution try_resolve(const ModelSpec& spec, const Options& options, const Platform& platform);

}  // namespace moekit
