// resolve(): walks the layers in construction order (block, experts, quant method, dispatcher,
// runner), asks every candidate backend whether it supports this deployment, and records each
// answer. Nothing here touches weights or the machine.

#include <algorithm>

#include "block/stages.hpp"
#include "comm/communicator.hpp"
#include "core/names.hpp"
#include "dispatch/dispatcher.hpp"
#include "moekit/error.hpp"
#include "moekit/plan.hpp"
#include "plan/capability.hpp"
#include "quant/quant_method.hpp"
#include "runner/registry.hpp"

namespace moekit {
namespace {

[[noreturn]] void refuse(const std::string& axes, const std::string& reason,
                         const std::string& legal) {
  fail(Errc::config_refused, "refused: {}: {}; legal here: {}", axes, reason, legal);
}

std::string join(const std::vector<std::string>& items) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : ", ") + item;
  return text.empty() ? "none" : text;
}

// A fallback is allowed but never silent; with strict it is an error.
void record_fallback(Plan& plan, Decision decision, const std::string& asked) {
  if (plan.options.strict) {
    fail(Errc::config_refused, "refused under --strict: {} {} asked, but {}", decision.topic, asked,
         decision.reason);
  }
  decision.fallback = fmt::format("{} asked; using {}", asked, decision.choice);
  plan.decisions.push_back(std::move(decision));
}

// More threads than this many per hardware thread only take turns on the cores, and a count far
// above it (a typo, say) would start that many threads before the first forward.
constexpr int kThreadsPerHardwareThread = 4;
constexpr int kMinThreadLimit = 4;

// Scratch memory is max_tokens times the layer's widths (each up to 2^20, top-k up to 2^16):
// beyond this many tokens its size would overflow 64 bits and the layer would get too little.
constexpr int64_t kMaxTokens = int64_t{1} << 24;

void check_options(const Options& options, const Platform& platform) {
  if (options.max_tokens < 1) {
    refuse(fmt::format("max_tokens={}", options.max_tokens),
           "a layer must accept at least one token", "max_tokens >= 1");
  }
  if (options.max_tokens > kMaxTokens) {
    refuse(fmt::format("max_tokens={}", options.max_tokens),
           "the scratch memory it sizes would not fit a 64-bit size",
           fmt::format("1 to {}", kMaxTokens));
  }
  if (options.tp.size < 1 || options.tp.rank < 0 || options.tp.rank >= options.tp.size) {
    refuse(fmt::format("tp size {} rank {}", options.tp.size, options.tp.rank),
           "a tensor-parallel rank is one of [0, size)", "--tp-size N >= 1, --tp-rank in [0, N)");
  }
  if (options.threads < 0) {
    refuse(fmt::format("threads={}", options.threads), "negative thread count", "0 (all) or more");
  }
  const int limit = std::max(kMinThreadLimit, kThreadsPerHardwareThread * platform.cpu_threads);
  if (options.threads > limit) {
    refuse(fmt::format("threads={}", options.threads),
           fmt::format("more than {} per hardware thread of this machine's {} (limit {})",
                       kThreadsPerHardwareThread, platform.cpu_threads, limit),
           fmt::format("0 (all {}) to {}", platform.cpu_threads, limit));
  }
}

// Why a shared expert cannot become routed slots, if it cannot. A quantised shared expert is
// quantised whole and then split, so that every form computes the same numbers; the split must
// not cut through a scale block.
std::optional<std::string> shared_split_problem(const ModelSpec& spec, const QuantParams& quant) {
  const int64_t I = spec.intermediate;
  if (spec.shared_intermediate % I != 0) {
    return fmt::format(
        "shared I={} is not a multiple of the routed I={}, so a shared expert cannot be split "
        "into expert slots",
        spec.shared_intermediate, I);
  }
  if (spec.shared_intermediate == I) return std::nullopt;
  if (quant.activation == ActivationQuant::fp8_per_token) {
    return fmt::format(
        "{} quantises GEMM2's input with one scale per token over the shared expert's whole "
        "I={}; split into slots of I={}, each piece would get a scale of its own",
        weight_format_name(quant.format), spec.shared_intermediate, I);
  }
  for (int64_t block : {quant.block_rows, quant.block_cols}) {
    if (block > 1 && I % block != 0) {
      return fmt::format(
          "the shared expert (I={}) would be split at multiples of I={}, inside the {} format's "
          "scale blocks of {}",
          spec.shared_intermediate, I, weight_format_name(quant.format), block);
    }
  }
  return std::nullopt;
}

