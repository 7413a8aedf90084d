#!/usr/bin/env bash
# Builds ./python (pip, scikit-build-core, nanobind; CPU only: RESHARD_WITH_CUDA
# OFF) into the interpreter given as $1, keeping the build tree in
# build-python/ so that a rebuild compiles only what changed. The tree lies
# at the depth of build/ and compiles with build/'s compiler, so that through
# ccache (cmake/ccache.cmake) it takes build/'s objects of the runtime, the
# compiler and the CLI instead of compiling them again. Used by the test
# stages that `import reshard` (tools/test.d/20-megatron.sh, 25-vllm.sh,
# 30-python.sh, 35-fsdp2.sh); tools/gpu-check.sh builds it with CUDA.
#
# The extension does not link torch, so one wheel serves every venv of the
# same Python version: for another venv (build/vllm-venv, which pins its own
# torch) the wheel is built in build/venv's tree (nothing recompiles when
# build/venv got it already) and installed from build/python-dist. A venv of
# another Python version gets a build tree of its own (build-python-NAME/).
#
#   tools/python_install.sh "$(tools/venv.sh)"
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$1
# build/'s compiler (scikit-build-core would take g++ where CMake took c++: the same
# compiler, another name, which ccache tells apart).
compiler=()
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' build/CMakeCache.txt 2>/dev/null || true)
[ -n "$cxx" ] && compiler=(-C cmake.define.CMAKE_CXX_COMPILER="$cxx")
version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }
env_name=$(basename "$(dirname "$(dirname "$PY")")")
builder=$PY
tree=build-python
if [ "$env_name" != venv ]; then
  if [ -x build/venv/bin/python ] && [ "$(version build/venv/bin/python)" = "$(version "$PY")" ]; then
    builder=build/venv/bin/python
  else
    tree=build-python-$env_name
  fi
fi
mkdir -p build
exec 9>build/python-install.lock
flock 9  # one build at a time: stages and users share the build tree and the wheel folder
start=$(date +%s)
dist=build/python-dist/$(version "$builder")
rm -rf "$dist"
mkdir -p "$dist"
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} "$builder" -m pip wheel -q --no-build-isolation --no-deps \
  -C build-dir="$(pwd)/$tree" -C cmake.define.RESHARD_WITH_CUDA=OFF "${compiler[@]}" -w "$dist" ./python
"$PY" -m pip install -q --no-deps --force-reinstall "$dist"/reshard-*.whl
echo "python_install: ./python into $env_name took $(( $(date +%s) - start )) s" >&2
