#!/usr/bin/env bash
# The device script: on a machine with an NVIDIA GPU, configures with -DMOEKIT_CUDA=ON, builds,
# runs the GPU tests (every test suite named Cuda*, the tests/cuda/ files) and
# FAILS if any of them was skipped there or none ran, runs compute-sanitizer memcheck and
# racecheck over the small GPU cases, then the GPU benchmark hook, and prints a short table
# last. Logs and JSON go to $OUT (default build/gpu/out).
#
#   scripts/gpu.sh                 # on the device machine, from anywhere
#   scripts/gpu.sh debs DIR        # on a Debian machine with apt: download the packages below
#                                  # into DIR, to carry to a device machine that lacks them
#
# Environment:
#   OUT                  where logs and JSON go
#   MOEKIT_GPU_BUILD_DIR the build folder (default build/gpu)
#   MOEKIT_DEBS          a folder of Debian packages (libgtest-dev libfmt-dev libfmt9
#                        nlohmann-json3-dev libcli11-dev, Debian 12's: see `debs` above)
#                        unpacked into a prefix that CMake searches first, for machines
#                        without those headers
#   MOEKIT_GPU_FILTER    gtest filter of the GPU tests (default: suites named Cuda*)
#   MOEKIT_GPU_TEST_SECONDS  the GPU tests' time limit (default 600)
#   MOEKIT_SANITIZE_GPU  0 skips compute-sanitizer (default 1)
#   MOEKIT_SANITIZER_FILTER  the small cases compute-sanitizer runs
#   MOEKIT_GPU_BENCH     0 skips the benchmark hook (default 1)
#   MOEKIT_GPU_TESTS     0 skips the GPU tests and compute-sanitizer and builds only the moekit
#                        command: a benchmark-only call, for a device session split in two
#   MOEKIT_AB_BASE       a source tree to time this one against, after the tests and the bench
#                        (`bench/ab.sh export REV build-ab/base` here, named in the device
#                        call's carry): bench/ab.sh builds its moekit and runs it alternated
#                        with this tree's (from the test build's folder: AB_B_BUILD), its
#                        output goes to ab.log and its last row into the table
#   MOEKIT_AB_ARGS       that A/B's bench arguments, several sets separated by ';' (one weight
#                        format each), each an A/B of its own with a row in the table (default:
#                        --device cuda --case qwen3-30b-a3b --tokens 1 --weights bf16 --repeats 60)
#
# Hook for the benchmark: an executable bench/cuda/run.sh is run last as
# `bench/cuda/run.sh BUILD_DIR OUT_DIR`; it writes its own JSON under OUT_DIR (at most 2 files:
# what comes back from the device is limited to 8 files), and its last output line goes into
# the table. Tests join through tests/cuda/ with suite names starting "Cuda".
set -uo pipefail
cd "$(dirname "$0")/.."
packages=(libgtest-dev libfmt-dev libfmt9 nlohmann-json3-dev libcli11-dev)
if [ "${1:-}" = debs ]; then
  mkdir -p "${2:?usage: scripts/gpu.sh debs DIR}"
  cd "$2" && exec apt-get download "${packages[@]}"
fi
build=${MOEKIT_GPU_BUILD_DIR:-build/gpu}
out=${OUT:-$build/out}
mkdir -p "$build" "$out"
jobs=$(nproc)
declare -a rows=()
status=0
row() { rows+=("$(printf '| %-12s | %-11s | %s' "$1" "$2" "$3")"); }

