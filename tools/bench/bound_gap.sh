#!/usr/bin/env bash
# Where the time above the lower bound goes (issue 32), for the rows that are
# predicted above 1.05x of it: `simulate` splits predicted / bound at the
# refit's busiest link (sim/simulate.h, GapOf):
#   bytes: that link's bytes at its bandwidth against the bound (1.00 where
#          the bound's bytes are spread evenly over its links)
#   idle:  the prediction against that link's busy time (1 / its
#          utilization): waiting on partners inside rounds
# Usage: tools/bench/bound_gap.sh   (BUILD=build-dir, default build)
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BUILD:-build}/reshard
S=samples
C=tools/bench/configs
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

report() {  # LABEL PLAN CLUSTER
  "$BIN" simulate -q "$2" --cluster "$3" --json | python3 -c "
import json, sys
s = json.load(sys.stdin)
g = s['gap']
print(f\"| $1 | {s['ratio_to_bound']:.3f}x | {s['bound']['binding']} | {g['link']}: {g['link_bytes'] / 1e9:.2f} GB | \"
      f\"{g['bytes_factor']:.3f} | {g['idle_factor']:.3f} ({100 / g['idle_factor']:.1f}% busy) |\")"
}

compile() {  # LABEL MODEL TRAIN INFER CLUSTER
  "$BIN" compile -q --model "$2" --from "$3" --to "$4" --cluster "$5" -o "$tmp/p.rsplan"
  report "$1" "$tmp/p.rsplan" "$5"
}

init() {  # LABEL CONFIG TRAIN INFER [CLUSTER]
  local d=$tmp/specs
  rm -rf "$d"
  "$BIN" init -q --hf-config "$2" --train "$3" --infer "$4" --cluster "${5:-dgx-h100}" -o "$d"
  compile "$1" "$d/model.json" "$d/train.json" "$d/infer.json" "$d/cluster.json"
}

echo "| row | predicted / bound | binding term | busiest link | bytes | idle |"
echo "|---|---|---|---|---|---|"
H=$S/clusters/dgx-h100.json
compile "Kimi-K2 1024 -> 512" $S/kimi-k2/model.json $S/kimi-k2/train-1024.json $S/kimi-k2/infer-512.json $H
compile "MoE 2.4T 1024 -> 512" $S/moe-2.4t/model.json $S/moe-2.4t/train-1024.json $S/moe-2.4t/infer-512.json $H
compile "Qwen3-235B -> TP8 DP16 FP8 per-channel" $S/qwen3-235b/model.json $S/qwen3-235b/train-tp4-pp8-ep16.json \
  $S/qwen3-235b/infer-tp8-dp16-fp8-channel.json $H
compile "GLM-4.5-Air -> TP2 DP4 EP x4" $S/glm-4.5-air/model.json $S/glm-4.5-air/train-tp2-pp4-ep8.json \
  $S/glm-4.5-air/infer-tp2-dp4-ep8-x4.json $H
init "Qwen3-30B-A3B -> TP2 DP8" $C/qwen3-30b-a3b.json megatron:tp=2,pp=2,ep=8,etp=1,grouped-gemm vllm:tp=2,dp=8
init "Qwen3-30B-A3B -> TP2 DP8 EP" $C/qwen3-30b-a3b.json megatron:tp=2,pp=2,ep=8,etp=1,grouped-gemm \
  vllm:tp=2,dp=8,ep
init "Llama-4-Scout -> TP4 x8" $C/llama-4-scout.json megatron:tp=4,pp=2,ep=8,etp=1,grouped-gemm vllm:tp=4,engines=8
init "DeepSeek-V3 -> TP8 DP4 EP x8" $S/deepseek-v3/config.json \
  megatron:pp=16,ep=16,etp=1,grouped-gemm,pp-layers=3,4,4,4,4,4,4,4,4,4,4,4,4,4,4,2 \
  vllm:tp=8,dp=4,ep,engines=8,quant=none
# Training and inference on the same 8 GPUs (the README's colocated rows).
python3 -c "
import json
c = json.load(open('$S/clusters/dgx-h100.json'))
c.update(name='colocated', placement='colocated')
json.dump(c, open('$tmp/colocated.json', 'w'))"
init "Qwen3-30B-A3B colocated, Megatron -> TP8" $C/qwen3-30b-a3b.json megatron:tp=2,ep=8,etp=1,grouped-gemm vllm:tp=8 \
  "$tmp/colocated.json"
init "Qwen3-30B-A3B colocated, FSDP2 -> TP2 DP4 EP" $C/qwen3-30b-a3b.json fsdp2:dp_shard=8,master=bf16 \
  vllm:tp=2,dp=4,ep "$tmp/colocated.json"
