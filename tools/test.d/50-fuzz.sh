#!/usr/bin/env bash
# CI stage: the libFuzzer harnesses (tests/fuzz/, cmake/fuzz.cmake) built with
# clang and -fsanitize=fuzzer,address,undefined in build-fuzz/; each runs its
# whole regression corpus (every input of issue 17 and every finding since),
# then fuzzes for RESHARD_FUZZ_SECONDS (60) from its seed corpus. New inputs go
# to a scratch directory, never into the tree; a crash leaves its input in
# build-fuzz/findings/ and fails the stage.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${RESHARD_FUZZ_SECONDS:-30}
if ! command -v clang++ >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang libclang-rt-14-dev
fi
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DRESHARD_FUZZ=ON -DRESHARD_BUILD_TESTS=OFF -DRESHARD_WITH_CUDA=OFF >/dev/null
ninja -C build-fuzz -j2 reshard_plan_fuzz reshard_spec_fuzz
export ASAN_OPTIONS=abort_on_error=1:detect_leaks=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
mkdir -p build-fuzz/findings
for h in plan spec; do
  bin=build-fuzz/reshard_${h}_fuzz
  echo "== 50-fuzz: $h: regression corpus"
  "$bin" -runs=0 tests/fuzz/regressions/$h tests/fuzz/seeds/$h
  echo "== 50-fuzz: $h: ${seconds} s"
  scratch=$(mktemp -d)
  cp tests/fuzz/seeds/$h/* "$scratch"/
  log=build-fuzz/findings/$h.log
  if ! "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
      -artifact_prefix=build-fuzz/findings/$h- -dict=tests/fuzz/$h.dict "$scratch" >"$log" 2>&1; then
    tail -80 "$log"
    echo "50-fuzz: $h found a problem; its input is in build-fuzz/findings/"
    exit 1
  fi
  grep -E '^stat::number_of_executed_units|^Done ' "$log" || true
  rm -rf "$scratch"
done