// NCCL runs one process per GPU, each on the GPU of its local rank, with NCCL loadable.
void require_nccl(const Plan& plan, const std::string& axes) {
  const Options& o = plan.options;
  const Platform& w = plan.platform;
  if (o.device.index != w.world_local_rank) {
    refuse(axes,
           fmt::format("the NCCL communicator runs each rank on the GPU of its local rank (one "
                       "process per GPU), and this rank's local rank is {}",
                       w.world_local_rank),
           fmt::format("--device cuda:{}", w.world_local_rank));
  }
  if (!communicator_built(CommKind::nccl)) {
    refuse(axes, communicator_absent_reason(CommKind::nccl),
           "one process without a launcher, or device=cpu over MPI");
  }
}

// The reduce form on the GPU: the ranks' partial outputs summed over NCCL, one GPU per rank.
void decide_nccl_reduce(Plan& plan, const std::string& axes) {
  const Options& o = plan.options;
  const Platform& w = plan.platform;
  require_nccl(plan, axes);
  plan.comm = CommKind::nccl;
  plan.decisions.push_back(
      {PlanLayer::dispatcher,
       "communicator",
       "nccl: reduce form",
       fmt::format("a2a none across {} processes on the GPU: the routed experts' partial sums "
                   "are summed over NCCL in rank order (a reduce-scatter and an all-gather of "
                   "grouped ncclSend/ncclRecv on the layer's stream), so every rank returns the "
                   "layer's output; every exchange waits at most {} ms",
                   w.world_size, o.comm_timeout_ms),
       {},
       std::nullopt});
}

// a2a nccl: the all-to-all between GPUs spans every rank the launcher started (or one process
// alone, whose rows all stay on its GPU), one GPU per rank.
void decide_nccl_all_to_all(Plan& plan, const std::string& launcher) {
  const Options& o = plan.options;
  const Platform& w = plan.platform;
  if (o.tp.size > 1) {
    refuse(fmt::format("a2a=nccl with tp size {}", o.tp.size),
           "tensor parallelism under the all-to-all is not built: each token would need its row on "
           "every slice's rank",
           "a2a none with --tp-size (and --ep-size), or a2a nccl with --tp-size 1");
  }
  if (o.device.kind != DeviceKind::cuda) {
    refuse(fmt::format("a2a=nccl on device={}", o.device.str()),
           "the NCCL communicator moves GPU memory",
           "device=cuda, or a2a mpi on device=cpu, or a2a none");
  }
  if (o.ep.size != w.world_size || o.ep.rank != w.world_rank) {
    refuse(fmt::format("a2a=nccl with ep size {} rank {}", o.ep.size, o.ep.rank),
           fmt::format("the all-to-all spans every rank the launcher started ({}, this one "
                       "rank {}), so the ep size and rank must be those",
                       w.world_size, w.world_rank),
           launcher +
               fmt::format(", or mpirun -np {} for ep size {}, or a2a none", o.ep.size, o.ep.size));
  }
  require_nccl(plan, "a2a=nccl");
  plan.comm = CommKind::nccl;
  plan.decisions.push_back(
      {PlanLayer::dispatcher,
       "communicator",
       "nccl",
       fmt::format("a2a nccl: rows go to the GPUs that hold their experts, over NCCL across {} "
                   "rank(s), one GPU each (NVLink multicast off: NCCL_NVLS_ENABLE=0 unless set); "
                   "every exchange waits at most {} ms",
                   w.world_size, o.comm_timeout_ms),
       {},
       std::nullopt});
}