cmake_flags=(-DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA=ON)
if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null; then cmake_flags+=(-G Ninja); fi
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
if [ -n "${MOEKIT_DEBS:-}" ]; then
  prefix=$(cd "$build" && pwd)/deps
  mkdir -p "$prefix"
  for deb in "$MOEKIT_DEBS"/*.deb; do dpkg -x "$deb" "$prefix"; done
  cmake_flags+=("-DCMAKE_PREFIX_PATH=$prefix/usr")
  export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

# Starts $1 processes of the rest of the command line, one per GPU, as the ranks of one world
# that share NCCL's id through a fresh file. Every rank's output goes to $build/ranks/rankR.log,
# rank 0's also to ranks.log in $out; fails if any rank fails or outlasts its limit.
run_ranks() {
  local n=$1 rc=0 pids=() r
  shift
  rm -rf "$build/ranks" && mkdir -p "$build/ranks"
  for ((r = 0; r < n; r++)); do
    MOEKIT_NCCL_ID_FILE="$build/ranks/nccl-id" MOEKIT_WORLD_SIZE=$n MOEKIT_WORLD_RANK=$r \
      MOEKIT_WORLD_LOCAL_RANK=$r timeout 300 "$@" >"$build/ranks/rank$r.log" 2>&1 &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do wait "${pids[$r]}" || rc=1; done
  { echo "== $n ranks: $*"; cat "$build/ranks/rank0.log"; } >>"$out/ranks.log"
  for ((r = 1; r < n; r++)); do
    grep -E 'FAILED|Failure|error' "$build/ranks/rank$r.log" | sed "s/^/rank $r: /" >>"$out/ranks.log"
  done
  return $rc
}

run_tests=${MOEKIT_GPU_TESTS:-1}
build_target=moekit_tests
[ "$run_tests" = 0 ] && build_target=moekit
echo "== configure and build ($jobs jobs, $build_target)"
start=$(date +%s)
if cmake -S . -B "$build" "${cmake_flags[@]}" >"$out/build.log" 2>&1 &&
  cmake --build "$build" -j "$jobs" --target "$build_target" >>"$out/build.log" 2>&1; then
  row build ok "$(($(date +%s) - start)) s, nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
else
  tail -n 40 "$out/build.log"
  row build FAILED "see build.log"
  printf '%s\n' "${rows[@]}"
  exit 1
fi
tests=$build/tests/moekit_tests

# The NCCL communicator opens libnccl.so.2 at run time (docs/EXPERT_PARALLEL.md); where neither
# the loader's path nor the CUDA toolkit has it, the copy of a Python wheel (nvidia-nccl-cu13,
# as torch installs it) is named instead, so that its tests run rather than skip.
has_nccl() {
  ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 ' && return 0
  local dir
  for dir in ${LD_LIBRARY_PATH//:/ } /usr/local/cuda/lib64 /usr/local/cuda/lib; do
    [ -e "$dir/libnccl.so.2" ] && return 0
  done
  return 1
}
if [ -z "${MOEKIT_NCCL_LIBRARY:-}" ] && ! has_nccl; then
  wheel=$(python3 -c '
import glob, site
for d in site.getsitepackages() + [site.getusersitepackages()]:
    hits = sorted(glob.glob(d + "/nvidia/**/libnccl.so.2", recursive=True))
    if hits:
        print(hits[0])
        break
' 2>/dev/null)
  if [ -n "$wheel" ]; then export MOEKIT_NCCL_LIBRARY=$wheel; fi
fi
if [ -n "${MOEKIT_NCCL_LIBRARY:-}" ]; then
  row nccl named "MOEKIT_NCCL_LIBRARY=$MOEKIT_NCCL_LIBRARY"
elif has_nccl; then
  row nccl found "libnccl.so.2 on the loader path or in the CUDA toolkit"
else
  row nccl absent "no libnccl.so.2 found: the CudaNccl tests will skip"
fi

