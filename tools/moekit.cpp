// The moekit command: demo, explain, matrix. Exit codes: 0 success, 2 a configuration refused
// by resolve(), 1 any other error.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <CLI/CLI.hpp>

#include "moekit/error.hpp"
#include "moekit/layer.hpp"
#include "moekit/plan.hpp"
#include "moekit/testing.hpp"

namespace {

using namespace moekit;

constexpr int kExitRefused = 2;
constexpr int kExitError = 1;

// The flags every subcommand that plans a layer shares, as text until parsed.
struct PlanFlags {
  std::string preset;
  std::string spec_file;
  std::string runner = "auto";
  std::string a2a = "none";
  std::string weights = "bf16";
  std::string form = "auto";
  std::string device = "cpu";
  std::string fused_ops = "auto";
  int ep_size = 1;
  int ep_rank = 0;
  int redundant = 0;
  int64_t max_tokens = 4096;
  int threads = 0;
  bool strict = false;
  // The weight format's parameters; each applies to one format (docs/QUANTIZATION.md).
  std::optional<std::string> fp8_scaling;
  std::optional<std::string> activations;
  std::optional<int64_t> block_size;
  std::optional<int64_t> group_size;
  std::optional<std::string> scale_dtype;
  bool zero_points = false;

  void add_spec(CLI::App& app) {
    auto* preset_opt = app.add_option("--preset", preset, "model preset: dsv3, qwen3-moe, mixtral");
    app.add_option("--spec", spec_file, "model spec JSON file")->excludes(preset_opt);
  }
  void add_deployment(CLI::App& app) {
    app.add_option("--runner", runner, "auto, reference, cpu, cuda, hopper")->capture_default_str();
    app.add_option("--a2a", a2a, "none, mpi, nccl")->capture_default_str();
    app.add_option("--weights", weights, "f32, f16, bf16, fp8-tensor, fp8-block, int4-group")
        ->capture_default_str();
    app.add_option("--form", form, "block form: auto, standard, overlapped, fused-slot")
        ->capture_default_str();
    app.add_option("--ep-size", ep_size, "expert-parallel ranks")->capture_default_str();
    app.add_option("--ep-rank", ep_rank, "this rank")->capture_default_str();
    app.add_option("--redundant", redundant, "redundant expert replicas")->capture_default_str();
    app.add_option("--device", device, "cpu, cuda, cuda:N")->capture_default_str();
    app.add_option("--fused-ops", fused_ops, "auto or off")->capture_default_str();
    app.add_option("--max-tokens", max_tokens, "largest batch")->capture_default_str();
    app.add_option("--threads", threads, "CPU threads, 0 = all")->capture_default_str();
    app.add_flag("--strict", strict, "refuse any fallback");
    app.add_option("--fp8-scaling", fp8_scaling, "fp8-tensor: tensor (default) or channel");
    app.add_option("--activations", activations, "fp8-tensor: dynamic (default) or static");
    app.add_option("--block-size", block_size, "fp8-block: rows and columns per scale (128)");
    app.add_option("--group-size", group_size, "int4-group: columns per scale (128)");
    app.add_option("--scale-dtype", scale_dtype, "int4-group: bf16 (default) or f16");
    app.add_flag("--zero-points", zero_points, "int4-group: asymmetric, with zero points");
  }

  // The format named by --weights with the parameters its own flags give; a flag of another
  // format is an error rather than silently ignored.
  QuantParams quant() const {
    const WeightFormat format = parse(parse_weight_format(weights), "--weights", weights);
    const auto only_for = [&](bool given, const char* flag, WeightFormat owner) {
      if (given && format != owner) {
        fail(Errc::invalid_argument, "{} applies to --weights {}, not {}", flag,
             weight_format_name(owner), weights);
      }
    };
    only_for(fp8_scaling.has_value(), "--fp8-scaling", WeightFormat::fp8_tensor);
    only_for(activations.has_value(), "--activations", WeightFormat::fp8_tensor);
    only_for(block_size.has_value(), "--block-size", WeightFormat::fp8_block);
    only_for(group_size.has_value(), "--group-size", WeightFormat::int4_group);
    only_for(scale_dtype.has_value(), "--scale-dtype", WeightFormat::int4_group);
    only_for(zero_points, "--zero-points", WeightFormat::int4_group);
    switch (format) {
      case WeightFormat::fp8_tensor:
        return QuantParams::Fp8Tensor(
            choose<Fp8Scaling>(
                fp8_scaling, "--fp8-scaling",
                {{"tensor", Fp8Scaling::per_tensor}, {"channel", Fp8Scaling::per_channel}}),
            choose<Fp8Activations>(
                activations, "--activations",
                {{"dynamic", Fp8Activations::dynamic}, {"static", Fp8Activations::static_}}));
      case WeightFormat::fp8_block:
        return QuantParams::Fp8Block(block_size.value_or(128));
      case WeightFormat::int4_group:
        return QuantParams::Int4Group(group_size.value_or(128),
                                      choose<DType>(scale_dtype, "--scale-dtype",
                                                    {{"bf16", DType::bf16}, {"f16", DType::f16}}),
                                      zero_points);
      default:
        return format;
    }
  }

