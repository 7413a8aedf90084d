#!/usr/bin/env bash
# CI stage: the runtime and compiler test suites (every plan check, the
# executor, the kernels, the spec parsers, the compiler) built with gcc under
# AddressSanitizer + UndefinedBehaviorSanitizer in build-asan/, every report
# fatal. The simulator and tools test suites are left to the normal build
# (CI time; they hold no plan-reading or runtime code of their own). `reshard`
# is built here with the sanitizers too, since the tests run it.
# RESHARD_SANITIZE_TARGETS overrides the test binaries built and run.
set -euo pipefail
cd "$(dirname "$0")/../.."
targets=${RESHARD_SANITIZE_TARGETS:-"reshard_runtime_test reshard_compiler_test"}
flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRESHARD_WITH_CUDA=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" >/dev/null
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
