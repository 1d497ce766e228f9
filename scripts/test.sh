#!/usr/bin/env bash
# All tests: formatting, bounded fuzz runs of the file readers, the release build, and the same
# tests under ASan + UBSan. The last line is ctest's summary of the sanitized run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

echo "== clang-format"
git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' | xargs clang-format --dry-run -Werror

echo "== fuzz: the readers of files users hand us (bounded time each)"
fuzzers=(spec_json_fuzzer:spec_json safetensors_fuzzer:safetensors hf_config_fuzzer:hf_config)
CXX=clang++ cmake -S . -B build/fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOEKIT_FUZZ=ON -DMOEKIT_TESTS=OFF >/dev/null
cmake --build build/fuzz -j "$(nproc)" --target "${fuzzers[@]%%:*}"
for entry in "${fuzzers[@]}"; do
  fuzzer=${entry%%:*} corpus=${entry##*:}
  echo "-- $fuzzer"
  # New inputs go to a scratch directory; the corpus in the repository is only read.
  scratch=$(mktemp -d)
  "build/fuzz/fuzz/$fuzzer" -max_total_time="${MOEKIT_FUZZ_SECONDS:-30}" -print_final_stats=1 \
    "$scratch" "fuzz/corpus/$corpus" 2>&1 | tail -n 3
  rm -rf "$scratch"
done

for flavour in release asan; do
  echo "== $flavour build"
  scripts/build.sh "$flavour"
  echo "== $flavour tests"
  (cd "build/$flavour" && ctest --output-on-failure -j "$(nproc)")
done