// Which communicator the plan's dispatcher exchanges over. a2a mpi spans every rank the launcher
// started; a2a none with ep size > 1 under a launcher sums the ranks' partial outputs over the
// same communicator (the reduce form), so every rank returns the layer's output: MPI for host
// buffers, NCCL for device ones.
void decide_world(Plan& plan) {
  const Options& o = plan.options;
  const Platform& w = plan.platform;
  if (o.comm_timeout_ms < 1) {
    refuse(fmt::format("comm_timeout_ms={}", o.comm_timeout_ms),
           "an exchange needs a positive time to wait for the other ranks", "1 ms or more");
  }
  const std::string launcher =
      fmt::format("--ep-size {} --ep-rank {} (the launcher's {} rank(s), this one rank {})",
                  w.world_size, w.world_rank, w.world_size, w.world_rank);
  if (o.a2a == A2AKind::nccl) return decide_nccl_all_to_all(plan, launcher);
  if (o.a2a == A2AKind::mpi && o.tp.size > 1) {
    refuse(fmt::format("a2a=mpi with tp size {}", o.tp.size),
           "tensor parallelism under the all-to-all is not built: each token would need its row on "
           "every slice's rank",
           "a2a none with --tp-size (and --ep-size), or a2a mpi with --tp-size 1");
  }
  if (o.a2a == A2AKind::mpi) {
    if (!communicator_built(CommKind::mpi)) {
      refuse("a2a=mpi", communicator_absent_reason(CommKind::mpi), "a2a none");
    }
    if (w.world_size == 1) {
      refuse("a2a=mpi",
             "the all-to-all exchanges rows between processes, and this one was not started by "
             "mpirun (a world of 1 rank)",
             "mpirun -np N moekit ... --a2a mpi --ep-size N, or a2a none");
    }
    if (o.ep.size != w.world_size || o.ep.rank != w.world_rank) {
      refuse(fmt::format("a2a=mpi with ep size {} rank {}", o.ep.size, o.ep.rank),
             fmt::format("the all-to-all spans every rank the launcher started ({}, this one "
                         "rank {}), so the ep size and rank must be those",
                         w.world_size, w.world_rank),
             launcher + fmt::format(", or mpirun -np {} for ep size {}, or a2a none", o.ep.size,
                                    o.ep.size));
    }
    if (o.device.kind != DeviceKind::cpu) {
      refuse(fmt::format("a2a=mpi on device={}", o.device.str()),
             "the MPI communicator moves host memory",
             "device=cpu, or a2a nccl (the all-to-all between GPUs), or a2a none with --ep-size "
             "(the reduce form, summed over NCCL)");
    }
    plan.comm = CommKind::mpi;
    plan.decisions.push_back(
        {PlanLayer::dispatcher,
         "communicator",
         "mpi",
         fmt::format("a2a mpi: rows go to the ranks that hold their experts, over MPI across {} "
                     "rank(s); every exchange waits at most {} ms",
                     w.world_size, o.comm_timeout_ms),
         {},
         std::nullopt});
    return;
  }
  const int parts = o.ep.size * o.tp.size;
  if (o.a2a != A2AKind::none || w.world_size == 1 || parts == 1) return;
  if (parts != w.world_size || o.ep.rank * o.tp.size + o.tp.rank != w.world_rank) {
    refuse(fmt::format("a2a=none with ep size {} rank {}, tp size {} rank {} under a launcher of "
                       "{} rank(s)",
                       o.ep.size, o.ep.rank, o.tp.size, o.tp.rank, w.world_size),
           "the partial outputs are summed over every rank the launcher started, so ep size x tp "
           "size must be their number and ep rank x tp size + tp rank this one's",
           launcher +
               ", or --tp-size N --ep-size launcher/N, or --ep-size 1 (every rank a whole "
               "layer)");
  }
  if (o.device.kind == DeviceKind::cuda) {
    return decide_nccl_reduce(plan, fmt::format("a2a=none across {} processes on device={}",
                                                w.world_size, o.device.str()));
  }
  if (!communicator_built(CommKind::mpi)) {
    plan.decisions.push_back({PlanLayer::dispatcher,
                              "communicator",
                              "none: the caller sums the ranks' outputs",
                              communicator_absent_reason(CommKind::mpi),
                              {},
                              std::nullopt});
    return;
  }
  plan.comm = CommKind::mpi;
  plan.decisions.push_back(
      {PlanLayer::dispatcher,
       "communicator",
       "mpi: reduce form",
       fmt::format("a2a none across {} processes: the routed experts' partial sums are summed over "
                   "MPI in rank order, so every rank returns the layer's output; every exchange "
                   "waits at most {} ms",
                   w.world_size, o.comm_timeout_ms),
       {},
       std::nullopt});
}

