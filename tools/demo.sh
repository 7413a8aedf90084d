#!/usr/bin/env bash
# Installs the dependencies, builds reshard and runs the main job on the bundled
# tiny MoE sample: compile a Megatron -> vLLM refit plan, validate it, show it,
# and run it across local processes with every destination byte checked.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build -j2 reshard
S=samples
build/reshard compile --model $S/tiny-moe/model.json --from $S/tiny-moe/train.json --to $S/tiny-moe/infer.json \
  --cluster $S/clusters/dgx-h100.json -o build/tiny-moe.rsplan
build/reshard validate build/tiny-moe.rsplan
build/reshard show build/tiny-moe.rsplan --top 4
build/reshard run build/tiny-moe.rsplan --local
