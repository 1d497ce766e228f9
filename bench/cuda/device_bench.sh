#!/usr/bin/env bash
# On the device machine, with a moekit binary built elsewhere (MOEKIT_BIN; LD_LIBRARY_PATH for
# any library it needs): the GPU commands' smoke checks, then the benchmark hook. Logs go to $OUT:
#   smoke.log  `moekit demo --device cuda` (bf16 and fp8-block) and `moekit run --device cuda:0`
#              on a small random checkpoint (tiny_checkpoint.py), compared with the CPU's run
#   bench.log  bench/cuda/run.sh: moekit bench --device cuda, the torch layers, side by side
# The last lines printed are the smoke results and the bench's summary.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/device_bench}
bin=${MOEKIT_BIN:?set MOEKIT_BIN to a moekit binary}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv >"$OUT/smoke.log" 2>&1
smoke() {  # label, command...
  local label=$1
  shift
  echo "== $label: $*" >>"$OUT/smoke.log"
  timeout 120 "$@" >>"$OUT/smoke.log" 2>&1
  local rc=$?
  echo "$label: exit $rc" | tee -a "$OUT/smoke.log"
}
smoke "demo cuda bf16" "$bin" demo --device cuda --tokens 64 --repeats 20
smoke "demo cuda:0 fp8-block T=1" "$bin" demo --device cuda:0 --runner cuda --weights fp8-block --tokens 1 --repeats 20
tiny=$(mktemp -d)
python3 bench/cuda/tiny_checkpoint.py "$tiny"
for quantize in bf16 fp8-block; do
  for device in cpu cuda:0; do
    smoke "run $device $quantize" "$bin" run --model "$tiny/model" --layer 1 \
      --input "$tiny/input.safetensors" --output "$tiny/$device-$quantize.safetensors" \
      --device "$device" --quantize "$quantize"
  done
  smoke "run cuda:0 vs cpu $quantize" python3 bench/cuda/tiny_checkpoint.py "$tiny" compare \
    "$tiny/cpu-$quantize.safetensors" "$tiny/cuda:0-$quantize.safetensors"
done
MOEKIT_BIN=$bin timeout "${MOEKIT_BENCH_SECONDS:-330}" bench/cuda/run.sh "$(mktemp -d)" "$OUT" \
  >"$OUT/bench.log" 2>&1
echo "bench: exit $?"
grep -E "^(gpu|ceilings): " "$OUT/bench.log"
if grep -q "torch loop us" "$OUT/bench.log"; then
  sed -n '/torch loop us/,$p' "$OUT/bench.log" | tail -n 50
else
  tail -n 30 "$OUT/bench.log"
fi
