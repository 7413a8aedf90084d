#!/usr/bin/env bash
# What overlapping rounds would buy (issue 32): the runtime keeps one round's
# messages in flight, and a NIC idles while its partners finish the round
# (bound_gap.sh's "idle"). `simulate --what-if-overlap N` predicts a runtime
# that keeps N rounds in flight; such a runtime needs N + 1 staging arenas of
# a round's size where today's needs 2, so each depth is compared at the same
# staging memory: the plan compiled with --staging-mb 512 x 2 / (N + 1).
# Usage: tools/bench/overlap_what_if.sh   (BUILD=build-dir, default build)
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BUILD:-build}/reshard
S=samples
C=tools/bench/configs
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ratio() {  # PLAN CLUSTER DEPTH
  "$BIN" simulate -q "$1" --cluster "$2" --json --what-if-overlap "$3" |
    python3 -c "import json, sys; print(f\"{json.load(sys.stdin)['ratio_to_bound']:.3f}x\")"
}

row() {  # LABEL MODEL TRAIN INFER CLUSTER
  local cells=()
  for spec in 512:0 512:2 341:2 256:3; do
    local mb=${spec%:*} depth=${spec#*:}
    [[ -f $tmp/p$mb.rsplan ]] ||
      "$BIN" compile -q --staging-mb "$mb" --model "$2" --from "$3" --to "$4" --cluster "$5" -o "$tmp/p$mb.rsplan"
    cells+=("$(ratio "$tmp/p$mb.rsplan" "$5" "$depth")")
  done
  rm -f "$tmp"/p*.rsplan
  echo "| $1 | ${cells[0]} | ${cells[1]} | ${cells[2]} | ${cells[3]} |"
}

init() {  # LABEL CONFIG TRAIN INFER
  local d=$tmp/specs
  rm -rf "$d"
  "$BIN" init -q --hf-config "$2" --train "$3" --infer "$4" --cluster dgx-h100 -o "$d"
  row "$1" "$d/model.json" "$d/train.json" "$d/infer.json" "$d/cluster.json"
}

echo "| row | today (512 MiB, 1 in flight) | 2 in flight, 512 MiB a pair of arenas (1.5x the memory) | 2 in flight, same memory (341) | 3 in flight, same memory (256) |"
echo "|---|---|---|---|---|"
H=$S/clusters/dgx-h100.json
row "GLM-4.5-Air -> TP2 DP4 EP x4" $S/glm-4.5-air/model.json $S/glm-4.5-air/train-tp2-pp4-ep8.json \
  $S/glm-4.5-air/infer-tp2-dp4-ep8-x4.json $H
init "Qwen3-30B-A3B -> TP2 DP8" $C/qwen3-30b-a3b.json megatron:tp=2,pp=2,ep=8,etp=1,grouped-gemm vllm:tp=2,dp=8
init "Qwen3-30B-A3B -> TP2 DP8 EP" $C/qwen3-30b-a3b.json megatron:tp=2,pp=2,ep=8,etp=1,grouped-gemm \
  vllm:tp=2,dp=8,ep
init "Llama-4-Scout -> TP4 x8" $C/llama-4-scout.json megatron:tp=4,pp=2,ep=8,etp=1,grouped-gemm vllm:tp=4,engines=8
init "DeepSeek-V3 -> TP8 DP4 EP x8" $S/deepseek-v3/config.json \
  megatron:pp=16,ep=16,etp=1,grouped-gemm,pp-layers=3,4,4,4,4,4,4,4,4,4,4,4,4,4,4,2 \
  vllm:tp=8,dp=4,ep,engines=8,quant=none
row "Qwen3-235B -> TP8 DP16 FP8 per-channel" $S/qwen3-235b/model.json $S/qwen3-235b/train-tp4-pp8-ep16.json \
  $S/qwen3-235b/infer-tp8-dp16-fp8-channel.json $H
row "Kimi-K2 1024 -> 512" $S/kimi-k2/model.json $S/kimi-k2/train-1024.json $S/kimi-k2/infer-512.json $H
row "MoE 2.4T 1024 -> 512" $S/moe-2.4t/model.json $S/moe-2.4t/train-1024.json $S/moe-2.4t/infer-512.json $H
