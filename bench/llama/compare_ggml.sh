#!/usr/bin/env bash
# moekit against llama.cpp's ggml CPU backend on the Qwen3-30B-A3B layer (E 128, top-8,
# H 2048, I 768), side by side in one run on this machine: ggml's graph is llama.cpp's
# build_moe_ffn (bench/llama/ggml_moe_layer.cpp), moekit's is `moekit bench --case
# cpu-qwen3-30b-a3b`; both with the same threads, the median of their timed runs. Pairs of the
# same scheme: bf16 / bf16; W4A8 with groups of 32 (ggml q4_0 with q8_0 activations / moekit
# int4-group-a8 group 32); W4A8 with groups of 128 against ggml's q4_K (super-blocks of 256 in
# sub-blocks of 32 with 6-bit scales and minimums, q8_K activations: the nearest ggml type). ggml
# runs its weights as they are ("plain") and repacked into its CPU_REPACK layout ("repacked", as
# llama.cpp loads a model on the CPU).
#
#   bench/llama/compare_ggml.sh GGML_DIR [OUT_DIR]
#
# GGML_DIR: a copy of github.com/ggml-org/ggml built with cmake into GGML_DIR/build (static
# libraries; e.g. cmake -S GGML_DIR -B GGML_DIR/build -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF
# -DCMAKE_BUILD_TYPE=Release && cmake --build GGML_DIR/build). It is third-party code: keep it
# outside this repository. MOEKIT_BIN: a moekit binary (default build/release/tools/moekit).
# MOEKIT_THREADS (default: all cores), MOEKIT_TOKENS (default 1,16,512).
set -euo pipefail
cd "$(dirname "$0")/../.."
ggml=${1:?usage: bench/llama/compare_ggml.sh GGML_DIR [OUT_DIR]}
out=${2:-build/compare_ggml}
moekit=${MOEKIT_BIN:-build/release/tools/moekit}
threads=${MOEKIT_THREADS:-$(nproc)}
tokens=${MOEKIT_TOKENS:-1,16,512}
mkdir -p "$out"
libs=("$ggml/build/src/libggml.a" "$ggml/build/src/libggml-cpu.a" "$ggml/build/src/libggml-base.a")
for lib in "${libs[@]}"; do
  [ -f "$lib" ] || { echo "compare_ggml: $lib is missing: build ggml first (see the header)" >&2; exit 2; }
done
[ -x "$moekit" ] || { echo "compare_ggml: no moekit binary at $moekit" >&2; exit 2; }
g++ -std=c++20 -O2 -I "$ggml/include" bench/llama/ggml_moe_layer.cpp "${libs[@]}" -fopenmp \
  -lpthread -ldl -lm -o "$out/ggml_moe_layer"
echo "ggml $(git -C "$ggml" log -1 --format=%h 2>/dev/null || echo '(no git)'), $threads threads, T = $tokens" \
  >"$out/ggml.txt"
for type in bf16 q4_0 q4_K; do
  "$out/ggml_moe_layer" --type "$type" --tokens "$tokens" --threads "$threads" | tee -a "$out/ggml.txt"
  if [ "$type" != bf16 ]; then
    "$out/ggml_moe_layer" --type "$type" --repack --tokens "$tokens" --threads "$threads" 2>/dev/null |
      tee -a "$out/ggml.txt"
  fi
done
run_moekit() {
  "$moekit" bench --case cpu-qwen3-30b-a3b --tokens "$tokens" --threads "$threads" --repeats 10 \
    --json "$out/moekit_$1.json" "${@:2}" >"$out/moekit_$1.log" 2>&1
}
run_moekit bf16 --weights bf16
run_moekit a8g32 --weights int4-group --group-size 32 --activations int8
run_moekit a8g128 --weights int4-group --group-size 128 --activations int8
python3 - "$out" <<'PY'
import json, re, sys
out = sys.argv[1]
ggml = {}
for line in open(f"{out}/ggml.txt"):
    m = re.match(r"ggml (\S+)\s+(\S+)\s+T=(\d+)\s+median\s+([\d.]+) ms", line)
    if m:
        ggml[(m[1], m[2], int(m[3]))] = float(m[4])
pairs = [("bf16", "bf16", "bf16"), ("a8g32", "int4-group-a8 g32", "q4_0"),
         ("a8g128", "int4-group-a8 g128", "q4_K")]
rows = []
print(open(f"{out}/ggml.txt").readline().strip())
print(f"{'moekit weights':20} {'ggml':5} {'T':>5} {'moekit ms':>10} {'ggml plain':>11} {'repacked':>9} {'ggml best / moekit':>19}")
for key, name, gtype in pairs:
    for r in json.load(open(f"{out}/moekit_{key}.json"))["results"]:
        T = r["tokens"]
        plain, repacked = ggml.get((gtype, "plain", T)), ggml.get((gtype, "repacked", T))
        best = min(v for v in (plain, repacked) if v is not None)
        rows.append({"moekit_weights": name, "ggml_type": gtype, "tokens": T,
                     "moekit_ms": r["median_ms"], "moekit_ok": r["ok"],
                     "ggml_plain_ms": plain, "ggml_repacked_ms": repacked,
                     "ggml_best_over_moekit": best / r["median_ms"]})
        fmt = lambda v: f"{v:9.2f}" if v is not None else "        -"
        print(f"{name:20} {gtype:5} {T:5d} {r['median_ms']:10.2f} {fmt(plain):>11} {fmt(repacked):>9}"
              f" {best / r['median_ms']:18.2f}x{'' if r['ok'] else '  (moekit check FAILED)'}")
json.dump(rows, open(f"{out}/compare_ggml.json", "w"), indent=1)
PY
