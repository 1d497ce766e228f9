#!/usr/bin/env bash
# scripts/gpu.sh's benchmark hook: `bench/cuda/run.sh BUILD_DIR OUT_DIR`. Builds gemm_bench
# (the expert GEMMs alone, see gemm_bench.cu) with nvcc into BUILD_DIR, runs it and writes
# OUT_DIR/gemm_bench.json; the torch._grouped_mm comparison follows where PyTorch is installed
# (MOEKIT_BENCH_TORCH=0 skips it). The last line printed is gemm_bench's summary.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: bench/cuda/run.sh BUILD_DIR OUT_DIR}/gemm_bench
out=${2:?usage: bench/cuda/run.sh BUILD_DIR OUT_DIR}
mkdir -p "$build" "$out"
flags="-std=c++20 -O3 -gencode arch=compute_90,code=sm_90 -I include -I src"
for f in src/runner/cuda/gemm/gemm_bf16.cu src/runner/cuda/gemm/gemm_f16.cu \
  src/runner/cuda/gemm/gemm_e4m3.cu src/runner/cuda/gemm/expert_gemm.cu; do
  nvcc $flags -c "$f" -o "$build/$(basename "$f").o" &
done
wait
nvcc $flags -o "$build/gemm_bench" bench/cuda/gemm_bench.cu "$build"/*.o
if [ "${MOEKIT_BENCH_TORCH:-1}" != 0 ] && python3 -c "import torch" 2> /dev/null; then
  timeout 150 python3 bench/cuda/torch_grouped_mm.py || echo "torch comparison failed"
fi
"$build/gemm_bench" --json "$out/gemm_bench.json"
