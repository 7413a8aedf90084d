#!/usr/bin/env bash
# The GPU checks, for a machine with a CUDA device, nvcc, NCCL and the Debian
# packages of tools/setup.sh: configures and builds with the CUDA path on,
# builds the Python package with CUDA into the venv of tools/venv.sh, packs
# both (tools/gpu-pack.sh) and runs the checks of tools/gpu-check-prebuilt.sh
# on them: the GPU tests, the CPU tests of the device path, the Python NCCL
# tests, the kernel and executor benchmarks.
#   tools/gpu-check.sh [build-dir]      (default build-gpu)
#   tools/gpu-check.sh --prebuilt DIR   the checks alone, on what
#       tools/gpu-pack.sh packed elsewhere (GPU machines without the Debian
#       packages to build with), with the machine's driver, NCCL and python3
# RESHARD_CUDA_ARCHITECTURES overrides the architectures (default 90).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--prebuilt" ]; then
  exec bash tools/gpu-check-prebuilt.sh "${2:?--prebuilt needs the folder tools/gpu-pack.sh wrote}"
fi
BUILD=${1:-build-gpu}
JOBS=${JOBS:-16}
ARCH=${RESHARD_CUDA_ARCHITECTURES:-90}

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRESHARD_WITH_CUDA=ON \
  -DRESHARD_CUDA_ARCHITECTURES="$ARCH" >"$BUILD.configure.log" 2>&1 || { tail -30 "$BUILD.configure.log"; exit 1; }
start=$(date +%s)
ninja -C "$BUILD" -j"$JOBS" reshard_runtime reshard_gpu_test reshard_cuda_cpu_test gpu_kernel_bench gpu_executor_bench \
  >"$BUILD.build.log" 2>&1 || { tail -40 "$BUILD.build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"

# The Python package with CUDA, for the NCCL Python tests (skipped, and so
# failed, without a venv).
if PY=$(tools/venv.sh 2>/dev/null); then
  rm -rf "$BUILD/python-cuda"
  "$PY" -m pip install -q --no-build-isolation --no-deps --target "$BUILD/python-cuda" \
    -C build-dir="$BUILD/python-wheel" -C cmake.define.RESHARD_WITH_CUDA=ON \
    -C cmake.define.RESHARD_CUDA_ARCHITECTURES="$ARCH" ./python >"$BUILD.python.log" 2>&1 ||
    { tail -20 "$BUILD.python.log"; exit 1; }
  export RESHARD_GPU_PYTHON=$PY
else
  echo "python: no venv (tools/venv.sh failed): NCCL Python tests not run"
fi
tools/gpu-pack.sh "$BUILD" "$BUILD/python-cuda" "$BUILD/packed" || exit 1
exec bash tools/gpu-check-prebuilt.sh "$BUILD/packed"
