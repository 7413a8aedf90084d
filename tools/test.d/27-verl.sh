#!/usr/bin/env bash
# reshard as verl 0.9.1's checkpoint-engine backend (tests/verl/refit.py), in
# build/vllm-venv (tools/vllm_venv.sh: vLLM 0.33, with verl installed there
# without its dependencies): a local Ray cluster on this machine's CPUs runs
# verl's own ActorRolloutRefWorker (FSDP2 engine, a tiny Qwen3 over Gloo, two
# ranks), verl's CheckpointEngineWorker actors beside a real vLLM 0.33 engine
# (TP 2, CPU workers), and verl's CheckpointEngineManager.update_weights,
# which makes the "reshard" backend from the config
# (custom_backend_module=reshard.verl). Two updates with an optimizer step
# between: after each, every vLLM parameter and buffer equals a fresh vLLM
# load of the trainer's weights, bit for bit. Then the refusals (no plan,
# another model, another mesh, other rollout sizes, another verl version)
# and an update that fails on one rank.
# Installs the Python package into the venv (tools/python_install.sh).
# Skips (exit 0, with a message) only when the Python package registry
# cannot be reached.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/stage_venv.sh
start=$(date +%s)
VPY=$(stage_venv tools/vllm_venv.sh "vLLM and verl") || stage_venv_exit $?
set -e
echo "27-verl: venv ready in $(( $(date +%s) - start )) s"
tools/python_install.sh "$VPY"
t=$(date +%s)
"$VPY" tests/verl/refit.py --build build
echo "27-verl: verl's checkpoint engine through reshard in $(( $(date +%s) - t )) s"