void decide_block(Plan& plan) {
  const ModelSpec& spec = plan.spec;
  const BlockForm asked = plan.options.form;
  Decision d{PlanLayer::block, "form", "", "", {}, std::nullopt};
  if (spec.n_shared == 0) {
    d.choice = "standard";
    d.reason = "no shared experts: the routed sum is the layer's output";
    plan.form = BlockForm::standard;
    if (asked == BlockForm::overlapped || asked == BlockForm::fused_slot) {
      return record_fallback(plan, d, std::string(block_form_name(asked)));
    }
    plan.decisions.push_back(d);
    return;
  }
  const std::optional<std::string> split_problem = shared_split_problem(spec, plan.options.weights);
  const bool slots_fit = !split_problem;
  const std::string slot_reason =
      slots_fit ? fmt::format("each shared expert (I={}) becomes {} slot(s) of the routed I={}",
                              spec.shared_intermediate,
                              spec.shared_intermediate / spec.intermediate, spec.intermediate)
                : *split_problem;
  switch (asked) {
    case BlockForm::auto_:
      plan.form = BlockForm::standard;
      d.choice = "standard";
      if (plan.options.device.kind == DeviceKind::cpu) {
        d.reason =
            "auto: on the CPU the routed experts already use every thread, so a second "
            "thread for the shared experts would only compete with them";
        d.rejected = {{"overlapped", "no spare compute to overlap with on the CPU"},
                      {"fused-slot",
                       slots_fit ? "auto keeps the shared MLP separate on the CPU" : slot_reason}};
      } else {
        d.reason =
            "auto: the shared experts after the routed ones, on the layer's stream; the other "
            "forms are taken when asked for by name";
        d.rejected = {
            {"overlapped", "not measured against standard on the GPU"},
            {"fused-slot", slots_fit ? "not measured against standard on the GPU" : slot_reason}};
      }
      break;
    case BlockForm::standard:
      plan.form = BlockForm::standard;
      d.choice = "standard";
      d.reason = "asked: shared experts computed after the routed ones and added to their sum";
      break;
    case BlockForm::overlapped:
      plan.form = BlockForm::overlapped;
      d.choice = "overlapped";
      d.reason = "asked: shared experts computed on a second thread while the routed ones run";
      break;
    case BlockForm::fused_slot:
      if (plan.options.tp.size > 1) {
        plan.form = BlockForm::standard;
        d.choice = "standard";
        d.reason = fmt::format(
            "tp size {} splits the routed experts' I; shared slots are not split with them",
            plan.options.tp.size);
        return record_fallback(plan, d, "fused-slot");
      }
      if (!slots_fit) {
        plan.form = BlockForm::standard;
        d.choice = "standard";
        d.reason = slot_reason;
        return record_fallback(plan, d, "fused-slot");
      }
      plan.form = BlockForm::fused_slot;
      d.choice = "fused-slot";
      d.reason = "asked: " + slot_reason + ", every token routed to them with weight 1";
      break;
  }
  plan.decisions.push_back(d);
}

// Why rank slices of I/tp columns of every routed expert cannot hold this format, if they cannot:
// a slice must be whole scale blocks (rows of w13, columns of w2), and GEMM2's input must not be
// quantised with one scale over the whole I.
std::optional<std::string> tp_split_problem(int64_t I, int tp, const QuantParams& quant) {
  if (I % tp != 0) return fmt::format("I={} does not divide into {} slices", I, tp);
  const int64_t slice = I / tp;
  if (quant.activation == ActivationQuant::fp8_per_token) {
    return fmt::format(
        "{} quantises GEMM2's input with one scale per token over the whole I={}; slices of {} "
        "would each get a scale of their own",
        weight_format_name(quant.format), I, slice);
  }
  for (int64_t block : {quant.block_rows, quant.block_cols}) {
    if (block > 1 && slice % block != 0) {
      return fmt::format("slices of I={} / {} = {} would cut the {} format's scale blocks of {}", I,
                         tp, slice, weight_format_name(quant.format), block);
    }
  }
  return std::nullopt;
}

// Tensor parallelism: this rank's slice of every routed expert's intermediate dimension.
void decide_tensor_parallel(Plan& plan) {
  const TensorParallel& tp = plan.options.tp;
  const int64_t I = plan.spec.intermediate;
  plan.routed_intermediate = I;
  plan.routed_first = 0;
  if (tp.size == 1) return;
  if (plan.options.device.kind != DeviceKind::cpu) {
    refuse(fmt::format("tp size {} on device={}", tp.size, plan.options.device.str()),
           "tensor parallelism is built for the CPU runners only", "device=cpu, or --tp-size 1");
  }
  if (std::optional<std::string> problem = tp_split_problem(I, tp.size, plan.options.weights)) {
    std::vector<std::string> sizes;
    for (int n = 2; n <= 8; n *= 2) {
      if (!tp_split_problem(I, n, plan.options.weights)) sizes.push_back(std::to_string(n));
    }
    refuse(fmt::format("tp size {} with weights={}", tp.size, plan.options.weights.name()),
           *problem, "--tp-size 1" + (sizes.empty() ? "" : " or " + join(sizes)));
  }
  plan.routed_intermediate = I / tp.size;
  plan.routed_first = tp.rank * plan.routed_intermediate;
  plan.decisions.push_back(
      {PlanLayer::experts,
       "tensor parallel",
       fmt::format("I columns [{}, {}) of every routed expert on tp rank {} of {}",
                   plan.routed_first, plan.routed_first + plan.routed_intermediate, tp.rank,
                   tp.size),
       "gated activations act column by column along I, so each slice's GEMM2 output is a "
       "partial sum of the layer's; the shared experts are computed whole",
       {},
       std::nullopt});
}

