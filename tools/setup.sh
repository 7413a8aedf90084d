#!/usr/bin/env bash
# Installs everything reshard needs to build and test, from Debian packages.
# Idempotent; run as root (or with sudo) on a fresh Debian 12 machine.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config
      libcli11-dev nlohmann-json3-dev libflatbuffers-dev flatbuffers-compiler
      libgtest-dev libgmock-dev libgloo-dev libsimgrid-dev libxxhash-dev libzstd-dev libjemalloc-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
