#!/usr/bin/env bash
# Real SGLang 0.5.23 on CPU (tests/sglang), in build/vllm-venv (tools/vllm_venv.sh
# installs SGLang there beside vLLM): every SGLang case of tests/data/recorded
# built on real SGLang ranks (one process per rank, Gloo) and dumped, its
# parameters, buffers and MLA's derived attributes (w_kc, w_vc, w_scale); each
# dump must equal the recorded one (tests/sglang/record.py; RecordedDumps in
# ctest checks `reshard init` and `reshard check` against them).
# Skips (exit 0, with a message) only when the Python package registry
# cannot be reached.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/stage_venv.sh
start=$(date +%s)
VPY=$(stage_venv tools/vllm_venv.sh "SGLang") || stage_venv_exit $?
set -e
echo "26-sglang: venv ready in $(( $(date +%s) - start )) s"
t=$(date +%s)
"$VPY" tests/sglang/record.py --build build
echo "26-sglang: real SGLang dumps checked in $(( $(date +%s) - t )) s"
