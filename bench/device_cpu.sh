#!/usr/bin/env bash
# The CPU runner on the device machine's host CPU (issue 17's second machine: an Intel Xeon with
# AVX-512 BF16 and VNNI): builds the moekit command without CUDA, then `moekit bench --case
# cpu-qwen3-30b-a3b` for every weight format at decode and prefill sizes, on THREADS threads
# (default 2, the cores of the issue's machine). Logs and JSON go to $OUT; the last lines
# printed are each run's result rows. RUNS (a space-separated list of the names below) picks some.
#
#   OUT=dir bench/device_cpu.sh [TOKENS]     # TOKENS default 1,16,512
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build/device_cpu}
build=${MOEKIT_CPU_BUILD_DIR:-build/device_cpu}
tokens=${1:-1,16,512}
threads=${THREADS:-2}
mkdir -p "$out" "$build"
flags=$(grep -o -E 'avx512_bf16|avx512_vnni|amx_bf16|amx_int8' /proc/cpuinfo | sort -u | tr '\n' ' ')
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) flags: $flags"
if ! { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA=OFF >"$out/build.log" 2>&1 &&
  cmake --build "$build" -j "$(nproc)" --target moekit >>"$out/build.log" 2>&1; }; then
  tail -n 30 "$out/build.log"
  exit 1
fi
runs=("bf16:--weights bf16" "int4-group:--weights int4-group"
  "int4-group-a8:--weights int4-group --activations int8"
  "int4-group-a8-g32:--weights int4-group --activations int8 --group-size 32"
  "fp8-block:--weights fp8-block" "fp8-tensor:--weights fp8-tensor")
status=0
: >"$out/bench.log"
picked() { [ -z "${RUNS:-}" ] || [[ " $RUNS " == *" $1 "* ]]; }
for run in "${runs[@]}"; do
  name=${run%%:*}
  picked "$name" || continue
  # shellcheck disable=SC2086
  timeout 300 "$build/tools/moekit" bench --case cpu-qwen3-30b-a3b --tokens "$tokens" \
    --threads "$threads" --repeats "${REPEATS:-10}" ${run#*:} --json "$out/$name.json" \
    >"$out/run.log" 2>&1 || status=1
  { echo "== $name"; grep -E '^(machine|warning|cpu-qwen3-30b-a3b  )' "$out/run.log"; } >>"$out/bench.log"
done
rm -f "$out/run.log"
cat "$out/bench.log"
exit $status