void decide_experts(Plan& plan) {
  const ModelSpec& spec = plan.spec;
  const ExpertParallel& ep = plan.options.ep;
  plan.location = ExpertLocation::build(spec.n_experts, ep);
  plan.local_routed = plan.location.per_rank();
  plan.first_local = ep.rank * plan.local_routed;
  std::string reason = fmt::format("{} logical experts in {} physical slots over {} rank(s)",
                                   spec.n_experts, plan.location.physical, ep.size);
  if (ep.redundant > 0) reason += fmt::format(", {} redundant replica(s)", ep.redundant);
  plan.decisions.push_back({PlanLayer::experts,
                            "local experts",
                            fmt::format("physical [{}, {}) on rank {}", plan.first_local,
                                        plan.first_local + plan.local_routed, ep.rank),
                            reason,
                            {},
                            std::nullopt});
  if (plan.form == BlockForm::fused_slot) {
    plan.shared_slots =
        spec.n_shared * static_cast<int>(spec.shared_intermediate / spec.intermediate);
    const bool own_tokens = owns_its_tokens(plan.options);
    plan.shared_slot_weight = own_tokens ? 1.0f : 1.0f / static_cast<float>(ep.size);
    plan.decisions.push_back(
        {PlanLayer::experts,
         "shared slots",
         fmt::format("{} slot(s) on every rank", plan.shared_slots),
         own_tokens
             ? std::string("an all-to-all: each rank computes the shared slots for its own tokens "
                           "with weight 1; their rows never leave the rank")
             : fmt::format("each rank computes the shared experts for every token with "
                           "weight 1/{}, so the ranks' sum adds them once",
                           ep.size),
         {},
         std::nullopt});
  } else if (spec.n_shared > 0) {
    const bool every_rank = owns_its_tokens(plan.options) || plan.comm != CommKind::none;
    plan.adds_shared_output = every_rank || (ep.rank == 0 && plan.options.tp.rank == 0);
    plan.decisions.push_back(
        {PlanLayer::experts,
         "shared experts",
         plan.adds_shared_output ? "added on this rank" : "added on rank 0, not here",
         owns_its_tokens(plan.options)
             ? "an all-to-all: each rank holds its own tokens and adds their shared output"
         : every_rank
             ? "reduce form: the routed sum is summed over the ranks first, so each rank adds "
               "the shared output to the whole sum"
             : "every rank sees every token here, so one rank adds the shared output to the sum",
         {},
         std::nullopt});
  }
}

std::string built_formats() {
  std::vector<std::string> names;
  for (const QuantEntry& entry : quant_table())
    names.emplace_back(weight_format_name(entry.format));
  return join(names);
}

// Which runners could take this deployment, each with its reason.
Capability runner_capability(RunnerKind kind, const Deployment& deployment) {
  const CoreEntry* core = find_core(kind);
  if (core == nullptr && kind == RunnerKind::hopper) {
    // docs/CUDA.md "Hopper": one runner, its GEMM kernel chosen by the device, not two runners.
    return Capability::No(
        "the hopper runner is not built as a runner of its own: Hopper's kernels (wgmma fed by "
        "TMA) run inside the cuda runner, which takes them on GPUs of compute capability 9.0 "
        "(--runner cuda)");
  }
  if (core == nullptr) {
    return Capability::No(
        fmt::format("the {} runner is not built in this version of moekit", runner_name(kind)));
  }
  if (Capability c = core->supports(deployment); !c.ok) return c;
  return core->reads(deployment.quant);
}

// The weight tensors this rank will hold, and their memory: the routed (and fused shared) slots,
// and the shared experts held apart in the other forms.
void record_tensors(Plan& plan) {
  const ModelSpec& spec = plan.spec;
  std::vector<std::string> listed;
  int64_t bytes = 0;
  const auto add = [&](const char* prefix, int slots, int64_t intermediate) {
    for (const TensorSpec& t : weight_tensors(plan.quant, slots, spec.hidden, intermediate)) {
      listed.push_back(
          fmt::format("{}{} {}{}", prefix, t.name, dtype_name(t.dtype), t.shape.str()));
      bytes += dtype_storage_bytes(t.dtype, t.shape.numel());
    }
  };
  add("", plan.local_routed + plan.shared_slots, plan.routed_intermediate);
  if (plan.adds_shared_output) add("shared_", spec.n_shared, spec.shared_intermediate);
  plan.decisions.push_back({PlanLayer::quant,
                            "tensors",
                            join(listed),
                            fmt::format("{:.1f} MiB of expert weights on this rank",
                                        static_cast<double>(bytes) / (1 << 20)),
                            {},
                            std::nullopt});
}

