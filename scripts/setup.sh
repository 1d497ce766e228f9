#!/usr/bin/env bash
# Installs, from Debian's packages, whatever the build and tests need and this machine lacks.
set -euo pipefail

packages=(cmake g++ make libgtest-dev nlohmann-json3-dev libcli11-dev libfmt-dev clang-format clang
  libclang-rt-14-dev openmpi-bin libopenmpi-dev)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi
