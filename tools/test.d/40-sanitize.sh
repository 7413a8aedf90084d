#!/usr/bin/env bash
# CI stage: the runtime test suite (every plan check, the executor, the
# kernels, plans compiled from specs and run end to end; it builds the compiler
# and `reshard` too) built with gcc at -O1 under AddressSanitizer +
# UndefinedBehaviorSanitizer in build-asan/, every report fatal. The compiler's
# own suite is left out for CI time (the 30-minute budget on 2 cores): the
# spec harness of 50-fuzz runs the parser and compiler under ASan + UBSan.
# RESHARD_SANITIZE_TARGETS overrides the test binaries built and run, e.g.
# "reshard_runtime_test reshard_compiler_test" for the fuller run.
set -euo pipefail
cd "$(dirname "$0")/../.."
targets=${RESHARD_SANITIZE_TARGETS:-"reshard_runtime_test"}
flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=None -DRESHARD_WITH_CUDA=OFF \
  -DCMAKE_CXX_FLAGS="-O1 -g1 $flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" >/dev/null
# shellcheck disable=SC2086
ninja -C build-asan -j2 $targets
export ASAN_OPTIONS=abort_on_error=1:strict_string_checks=1:detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# LeakSanitizer needs ptrace, which some containers deny: then run without it.
if ! build-asan/reshard --version >/dev/null 2>&1; then
  echo "40-sanitize: LeakSanitizer unavailable here, running without leak checks"
  export ASAN_OPTIONS=abort_on_error=1:strict_string_checks=1:detect_leaks=0
fi
for t in $targets; do
  echo "== 40-sanitize: $t"
  "build-asan/$t" --gtest_brief=1
done
