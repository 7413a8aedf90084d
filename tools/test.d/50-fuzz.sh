#!/usr/bin/env bash
# CI stage: the libFuzzer harnesses (tests/fuzz/, cmake/fuzz.cmake) built with
# clang and -fsanitize=fuzzer,address,undefined (tools/sanitize_build.sh, the
# build 40-sanitize ran the test suite in); each runs its whole regression
# corpus (the plan checks' regression cases and every finding), then fuzzes for
# RESHARD_FUZZ_SECONDS (30) from its seed corpus. New inputs go to a scratch
# directory, never into the tree; a crash leaves its input in
# build-sanitize/findings/ and fails the stage. (For long runs, a separate
# -O2 build: see cmake/fuzz.cmake.)
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${RESHARD_FUZZ_SECONDS:-30}
build=$(tools/sanitize_build.sh)
export ASAN_OPTIONS=abort_on_error=1:detect_leaks=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
mkdir -p "$build/findings"
for h in plan spec; do
  echo "== 50-fuzz: $h: regression corpus"
  "$build/reshard_${h}_fuzz" -runs=0 tests/fuzz/regressions/$h tests/fuzz/seeds/$h
done
# Both harnesses fuzz at once, one core each (one after the other, a core
# idled for the whole run).
fuzz() {  # harness
  local h=$1 scratch
  scratch=$(mktemp -d)
  cp tests/fuzz/seeds/$h/* "$scratch"/
  local status=0
  "$build/reshard_${h}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="$build/findings/$h-" -dict=tests/fuzz/$h.dict "$scratch" \
      >"$build/findings/$h.log" 2>&1 || status=$?
  rm -rf "$scratch"
  return $status
}
echo "== 50-fuzz: plan and spec: ${seconds} s each, at once"
declare -A pid
for h in plan spec; do
  fuzz $h &
  pid[$h]=$!
done
failed=0
for h in plan spec; do
  log=$build/findings/$h.log
  if wait "${pid[$h]}"; then
    echo "== 50-fuzz: $h:"
    grep -E '^stat::number_of_executed_units|^Done ' "$log" || true
  else
    tail -80 "$log"
    echo "50-fuzz: $h found a problem; its input is in $build/findings/"
    failed=1
  fi
done
exit $failed
