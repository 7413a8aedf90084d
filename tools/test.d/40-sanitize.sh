#!/usr/bin/env bash
# CI stage: the whole test suite (every ctest of the plain build) built with
# clang under AddressSanitizer + UndefinedBehaviorSanitizer
# (tools/sanitize_build.sh, build-sanitize/), every report fatal, leaks
# included where LeakSanitizer can run. Some tests skip there, each saying
# why: two run `reshard` under `ulimit -v`, which ASan's shadow memory cannot
# fit; six compile plans of 256-1536 ranks, a minute or more each there
# (their code runs there on the other tests' smaller plans; every plain build
# runs them all); one checks the flow estimate's default budget on 4 peers
# only (64 peers took 70 s).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=$(tools/sanitize_build.sh)
export ASAN_OPTIONS=abort_on_error=1:strict_string_checks=1:detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# LeakSanitizer needs ptrace, which some containers deny: then run without it.
if ! "$build/reshard" --version >/dev/null 2>&1; then
  echo "40-sanitize: LeakSanitizer unavailable here, running without leak checks"
  export ASAN_OPTIONS=abort_on_error=1:strict_string_checks=1:detect_leaks=0
fi
(cd "$build" && ctest --output-on-failure -j2)
