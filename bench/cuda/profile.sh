#!/usr/bin/env bash
# Where one forward's time goes on the GPU, kernel by kernel: `moekit bench --device cuda` on
# one case under Nsight Systems (each node of the replayed CUDA graph, with the gaps between
# them), or under Nsight Compute where nsys is absent (durations only). Prints, for the last
# forward of each T, every kernel's start (from the forward's first kernel) and duration.
#
#   bench/cuda/profile.sh BUILD_DIR OUT_DIR [moekit bench arguments]
#   e.g. bench/cuda/profile.sh build/gpu out --case qwen3-30b-a3b --tokens 1,64 --weights bf16
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: bench/cuda/profile.sh BUILD_DIR OUT_DIR [bench args]}
out=${2:?usage: bench/cuda/profile.sh BUILD_DIR OUT_DIR [bench args]}
shift 2
mkdir -p "$out"
cmake --build "$build" -j "$(nproc)" --target moekit >/dev/null || exit 1
args=(bench --device cuda --repeats 3 --warmup 1 "$@")
name=profile-$(date +%s)
nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -n 1)
if [ -n "$nsys" ] && [ -x "$nsys" ]; then
  "$nsys" profile --cuda-graph-trace=node -o "$out/$name" --force-overwrite true \
    "$build/tools/moekit" "${args[@]}" >"$out/$name.log" 2>&1 || { tail -n 20 "$out/$name.log"; exit 1; }
  "$nsys" stats --report cuda_gpu_trace --format csv --output "$out/$name" "$out/$name.nsys-rep" \
    >/dev/null 2>&1
  trace=$(ls "$out/$name"*cuda_gpu_trace*.csv 2>/dev/null | head -n 1)
  python3 bench/cuda/profile_summary.py nsys "$trace"
else
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv "$build/tools/moekit" "${args[@]}" \
    >"$out/$name.csv" 2>"$out/$name.log" || { tail -n 20 "$out/$name.log"; exit 1; }
  python3 bench/cuda/profile_summary.py ncu "$out/$name.csv"
fi
