#!/usr/bin/env bash
# scripts/gpu.sh's benchmark hook: `bench/cuda/run.sh BUILD_DIR OUT_DIR`. Builds the moekit
# command in BUILD_DIR, runs the two PyTorch layers on the GPU cases where PyTorch is installed
# (torch_moe_layers.py, at most MOEKIT_TORCH_SECONDS; MOEKIT_BENCH_TORCH=0 skips them), then
# `moekit bench --device cuda` (every GPU case, checked against the reference;
# OUT_DIR/bench_cuda.json), and prints them side by side
# (compare.py; OUT_DIR/bench_compare.json). The last line printed is one summary line.
#
#   MOEKIT_BIN         a moekit binary to use instead of building one
#   MOEKIT_BENCH_ARGS  more arguments for moekit bench (e.g. "--case qwen3-30b-a3b")
#   MOEKIT_GEMM_BENCH  1: also build and run gemm_bench (the expert GEMMs alone; OUT_DIR/gemm_bench.json)
#   MOEKIT_GEMM_BENCH_ARGS  more arguments for gemm_bench (--quick: T <= 64; --prefill: T >= 512;
#                      --no-others)
#   MOEKIT_TMA_BENCH   1: also build and run tma_read_bench (TMA weight streams alone; OUT_DIR/tma_read_bench.json)
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: bench/cuda/run.sh BUILD_DIR OUT_DIR}
out=${2:?usage: bench/cuda/run.sh BUILD_DIR OUT_DIR}
mkdir -p "$build" "$out"
moekit=${MOEKIT_BIN:-$build/tools/moekit}
if [ -z "${MOEKIT_BIN:-}" ]; then
  cmake --build "$build" -j "$(nproc)" --target moekit || exit 1
fi
# The torch layers first: their figures come back even if the moekit run is cut short.
torch_json=$build/torch_layers.json
rm -f "$torch_json"
if [ "${MOEKIT_BENCH_TORCH:-1}" != 0 ] && python3 -c "import torch" 2>/dev/null; then
  timeout "${MOEKIT_TORCH_SECONDS:-150}" python3 bench/cuda/torch_moe_layers.py "$torch_json" ||
    echo "torch layers: exit $?"
fi
# shellcheck disable=SC2086
"$moekit" bench --device cuda --json "$out/bench_cuda.json" ${MOEKIT_BENCH_ARGS:-}
bench_rc=$?
if [ "${MOEKIT_GEMM_BENCH:-0}" = 1 ]; then
  cmake --build "$build" -j "$(nproc)" --target gemm_bench &&
    # shellcheck disable=SC2086
    "$build/bench/cuda/gemm_bench" --json "$out/gemm_bench.json" ${MOEKIT_GEMM_BENCH_ARGS:-}
fi
if [ "${MOEKIT_TMA_BENCH:-0}" = 1 ]; then
  cmake --build "$build" -j "$(nproc)" --target tma_read_bench &&
    "$build/bench/cuda/tma_read_bench" --json "$out/tma_read_bench.json"
fi
python3 bench/cuda/compare.py "$out/bench_cuda.json" "$torch_json" "$out/bench_compare.json"
compare_rc=$?
[ "$bench_rc" -eq 0 ] && [ "$compare_rc" -eq 0 ]
