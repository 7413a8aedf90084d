#!/usr/bin/env bash
# tools/dump_state_dict.py's tests, then real Megatron-Core 0.19.2 on CPU
# (tests/megatron): every case of
# tests/megatron/cases.py is built on Gloo ranks, each rank's dump must equal
# the recorded tests/data/megatron/<case>/dump.json and match the case's
# train.json under `reshard check` with zero differences, and the ranks' own
# parameter memory is refit through the runtime into an unsharded HF rank,
# bit-exact against the Megatron -> HF conversion, and once more through the
# Python package (installed here by tools/python_install.sh): each rank
# `reshard.Session.bind_module(model)` of its Float16Module, again bit-exact
# (python/). Skips (exit 0, with a
# message) only when the Python package registry cannot be reached.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/stage_venv.sh
PY=$(stage_venv tools/venv.sh "Megatron-Core") || stage_venv_exit $?
set -e
"$PY" -m pytest -q -p no:cacheprovider tests/megatron/dump_state_dict_test.py
tools/python_install.sh "$PY"
"$PY" tests/megatron/refit.py --build build --python-api
