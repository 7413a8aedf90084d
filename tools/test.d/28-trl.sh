#!/usr/bin/env bash
# Real TRL 1.16 on CPU (tests/trl), in build/vllm-venv (tools/vllm_venv.sh:
# vLLM 0.33, TRL without its vllm extra): reshard.trl replaces
# VLLMGeneration.sync_weights of a real GRPOTrainer (FSDP2 through accelerate,
# 2 Gloo processes, a tiny Qwen3 and a tokenizer built locally; generation by
# the HF policy, since a colocated vllm.LLM cannot be built on this CPU) with
# one colocated reshard refit into the vLLM 0.33 rank each process holds
# (built as tests/vllm builds it). After each of two GRPO steps every vLLM
# tensor equals a fresh vLLM load of the trainer's weights, bit for bit;
# TRL's own sync_weights gives the same engine; the refusals at setup and a
# sync failing on one rank are checked on both ranks (tests/trl/run.py).
# It then times 10 syncs of each path on both ranks and prints them (for the
# record only: tools/bench/trl_bench.py is the benchmark).
# Skips (exit 0, with a message) only when the Python package registry cannot
# be reached.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/stage_venv.sh
start=$(date +%s)
VPY=$(stage_venv tools/vllm_venv.sh "vLLM and TRL") || stage_venv_exit $?
set -e
echo "28-trl: venv ready in $(( $(date +%s) - start )) s"
tools/python_install.sh "$VPY"
t=$(date +%s)
"$VPY" tests/trl/run.py --build build --bench 10
echo "28-trl: GRPO steps refit through reshard.trl in $(( $(date +%s) - t )) s; stage $(( $(date +%s) - start )) s"
