#!/usr/bin/env bash
# Real vLLM 0.33.0 on CPU (tests/vllm), in build/vllm-venv (tools/vllm_venv.sh:
# vLLM pins torch 2.14, so it has a venv of its own, cached like build/venv):
#  1. every vLLM case of tests/data/recorded built on real vLLM ranks and
#     dumped; each dump must equal the recorded one (tests/vllm/record.py;
#     RecordedDumps in ctest checks `reshard init` against them);
#  2. reshard.vllm's checks on a real rank (tests/vllm/worker_checks.py);
#  3. vLLM's own weight-transfer doors: `vllm serve` (API server, engine core,
#     TP2 workers) finds reshard's engines through the vllm.general_plugins
#     entry point, and a two-rank trainer refits it through
#     WeightTransferTrainerFactory.trainer_init / send_weights and vLLM's HTTP
#     client, one init dict for every worker (tests/vllm/doors.py);
#  4. live refits: real Megatron-Core ranks, a BF16 HF rank, and real FSDP2
#     ranks (transformers Qwen3, TP2 x FSDP2, fp32 masters; build/venv) into
#     real vLLM ranks through one plan, twice, every parameter and buffer of
#     each vLLM rank equal to a fresh vLLM load after each
#     (tests/vllm/refit_live.py).
# Installs the Python package into both venvs (tools/python_install.sh).
# Skips (exit 0, with a message) only when the Python package registry
# cannot be reached.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/stage_venv.sh
start=$(date +%s)
VPY=$(stage_venv tools/vllm_venv.sh "vLLM") || stage_venv_exit $?
PY=$(stage_venv tools/venv.sh "Megatron-Core") || stage_venv_exit $?
set -e
echo "25-vllm: venvs ready in $(( $(date +%s) - start )) s"
tools/python_install.sh "$VPY"
tools/python_install.sh "$PY"
t=$(date +%s)
"$VPY" tests/vllm/record.py --build build
echo "25-vllm: real vLLM dumps checked in $(( $(date +%s) - t )) s"
t=$(date +%s)
"$VPY" tests/vllm/worker_checks.py --build build
echo "25-vllm: worker checks in $(( $(date +%s) - t )) s"
t=$(date +%s)
"$VPY" tests/vllm/doors.py --build build
echo "25-vllm: vLLM's weight-transfer doors in $(( $(date +%s) - t )) s"
t=$(date +%s)
"$PY" tests/vllm/refit_live.py --build build --vllm-python "$VPY"
echo "25-vllm: live refits in $(( $(date +%s) - t )) s"
