#!/usr/bin/env bash
# The virtual environment of the Python tests, build/pyenv: nanobind (so that the release build
# makes the module), numpy, pytest, and torch with transformers unless MOEKIT_PYTHON_TORCH=0.
# Installed once: a second run with the same requirements does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir=build/pyenv
requirements=(python/requirements-test.txt)
[ "${MOEKIT_PYTHON_TORCH:-1}" = 0 ] || requirements+=(python/requirements-torch.txt)
stamp=$(cat "${requirements[@]}" | sha256sum | cut -c1-16)
if [ -f "$env_dir/.moekit-$stamp" ]; then
  echo "python_env: $env_dir is up to date"
  exit 0
fi
rm -rf "$env_dir"
python3 -m venv "$env_dir"
args=()
for file in "${requirements[@]}"; do args+=(-r "$file"); done
# Bounded: a stalled download fails the stage instead of hanging CI.
timeout 900 "$env_dir/bin/pip" install --quiet --no-cache-dir --disable-pip-version-check "${args[@]}"
touch "$env_dir/.moekit-$stamp"
