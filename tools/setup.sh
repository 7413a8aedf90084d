#!/usr/bin/env bash
# Installs everything reshard needs to build and test, from Debian packages.
# Idempotent; run as root (or with sudo) on a fresh Debian 12 machine.
#   tools/setup.sh           what the build and the demo need (tools/demo.sh)
#   tools/setup.sh --tests   and what the test stages need besides
#                            (tools/test.sh): clang with its sanitizer and
#                            libFuzzer runtimes (40-sanitize, 50-fuzz) and
#                            python3-venv (the framework stages' venvs, where
#                            there is no Python 3.12 of pyenv's). Installed
#                            here, before test.sh starts its background jobs,
#                            so that no two of them run apt-get at once.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config ccache
      libcli11-dev nlohmann-json3-dev libflatbuffers-dev flatbuffers-compiler
      libgtest-dev libgmock-dev libgloo-dev libsimgrid-dev libxxhash-dev libzstd-dev libjemalloc-dev)
case "${1:-}" in
  "") ;;
  --tests) pkgs+=(clang libclang-rt-14-dev python3-venv) ;;
  *) echo "usage: tools/setup.sh [--tests]" >&2; exit 2 ;;
esac
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