  // The value named by an optional flag, the first choice when it is absent.
  template <typename T>
  static T choose(const std::optional<std::string>& given, const char* flag,
                  std::initializer_list<std::pair<const char*, T>> choices) {
    if (!given) return choices.begin()->second;
    std::string names;
    for (const auto& [name, value] : choices) {
      if (*given == name) return value;
      names += names.empty() ? name : std::string(", ") + name;
    }
    fail(Errc::invalid_argument, "{} '{}' is not one of {}", flag, *given, names);
  }

  ModelSpec spec(const ModelSpec& fallback) const {
    if (!spec_file.empty()) return ModelSpec::from_json_file(spec_file);
    if (!preset.empty()) return ModelSpec::preset(preset);
    return fallback;
  }

  template <typename T>
  static T parse(std::optional<T> value, const char* flag, const std::string& text) {
    if (!value)
      fail(Errc::invalid_argument, "{} '{}' is not a known value (see --help)", flag, text);
    return *value;
  }

  Options options() const {
    Options o;
    o.runner = parse(parse_runner(runner), "--runner", runner);
    o.a2a = parse(parse_a2a(a2a), "--a2a", a2a);
    o.weights = quant();
    o.form = parse(parse_block_form(form), "--form", form);
    if (fused_ops != "auto" && fused_ops != "off") {
      fail(Errc::invalid_argument, "--fused-ops '{}' is not auto or off", fused_ops);
    }
    o.fused_ops = fused_ops == "off" ? FusedOps::off : FusedOps::auto_;
    o.ep = ExpertParallel::Rank(ep_size, ep_rank, redundant);
    o.device = Device::parse(device);
    o.strict = strict;
    o.max_tokens = max_tokens;
    o.threads = threads;
    return o;
  }
};

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

int run_demo(const PlanFlags& flags, int64_t tokens, int repeats) {
  const ModelSpec spec = flags.spec(ModelSpec::demo());
  Options options = flags.options();
  options.max_tokens = std::max<int64_t>(tokens, 1);
  const Platform platform = Platform::probe();
  const Plan plan = resolve(spec, options, platform);
  std::printf("%s\n", plan.explain().c_str());

  const RandomWeights weights =
      RandomWeights::make(spec, random_weights_dtype(plan.quant.format), 2024);
  std::mt19937_64 rng(7);
  const Tensor hidden = random_tensor({tokens, spec.hidden}, DType::bf16, rng);
  const Tensor logits = random_tensor({tokens, spec.n_experts}, DType::f32, rng, 2.0f);
  Tensor output = Tensor::empty(DType::bf16, {tokens, spec.hidden});
  Tensor expected = Tensor::empty(DType::bf16, {tokens, spec.hidden});
  const StaticScales scales(spec, plan.quant, hidden);
  const LayerWeights given = scales.attach(weights.view());

  Options reference_options = options;
  reference_options.runner = RunnerKind::reference;
  reference_options.form = BlockForm::standard;
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
                std::string(weight_format_name(plan.quant.format)).c_str(),
                relative_l2(expected, exact));
  }

  MoeLayer layer(plan, given);
  output.fill_bytes(0xD5);
  layer.forward(hidden, logits, output);  // warm-up, and the result we check
  const double error = relative_l2(output, expected);
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    layer.forward(hidden, logits, output);
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const double time = median(seconds);
  const double flops = 6.0 * static_cast<double>(tokens) *
                       static_cast<double>(spec.routing.top_k * spec.intermediate +
                                           spec.n_shared * spec.shared_intermediate) *

                       static_cast<double>(spec.hidden);
  const bool ok = error < 2e-2;  // bf16 output: a few ulps of bf16 on the sum
  std::printf(
      "result: %lld tokens, relative L2 error vs reference %.2e (%s, bf16 tolerance 2e-2)\n",
      static_cast<long long>(tokens), error, ok ? "ok" : "FAILED");
  std::printf("speed:  %.2f ms per forward (median of %d), %.0f tokens/s, %.1f GFLOP/s\n",
              time * 1e3, repeats, static_cast<double>(tokens) / time, flops / time * 1e-9);
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moekit: the Mixture-of-Experts layer, planned then run"};
  app.require_subcommand(1);
  PlanFlags flags;
  int64_t tokens = 64;
  int repeats = 5;

  CLI::App* demo = app.add_subcommand("demo",
                                      "run a DeepSeek-V3-shaped layer on the CPU, check it "
                                      "against the reference and time it");
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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*demo) return run_demo(flags, tokens, repeats);
    if (*explain) return run_explain(flags);
    return run_matrix(flags);
  } catch (const Error& e) {
    std::fprintf(stderr, "moekit: %s\n", e.what());
    return e.code() == Errc::config_refused ? kExitRefused : kExitError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit: %s\n", e.what());
    return kExitError;
  }
}
