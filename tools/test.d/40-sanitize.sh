#!/usr/bin/env bash
# CI stage: the whole test suite (every ctest of the plain build) built with
# clang under AddressSanitizer + UndefinedBehaviorSanitizer
# (tools/sanitize_build.sh, build-sanitize/), every report fatal, leaks
# included where LeakSanitizer can run. Some tests skip there, each saying
# why: two run `reshard` under `ulimit -v`, which ASan's shadow memory cannot
# fit; six compile plans of 256-1536 ranks, far slower there (their code
# runs there on the other tests' smaller plans; every plain build runs them
# all); one checks the flow estimate's default budget on 4 peers only (64
# peers take too long there).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=$(tools/sanitize_build.sh)
# intercept_tls_get_addr=0: clang 14's runtime takes a dynamic TLS block that
# lands 16 bytes past a 4 KiB boundary for a pre-2.25 glibc one and records
# the two words before it as the block's range (compiler-rt,
# sanitizer_tls_get_addr.cpp, DTLS_on_tls_get_addr; google/sanitizers#1322).
# `reshard simulate` dlopens libreshard_simgrid.so, whose thread_locals are
# such blocks; a `simulate` has ended in "Tracer caught signal 11" at exit,
# rarely, with no leak found. Without
# the interception LeakSanitizer does not scan dynamic TLS for roots; nothing
# of ours keeps heap memory only there.
export ASAN_OPTIONS=abort_on_error=1:strict_string_checks=1:detect_leaks=1:intercept_tls_get_addr=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# LeakSanitizer needs ptrace, which some containers deny: then run without it.
if ! "$build/reshard" --version >/dev/null 2>&1; then
  echo "40-sanitize: LeakSanitizer unavailable here, running without leak checks"
  export ASAN_OPTIONS=abort_on_error=1:strict_string_checks=1:detect_leaks=0:intercept_tls_get_addr=0
fi
(cd "$build" && ctest --output-on-failure -j2)
