#!/usr/bin/env bash
# All tests: formatting, bounded fuzz runs of the file readers, the release build, the same tests
# under ASan + UBSan, and the tests that use threads under TSan. The last lines are the
# summary of the TSan run.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's start, in seconds since this script began: CI's whole run must stay under 45
# minutes, and these lines say where the time goes.
started=$SECONDS
phase() { echo "== [$((SECONDS - started)) s] $*"; }
scripts/setup.sh

phase "clang-format"
git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' | xargs clang-format --dry-run -Werror

phase "fuzz: the readers of files users hand us (bounded time each)"
fuzzers=(spec_json_fuzzer:spec_json safetensors_fuzzer:safetensors hf_config_fuzzer:hf_config)
CXX=clang++ cmake -S . -B build/fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOEKIT_FUZZ=ON -DMOEKIT_TESTS=OFF \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG" >/dev/null
cmake --build build/fuzz -j "$(nproc)" --target "${fuzzers[@]%%:*}"
# Inputs that crash, leak or time out, and each failing run's log, are kept outside the
# repository; the corpus in the repository is only read, new inputs go to a scratch directory.
findings=$(mktemp -d "${TMPDIR:-/tmp}/moekit-fuzz.XXXXXX")
echo "fuzz: inputs that fail and their logs go to $findings"
failed=()
for entry in "${fuzzers[@]}"; do
  fuzzer=${entry%%:*} corpus=${entry##*:}
  echo "-- $fuzzer"
  scratch=$(mktemp -d)
  log="$findings/$fuzzer.log"
  if "build/fuzz/fuzz/$fuzzer" -max_total_time="${MOEKIT_FUZZ_SECONDS:-30}" -print_final_stats=1 \
    -artifact_prefix="$findings/$fuzzer-" "$scratch" "fuzz/corpus/$corpus" >"$log" 2>&1; then
    tail -n 3 "$log"
    rm "$log"
  else
    # The whole report (sanitizer trace, the input's file, the stats) without libFuzzer's
    # progress lines ("#1234 NEW cov: ...").
    grep -v -E '^#[0-9]+[[:space:]]' "$log" || true
    failed+=("$fuzzer")
  fi
  rm -rf "$scratch"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: ${failed[*]} found failing inputs, kept in $findings" >&2
  echo "fuzz: reproduce one with build/fuzz/fuzz/<fuzzer> <file>" >&2
  exit 1
fi
rmdir "$findings"

phase "python: the test environment (build/pyenv, from PyPI; kept between runs)"
scripts/python_env.sh

# The gtest binary, one shard per core, each shard one process (a test's failure and the
# skipped tests are listed in its shard's log, printed when it fails); bounded in time.
run_gtest_shards() {
  local binary=$1 shards
  shards=$(nproc)
  local logs=() pids=() failed=0
  for ((i = 0; i < shards; i++)); do
    logs+=("$(mktemp "${TMPDIR:-/tmp}/moekit-shard.XXXXXX")")
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout "${MOEKIT_TEST_SECONDS:-1800}" \
      "$binary" --gtest_brief=1 >"${logs[$i]}" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < shards; i++)); do
    if wait "${pids[$i]}"; then
      grep -E '^\[  (PASSED|SKIPPED) +\]|tests? from .* ran' "${logs[$i]}" || true
    else
      echo "-- shard $i of $binary failed (exit $?):"
      cat "${logs[$i]}"
      failed=1
    fi
    rm -f "${logs[$i]}"
  done
  return "$failed"
}

for flavour in release asan; do
  phase "$flavour build"
  scripts/build.sh "$flavour"
  phase "$flavour tests"
  run_gtest_shards "build/$flavour/tests/moekit_tests"
  (cd "build/$flavour" && ctest --output-on-failure -j "$(nproc)" -LE gtest)
  if [ "$flavour" = release ]; then
    phase "python tests, against the release build's module"
    PYTHONPATH=build/release/python build/pyenv/bin/python -m pytest python/tests -q -p no:cacheprovider
  fi
done

# The thread pool and its users (top-k selection), the overlapped block form (its shared experts
# on a thread of their own) in every format, and the AVX2 layer on all the machine's threads; one
# process, since TSan is slow. The leading * takes the parameterised suites' prefixes. The TSan
# test binary is built from the files holding these suites only (tests/CMakeLists.txt lists them).
phase "tsan build (the test binary only)"
scripts/build.sh tsan
phase "tsan tests: the ones that use threads"
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}" \
  build/tsan/tests/moekit_tests --gtest_brief=1 \
  --gtest_filter='*ThreadPool*:*Overlapped*:*SharedExperts.*:*QuantizedLayerForms.*:*LayerThreads*:*CpuLayer*/all_*'
phase "done"
