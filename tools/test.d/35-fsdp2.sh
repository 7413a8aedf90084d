#!/usr/bin/env bash
# Real FSDP2 on CPU: tests/fsdp2/run.py builds tiny Hugging Face
# transformers models (Qwen3, Qwen3-MoE with fused experts, Qwen3-Next) on 4
# Gloo processes, one launch for all cases: 1-D FSDP2 with fp32 masters and
# with bf16, HSDP 2x2, TP2 x FSDP2, fused experts sharded on dim 0 and on dim
# 1, activation checkpointing, Qwen3-Next's fused linear-attention parameters
# chunked whole; one AdamW step each. For every case `reshard init
# --train fsdp2:...` writes the specs, reshard.layout_from_module(model) must
# give the same buffers on every rank, `reshard check` finds zero differences
# between init's layout and every rank's dump (tools/dump_state_dict.py), and
# each rank's own FSDP2 memory (Session.bind_module) is refit bit-exact into
# an unsharded HF rank and into vLLM TP2 ranks (fused qkv/gate_up, w13/w2
# experts). Any difference fails the stage. Skips (exit 0, with a message)
# only when the Python package registry cannot be reached.
set -uo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
. tools/stage_venv.sh
PY=$(stage_venv tools/venv.sh "torch and transformers") || stage_venv_exit $?
set -e
venv_s=$(( $(date +%s) - start ))
tools/python_install.sh "$PY"  # waits for another build of the package holding its lock
install_s=$(( $(date +%s) - start - venv_s ))
"$PY" tests/fsdp2/run.py --build build
# tools/dump_state_dict.py on DTensors: local shapes, placements, mesh, wrapper names
"$PY" -m pytest -q -p no:cacheprovider tests/megatron/fsdp2_dump_test.py
echo "35-fsdp2: $(( $(date +%s) - start )) s (venv ${venv_s} s, package install ${install_s} s including any wait for its lock)"
