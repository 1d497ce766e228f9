#pragma once
// The subcommands defined in files of their own; main() lists them.

#include <CLI/CLI.hpp>

#include "plan_flags.hpp"

namespace moekit::cli {

// moekit bench: times whole MoE layers against the machine's measured ceilings.
Command add_bench_command(CLI::App& app);
// moekit run: one MoE layer of a Hugging Face checkpoint, from and to safetensors files.
Command add_run_command(CLI::App& app);
// moekit inspect: a Hugging Face model directory's MoE layers, memory and plan.
Command add_inspect_command(CLI::App& app);

}  // namespace moekit::cli