void decide_quant_and_runner(Plan& plan) {
  const Options& options = plan.options;
  const std::string format_name = options.weights.name();
  const QuantEntry* quant = find_quant(options.weights.format);
  if (quant == nullptr) {
    refuse(fmt::format("weights={}", format_name),
           "no quant method for this format is built in this version of moekit", built_formats());
  }
  if (std::vector<std::string> problems = options.weights.problems(); !problems.empty()) {
    refuse(fmt::format("weights={} ({})", format_name, options.weights.describe()), join(problems),
           fmt::format("the defaults of {}, or see docs/QUANTIZATION.md", format_name));
  }
  plan.quant = options.weights;
  if (Capability c = quant->supports_spec(plan.spec, plan.quant); !c.ok) {
    refuse(fmt::format("weights={} for {}", format_name, plan.spec.name), c.reason,
           "a format that can hold this layer, e.g. bf16");
  }
  plan.decisions.push_back(
      {PlanLayer::quant, "method", format_name, plan.quant.describe(), {}, std::nullopt});
  record_tensors(plan);

  const Deployment deployment{plan.spec, options, plan.platform, plan.quant};
  constexpr RunnerKind kPreference[] = {RunnerKind::cpu, RunnerKind::reference, RunnerKind::cuda,
                                        RunnerKind::hopper};
  std::vector<std::string> legal;
  std::vector<Rejected> rejected;
  std::optional<RunnerKind> first_ok;
  for (RunnerKind kind : kPreference) {
    Capability c = runner_capability(kind, deployment);
    if (c.ok) {
      legal.emplace_back(runner_name(kind));
      if (!first_ok) first_ok = kind;
    } else {
      rejected.push_back({std::string(runner_name(kind)), c.reason});
    }
  }
  const std::string legal_text = legal.empty() ? "none" : "auto, " + join(legal);
  const std::string axes =
      fmt::format("runner={} with weights={} on device={}", runner_name(options.runner),
                  format_name, options.device.str());
  if (options.runner == RunnerKind::auto_) {
    if (!first_ok) {
      std::vector<std::string> why;
      for (const Rejected& r : rejected) why.push_back(r.candidate + ": " + r.reason);
      refuse(axes, "no built runner supports this deployment (" + join(why) + ")", "device=cpu");
    }
    plan.runner = *first_ok;
    plan.decisions.push_back({PlanLayer::quant, "runner", std::string(runner_name(plan.runner)),
                              "auto: the fastest built runner that reads these weights here",
                              rejected, std::nullopt});
    return;
  }
  Capability asked = runner_capability(options.runner, deployment);
  if (!asked.ok) refuse(axes, asked.reason, "runners " + legal_text);
  plan.runner = options.runner;
  std::erase_if(rejected,
                [&](const Rejected& r) { return r.candidate == runner_name(plan.runner); });
  plan.decisions.push_back({PlanLayer::quant,
                            "runner",
                            std::string(runner_name(plan.runner)),
                            "asked: " + asked.reason,
                            {},
                            std::nullopt});
}

void decide_dispatcher(Plan& plan) {
  const Options& options = plan.options;
  const Deployment deployment{plan.spec, options, plan.platform, plan.quant};
  const auto axes = fmt::format("a2a={} with ep size {}", a2a_name(options.a2a), options.ep.size);
  std::vector<std::string> legal;
  for (const DispatcherEntry& entry : dispatcher_table()) {
    if (entry.supports(deployment).ok) legal.push_back(fmt::format("a2a {}", a2a_name(entry.a2a)));
  }
  const DispatcherEntry* entry = find_dispatcher(options.a2a);
  if (entry == nullptr) {
    refuse(
        axes,
        fmt::format("no {} dispatcher is built in this version of moekit", a2a_name(options.a2a)),
        join(legal));
  }
  const Capability c = entry->supports(deployment);
  if (!c.ok) refuse(axes, c.reason, join(legal));
  plan.dispatcher = entry->kind;
  plan.dispatch_format = entry->format;
  plan.max_received_tokens = entry->max_received_tokens(options);
  std::vector<Rejected> rejected;
  for (A2AKind a2a : kAllA2A) {
    if (find_dispatcher(a2a) == nullptr)
      rejected.push_back({std::string(a2a_name(a2a)), "not built"});
  }
  plan.decisions.push_back({PlanLayer::dispatcher, "dispatcher",
                            std::string(dispatcher_name(plan.dispatcher)), c.reason, rejected,
                            std::nullopt});
  if (entry->decide != nullptr) entry->decide(plan);
}

