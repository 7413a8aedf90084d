#!/usr/bin/env bash
# Installs the dependencies (Debian packages), builds everything with -j2 and
# runs the whole test suite: the C++ tests (ctest), then every further stage
# in tools/test.d/ in name order (each one script: Python tests, sanitizers,
# fuzzing). A stage that fails fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
ninja -C build -j2
(cd build && ctest --output-on-failure -j2)
for stage in tools/test.d/*.sh; do
  [ -e "$stage" ] || continue
  echo "== test stage: $stage"
  start=$(date +%s)
  bash "$stage"
  echo "== $stage passed in $(( $(date +%s) - start )) s"
done
