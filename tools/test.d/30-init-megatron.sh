#!/usr/bin/env bash
# reshard init against real Megatron-Core 0.19.2 on CPU: the specs `reshard
# init` writes for two of tests/megatron/cases.py's tiny models (TP4 with 2
# query groups plus a vLLM TP4 destination; MoE TP2 PP2 DP2 EP2 with expert-TP
# 2) are used by tests/megatron/refit.py --specs: every rank's real parameters
# must match init's training layout under `reshard check` with zero
# differences, and refit from the ranks' own memory bit-exact into HF (and
# into init's vLLM TP4 layout, against vLLM's weight loaders' shards). The
# other cases' zero-difference checks run in ctest (InitMegatron.*). Skips
# (exit 0, with a message) only when the Python package registry cannot be reached.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/stage_venv.sh
PY=$(stage_venv tools/venv.sh "Megatron-Core") || stage_venv_exit $?
set -e
specs=$(mktemp -d)
trap 'rm -rf "$specs"' EXIT
init() {  # CASE TRAIN [vllm]
  local d=tests/data/megatron/$1
  build/reshard init -q --hf-config "$d/config.json" --train "$2" --infer vllm:tp=4 -o "$specs/$1"
  if [ "${3:-}" = vllm ]; then mv "$specs/$1/infer.json" "$specs/$1/vllm-tp4.json"; else rm "$specs/$1/infer.json"; fi
}
init dense-tp4-qg2 megatron:tp=4,spec=local,vocab-divisible=16 vllm
init moe-tp2-pp2-dp2-ep2-etp2 megatron:tp=2,pp=2,dp=2,ep=2,etp=2,spec=local
"$PY" tests/megatron/refit.py --build build --specs "$specs" dense-tp4-qg2 moe-tp2-pp2-dp2-ep2-etp2
