#pragma once
// The flags every subcommand that plans a layer shares, and how the moekit command's
// subcommands are put together.

#include <algorithm>
#include <functional>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "moekit/error.hpp"
#include "moekit/options.hpp"
#include "moekit/plan.hpp"
#include "moekit/spec.hpp"

namespace moekit::cli {

inline constexpr int kExitRefused = 2;
inline constexpr int kExitError = 1;

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
  std::optional<int> ep_rank;  // from the launcher's rank when absent
  int tp_size = 1;
  std::optional<int> tp_rank;  // from the launcher's rank when absent
  std::string a2a_mode = "auto";
  std::string a2a_wire = "auto";
  double comm_timeout_s = 30.0;
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
  CLI::Option* weights_option = nullptr;

  // The weight format asked for on the command line, if any.
  std::optional<QuantParams> requested_quant() const {
    if (weights_option == nullptr || weights_option->count() == 0) {
      if (fp8_scaling || activations || block_size || group_size || scale_dtype || zero_points) {
        fail(Errc::invalid_argument, "format flags such as --group-size need {}",
             weights_option == nullptr ? "--weights" : weights_option->get_name());
      }
      return std::nullopt;
    }
    return quant();
  }

  void add_spec(CLI::App& app) {
    auto* preset_opt = app.add_option("--preset", preset, "model preset: dsv3, qwen3-moe, mixtral");
    app.add_option("--spec", spec_file, "model spec JSON file")->excludes(preset_opt);
  }
  // `weights_flag` names the weight-format flag: --weights, or --quantize where the weights come
  // from a checkpoint and the flag asks to quantise them at load time.
  void add_deployment(CLI::App& app, const std::string& weights_flag = "--weights") {
    app.add_option("--runner", runner, "auto, reference, cpu, cuda, hopper")->capture_default_str();
    app.add_option("--a2a", a2a, "none, mpi, nccl")->capture_default_str();
    weights_option =
        app.add_option(weights_flag, weights, "f32, f16, bf16, fp8-tensor, fp8-block, int4-group");
    if (weights_flag == "--weights") weights_option->capture_default_str();
    app.add_option("--form", form, "block form: auto, standard, overlapped, fused-slot")
        ->capture_default_str();
    app.add_option("--ep-size", ep_size, "expert-parallel ranks")->capture_default_str();
    app.add_option("--ep-rank", ep_rank, "this rank (default: mpirun's rank, else 0)");
    app.add_option("--tp-size", tp_size, "MoE tensor-parallel ranks (slices of every expert's I)")
        ->capture_default_str();
    app.add_option("--tp-rank", tp_rank,
                   "this tensor-parallel rank (default: mpirun's rank modulo --tp-size)");
    app.add_option("--a2a-mode", a2a_mode, "a2a mpi: auto, normal (prefill), low-latency (decode)")
        ->capture_default_str();
    app.add_option("--a2a-wire", a2a_wire,
                   "a2a mpi: auto, activations (rows as they come: bf16 for bf16), e4m3 (fp8 "
                   "formats: rows quantised before sending)")
        ->capture_default_str();
    app.add_option("--comm-timeout", comm_timeout_s,
                   "seconds any exchange with the other ranks may wait")
        ->capture_default_str()
        ->check(CLI::Range(0.001, 86400.0));
    app.add_option("--redundant", redundant, "redundant expert replicas")->capture_default_str();
    app.add_option("--device", device, "cpu, cuda, cuda:N")->capture_default_str();
    app.add_option("--fused-ops", fused_ops, "auto or off")->capture_default_str();
    app.add_option("--max-tokens", max_tokens, "largest batch")->capture_default_str();
    app.add_option("--threads", threads, "CPU threads, 0 = all")->capture_default_str();
    app.add_flag("--strict", strict, "refuse any fallback");
    app.add_option("--fp8-scaling", fp8_scaling, "fp8-tensor: tensor (default) or channel");
    app.add_option("--activations", activations,
                   "fp8-tensor: dynamic (default) or static; int4-group: unquantized (default, "
                   "W4A16) or int8 (W4A8, per token per group)");
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
    if (activations && format != WeightFormat::fp8_tensor && format != WeightFormat::int4_group) {
      fail(Errc::invalid_argument,
           "--activations applies to --weights fp8-tensor or int4-group, not {}", weights);
    }
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
      case WeightFormat::int4_group: {
        const int64_t group = group_size.value_or(128);
        const DType scales = choose<DType>(scale_dtype, "--scale-dtype",
                                           {{"bf16", DType::bf16}, {"f16", DType::f16}});
        const bool int8 =
            choose<bool>(activations, "--activations", {{"unquantized", false}, {"int8", true}});
        return int8 ? QuantParams::Int4GroupA8(group, scales, zero_points)
                    : QuantParams::Int4Group(group, scales, zero_points);
      }
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
    // Under mpirun the launcher's rank is ep rank x tp size + tp rank.
    const int launcher_rank = ep_size > 1 || tp_size > 1 ? Platform::probe().world_rank : 0;
    const int tp = std::max(1, tp_size);
    o.tp = {tp_size, tp_rank.value_or(launcher_rank % tp)};
    o.ep = ExpertParallel::Rank(ep_size, ep_rank.value_or(launcher_rank / tp), redundant);
    o.a2a_mode = parse(parse_a2a_mode(a2a_mode), "--a2a-mode", a2a_mode);
    o.a2a_wire = parse(parse_a2a_wire(a2a_wire), "--a2a-wire", a2a_wire);
    o.comm_timeout_ms = static_cast<int64_t>(comm_timeout_s * 1000.0);
    o.device = Device::parse(device);
    o.strict = strict;
    o.max_tokens = max_tokens;
    o.threads = threads;
    return o;
  }
};

// A subcommand defined in its own file: its parser, and what runs when it was chosen.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

}  // namespace moekit::cli
