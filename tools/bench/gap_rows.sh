# The rows whose time above the bound the gap analyses look at, for
# tools/bench/bound_gap.sh and overlap_what_if.sh (sourced; BUILD=build-dir,
# default build). Sets BIN, S (samples), C (tools/bench/configs), H (the DGX
# H100 cluster) and tmp (removed on exit), and defines:
#   init_row FN LABEL CONFIG TRAIN INFER [CLUSTER]
#       `reshard init` of an HF config into $tmp/specs, then
#       FN LABEL MODEL TRAIN INFER CLUSTER on what it wrote
#   gap_rows FN
#       FN LABEL MODEL TRAIN INFER CLUSTER for each row, the 1024-rank ones last
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BIN=${BUILD:-build}/reshard
S=samples
C=tools/bench/configs
H=$S/clusters/dgx-h100.json
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

init_row() {
  local fn=$1 d=$tmp/specs
  rm -rf "$d"
  "$BIN" init -q --hf-config "$3" --train "$4" --infer "$5" --cluster "${6:-dgx-h100}" -o "$d"
  "$fn" "$2" "$d/model.json" "$d/train.json" "$d/infer.json" "$d/cluster.json"
}

gap_rows() {
  local fn=$1
  "$fn" "Qwen3-235B -> TP8 DP16 FP8 per-channel" $S/qwen3-235b/model.json $S/qwen3-235b/train-tp4-pp8-ep16.json \
    $S/qwen3-235b/infer-tp8-dp16-fp8-channel.json $H
  "$fn" "GLM-4.5-Air -> TP2 DP4 EP x4" $S/glm-4.5-air/model.json $S/glm-4.5-air/train-tp2-pp4-ep8.json \
    $S/glm-4.5-air/infer-tp2-dp4-ep8-x4.json $H
  init_row "$fn" "Qwen3-30B-A3B -> TP2 DP8" $C/qwen3-30b-a3b.json megatron:tp=2,pp=2,ep=8,etp=1,grouped-gemm \
    vllm:tp=2,dp=8
  init_row "$fn" "Qwen3-30B-A3B -> TP2 DP8 EP" $C/qwen3-30b-a3b.json megatron:tp=2,pp=2,ep=8,etp=1,grouped-gemm \
    vllm:tp=2,dp=8,ep
  init_row "$fn" "Llama-4-Scout -> TP4 x8" $C/llama-4-scout.json megatron:tp=4,pp=2,ep=8,etp=1,grouped-gemm \
    vllm:tp=4,engines=8
  init_row "$fn" "DeepSeek-V3 -> TP8 DP4 EP x8" $S/deepseek-v3/config.json \
    megatron:pp=16,ep=16,etp=1,grouped-gemm,pp-layers=3,4,4,4,4,4,4,4,4,4,4,4,4,4,4,2 \
    vllm:tp=8,dp=4,ep,engines=8,quant=none
  # The FP8-serving rows, from `reshard init` (the Qwen3-235B
  # config: samples/qwen3-235b's with the FP8 release's quantization_config).
  init_row "$fn" "DeepSeek-V3 FP8 -> TP16 x16, GB200 NVL72" $S/deepseek-v3/config.json \
    megatron:pp=16,ep=16,etp=1,grouped-gemm,pp-layers=3,4,4,4,4,4,4,4,4,4,4,4,4,4,4,2 vllm:tp=16,engines=16 gb200-nvl72
  init_row "$fn" "Qwen3-235B FP8 checkpoint -> TP4 x32" $C/qwen3-235b-a22b-fp8.json \
    megatron:tp=4,pp=8,ep=16,etp=1,grouped-gemm,pp-layers=11,12,12,12,12,12,12,11 vllm:tp=4,engines=32
  "$fn" "Kimi-K2 1024 -> 512" $S/kimi-k2/model.json $S/kimi-k2/train-1024.json $S/kimi-k2/infer-512.json $H
  init_row "$fn" "Kimi-K2 FP8 serving, 1024 -> TP8 DP16 EP x4" $S/kimi-k2/config.json \
    megatron:tp=4,pp=16,ep=64,etp=1,grouped-gemm,pp-layers=3,4,4,4,4,4,4,4,4,4,4,4,4,4,4,2 vllm:tp=8,dp=16,ep,engines=4
  "$fn" "MoE 2.4T 1024 -> 512" $S/moe-2.4t/model.json $S/moe-2.4t/train-1024.json $S/moe-2.4t/infer-512.json $H
}
