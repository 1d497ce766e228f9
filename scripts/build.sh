#!/usr/bin/env bash
# Configures and builds one flavour: release (default), asan (AddressSanitizer + UBSan, with
# float-cast-overflow) or tsan (ThreadSanitizer; only the test binary, for the tests that use
# threads).
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=${1:-release}
targets=()
case "$flavour" in
  release) flags=(-DCMAKE_BUILD_TYPE=Release) ;;
  asan) flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOEKIT_SANITIZE=address) ;;
  tsan)
    flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOEKIT_SANITIZE=thread)
    targets=(--target moekit_tests)
    ;;
  *) echo "build.sh: unknown flavour '$flavour' (release, asan or tsan)" >&2; exit 1 ;;
esac
cmake -S . -B "build/$flavour" "${flags[@]}" >/dev/null
cmake --build "build/$flavour" -j "$(nproc)" "${targets[@]}"
