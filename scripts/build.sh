#!/usr/bin/env bash
# Configures and builds one flavour: release (default) or asan (AddressSanitizer + UBSan).
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=${1:-release}
case "$flavour" in
  release) flags=(-DCMAKE_BUILD_TYPE=Release) ;;
  asan) flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOEKIT_SANITIZE=ON) ;;
  *) echo "build.sh: unknown flavour '$flavour' (release or asan)" >&2; exit 1 ;;
esac
cmake -S . -B "build/$flavour" "${flags[@]}" >/dev/null
cmake --build "build/$flavour" -j "$(nproc)"
