#!/usr/bin/env bash
# Builds ./python (pip, scikit-build-core, nanobind; CPU only: RESHARD_WITH_CUDA
# OFF) into the interpreter given as $1, keeping the build tree in
# build/python-wheel so that a rebuild compiles only what changed. Used by the
# test stages that `import reshard` (tools/test.d/20-megatron.sh,
# 30-python.sh); tools/gpu-check.sh builds it with CUDA.
#
#   tools/python_install.sh "$(tools/venv.sh)"
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$1
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
start=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} "$PY" -m pip install -q --no-build-isolation --no-deps \
  -C build-dir="$(pwd)/build/python-wheel" -C cmake.define.RESHARD_WITH_CUDA=OFF "${launcher[@]}" ./python
echo "python_install: pip install ./python took $(( $(date +%s) - start )) s" >&2