if [ "$run_tests" != 0 ]; then
  echo "== GPU tests"
  # CudaRanks runs below, as several processes: alone it skips.
  filter=${MOEKIT_GPU_FILTER:-Cuda*:*/Cuda*:-*CudaRanks*}
  # A kernel that never finishes fails the run instead of holding the machine.
  timeout "${MOEKIT_GPU_TEST_SECONDS:-600}" "$tests" --gtest_filter="$filter" \
    --gtest_output="json:$out/gpu_tests.json" >"$out/gpu_tests.log" 2>&1
  test_rc=$?
  [ "$test_rc" -eq 124 ] && echo "GPU tests: over ${MOEKIT_GPU_TEST_SECONDS:-600} s (gpu_tests.log)"
  grep -E '^\[  (FAILED|SKIPPED) \] [^ ]+$' "$out/gpu_tests.log" | sort -u | head -n 40
  summary=$(python3 - "$out/gpu_tests.json" <<'PY'
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    print(f"0 0 0 no-report:{e.__class__.__name__}")
    sys.exit()
ran = skipped = failed = 0
for suite in report.get("testsuites", []):
    for case in suite.get("testsuite", []):
        if case.get("result") == "SKIPPED":
            skipped += 1
        else:
            ran += 1
            failed += 1 if case.get("failures") else 0
print(ran, skipped, failed, "ok")
PY
  )
  read -r ran skipped failed report <<<"$summary"
  if [ "$report" != ok ]; then
    row "gpu tests" FAILED "no gtest report (exit $test_rc): see gpu_tests.log"
    status=1
  elif [ "$test_rc" -ne 0 ] || [ "$failed" -ne 0 ] || [ "$skipped" -ne 0 ] || [ "$ran" -eq 0 ]; then
    row "gpu tests" FAILED "$((ran - failed)) passed, $failed failed, $skipped skipped (a GPU test must not skip here)"
    status=1
  else
    row "gpu tests" ok "$ran passed, 0 skipped"
  fi

  if [ "${MOEKIT_SANITIZE_GPU:-1}" != 0 ]; then
    # The out-of-memory test's failed cudaMalloc is what it checks; memcheck would report it.
    # Split K's GEMM cases too: their CTAs meet through global memory. Not the wide_mixtral
    # layer cases: 10-20 s each under memcheck, eight formats of them took a 75 s budget whole
    # (stop 38), and the GEMM split cases cover the same kernels. The all-to-all's kernels run
    # between ranks of the loopback world (CudaAllToAll*), not over NCCL: NCCL's own start-up
    # probes kernels of other architectures (cudaFuncGetAttributes answers "no kernel image"),
    # which memcheck reports as API errors.
    small=${MOEKIT_SANITIZER_FILTER:-*Cuda*T1:*Cuda*T1_*:*Cuda*T3:*Cuda*T3_*:*CudaGemm*_split*:CudaFiniteStatus.*:CudaToPhysical.*:CudaGraph.*:CudaMemory.*:*CudaAllToAll*:-CudaMemory.AnAllocationTooLarge*:*wide_mixtral*:*a2a_nccl*}
    : >"$out/sanitizer.log"
    sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    for tool in memcheck racecheck; do
      if [ ! -x "$sanitizer" ]; then
        row "$tool" unavailable "no compute-sanitizer on this machine"
        continue
      fi
      echo "== compute-sanitizer $tool"
      start=$(date +%s)
      timeout "${MOEKIT_SANITIZER_SECONDS:-150}" "$sanitizer" --tool "$tool" --error-exitcode 99 \
        "$tests" --gtest_filter="$small" >>"$out/sanitizer.log" 2>&1
      rc=$?
      took="$(($(date +%s) - start)) s"
      if [ "$rc" -eq 124 ]; then
        row "$tool" FAILED "over ${MOEKIT_SANITIZER_SECONDS:-150} s (sanitizer.log)"
        status=1
      elif [ "$rc" -eq 0 ]; then
        row "$tool" ok "clean over the small GPU cases ($took)"
      elif grep -q -E 'Device not supported|Unable to find injection library|not supported on this' \
        "$out/sanitizer.log"; then
        row "$tool" unavailable "compute-sanitizer cannot attach on this machine (sanitizer.log)"
      else
        row "$tool" FAILED "exit $rc, see sanitizer.log"
        status=1
      fi
    done
  fi

  # Expert parallelism across GPUs (tests/cuda/test_cuda_ranks.cpp, suite CudaRanks): one process
  # per GPU, on 2, 4 and 8 of them where the machine has them, then moekit bench --a2a nccl on
  # the same ranks (DeepSeek-V3's layer: 128 and 4096 tokens per rank). A machine of one GPU says
  # so in the table.
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if [ "$gpus" -lt 2 ]; then
    row ranks "not run" "$gpus GPU here: CudaRanks and bench --a2a nccl need 2 or more"
  fi
  : >"$out/ranks.log"
  for n in 2 4 8; do
    [ "$n" -le "$gpus" ] || continue
    echo "== CudaRanks on $n GPUs"
    if run_ranks "$n" "$tests" --gtest_filter='*CudaRanks*' &&
      ! grep -q -E '^\[  SKIPPED \] [^ ]+$' "$build"/ranks/rank*.log; then
      row "ranks $n" ok "$(grep -h -E '^\[  PASSED  \]' "$build/ranks/rank0.log")"
    else
      row "ranks $n" FAILED "a rank failed or skipped (ranks.log)"
      status=1
    fi
    echo "== moekit bench --a2a nccl on $n GPUs"
    if run_ranks "$n" "$build/tools/moekit" bench --a2a nccl --experts 256 --top-k 8 \
      --hidden 7168 --intermediate 2048 --tokens 128,4096 --repeats 20; then
      row "a2a bench $n" ok "ranks.log"
    else
      row "a2a bench $n" FAILED "ranks.log"
      status=1
    fi
  done
