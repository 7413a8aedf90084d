#!/usr/bin/env bash
# Builds everything (libraries, `reshard`, every test binary and the libFuzzer
# harnesses) with clang under AddressSanitizer + UndefinedBehaviorSanitizer in
# build-sanitize/ (cmake/sanitize.cmake, cmake/fuzz.cmake): -O1, every report
# fatal, no CUDA. One build serves both CI stages that need it:
# tools/test.d/40-sanitize.sh (the whole test suite) and 50-fuzz.sh;
# tools/test.sh starts it in the background before the stages. One build at a
# time: a second call waits for the first, then finds nothing left to do.
# Installs clang first where it is missing (tools/setup.sh --tests does).
# Prints the build directory.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build-sanitize
exec 9>build-sanitize/.build.lock
flock 9
if ! command -v clang++ >/dev/null || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang libclang-rt-14-dev >&2
fi
cmake -S . -B build-sanitize -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O1 -g1" \
  -DCMAKE_CXX_COMPILER=clang++ -DRESHARD_SANITIZE=ON -DRESHARD_FUZZ=ON -DRESHARD_WITH_CUDA=OFF >/dev/null
ninja -C build-sanitize -j2 >&2
echo build-sanitize