// The block's stages for the plan's device, and how the shared experts run in its form.
void decide_stages(Plan& plan) {
  const StageEntry* stages = find_stages(plan.options.device.kind);
  if (stages == nullptr) {
    refuse(fmt::format("device={}", plan.options.device.str()),
           "no block stages (checks, router, output) are built for this device", "device=cpu");
  }
  plan.stages = std::string(stages->name);
  plan.decisions.push_back(
      {PlanLayer::block,
       "stages",
       plan.stages,
       fmt::format("checks, router and output sum run on {}", plan.options.device.str()),
       {},
       std::nullopt});
  if (!plan.adds_shared_output) return;
  plan.shared_strategy =
      plan.form == BlockForm::overlapped ? SharedStrategy::overlapped : SharedStrategy::after;
  plan.decisions.push_back(
      {PlanLayer::block,
       "shared experts",
       plan.shared_strategy == SharedStrategy::overlapped ? "beside the routed experts"
                                                          : "after the routed experts",
       plan.shared_strategy == SharedStrategy::overlapped
           ? "overlapped: a second thread with a pool of its own, joined before the output"
           : "standard: the same threads, once the routed experts are done",
       {},
       std::nullopt});
}

void decide_runner_pipeline(Plan& plan) {
  const Options& options = plan.options;
  const Deployment deployment{plan.spec, options, plan.platform, plan.quant};
  const CoreEntry* core = find_core(plan.runner);
  plan.core_format = core->format;
  if (core->decide_kernels != nullptr) core->decide_kernels(plan);
  if (const FusedOpEntry* fused = find_fused_op(options.a2a, plan.runner)) {
    if (options.fused_ops == FusedOps::off) {
      plan.decisions.push_back({PlanLayer::runner,
                                "fused op",
                                "none",
                                fmt::format("{} is registered but fused ops are off", fused->name),
                                {},
                                std::nullopt});
    } else if (Capability c = fused->supports(plan); c.ok) {
      plan.fused_op = std::string(fused->name);
      plan.decisions.push_back(
          {PlanLayer::runner, "fused op", plan.fused_op.value(), c.reason, {}, std::nullopt});
      return;
    } else {
      plan.decisions.push_back({PlanLayer::runner,
                                "fused op",
                                "none",
                                "",
                                {{std::string(fused->name), c.reason}},
                                std::nullopt});
    }
  }
  const PrePermuteEntry* pre = find_pre_permute(plan.dispatch_format, plan.core_format);
  const PostPermuteEntry* post = find_post_permute(plan.core_format, plan.dispatch_format);
  if (pre == nullptr || post == nullptr) {
    fail(Errc::internal, "no permute between dispatch format {} and core format {}",
         dispatch_format_name(plan.dispatch_format), runner_format_name(plan.core_format));
  }
  plan.decisions.push_back({PlanLayer::runner,
                            "core",
                            fmt::format("{} ({} format)", runner_name(plan.runner),
                                        runner_format_name(plan.core_format)),
                            core->supports(deployment).reason,
                            {},
                            std::nullopt});
  plan.decisions.push_back({PlanLayer::runner,
                            "permutes",
                            fmt::format("pre: {}; post: {}", pre->name, post->name),
                            fmt::format("from the dispatcher's {} format to the core's and back",
                                        dispatch_format_name(plan.dispatch_format)),
                            {},
                            std::nullopt});
}

