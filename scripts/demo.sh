#!/usr/bin/env bash
# From a fresh machine: install what is missing, build, and run `moekit demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release
build/release/tools/moekit demo "$@"
