#!/usr/bin/env bash
# The GPU checks, for a machine with a CUDA device, nvcc and NCCL: configures
# and builds with the CUDA path on, runs the GPU tests (ctest label `gpu`) and
# the CPU tests of the device path, then the kernel benchmark, and prints a
# short table. Usage: tools/gpu-check.sh [build-dir] (default build-gpu).
# RESHARD_CUDA_ARCHITECTURES overrides the architectures (default 90).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
JOBS=${JOBS:-16}
ARCH=${RESHARD_CUDA_ARCHITECTURES:-90}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: none"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRESHARD_WITH_CUDA=ON \
  -DRESHARD_CUDA_ARCHITECTURES="$ARCH" >"$BUILD.configure.log" 2>&1 || { tail -30 "$BUILD.configure.log"; exit 1; }
start=$(date +%s)
ninja -C "$BUILD" -j"$JOBS" reshard_runtime reshard reshard_gpu_test reshard_cuda_cpu_test gpu_kernel_bench \
  >"$BUILD.build.log" 2>&1 || { tail -40 "$BUILD.build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"

(cd "$BUILD" && ctest -L gpu --output-on-failure --timeout 300 >ctest-gpu.log 2>&1)
gpu_rc=$?
ctest_rc=$gpu_rc
(cd "$BUILD" && ctest -R 'RegionPlanTest|GpuHooksTest' --timeout 300 >ctest-cuda-cpu.log 2>&1)
cpu_rc=$?

echo
printf '%-62s %s\n' "test" "result"
grep -E '^ *[0-9]+/[0-9]+ Test +#' "$BUILD/ctest-gpu.log" "$BUILD/ctest-cuda-cpu.log" -h |
  sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) \.+ *(\*\*\*)?([A-Za-z]+).*/\1 \3/' |
  awk '{printf "%-62s %s\n", $1, $2}'
# On the machine this script is for, a skipped GPU test checked nothing: a failure.
if grep -q "Skipped" "$BUILD/ctest-gpu.log"; then
  echo "GPU tests skipped: $("$BUILD/reshard_gpu_test" 2>&1 | grep -m1 'GPU test skipped' | sed 's/.*skipped: //')"
  gpu_rc=1
fi
[ $ctest_rc -ne 0 ] && { echo; echo "GPU test failures:"; grep -B2 -A20 "Failure\|FAILED" "$BUILD/ctest-gpu.log" | head -80; }

echo
"$BUILD/gpu_kernel_bench"
bench_rc=$?
echo
echo "gpu tests: $([ $gpu_rc -eq 0 ] && echo ok || echo FAILED), cpu tests of the device path: $([ $cpu_rc -eq 0 ] && echo ok || echo FAILED), bench: $([ $bench_rc -eq 0 ] && echo ok || echo FAILED)"
exit $(( gpu_rc || cpu_rc || bench_rc ))
