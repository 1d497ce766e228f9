#!/usr/bin/env bash
# On the device machine, from a directory holding include/, src/, tests/ and bench/ (a copy of
# the tree): builds the GEMM check and benchmark with nvcc (the three kernel files in
# parallel), runs the check, the benchmark and the torch comparison; logs under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gemm_out}
mkdir -p "$OUT" build
F="-std=c++20 -O3 -gencode arch=compute_90,code=sm_90 -I include -I src -I tests"
G=src/runner/cuda/gemm
for f in $G/gemm_bf16.cu $G/gemm_f16.cu $G/gemm_e4m3.cu $G/expert_gemm.cu tests/cuda/test_cuda_gemm_cases.cu; do
  nvcc $F -Xptxas -warn-spills -c "$f" -o "build/$(basename "$f").o" 2>&1 | tee -a "$OUT/build.log" &
done
nvcc ${F/compute_90,code=sm_90/compute_90a,code=sm_90a} -Xptxas -warn-spills -c $G/gemm_wgmma_sm90a.cu -o build/gemm_wgmma_sm90a.cu.o 2>&1 | tee -a "$OUT/build.log" &
wait
nvcc $F -o build/gemm_check bench/cuda/gemm_check.cu build/*.o 2>&1 | tee -a "$OUT/build.log"
nvcc $F -o build/gemm_bench bench/cuda/gemm_bench.cu build/gemm_*.o build/expert_gemm.cu.o 2>&1 | tee -a "$OUT/build.log"
# Which tensor-core instructions the fp8 kernels became on sm_90 (HMMA: f16 mma).
if command -v cuobjdump > /dev/null; then
  cuobjdump -sass build/gemm_e4m3.cu.o | grep -oE "(QMMA|HMMA)[.A-Z0-9]*" | sort | uniq -c | tee "$OUT/sass.txt"
fi
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv | tee "$OUT/gpu.txt"
./build/gemm_check > "$OUT/check.log" 2>&1; check_rc=$?
tail -n 60 "$OUT/check.log"
# compute-sanitizer over a few small cases: every kernel variant of one format.
if command -v compute-sanitizer > /dev/null; then
  for tool in memcheck racecheck; do
    timeout 90 compute-sanitizer --tool $tool --error-exitcode 3 ./build/gemm_check fp8_block_ > "$OUT/$tool.log" 2>&1
    echo "$tool fp8_block: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | tail -1)"
  done
  timeout 60 compute-sanitizer --tool memcheck --error-exitcode 3 ./build/gemm_check bf16_ > "$OUT/memcheck_bf16.log" 2>&1
  echo "memcheck bf16: rc=$? $(grep 'ERROR SUMMARY' "$OUT/memcheck_bf16.log" | tail -1)"
fi
./build/gemm_bench ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
if [ "${TORCH:-1}" = 1 ]; then timeout 150 python3 bench/cuda/torch_grouped_mm.py > "$OUT/torch.log" 2>&1; fi
cat "$OUT/torch.log" 2>/dev/null | tail -n 12
echo "check rc=$check_rc"
grep -E "^\|" "$OUT/bench.log"
exit $check_rc
