#!/usr/bin/env bash
# Where one forward's time goes on the GPU, kernel by kernel: `moekit bench --device cuda` on
# one case under Nsight Systems (each node of the replayed CUDA graph, with the gaps between
# them), or under Nsight Compute where nsys is absent (durations only). Prints, for the last
# forward of each T, every kernel's start (from the forward's first kernel) and duration.
# PROFILE_STALLS=1 (Nsight Compute only): the layer's kernels alone, each with its DRAM
# throughput, instructions executed and main warp stall reasons (caches flushed before each
# kernel, as the bench's L2 flush leaves them cold), PROFILE_COUNT of them after the first
# PROFILE_SKIP (default 15 after 10: the forwards after the first two).
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
  if [ "${PROFILE_STALLS:-0}" = 1 ]; then
    layer='route|sort|gather|combine|output|decode|wgmma|prefill|quantize|finite|map_kernel|segment|shared_gate|chunk'
    "$ncu" --clock-control none --cache-control all --kernel-name-base function -k "regex:$layer" \
      --launch-skip "${PROFILE_SKIP:-10}" --launch-count "${PROFILE_COUNT:-15}" \
      --section SpeedOfLight --section WarpStateStats --print-units base --page raw --csv \
      --metrics gpu__time_duration.sum,smsp__inst_executed.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed "$build/tools/moekit" "${args[@]}" \
      >"$out/$name.csv" 2>"$out/$name.log" || { tail -n 20 "$out/$name.log"; exit 1; }
    python3 bench/cuda/profile_summary.py stalls "$out/$name.csv"
    exit
  fi
  "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv "$build/tools/moekit" "${args[@]}" \
    >"$out/$name.csv" 2>"$out/$name.log" || { tail -n 20 "$out/$name.log"; exit 1; }
  python3 bench/cuda/profile_summary.py ncu "$out/$name.csv"
fi
