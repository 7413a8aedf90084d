#!/usr/bin/env bash
# Installs the dependencies (Debian packages), builds everything with -j2 and
# runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
ninja -C build -j2
cd build && ctest --output-on-failure -j2
