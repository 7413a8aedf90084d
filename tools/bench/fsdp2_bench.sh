#!/usr/bin/env bash
# FSDP2 trainers: Qwen3-30B-A3B trained with FSDP2 on 64 ranks
# (fp32 masters, and bf16) refit into vLLM TP2 x DP8, next to Megatron TP2
# EP8 on the same 64 GPUs into the same engines. `reshard init`, then compile
# (median of RUNS), validate and simulate on DGX H100. Prints a markdown
# table: compile time, plan size, bytes on the network, predicted refit, its
# lower bound and the ratio. Usage:
#   tools/bench/fsdp2_bench.sh            (BUILD=build-dir, RUNS=5)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
RUNS=${RUNS:-5}
BIN=$BUILD/reshard
CONFIG=tools/bench/configs/qwen3-30b-a3b.json
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# row LABEL TRAIN INFER [WIRE]: WIRE=fp32 rewrites the model spec's dtype to
# fp32, so that fp32 goes on the wire (the contrast to sender-side conversion)
row() {
  local label=$1 train=$2 infer=$3 wire=${4:-} d=$tmp/specs
  rm -rf "$d"
  "$BIN" init -q --hf-config "$CONFIG" --train "$train" --infer "$infer" --cluster dgx-h100 -o "$d"
  [ "$wire" = fp32 ] && sed -i 's/"dtype": "bf16"/"dtype": "fp32"/' "$d/model.json"
  local times=()
  for _ in $(seq "$RUNS"); do
    local t0 t1
    t0=$(date +%s.%N)
    "$BIN" compile -q --model $d/model.json --from $d/train.json --to $d/infer.json --cluster $d/cluster.json -o $d/p.rsplan
    t1=$(date +%s.%N)
    times+=("$(echo "$t1 - $t0" | bc)")
  done
  "$BIN" validate $d/p.rsplan >/dev/null
  local sim size
  sim=$("$BIN" simulate $d/p.rsplan --cluster $d/cluster.json --json)
  size=$(stat -c %s $d/p.rsplan)
  python3 - "$label" "$train" "$infer" "$size" "$sim" "${times[@]}" <<'PY'
import json, statistics, sys
label, train, infer, size, sim, *times = sys.argv[1:]
s = json.loads(sim)
b = s["bytes"]
print(f"| {label} | `{train}` | `{infer}` | {statistics.median(map(float, times)):.2f} s | "
      f"{int(size)/2**20:.1f} MiB | {b['net'] / 1e9:.1f} GB | {b['nvlink'] / 1e9:.1f} GB | "
      f"{s['predicted_seconds']:.3f} s | {s['lower_bound_seconds']:.3f} s | "
      f"{s['predicted_seconds'] / s['lower_bound_seconds']:.3f}x |")
PY
}

echo "| Qwen3-30B-A3B, 64 training GPUs | --train | --infer | compile (median of $RUNS) | plan | network | NVLink | predicted refit | lower bound | predicted / bound |"
echo "|---|---|---|---|---|---|---|---|---|---|"
row "FSDP2, fp32 masters" fsdp2:dp_shard=64 vllm:tp=2,dp=8
row "FSDP2, fp32 masters, fp32 on the wire" fsdp2:dp_shard=64 vllm:tp=2,dp=8 fp32
row "FSDP2, bf16" fsdp2:dp_shard=64,master=bf16 vllm:tp=2,dp=8
row "FSDP2 HSDP 8x8" fsdp2:dp_replicate=8,dp_shard=8 vllm:tp=2,dp=8
row "FSDP2 TP2 x FSDP 32" fsdp2:dp_shard=32,tp=2 vllm:tp=2,dp=8
row "Megatron TP2 EP8" megatron:tp=2,ep=8,dp=32,etp=1,grouped-gemm vllm:tp=2,dp=8
