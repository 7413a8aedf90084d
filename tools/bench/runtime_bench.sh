#!/usr/bin/env bash
# Runtime benchmarks on 2 local ranks over Gloo (tools/bench/runtime_bench.cc):
#   a. per-step overhead of a plan of >100k small steps (target < 2 us/step),
#   b. strided bf16 pack/unpack of 256 MiB vs memcpy (target >= 50%),
#   c. a plan of large regions rank 0 -> rank 1 vs raw Gloo send/recv (target >= 80%),
#   d. a staged plan (pack, send, recv, unpack of 256 MiB strided bf16 in 16
#      rounds), pipelined, vs raw Gloo (target >= 85%), and the same in series.
# Prints a table of medians of 5 repetitions; exits non-zero if the benchmark fails
# to run (not when a target is missed). Takes seconds.
# Usage: tools/bench/runtime_bench.sh [build-dir] [runtime_bench options, e.g. --reps 9]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="$root/build"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  build="$1"
  shift
fi
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja >/dev/null
fi
ninja -C "$build" -j2 runtime_bench >/dev/null
exec "$build/runtime_bench" "$@"