// The GPU's fusions of two stages into one kernel (Plan::fusions): each where the plan's other
// choices allow it and fused ops are not off, recorded with its reason either way. The one place
// that decides them; the stages read the plan.
void decide_gpu_fusions(Plan& plan) {
  if (plan.runner != RunnerKind::cuda || plan.fused_op) return;
  const bool off = plan.options.fused_ops == FusedOps::off;
  const auto record = [&](PlanLayer layer, const char* topic, bool& flag, const char* fused,
                          const std::string& why_not) {
    flag = !off && why_not.empty();
    plan.decisions.push_back(
        {layer,
         topic,
         flag ? "one kernel" : "two kernels",
         flag ? std::string(fused) : (off ? std::string("fused ops are off") : why_not),
         {},
         std::nullopt});
  };
  GpuFusions& f = plan.fusions;
  record(PlanLayer::block, "finite checks + router", f.checks_in_router,
         "the router kernel checks hidden states and logits in blocks of its own beside the "
         "routing ones",
         plan.options.check_finite ? "" : "the finite checks are off");
  record(PlanLayer::block, "router + logical -> physical", f.route_to_physical,
         "the router kernel writes each token's physical ids and weights as it picks them",
         plan.shared_slots > 0 && plan.spec.shared_gate
             ? "the shared gate that weights the fused shared slots is a kernel of its own"
             : "");
  record(
      PlanLayer::dispatcher, "map to local slots", f.map_in_sort,
      "the runner's sort maps the global ids through the standard dispatcher's table as it "
      "reads them",
      plan.dispatcher != DispatcherKind::standard ? "the dispatcher is not the standard one" : "");
  std::string output_why_not;
  if (plan.shared_strategy != SharedStrategy::none) {
    output_why_not = "the shared experts' output is added to the routed sum";
  } else if (plan.comm != CommKind::none) {
    output_why_not = "the routed sum is summed over the ranks before the output";
  } else if (plan.dispatcher != DispatcherKind::standard) {
    output_why_not = "the dispatcher's combine returns the sums";
  }
  bool rows_from_hidden = false;
  if (plan.cuda_kernels) {
    for (const auto* runs : {&plan.cuda_kernels->routed, &plan.cuda_kernels->shared}) {
      for (const CudaGemmChoice& run : *runs) rows_from_hidden |= run.rows_from_hidden;
    }
  }
  record(PlanLayer::runner, "sort + gather in GEMM1", f.gather_in_gemm1,
         "decode batches on the wgmma decode tiles: GEMM1 reads every token's row from the hidden "
         "states and each GEMM CTA places the router's entries itself, so no sort + gather kernel "
         "runs",
         rows_from_hidden ? ""
                          : "no batch runs the wgmma decode tiles on 16-bit weights with tokens "
                            "and entries few enough for the GEMMs to place");
  std::string route_why_not;
  if (!plan.cuda_kernels ||
      CudaKernels::for_tokens(plan.cuda_kernels->routed, 1).kernel != CudaGemmKernel::one_token) {
    route_why_not = "the routed experts' batch of one token is not the one-token kernel's";
  } else if (!f.route_to_physical) {
    route_why_not = "the physical columns are a kernel of their own after the shared gate's";
  } else if (plan.options.check_finite && !f.checks_in_router) {
    route_why_not = "the finite checks are a kernel of their own";
  } else if (!f.map_in_sort) {
    route_why_not = "the dispatcher maps the ids before the runner reads them";
  }
  record(PlanLayer::block, "router + one-token kernel", f.route_in_runner,
         "a batch of one token is routed in every CTA of the one-token kernel, which writes the "
         "router's outputs: no router kernel runs before it",
         route_why_not);
  record(PlanLayer::block, "output", f.combine_to_output,
         "nothing is added to the routed sum: the routed experts' combine writes the layer's "
         "output in its dtype",
         output_why_not);
}

}  // namespace

Plan resolve(const ModelSpec& spec, const Options& options, const Platform& platform) {
  if (std::vector<std::string> problems = spec.problems(); !problems.empty()) {
    fail(Errc::config_refused, "refused: model spec '{}' cannot describe a layer: {}", spec.name,
         join(problems));
  }
  check_options(options, platform);
  Plan plan;
  plan.spec = spec;
  plan.options = options;
  plan.platform = platform;
  plan.threads = options.threads > 0 ? options.threads : platform.cpu_threads;
  plan.decisions.push_back(
      {PlanLayer::model, "spec", spec.summary(), "as given", {}, std::nullopt});
  decide_world(plan);
  decide_block(plan);
  decide_tensor_parallel(plan);
  decide_experts(plan);
  decide_quant_and_runner(plan);
  decide_dispatcher(plan);
  decide_runner_pipeline(plan);
  decide_stages(plan);
  decide_gpu_fusions(plan);
  return plan;
}

Resolution try_resolve(const ModelSpec& spec, const Options& options, const Platform& platform) {
  try {
    return {resolve(spec, options, platform), ""};
  } catch (const Error& e) {
    if (e.code() != Errc::config_refused) throw;
    return {std::nullopt, e.what()};
  }
}

}  // namespace moekit
