#!/usr/bin/env bash
# tools/gpu-check.sh --prebuilt DIR: the GPU checks on what tools/gpu-pack.sh
# packed into DIR (a build made on a machine with the Debian packages). Runs
# the GPU tests, the CPU tests of the device path, the Python NCCL tests (when
# DIR/py holds a CUDA build of the package) and the kernel benchmark.
# A skipped GPU test counts as a failure here: this script is for GPU machines.
# The Python tests run on RESHARD_GPU_PYTHON (default python3), which needs
# torch with CUDA and pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
PRE=$(realpath "$1")
[ -x "$PRE/bin/reshard_gpu_test" ] || { echo "gpu-check: $PRE/bin/reshard_gpu_test missing (run tools/gpu-pack.sh)"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: none"
PY=${RESHARD_GPU_PYTHON:-python3}
# NCCL: the one of the machine's Python packages (nvidia-nccl-*), else CUDA's.
nccl=$("$PY" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
[ -f "$nccl/libnccl.so.2" ] || nccl=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnccl.so.2' 2>/dev/null | head -1)")
echo "nccl: $nccl"
export LD_LIBRARY_PATH="$PRE/lib:$nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
LOG=${OUT:-/tmp}/gpu-check
mkdir -p "$LOG"

run_gtest() {  # name binary [filter]: prints one line per test, returns non-zero on failure or skip
  local name=$1 bin=$2 filter=${3:-*}
  "$PRE/bin/$bin" --gtest_filter="$filter" >"$LOG/$name.log" 2>&1
  local rc=$?
  grep -E '^\[ +(OK|FAILED|SKIPPED) +\] [A-Za-z]' "$LOG/$name.log" | sed -E 's/^\[ +([A-Z]+) +\] ([^ ]+).*/\2 \1/' |
    sort -u | awk '{printf "%-62s %s\n", $1, $2}'
  grep -q '^\[  SKIPPED \]' "$LOG/$name.log" && { grep -m1 'GPU test skipped' "$LOG/$name.log"; rc=1; }
  [ $rc -ne 0 ] && { echo "$name failed:"; grep -B2 -A20 "Failure\|FAILED\|rror" "$LOG/$name.log" | head -60; }
  return $rc
}

printf '%-62s %s\n' "test" "result"
run_gtest gpu reshard_gpu_test; gpu_rc=$?
run_gtest cuda-cpu reshard_cuda_cpu_test 'RegionPlanTest*:GpuHooksTest*'; cpu_rc=$?

py_rc=0
if [ -d "$PRE/py/reshard" ]; then
  (cd python/tests && PYTHONPATH="$PRE/py" LD_LIBRARY_PATH="$PRE/py/reshard:$LD_LIBRARY_PATH" RESHARD_NCCL_LIBRARY="$nccl/libnccl.so.2" \
     "$PY" -m pytest -q -rs -p no:cacheprovider test_nccl_gpu.py) >"$LOG/python.log" 2>&1
  py_rc=$?
  grep -q "SKIPPED" "$LOG/python.log" && py_rc=1
  tail -8 "$LOG/python.log"
else
  echo "python: $PRE/py holds no reshard package: NCCL Python tests not run"; py_rc=1
fi

echo
"$PRE/bin/gpu_kernel_bench" 2>&1 | tee "$LOG/bench.log"
bench_rc=${PIPESTATUS[0]}
echo
"$PRE/bin/gpu_executor_bench" 2>&1 | tee "$LOG/executor-bench.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || bench_rc=1
echo
echo "gpu tests: $([ $gpu_rc -eq 0 ] && echo ok || echo FAILED), cpu tests of the device path: $([ $cpu_rc -eq 0 ] && echo ok || echo FAILED), python nccl: $([ $py_rc -eq 0 ] && echo ok || echo FAILED), bench: $([ $bench_rc -eq 0 ] && echo ok || echo FAILED)"
exit $(( gpu_rc || cpu_rc || py_rc || bench_rc ))
