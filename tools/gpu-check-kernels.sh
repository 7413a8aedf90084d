#!/usr/bin/env bash
# The proof of vLLM 0.33's GPU-only kernel formats (docs/kernels.md, "waits
# for a GPU run"), for one H100 / H200 / B200 with vLLM 0.33.0 installed:
# tests/vllm/kernels_gpu.py builds vLLM ranks with their *default* kernels
# (DeepGEMM block FP8 linears with UE8M0 requantization, DeepGEMM or TRT-LLM
# FP8 experts, MLA under DeepGEMM, TRT-LLM BF16 experts on Blackwell), refits
# each twice in place through reshard.vllm.WorkerRefit over a one-rank NCCL
# communicator (a colocated plan: the BF16 source tensors on the same GPU),
# and compares every parameter and buffer with a fresh vLLM load, bit for
# bit. About 3 minutes on an H100 once the package is built (three cases,
# each a fresh process: vLLM's import, two model loads per refit).
#
#   tools/gpu-check-kernels.sh [work-dir]
#
# RESHARD_VLLM_PYTHON: the Python with vLLM 0.33.0 and torch with CUDA
#   (default python3).
# RESHARD_PYTHON_CUDA: a folder holding the reshard package built with CUDA
#   (pip install --target DIR -C cmake.define.RESHARD_WITH_CUDA=ON ./python);
#   without it the package is built here into build-gpu/python-cuda-vllm
#   (needs nvcc, cmake, ninja, scikit-build-core and nanobind in that Python).
# Exit 0: every case equals a fresh load after each refit; then the kernels
# it names ("proving") may join reshard.vllm.PROVEN_KERNELS (and
# STAGING_PROVEN), with the device named in docs/kernels.md.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${RESHARD_VLLM_PYTHON:-python3}
WORK=${1:-$(mktemp -d /tmp/reshard-gpu-kernels.XXXXXX)}
mkdir -p "$WORK"
start=$(date +%s)
if ! "$PY" - <<'EOF'
import sys
import torch
import vllm
problems = []
if vllm.__version__ != "0.33.0":
    problems.append(f"vLLM {vllm.__version__}, not 0.33.0")
if not torch.cuda.is_available():
    problems.append("no CUDA device")
if problems:
    sys.exit("gpu-check-kernels: " + "; ".join(problems))
cc = torch.cuda.get_device_capability(0)
print(f"gpu-check-kernels: {torch.cuda.get_device_name(0)} (sm{cc[0]}{cc[1]}), vLLM {vllm.__version__}, "
      f"torch {torch.__version__}")
EOF
then
  exit 1
fi
TARGET=${RESHARD_PYTHON_CUDA:-}
if [ -z "$TARGET" ]; then
  ARCH=$("$PY" -c 'import torch; a, b = torch.cuda.get_device_capability(0); print(f"{a}{b}")')
  TARGET=build-gpu/python-cuda-vllm
  rm -rf "$TARGET"
  mkdir -p build-gpu
  t=$(date +%s)
  "$PY" -m pip install -q --no-build-isolation --no-deps --target "$TARGET" \
    -C build-dir=build-gpu/python-wheel-vllm -C cmake.define.RESHARD_WITH_CUDA=ON \
    -C cmake.define.RESHARD_CUDA_ARCHITECTURES="$ARCH" ./python >build-gpu/python-vllm.log 2>&1 ||
    { tail -20 build-gpu/python-vllm.log; echo "gpu-check-kernels: building the package failed"; exit 1; }
  echo "gpu-check-kernels: package built with CUDA (sm$ARCH) in $(( $(date +%s) - t )) s"
fi
t=$(date +%s)
PYTHONPATH="$PWD/$TARGET${PYTHONPATH:+:$PYTHONPATH}" timeout 600 "$PY" tests/vllm/kernels_gpu.py --work "$WORK" \
  2>&1 | tee "$WORK/kernels_gpu.log"
rc=${PIPESTATUS[0]}
echo "gpu-check-kernels: cases in $(( $(date +%s) - t )) s, all in $(( $(date +%s) - start )) s (log: $WORK/kernels_gpu.log)"
exit "$rc"
