#!/usr/bin/env bash
# Runs `moekit bench` with the given flags, then a plain PyTorch MoE layer on the same cases, and
# prints both side by side (bench/README.md). MOEKIT=path uses that binary instead of building
# build/release; COMPARE_JSON=file is where the combined results go.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=bench/.venv
out=${COMPARE_JSON:-build/compare_torch.json}

# PyPI has no CPU-only torch for x86-64 Linux: its wheel links the CUDA libraries when it loads.
# torch without its dependencies, plus only the libraries its shared objects load (readelf -d
# torch/lib/*.so) and the one module `import torch` needs, leaves out triton, cuSOLVER and the
# CUDA Python bindings: 4.0 GB instead of 5.4 GB. Where these pins do not install or do not run
# (another platform, a Python that torch 2.15.0 lacks), the plain install is used.
trimmed=(typing-extensions numpy
  "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,cusparse,nvjitlink,nvrtc]==13.2.2"
  nvidia-cudnn-cu13==9.26.0.51 nvidia-cusparselt-cu13==0.8.1 nvidia-nccl-cu13==2.30.7
  nvidia-nvshmem-cu13==3.7.2)
torch_pin=torch==2.15.0
stamp="$torch_pin ${trimmed[*]}"

works() {
  "$venv/bin/python" -c 'import numpy, torch; torch.randn(2) @ torch.randn(2)' 2>/dev/null
}

install_venv_module() {
  command -v python3 >/dev/null && python3 -c 'import ensurepip, venv' 2>/dev/null && return
  echo "compare_torch: installing python3-venv"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq python3-venv >/dev/null
}

# The venv is kept between runs; the stamp, written last, says it was completed with these pins.
if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$stamp" ] || ! works; then
  install_venv_module
  rm -rf "$venv"
  python3 -m venv "$venv"
  echo "compare_torch: installing torch into $venv (about 4 GB, once)"
  # No pip cache: the venv itself is the cache, and a second copy of the wheels would be 3 GB.
  pip=("$venv/bin/pip" install --quiet --no-cache-dir --no-warn-conflicts)
  if ! { "${pip[@]}" --no-deps "$torch_pin" && "${pip[@]}" "${trimmed[@]}" && works; }; then
    echo "compare_torch: the trimmed install failed; installing torch with all its dependencies"
    "${pip[@]}" torch numpy
    works || { echo "compare_torch: torch does not run in $venv" >&2; exit 1; }
  fi
  echo "$stamp" >"$venv/.installed"
fi

moekit=${MOEKIT:-}
if [ -z "$moekit" ]; then
  scripts/build.sh release
  moekit=build/release/tools/moekit
fi
mkdir -p "$(dirname "$out")"
cases=$(mktemp)
trap 'rm -f "$cases"' EXIT
# moekit exits 2 when it refused some cases and 1 when a check failed, and still writes the
# others; --help and --list write nothing.
status=0
"$moekit" bench --json "$cases" "$@" || status=$?
[ -s "$cases" ] || exit "$status"
"$venv/bin/python" bench/torch_moe.py --cases "$cases" --out "$out"
echo "compare_torch: combined results in $out"
exit "$status"
