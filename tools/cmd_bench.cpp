// moekit bench: times whole MoE layers (routing to combined output) and reports them against
// the read bandwidth and FMA peak measured in the same run, each layer checked against the
// float64 reference runner. shared/BENCHMARKS.md defines the cases and the roofline.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/a2a.hpp"
#include "bench/bench.hpp"
#include "bench/gpu_bench.hpp"
#include "commands.hpp"

namespace moekit::cli {
namespace {

struct BenchFlags {
  PlanFlags plan;
  std::optional<std::string> case_name;
  bool list = false;
  std::optional<int> experts;
  std::optional<int> top_k;
  std::optional<int64_t> hidden;
  std::optional<int64_t> intermediate;
  std::optional<std::string> tokens;
  std::string routing = "uniform";
  bench::BenchSettings settings;
  int64_t bandwidth_bytes = bench::CeilingSizes::Full().read_bytes;
  std::string json_file;
  std::string cpu_isa = "all";
};

// The machine the plans are made for: this one, or with --cpu-isa avx2 this one without its
// AVX-512 (the AVX2 kernels, as a CPU without AVX-512 runs them).
Platform bench_platform(const BenchFlags& f) {
  Platform platform = Platform::probe();
  if (f.cpu_isa == "all") return platform;
  if (f.cpu_isa != "avx2") {
    fail(Errc::invalid_argument, "--cpu-isa: '{}' is not all or avx2", f.cpu_isa);
  }
  if (!(platform.avx2 && platform.fma && platform.f16c)) {
    fail(Errc::invalid_argument, "--cpu-isa avx2: this CPU lacks AVX2, FMA or F16C");
  }
  platform.avx512f = platform.avx512_bf16 = platform.avx512_vnni = false;
  return platform;
}

std::string list_cases() {
  std::string text = fmt::format("{:<18} {:<6} {:>4} {:>5} {:>6} {:>6}  {:<20} {}\n", "case",
                                 "device", "E", "top-k", "H", "I", "weights", "T");
  for (const DeviceKind device : {DeviceKind::cpu, DeviceKind::cuda}) {
    for (const bench::BenchCase& c : bench::headline_cases(device)) {
      std::string formats, tokens;
      for (const QuantParams& f : c.formats) {
        formats += (formats.empty() ? "" : ", ") + f.name();
      }
      for (const int64_t t : c.tokens) tokens += (tokens.empty() ? "" : ", ") + std::to_string(t);
      text +=
          fmt::format("{:<18} {:<6} {:>4} {:>5} {:>6} {:>6}  {:<20} {}\n", c.name,
                      device == DeviceKind::cpu ? "cpu" : "cuda", c.spec.n_experts,
                      c.spec.routing.top_k, c.spec.hidden, c.spec.intermediate, formats, tokens);
    }
  }
  return text;
}

// The table's cases for the device, one of them (--case), or one made from the size flags;
// --weights and --tokens replace the cases' own lists (--tokens their skewed rows too).
std::vector<bench::BenchCase> chosen_cases(const BenchFlags& f) {
  const DeviceKind device = Device::parse(f.plan.device).kind;
  const std::optional<QuantParams> requested = f.plan.requested_quant();
  const int sizes_given = f.experts.has_value() + f.top_k.has_value() + f.hidden.has_value() +
                          f.intermediate.has_value();
  std::vector<bench::BenchCase> cases;
  if (sizes_given > 0) {
    if (sizes_given < 4) {
      fail(Errc::invalid_argument,
           "a custom case needs all of --experts, --top-k, --hidden and --intermediate");
    }
    if (f.case_name) {
      fail(Errc::invalid_argument, "--case {} and a custom case's sizes exclude each other",
           *f.case_name);
    }
    cases.push_back(
        bench::BenchCase::Routed("custom", *f.experts, *f.top_k, *f.hidden, *f.intermediate,
                                 {requested.value_or(WeightFormat::bf16)}, {1, 16, 512}, device));
  } else if (f.case_name) {
    cases.push_back(bench::find_case(*f.case_name, device));
  } else {
    cases = bench::headline_cases(device);
  }
  for (bench::BenchCase& c : cases) {
    if (requested) c.formats = {*requested};
    if (f.tokens) c.time_only(bench::parse_token_list(*f.tokens));
  }
  return cases;
}

bench::BenchLog console_log() {
  const bool terminal = isatty(STDERR_FILENO) != 0;
  return {[terminal](const std::string& line) {
            if (terminal) std::fputs("\r\033[K", stderr);
            std::printf("%s\n", line.c_str());
            std::fflush(stdout);
          },
          [terminal](const std::string& line) {
            std::fprintf(stderr, terminal ? "\r\033[K%s" : "%s\n", line.c_str());
            std::fflush(stderr);
          }};
}

// The plan of the first case and format that resolve, as bench::run_case plans them, for the
// thread count the ceilings are measured with. They start those threads before any case runs,
// so when nothing resolves (a runner not built, more threads than resolve grants) each refusal
// is printed and nothing is measured.
std::optional<Plan> first_plan(const std::vector<bench::BenchCase>& cases, const Options& options,
                               const Platform& platform) {
  std::vector<std::string> refusals;
  for (const bench::BenchCase& c : cases) {
    if (c.tokens.empty()) continue;  // bench::run_case says why
    for (const QuantParams& format : c.formats) {
      Options timed = options;
      timed.weights = format;
      timed.max_tokens = *std::max_element(c.tokens.begin(), c.tokens.end());
      Resolution resolution = try_resolve(c.spec, timed, platform);
      if (resolution.plan) return std::move(resolution.plan);
      refusals.push_back(fmt::format("{} {}: {}", c.name, format.name(), resolution.refusal));
    }
  }
  for (const std::string& refusal : refusals) std::fprintf(stderr, "moekit: %s\n", refusal.c_str());
  return std::nullopt;
}

// Opened first, so that a path that cannot be written fails before a long run.
std::ofstream open_json(const std::string& path) {
  std::ofstream out;
  if (!path.empty()) {
    out.open(path);
    if (!out) fail(Errc::io, "--json {}: cannot open the file for writing", path);
  }
  return out;
}

void write_json(std::ofstream& out, const std::string& path, const std::string& text) {
  if (!out.is_open()) return;
  out << text;
  out.close();
  if (!out) fail(Errc::io, "--json {}: could not write the results", path);
}

// The GPU cases: ceilings of the GPU, CUDA events, graphs for small batches (gpu_bench.hpp).
// A machine without a usable GPU gets resolve's refusal of the first case, exit 2.
int run_gpu_bench(const BenchFlags& f, const std::vector<bench::BenchCase>& cases,
                  const bench::BenchSettings& settings, const Options& options,
                  const Platform& platform) {
  for (const bench::BenchCase& c : cases) {
    Options probe = options;
    probe.weights = c.formats.front();
    const Resolution r = try_resolve(c.spec, probe, platform);
    if (!r.plan)
      fail(Errc::config_refused, "{} {}: {}", c.name, c.formats.front().name(), r.refusal);
  }
  const auto start = std::chrono::steady_clock::now();
  open_json(f.json_file);  // a path that cannot be written fails here, not after the run
  const auto save = [&f](const bench::GpuReport& so_far) {
    std::ofstream out = open_json(f.json_file);
    write_json(out, f.json_file, so_far.json());
  };
  const bench::BenchLog log = console_log();
  bench::GpuReport report;
  report.gpu = bench::measure_gpu_ceilings(options.device.index, f.bandwidth_bytes, 10);
  log.note(fmt::format("ceilings: read {:.2f} TB/s, bf16 {:.0f} TFLOP/s, fp8 {:.0f} TFLOP/s ({})",
                       report.gpu.read_bytes_per_s * 1e-12, report.gpu.bf16_flops_per_s * 1e-12,
                       report.gpu.fp8_flops_per_s * 1e-12, report.gpu.peak_method));
  log.note(fmt::format(
      "CUDA events per forward, CUDA-graph replay for T <= {}, fresh router logits and an L2 "
      "flush ({} MiB written) before every repeat; median of {} after {} warm-up",
      bench::kGraphMaxTokens, std::max<int64_t>(4 * report.gpu.l2_bytes, int64_t{64} << 20) >> 20,
      std::max(10, settings.repeats), std::max(1, settings.warmup)));
  bench::run_gpu_cases(cases, options, platform, settings, log, report, save);
  log.note(
      fmt::format("done in {:.1f} s, of which building layers {:.1f} s\n",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                  report.setup_s));
  std::printf("%s%s\n", report.table().c_str(), report.summary().c_str());
  save(report);
  if (!report.all_ok()) return kExitError;
  return report.refusals.empty() ? 0 : kExitRefused;
}

// --a2a mpi or nccl: the dispatcher's exchanges on every rank against the communicator's bare
// all-to-all of the same bytes (MPI_Alltoallv; grouped ncclSend/ncclRecv), on the demo layer's
// sizes or a custom case's. nccl runs each rank on the GPU of its local rank.
int run_a2a_bench(const BenchFlags& f) {
  const Platform platform = Platform::probe();
  ModelSpec spec = ModelSpec::demo();
  if (f.experts || f.top_k || f.hidden || f.intermediate) {
    const std::vector<bench::BenchCase> custom = chosen_cases(f);
    spec = custom.front().spec;
  }
  Options options = f.plan.options();
  options.ep = ExpertParallel::Rank(platform.world_size, platform.world_rank, f.plan.redundant);
  if (options.a2a == A2AKind::nccl) {
    options.runner = RunnerKind::cuda;
    options.device = Device::cuda(platform.world_local_rank);
  } else {
    options.runner = RunnerKind::cpu;
  }
  const std::vector<int64_t> tokens =
      f.tokens ? bench::parse_token_list(*f.tokens) : std::vector<int64_t>{16, 256};
  const std::string report =
      bench::run_a2a_bench(spec, options, platform, tokens, f.settings.repeats, f.settings.seed);
  std::printf("%s", report.c_str());
  return 0;
}

int run_bench(const BenchFlags& f) {
  if (f.list) {
    std::printf("%s", list_cases().c_str());
    return 0;
  }
  // With a case, the layers' table: --a2a nccl on one GPU then times the whole layer through
  // the all-to-all (a world of this one process), beside the same case without it.
  if ((f.plan.a2a == "mpi" || f.plan.a2a == "nccl") && !f.case_name) return run_a2a_bench(f);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<bench::BenchCase> cases = chosen_cases(f);
  bench::BenchSettings settings = f.settings;
  settings.routing = PlanFlags::parse(bench::parse_routing(f.routing), "--routing", f.routing);
  const Options options = f.plan.options();
  const Platform platform = bench_platform(f);
  if (options.device.kind == DeviceKind::cuda) {
    return run_gpu_bench(f, cases, settings, options, platform);
  }
  const std::optional<Plan> first = first_plan(cases, options, platform);
  if (!first) return kExitRefused;
  const int threads = first->threads;
  const bench::BenchLog log = console_log();

  bench::CeilingSizes sizes = bench::CeilingSizes::Full();
  sizes.read_bytes = f.bandwidth_bytes;
  std::ofstream json_out = open_json(f.json_file);
  const auto step = std::chrono::steady_clock::now();
  bench::BenchReport report;
  report.machine = bench::Ceilings::Measure(threads, sizes, platform);
  log.note(fmt::format(
      "ceilings measured in {:.1f} s: read {:.1f} GB/s ({} MiB summed), fp32 FMA peak {:.1f} "
      "GFLOP/s ({}), bf16 dot-product peak {:.1f} GFLOP/s, int8 dot-product peak {:.1f} GOP/s "
      "({}), {} threads, which had {:.0f}% of their CPU time",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - step).count(),
      report.machine.read_bytes_per_s * 1e-9, sizes.read_bytes >> 20,
      report.machine.fma_flops_per_s * 1e-9, bench::simd_isa_name(report.machine.isa),
      report.machine.bf16_dot_flops_per_s * 1e-9, report.machine.int8_dot_ops_per_s * 1e-9,
      bench::simd_isa_name(report.machine.int8_isa), threads, 100.0 * report.machine.cpu_share));
  log.note(fmt::format(
      "routing {}, fresh router logits for every repeat, caches flushed between "
      "repeats; {} repeats after {} warm-up, fewer (at least {}) once a case and T "
      "has spent {:.0f} s",
      f.routing, settings.repeats, settings.warmup, bench::kMinRepeats, settings.budget_s));

