#!/usr/bin/env bash
# Refits that land in a live SGLang 0.5.23 (tests/sglang/refit_live.py): real
# Megatron-Core ranks (build/venv) and a BF16 HF rank refit real SGLang CPU
# ranks (build/vllm-venv, tools/vllm_venv.sh: SGLang shares vLLM's venv)
# through one plan, twice, inside SGLang's own weight-update session
# (begin_weight_update, update_weights_from_tensor naming reshard's custom
# weight loader reshard.sglang.load_refit, end_weight_update); after each,
# every parameter, buffer and derived MLA attribute of each SGLang rank
# equals a fresh SGLang load of the same checkpoint, bit for bit, and no
# parameter or buffer moved in memory. Cases: dense TP4 (replicated KV
# heads), Qwen3-MoE TP2 EP2 with attention DP 2, DeepSeek-style MLA FP8 with
# a shared expert held apart. Installs the Python package into both
# venvs (tools/python_install.sh). Skips (exit 0, with a message) only when
# the Python package registry cannot be reached.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/stage_venv.sh
start=$(date +%s)
VPY=$(stage_venv tools/vllm_venv.sh "SGLang") || stage_venv_exit $?
PY=$(stage_venv tools/venv.sh "Megatron-Core") || stage_venv_exit $?
set -e
echo "27-sglang-refit: venvs ready in $(( $(date +%s) - start )) s"
tools/python_install.sh "$VPY"
tools/python_install.sh "$PY"
t=$(date +%s)
"$VPY" -m pytest -q -p no:cacheprovider python/tests/test_sglang_door.py
echo "27-sglang-refit: reshard.sglang's door checks in $(( $(date +%s) - t )) s"
t=$(date +%s)
"$PY" tests/sglang/refit_live.py --build build --sglang-python "$VPY"
echo "27-sglang-refit: live SGLang refits in $(( $(date +%s) - t )) s"
