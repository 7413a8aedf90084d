#!/usr/bin/env bash
# Packs a CUDA build made here for a GPU machine that has the driver, NCCL and
# Python but none of the Debian packages reshard builds against (the lent H200
# machines: no package registry there): the GPU test and bench binaries, the
# runtime, the shared libraries they need beyond glibc/libstdc++/CUDA's (Gloo
# and its deps) and, when built, the CUDA build of the Python package.
#   tools/gpu-pack.sh [build-dir] [python-target-dir] [out-dir]
# (defaults build, build/python-cuda, .gpu). Then, there:
#   tools/gpu-check.sh --prebuilt .gpu
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
PYDIR=${2:-$BUILD/python-cuda}
OUT=${3:-.gpu}
bins=(reshard_gpu_test reshard_cuda_cpu_test gpu_kernel_bench gpu_executor_bench)
for b in "${bins[@]}"; do
  [ -x "$BUILD/$b" ] || { echo "gpu-pack: $BUILD/$b missing: configure with -DRESHARD_WITH_CUDA=ON and build it" >&2; exit 1; }
done
rm -rf "$OUT"; mkdir -p "$OUT/bin" "$OUT/lib"
for b in "${bins[@]}"; do cp "$BUILD/$b" "$OUT/bin/"; done
cp "$BUILD/libreshard_runtime.so" "$OUT/lib/"
# Libraries outside the base system and CUDA: found by ldd, copied with their
# sonames. libcudart and libnccl are the GPU machine's own.
ldd "$BUILD/libreshard_runtime.so" "${bins[@]/#/$BUILD/}" | awk '/=> \//{print $1, $3}' | sort -u |
  while read -r name path; do
    case "$name" in
      libc.so*|libm.so*|libgcc_s*|libstdc++*|libdl.so*|libpthread*|librt.so*|libnccl*|libreshard_runtime*) ;;
      *) cp -L "$path" "$OUT/lib/$name" ;;
    esac
  done
if [ -d "$PYDIR/reshard" ]; then cp -r "$PYDIR" "$OUT/py"; fi
echo "gpu-pack: $(du -sh "$OUT" | cut -f1) in $OUT ($(ls "$OUT/lib" | tr '\n' ' '))"