else
  row "gpu tests" skipped "MOEKIT_GPU_TESTS=0 (a benchmark-only call)"
fi

if [ "${MOEKIT_GPU_BENCH:-1}" != 0 ] && [ -x bench/cuda/run.sh ]; then
  echo "== GPU benchmark (bench/cuda/run.sh)"
  if bench/cuda/run.sh "$build" "$out" >"$out/bench.log" 2>&1; then
    row bench ok "$(tail -n 1 "$out/bench.log")"
  else
    tail -n 20 "$out/bench.log"
    row bench FAILED "see bench.log"
    status=1
  fi
fi

if [ -n "${MOEKIT_AB_BASE:-}" ]; then
  IFS=';' read -r -a ab_sets <<<"${MOEKIT_AB_ARGS:---device cuda --case qwen3-30b-a3b --tokens 1 --weights bf16 --repeats 60}"
  : >"$out/ab.log"
  for i in "${!ab_sets[@]}"; do
    read -r -a ab_args <<<"${ab_sets[$i]}"
    echo "== A/B against $MOEKIT_AB_BASE: ${ab_args[*]}"
    # Each run's JSON stays in the build folder: what comes back from the device is a few files.
    # B is this tree: its moekit comes from the test build's folder, not a second compile.
    if AB_OUT="$build/ab/$i" AB_B_BUILD="$build" AB_CMAKE_FLAGS="${cmake_flags[*]}" \
      bench/ab.sh "$MOEKIT_AB_BASE" "${ab_args[@]}" >>"$out/ab.log" 2>&1; then
      row "a/b" ok "$(tail -n 1 "$out/ab.log")"
    else
      tail -n 20 "$out/ab.log"
      row "a/b" FAILED "see ab.log"
      status=1
    fi
  done
fi

python3 - "$out/gpu_summary.json" "$status" "${rows[@]}" <<'PY'
import json, sys
path, status, rows = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
steps = []
for row in rows:
    cells = [c.strip() for c in row.strip("|").split("|", 2)]
    steps.append({"step": cells[0], "result": cells[1], "detail": cells[2]})
json.dump({"ok": status == 0, "steps": steps}, open(path, "w"), indent=2)
PY
echo
echo "| step         | result      | detail"
printf '%s\n' "${rows[@]}"
exit "$status"
