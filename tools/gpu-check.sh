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

# The Python package's NCCL surface (python/tests/test_nccl_gpu.py): built
# with CUDA into the venv of tools/venv.sh; skipped tests fail it here.
py_rc=0
if PY=$(tools/venv.sh 2>/dev/null); then
  "$PY" -m pip install -q --no-build-isolation --no-deps -C build-dir="$BUILD/python-wheel" \
    -C cmake.define.RESHARD_WITH_CUDA=ON -C cmake.define.RESHARD_CUDA_ARCHITECTURES="$ARCH" ./python \
    >"$BUILD.python.log" 2>&1 && (cd python/tests && "$PY" -m pytest -q -rs test_nccl_gpu.py) >>"$BUILD.python.log" 2>&1
  py_rc=$?
  grep -q "SKIPPED" "$BUILD.python.log" && py_rc=1
  tail -5 "$BUILD.python.log"
else
  echo "python: no venv (tools/venv.sh failed): NCCL Python tests not run"; py_rc=1
fi

echo
"$BUILD/gpu_kernel_bench"
bench_rc=$?
echo
echo "gpu tests: $([ $gpu_rc -eq 0 ] && echo ok || echo FAILED), cpu tests of the device path: $([ $cpu_rc -eq 0 ] && echo ok || echo FAILED), python nccl: $([ $py_rc -eq 0 ] && echo ok || echo FAILED), bench: $([ $bench_rc -eq 0 ] && echo ok || echo FAILED)"
exit $(( gpu_rc || cpu_rc || py_rc || bench_rc ))
