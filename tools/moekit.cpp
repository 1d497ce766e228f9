// The moekit command: demo, explain, matrix. Exit codes: 0 success, 2 a configuration refused
// by resolve(), 1 any other error (a command line the parser refuses among them).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/gpu_bench.hpp"
#include "comm/communicator.hpp"
#include "commands.hpp"
#include "moekit/error.hpp"
#include "moekit/layer.hpp"
#include "moekit/plan.hpp"
#include "moekit/testing.hpp"
#include "plan_flags.hpp"

namespace {

using namespace moekit;
using namespace moekit::cli;

// fp8 static activations need a scale per GEMM input, which a checkpoint would carry. The demo
// calibrates GEMM1's from its own hidden states; GEMM2's input, silu(gate) * up of unit-variance
// projections, stays below 8 in this layer, so 8 / 448 keeps it unsaturated.
struct StaticScales {
  Tensor w13, w2, shared_w13, shared_w2;

  StaticScales(const ModelSpec& spec, const QuantParams& quant, const Tensor& hidden) {
    if (quant.activation != ActivationQuant::fp8_static) return;
    std::vector<float> x(static_cast<size_t>(hidden.view().numel()));
    convert_to_f32(hidden.view().data, hidden.view().dtype, hidden.view().numel(), x.data());
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const auto filled = [](int64_t n, float value) {
      Tensor t = Tensor::empty(DType::f32, {n});
      std::fill_n(t.data<float>(), n, value);
      return t;
    };
    w13 = filled(spec.n_experts, amax / kE4M3Max);
    w2 = filled(spec.n_experts, 8.0f / kE4M3Max);
    if (spec.n_shared > 0) {
      shared_w13 = filled(spec.n_shared, amax / kE4M3Max);
      shared_w2 = filled(spec.n_shared, 8.0f / kE4M3Max);
    }
  }

