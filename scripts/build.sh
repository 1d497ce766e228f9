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
  # The sanitizer builds at -O1 with line tables only: their reports keep file and line, and
  # they build in half the time of -O2 -g (ASan's was the longest phase of CI's run).
  asan)
    flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOEKIT_SANITIZE=address
      "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")
    ;;
  tsan)
    flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOEKIT_SANITIZE=thread
      "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")
    targets=(--target moekit_tests)
    ;;
  *) echo "build.sh: unknown flavour '$flavour' (release, asan or tsan)" >&2; exit 1 ;;
esac
# The release build makes the Python module too where scripts/python_env.sh has made its
# environment (MOEKIT_PYTHON=AUTO finds nanobind there).
if [ "$flavour" = release ] && [ -x build/pyenv/bin/python ]; then
  flags+=(-DPython_EXECUTABLE="$PWD/build/pyenv/bin/python")
fi
cmake -S . -B "build/$flavour" "${flags[@]}" >/dev/null
cmake --build "build/$flavour" -j "$(nproc)" "${targets[@]}"