  for (const bench::BenchCase& c : cases) {
    bench::run_case(c, options, platform, settings, log, report);
  }
  const double total_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log.note(fmt::format("done in {:.1f} s, of which setup (weights and layers) {:.1f} s\n", total_s,
                       report.setup_s));
  std::printf("%s", report.table().c_str());
  write_json(json_out, f.json_file, report.json());
  if (!report.all_ok()) return kExitError;
  return report.refusals.empty() ? 0 : kExitRefused;
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* bench = app.add_subcommand(
      "bench",
      "time whole MoE layers against this machine's measured read bandwidth and FMA peak, "
      "checking each against the reference runner");
  bench->add_option("--case", f->case_name, "one case of the table (see --list)");
  bench->add_flag("--list", f->list, "print the cases and exit");
  bench->add_option("--experts", f->experts, "custom case: routed experts")
      ->check(CLI::Range(1, 1 << 16));
  bench->add_option("--top-k", f->top_k, "custom case: experts per token")
      ->check(CLI::Range(1, 1 << 16));
  bench->add_option("--hidden", f->hidden, "custom case: hidden size")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  bench->add_option("--intermediate", f->intermediate, "custom case: expert intermediate size")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  bench->add_option("--tokens", f->tokens, "token counts, e.g. 1,16,512 (default: the case's)");
  f->plan.weights_option =
      bench->add_option("--weights", f->plan.weights,
                        "f32, f16, bf16, fp8-tensor, fp8-block, int4-group (default: the case's)");
  bench->add_option("--fp8-scaling", f->plan.fp8_scaling,
                    "fp8-tensor: tensor (default) or channel");
  bench->add_option("--activations", f->plan.activations,
                    "fp8-tensor: dynamic (default) or static; int4-group: unquantized (default, "
                    "W4A16) or int8 (W4A8, per token per group)");
  bench->add_option("--block-size", f->plan.block_size,
                    "fp8-block: rows and columns per scale (128)");
  bench->add_option("--group-size", f->plan.group_size, "int4-group: columns per scale (128)");
  bench->add_option("--scale-dtype", f->plan.scale_dtype, "int4-group: bf16 (default) or f16");
  bench->add_flag("--zero-points", f->plan.zero_points, "int4-group: asymmetric, with zero points");
  bench->add_option("--runner", f->plan.runner, "auto, reference, cpu, cuda, hopper")
      ->capture_default_str();
  bench->add_option("--device", f->plan.device, "cpu, cuda, cuda:N: which table of cases")
      ->capture_default_str();
  bench->add_option("--fused-ops", f->plan.fused_ops, "auto or off")->capture_default_str();
  bench->add_option("--threads", f->plan.threads, "CPU threads, 0 = all")->capture_default_str();
  bench
      ->add_option("--a2a", f->plan.a2a,
                   "none (the layers), or mpi / nccl: the dispatcher's exchanges on every rank "
                   "of mpirun against a bare MPI_Alltoallv / ncclSend+ncclRecv of the same bytes; "
                   "with --case, the layers' table through that dispatcher")
      ->capture_default_str();
  bench->add_option("--a2a-mode", f->plan.a2a_mode, "a2a mpi: auto, normal, low-latency")
      ->capture_default_str();
  bench
      ->add_option("--a2a-wire", f->plan.a2a_wire,
                   "a2a mpi: auto, activations, e4m3 (with --weights fp8-block or fp8-tensor)")
      ->capture_default_str();
  bench
      ->add_option("--redundant", f->plan.redundant,
                   "a2a mpi: redundant expert replicas (to divide the experts over the ranks)")
      ->capture_default_str();
  bench
      ->add_option("--comm-timeout", f->plan.comm_timeout_s,
                   "a2a mpi: seconds any exchange may wait")
      ->capture_default_str();
  bench->add_option("--routing", f->routing, "uniform, or skewed: a few hot experts per repeat")
      ->capture_default_str();
  bench->add_option("--repeats", f->settings.repeats, "timed runs per case and T")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  bench->add_option("--warmup", f->settings.warmup, "untimed runs first")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));
  bench
      ->add_option("--max-seconds", f->settings.budget_s,
                   "a slow case stops repeating after this much timed work (at least 3 runs)")
      ->capture_default_str()
      // Not CLI::PositiveNumber, whose message spells out the largest double.
      ->check(CLI::Range(1e-3, 1e6));
  bench->add_option("--seed", f->settings.seed, "weights, hidden states and logits")
      ->capture_default_str();
  bench
      ->add_option("--bandwidth-bytes", f->bandwidth_bytes,
                   "size of the array summed for the read bandwidth; keep it far above the "
                   "last-level cache")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{4096}, int64_t{1} << 40));
  bench
      ->add_option("--cpu-isa", f->cpu_isa,
                   "all, or avx2: plan and measure as on this CPU without its AVX-512")
      ->capture_default_str();
  bench->add_option("--json", f->json_file, "write the results as JSON to this file");
  return {bench, [f] { return run_bench(*f); }};
}

}  // namespace moekit::cli
