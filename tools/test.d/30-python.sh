#!/usr/bin/env bash
# Test stage: the Python package. Installs ./python (tools/python_install.sh:
# pip, scikit-build-core, nanobind; build tree kept in build-python/)
# into the cached virtual environment of tools/venv.sh, then runs its pytest
# suite (python/tests). Skips with a message when the package registry cannot
# be reached to create that environment.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
set +e
PY=$(tools/venv.sh)
rc=$?
set -e
if [ $rc -eq 3 ]; then
  echo "30-python: SKIPPED: the Python package registry cannot be reached to create build/venv"
  exit 0
elif [ $rc -ne 0 ]; then
  echo "30-python: tools/venv.sh failed ($rc)" >&2
  exit 1
fi
# CPU tests: the package is built without the CUDA path (tools/gpu-check.sh
# builds and tests it with CUDA on a GPU machine); 20-megatron.sh installed it
# already (then this is a no-op build).
tools/python_install.sh "$PY"
# The tests compare against the CLI and use the benchmark's plan writer.
ninja -C build -j2 reshard python_overhead >/dev/null
cd python/tests
RESHARD_BIN="$root/build/reshard" "$PY" -m pytest -q -rs -p no:cacheprovider .
