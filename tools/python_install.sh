#!/usr/bin/env bash
# Builds ./python (pip, scikit-build-core, nanobind; CPU only: RESHARD_WITH_CUDA
# OFF) into the interpreter given as $1, keeping the build tree in
# build/python-wheel (build/python-wheel-NAME for a venv named NAME) so that a
# rebuild compiles only what changed. Used by the
# test stages that `import reshard` (tools/test.d/20-megatron.sh,
# 30-python.sh); tools/gpu-check.sh builds it with CUDA.
#
#   tools/python_install.sh "$(tools/venv.sh)"
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$1
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
# One build tree per venv (build/python-wheel for build/venv, build/python-wheel-vllm-venv
# for build/vllm-venv): a tree configured for another interpreter would rebuild everything.
env_name=$(basename "$(dirname "$(dirname "$PY")")")
tree=build/python-wheel
[ "$env_name" = venv ] || tree=build/python-wheel-$env_name
start=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} "$PY" -m pip install -q --no-build-isolation --no-deps \
  -C build-dir="$(pwd)/$tree" -C cmake.define.RESHARD_WITH_CUDA=OFF "${launcher[@]}" ./python
echo "python_install: pip install ./python took $(( $(date +%s) - start )) s" >&2
