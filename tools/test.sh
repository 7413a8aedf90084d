#!/usr/bin/env bash
# Installs the dependencies (Debian packages), builds everything with -j2 and
# runs the whole test suite: the C++ tests (ctest), then every further stage
# in tools/test.d/ in name order (each one script: Python tests, sanitizers,
# fuzzing). A stage that fails fails the run.
#
# Two long jobs of later stages run in the background from the start of
# ctest, at the lowest CPU priority, so that they take only the cores the
# tests leave idle (a venv's pip install keeps one core busy, the framework
# tests' ranks wait on each other): the sanitizer build (40-sanitize,
# 50-fuzz; tools/sanitize_build.sh) and the vLLM venv (25-vllm;
# tools/vllm_venv.sh). Each stage still calls its script, which waits for the
# background one (a lock) and then finds its work done - or, where the
# background one failed, does it again in the foreground and shows why.
# Their logs: build/logs/.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh --tests
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
ninja -C build -j2
mkdir -p build/logs
background=()
trap 'for p in "${background[@]}"; do kill -- "-$p" 2>/dev/null || true; done' EXIT
for job in tools/sanitize_build.sh tools/vllm_venv.sh; do
  # Each in a session of its own, so that the trap stops its children too.
  # Linux shares the CPU between sessions first (autogroup), whatever their
  # processes' nice values: the session's own nice value (/proc/self/autogroup)
  # is lowered as well, or the job takes a core from the tests and ctest runs
  # far slower.
  setsid bash -c 'echo 19 >/proc/self/autogroup 2>/dev/null || true; exec nice -n 19 "$0"' "$job" \
    >"build/logs/$(basename "$job" .sh).log" 2>&1 &
  background+=($!)
done
(cd build && ctest --output-on-failure -j2)
for stage in tools/test.d/*.sh; do
  [ -e "$stage" ] || continue
  echo "== test stage: $stage"
  start=$(date +%s)
  bash "$stage"
  echo "== $stage passed in $(( $(date +%s) - start )) s"
done
