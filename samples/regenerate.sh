#!/usr/bin/env bash
# Regenerates every sample spec from samples/*/config.json with `reshard init`.
#   samples/regenerate.sh [OUT]   (default OUT: samples/ itself)
# RESHARD names the binary (default: build/reshard). The test
# InitSamples.CheckedInSamplesAreWhatInitWrites runs this into a scratch
# folder and fails on any difference with the checked-in files.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here}
bin=${RESHARD:-$here/../build/reshard}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# gen DIR NAME TRAIN INFER [TRAIN_FILE INFER_FILE]: one init run, its files
# copied under OUT/DIR (model.json always; the layouts under the names given).
gen() {
  local dir=$1 name=$2 train=$3 infer=$4 train_file=${5:-train.json} infer_file=${6:-infer.json}
  rm -rf "$tmp/run"
  "$bin" init -q --hf-config "$here/$dir/config.json" --name "$name" --train "$train" --infer "$infer" -o "$tmp/run"
  mkdir -p "$out/$dir"
  cp "$tmp/run/model.json" "$out/$dir/model.json"
  [ "$train_file" = - ] || cp "$tmp/run/train.json" "$out/$dir/$train_file"
  [ "$infer_file" = - ] || cp "$tmp/run/infer.json" "$out/$dir/$infer_file"
}

# Tiny models for tests and `reshard run --local` (Megatron TE spec).
T=megatron:tp=2,pp=2,dp=2,pp-layers=1,3
gen tiny-dense tiny-dense $T vllm:tp=4
gen tiny-dense tiny-dense $T vllm:tp=2,dp=2 - infer-tp2-dp2.json
gen tiny-dense tiny-dense $T vllm:tp=1,dp=4 - infer-tp1-dp4.json
T=megatron:tp=2,pp=2,dp=2,ep=4,etp=1,pp-layers=1,3
gen tiny-moe tiny-moe $T vllm:tp=4,dp=2
gen tiny-moe tiny-moe $T vllm:tp=4,dp=2,ep - infer-ep.json

# Qwen3-235B-A22B: NeMo RL's TP4 PP8 EP16 -> TP8 DP16 (16 independent engines).
T=megatron:tp=4,pp=8,ep=16,etp=1,grouped-gemm,pp-layers=11,12,12,12,12,12,12,11
gen qwen3-235b qwen3-235b-a22b $T vllm:tp=8,engines=16 train-tp4-pp8-ep16.json infer-tp8-dp16.json
gen qwen3-235b qwen3-235b-a22b $T vllm:tp=4,engines=32 - infer-tp4-dp32.json
gen qwen3-235b qwen3-235b-a22b $T vllm:tp=8,engines=16,quant=fp8-channel - infer-tp8-dp16-fp8-channel.json

# DeepSeek-V3: PP16 EP16 -> TP32 DP8 in BF16; FP8 block scales need TP16 (vLLM
# refuses TP32: 18432 / 32 = 576 rows is not a whole number of 128-row blocks).
T=megatron:pp=16,ep=16,etp=1,grouped-gemm,pp-layers=3,4,4,4,4,4,4,4,4,4,4,4,4,4,4,2
gen deepseek-v3 deepseek-v3 $T vllm:tp=32,engines=8,quant=none train-pp16-ep16.json infer-tp32-dp8.json
gen deepseek-v3 deepseek-v3 $T vllm:tp=16,engines=16 - infer-tp16-dp16-fp8.json

# Kimi-K2 and its 896-expert scale-up: PP16 DP16 TP4 EP64 -> 4 engines of
# attention TP8 x DP16 with EP128 experts, BF16 on both sides.
T=megatron:tp=4,pp=16,dp=16,ep=64,etp=1,grouped-gemm,pp-layers=3,4,4,4,4,4,4,4,4,4,4,4,4,4,4,2
gen kimi-k2 kimi-k2 $T vllm:tp=8,dp=16,ep,engines=4,quant=none train-1024.json infer-512.json
gen moe-2.4t moe-2.4t $T vllm:tp=8,dp=16,ep,engines=4,quant=none train-1024.json infer-512.json

# GLM-4.5-Air (glm4_moe): Megatron TP2 PP4 EP8 (32 ranks, DP4; the dense layer
# 0 on stage 0) -> 8 engines of vLLM TP4, or 4 engines of TP2 x DP4 with EP8.
T=megatron:tp=2,pp=4,ep=8,etp=1,grouped-gemm,pp-layers=11,12,12,11
gen glm-4.5-air glm-4.5-air $T vllm:tp=4,engines=8 train-tp2-pp4-ep8.json infer-tp4-dp8.json
gen glm-4.5-air glm-4.5-air $T vllm:tp=2,dp=4,ep,engines=4 - infer-tp2-dp4-ep8-x4.json

# gpt-oss-120b (gpt_oss), its release config (MXFP4 experts): vLLM engines
# serving it in BF16 (quant=none; init refuses a refit into MXFP4-serving ones).
T=megatron:tp=2,pp=4,ep=8,etp=1,grouped-gemm
gen gpt-oss-120b gpt-oss-120b $T vllm:tp=4,engines=8,quant=none train-tp2-pp4-ep8.json infer-tp4-dp8.json
gen gpt-oss-120b gpt-oss-120b $T vllm:tp=2,dp=4,ep,engines=4,quant=none - infer-tp2-dp4-ep8-x4.json

# Clusters.
mkdir -p "$out/clusters"
for c in dgx-h100 gb200-nvl72; do
  rm -rf "$tmp/run"
  "$bin" init -q --hf-config "$here/tiny-dense/config.json" --train hf --infer hf --cluster $c -o "$tmp/run"
  cp "$tmp/run/cluster.json" "$out/clusters/$c.json"
done
