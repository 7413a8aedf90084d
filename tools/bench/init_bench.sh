#!/usr/bin/env bash
# reshard init acceptance: for real models, `reshard init` from the
# HF config.json and the frameworks' settings, then compile, validate and
# simulate on DGX H100. Prints a markdown table: init + compile wall time,
# plan size, predicted refit and its lower bound. Usage:
#   tools/bench/init_bench.sh            (BUILD=build-dir, default build)
# (predicted / bound: the target is 1.08x on these rows too)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
BIN=$BUILD/reshard
C=tools/bench/configs
S=samples
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

now() { date +%s.%N; }

# row LABEL CONFIG TRAIN INFER
row() {
  local label=$1 config=$2 train=$3 infer=$4 d=$tmp/specs
  rm -rf "$d"
  local t0 t1 t2
  t0=$(now)
  "$BIN" init -q --hf-config "$config" --train "$train" --infer "$infer" --cluster dgx-h100 -o "$d"
  t1=$(now)
  "$BIN" compile -q --model $d/model.json --from $d/train.json --to $d/infer.json --cluster $d/cluster.json -o $d/p.rsplan
  t2=$(now)
  "$BIN" validate $d/p.rsplan >/dev/null
  local sim size
  sim=$("$BIN" simulate $d/p.rsplan --cluster $d/cluster.json --json)
  size=$(stat -c %s $d/p.rsplan)
  python3 - "$label" "$t0" "$t1" "$t2" "$size" "$sim" "$train" "$infer" <<'EOF'
import json, sys
label, t0, t1, t2, size, sim, train, infer = sys.argv[1:]
s = json.loads(sim)
print(f"| {label} | `{train}` | `{infer}` | {float(t1)-float(t0):.2f} + {float(t2)-float(t1):.2f} s | "
      f"{int(size)/2**20:.1f} MiB | {s['predicted_seconds']:.3f} s | {s['lower_bound_seconds']:.3f} s | "
      f"{s['predicted_seconds'] / s['lower_bound_seconds']:.3f}x |")
EOF
}

echo "| model | --train | --infer | init + compile | plan | predicted refit | lower bound | predicted / bound |"
echo "|---|---|---|---|---|---|---|---|"
row "Llama-3.1-70B" $C/llama-3.1-70b.json megatron:tp=8,pp=4,dp=2 vllm:tp=8,dp=8
row "Llama-3.1-70B" $C/llama-3.1-70b.json megatron:tp=8,pp=4,dp=2 vllm:tp=4,dp=16
row "Qwen3-30B-A3B" $C/qwen3-30b-a3b.json megatron:tp=2,pp=2,ep=8,etp=1,grouped-gemm vllm:tp=2,dp=8
row "Qwen3-30B-A3B" $C/qwen3-30b-a3b.json megatron:tp=2,pp=2,ep=8,etp=1,grouped-gemm vllm:tp=2,dp=8,ep
row "Mixtral-8x7B" $C/mixtral-8x7b.json megatron:tp=2,pp=4,ep=8,etp=1,grouped-gemm vllm:tp=8,engines=4
DS=megatron:pp=16,ep=16,etp=1,grouped-gemm,pp-layers=3,4,4,4,4,4,4,4,4,4,4,4,4,4,4,2
row "DeepSeek-V3 BF16" $S/deepseek-v3/config.json $DS vllm:tp=32,engines=8,quant=none
row "DeepSeek-V3 FP8" $S/deepseek-v3/config.json $DS vllm:tp=16,engines=16
# GLM-4.5 and gpt-oss (samples/glm-4.5-air, samples/gpt-oss-120b: real configs).
GLM=megatron:tp=2,pp=4,ep=8,etp=1,grouped-gemm,pp-layers=11,12,12,11
row "GLM-4.5-Air" $S/glm-4.5-air/config.json $GLM vllm:tp=4,engines=8
row "GLM-4.5-Air" $S/glm-4.5-air/config.json $GLM vllm:tp=2,dp=4,ep,engines=4
OSS=megatron:tp=2,pp=4,ep=8,etp=1,grouped-gemm
row "gpt-oss-120b BF16" $S/gpt-oss-120b/config.json $OSS vllm:tp=4,engines=8,quant=none
row "gpt-oss-120b BF16" $S/gpt-oss-120b/config.json $OSS vllm:tp=2,dp=4,ep,engines=4,quant=none
# Qwen3-Next and Llama 4 (tools/bench/configs: the releases' config fields). Qwen3-Next
# trains under hf:tp=8 (plain tensor-parallel shards under the checkpoint's names) and
# under Megatron (TE spec: out_norm held as w - 1, converted on the way).
row "Qwen3-Next-80B-A3B" $C/qwen3-next-80b-a3b.json hf:tp=8 vllm:tp=4,engines=4
row "Qwen3-Next-80B-A3B" $C/qwen3-next-80b-a3b.json hf:tp=8 vllm:tp=2,dp=4,ep,engines=2
NEXT=megatron:tp=2,pp=4,ep=8,etp=1,grouped-gemm
row "Qwen3-Next-80B-A3B" $C/qwen3-next-80b-a3b.json $NEXT vllm:tp=4,engines=4
row "Qwen3-Next-80B-A3B" $C/qwen3-next-80b-a3b.json $NEXT vllm:tp=2,dp=4,ep,engines=2
row "Llama-4-Scout" $C/llama-4-scout.json megatron:tp=4,pp=2,ep=8,etp=1,grouped-gemm vllm:tp=4,engines=8
row "Llama-4-Maverick" $C/llama-4-maverick.json megatron:tp=4,pp=4,ep=16,etp=1,grouped-gemm vllm:tp=8,dp=2,ep,engines=2
