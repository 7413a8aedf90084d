#!/usr/bin/env bash
# Creates (or reuses) the virtual environment with real vLLM 0.33.0 on CPU
# under build/vllm-venv (RESHARD_VLLM_VENV), from tools/vllm-requirements.txt,
# through tools/venv.sh: cached, rebuilt only when the requirements file
# changes; prints the venv's python; exit 3 when the package registry cannot
# be reached. Holds vLLM, SGLang, verl and TRL (see the requirements file);
# vLLM pins torch 2.14.0, so it cannot share build/venv.
#
#   PY=$(tools/vllm_venv.sh) && "$PY" -c 'import vllm'
set -euo pipefail
cd "$(dirname "$0")/.."
RESHARD_VENV=${RESHARD_VLLM_VENV:-build/vllm-venv} RESHARD_VENV_REQUIREMENTS=tools/vllm-requirements.txt \
  exec tools/venv.sh