  LayerWeights attach(LayerWeights weights) const {
    weights.w13.input_scale = w13.view();
    weights.w2.input_scale = w2.view();
    weights.shared_w13.input_scale = shared_w13.view();
    weights.shared_w2.input_scale = shared_w2.view();
    return weights;
  }
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// One forward into `output`, poisoned first (the result the demo checks), then `repeats` timed.
std::vector<double> forward_on_cpu(MoeLayer& layer, const Tensor& hidden, const Tensor& logits,
                                   Tensor& output, int repeats) {
  output.fill_bytes(0xD5);
  layer.forward(hidden, logits, output);  // warm-up, and the result we check
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    layer.forward(hidden, logits, output);
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return seconds;
}

// The same on the plan's GPU: the inputs uploaded once, the checked output copied back, the
// repeats enqueued on a stream and timed with CUDA events.
std::vector<double> forward_on_gpu(MoeLayer& layer, const Tensor& hidden, const Tensor& logits,
                                   Tensor& output, int repeats) {
  const Device device = layer.plan().options.device;
  const auto upload = [&device](const Tensor& host) {
    Tensor on_device = Tensor::empty(host.view().dtype, host.view().shape, device);
    copy(on_device, host);
    return on_device;
  };
  output.fill_bytes(0xD5);
  const Tensor hidden_d = upload(hidden), logits_d = upload(logits);
  Tensor output_d = upload(output);  // poisoned: an output the layer does not write fails
  layer.forward(hidden_d, logits_d, output_d);
  copy(output, output_d);
  std::vector<double> seconds = bench::time_on_gpu(
      device.index, 1, repeats,
      [&](CUstream_st* stream) { layer.forward(hidden_d, logits_d, output_d, nullptr, stream); });
  layer.synchronize();
  return seconds;
}

int run_demo(const PlanFlags& flags, int64_t tokens, int repeats) {
  const ModelSpec spec = flags.spec(ModelSpec::demo());
  Options options = flags.options();
  options.max_tokens = std::max<int64_t>(tokens, 1);
  const Platform platform = Platform::probe();
  const Plan plan = resolve(spec, options, platform);
  std::printf("%s\n", plan.explain().c_str());

  const RandomWeights weights =
      RandomWeights::make(spec, random_weights_dtype(plan.quant.format), 2024);
  // Across processes every rank has the same weights and tokens of its own.
  const bool ranks = plan.comm != CommKind::none;
  const int rank = plan.options.ep.rank;
  std::mt19937_64 rng(7 + static_cast<uint64_t>(owns_its_tokens(plan.options) ? rank : 0));
  const Tensor hidden = random_tensor({tokens, spec.hidden}, DType::bf16, rng);
  const Tensor logits = random_tensor({tokens, spec.n_experts}, DType::f32, rng, 2.0f);
  Tensor output = Tensor::empty(DType::bf16, {tokens, spec.hidden});
  Tensor expected = Tensor::empty(DType::bf16, {tokens, spec.hidden});
  const StaticScales scales(spec, plan.quant, hidden);
  const LayerWeights given = scales.attach(weights.view());

  Options reference_options = options;
  reference_options.runner = RunnerKind::reference;
  reference_options.form = BlockForm::standard;
  reference_options.device = Device::cpu();  // the reference runs on the host's copy
  if (ranks) {
    // The single-process layer on this rank's tokens: what every rank's output must equal.
    reference_options.a2a = A2AKind::none;
    reference_options.ep = ExpertParallel::Single();
    reference_options.tp = {};
  }
  MoeLayer reference(resolve(spec, reference_options, platform), given);
  reference.forward(hidden, logits, expected);
  if (plan.quant.quantized()) {
    // What the format costs: the same weights unquantised, in the float64 reference.
    Options float_options = reference_options;
    float_options.weights = WeightFormat::bf16;
    MoeLayer unquantized(resolve(spec, float_options, platform), weights.view());
    Tensor exact = Tensor::empty(DType::bf16, {tokens, spec.hidden});
    unquantized.forward(hidden, logits, exact);
    std::printf("quantization: %s costs a relative L2 error of %.2e against bf16 weights\n",
                plan.quant.name().c_str(), relative_l2(expected, exact));
  }

  MoeLayer layer(plan, given);
  const std::vector<double> seconds = plan.options.device.kind == DeviceKind::cpu
                                          ? forward_on_cpu(layer, hidden, logits, output, repeats)
                                          : forward_on_gpu(layer, hidden, logits, output, repeats);
  const double error = relative_l2(output, expected);
  const double time = median(seconds);
  const double flops = 6.0 * static_cast<double>(tokens) *
                       static_cast<double>(spec.routing.top_k * spec.intermediate +
                                           spec.n_shared * spec.shared_intermediate) *

                       static_cast<double>(spec.hidden);
  const bool ok = error < 2e-2;  // bf16 output: a few ulps of bf16 on the sum
  const std::string who =
      ranks ? fmt::format("rank {} of {}: ", plan.platform.world_rank, plan.platform.world_size)
            : "";
  std::printf(
      "%sresult: %lld tokens, relative L2 error vs %sreference %.2e (%s, bf16 tolerance 2e-2)\n",
      who.c_str(), static_cast<long long>(tokens), ranks ? "the single-process " : "", error,
      ok ? "ok" : "FAILED");
  std::printf("%sspeed:  %.3f ms per forward (median of %d, %s), %.0f tokens/s, %.1f GFLOP/s\n",
              who.c_str(), time * 1e3, repeats,
              plan.options.device.kind == DeviceKind::cpu ? "wall clock" : "CUDA events",
              static_cast<double>(tokens) / time, flops / time * 1e-9);
  return ok ? 0 : kExitError;
}

int run_explain(const PlanFlags& flags) {
  const Plan plan = resolve(flags.spec(ModelSpec::demo()), flags.options(), Platform::probe());
  std::printf("%s", plan.explain().c_str());
  return 0;
}

int run_matrix(const PlanFlags& flags) {
  const ModelSpec spec = flags.spec(ModelSpec::demo());
  Options base = flags.options();
  const Platform platform = Platform::probe();
  std::printf("compatibility of %s\non %s, ep %d/%d, device %s\n\n", spec.summary().c_str(),
              platform.summary().c_str(), base.ep.rank, base.ep.size, base.device.str().c_str());
  std::printf("%-10s %-5s %-11s %-11s %s\n", "runner", "a2a", "weights", "form", "plan");
  int resolved = 0, refused = 0;
  for (RunnerKind runner : kAllRunners) {
    for (A2AKind a2a : kAllA2A) {
      for (WeightFormat format : kAllWeightFormats) {
        for (BlockForm form : kAllBlockForms) {
          Options options = base;
          options.runner = runner;
          options.a2a = a2a;
          options.weights = format;
          options.form = form;
          const Resolution r = try_resolve(spec, options, platform);
          std::string outcome;
          if (r.plan) {
            ++resolved;
            const Plan& p = *r.plan;
            outcome =
                fmt::format("ok: {} {} form, {}", runner_name(p.runner), block_form_name(p.form),
                            p.fused_op ? "fused op " + *p.fused_op
                                       : fmt::format("{} core", runner_format_name(p.core_format)));
            if (!p.fallbacks().empty()) outcome += " (fallback)";
          } else {
            ++refused;
            outcome = r.refusal;
          }
          std::printf("%-10s %-5s %-11s %-11s %s\n", std::string(runner_name(runner)).c_str(),
                      std::string(a2a_name(a2a)).c_str(),
                      std::string(weight_format_name(format)).c_str(),
                      std::string(block_form_name(form)).c_str(), outcome.c_str());
        }
      }
    }
  }
  std::printf("\n%d combinations resolve, %d are refused\n", resolved, refused);
  return 0;
}

// A failing rank of several must not leave the others waiting: if they do not all reach this
// barrier in time (they are not failing with it), every rank is ended with the exit code.
int failed_with(int code) {
  std::fflush(stderr);
  std::fflush(stdout);
  if (Communicator* comm = active_world_communicator()) {
    if (!comm->barrier({"every rank fails together", 3000})) comm->abort(code);
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moekit: the Mixture-of-Experts layer, planned then run"};
  app.require_subcommand(1);
  PlanFlags flags;
  int64_t tokens = 64;
  int repeats = 5;

  CLI::App* demo = app.add_subcommand("demo",
                                      "run a DeepSeek-V3-shaped layer (--device cpu or cuda[:N]), "
                                      "check it against the reference and time it");
  flags.add_spec(*demo);
  flags.add_deployment(*demo);
  demo->add_option("--tokens", tokens, "tokens in the batch")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  demo->add_option("--repeats", repeats, "timed runs")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));

  CLI::App* explain = app.add_subcommand("explain", "print the plan's five layers and why");
  flags.add_spec(*explain);
  flags.add_deployment(*explain);

  CLI::App* matrix = app.add_subcommand("matrix", "print which combinations of the axes resolve");
  flags.add_spec(*matrix);
  flags.add_deployment(*matrix);

  const std::vector<Command> commands = {add_bench_command(app), add_run_command(app),
                                         add_inspect_command(app)};

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints its message; a request for help is its "error" of code 0. Every other code of
    // its own (105 for a value out of range, 106 for a missing option, ...) is a command line
    // that is wrong, which moekit's exit codes call an error.
    return app.exit(e) == 0 ? 0 : kExitError;
  }
  try {
    if (*demo) return run_demo(flags, tokens, repeats);
    if (*explain) return run_explain(flags);
    for (const Command& command : commands) {
      if (*command.app) return command.run();
    }
    return run_matrix(flags);
  } catch (const Error& e) {
    std::fprintf(stderr, "moekit: %s\n", e.what());
    return failed_with(e.code() == Errc::config_refused ? kExitRefused : kExitError);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit: %s\n", e.what());
    return failed_with(kExitError);
  }
}
