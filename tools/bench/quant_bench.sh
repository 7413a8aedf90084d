#!/usr/bin/env bash
# Quantized refit: DeepSeek-V3 from BF16 training (PP16 EP16) into
# FP8 128x128 block-scaled inference weights (TP16 DP16, the
# infer-tp16-dp16-fp8.json sample: vLLM refuses block FP8 at TP32, whose
# 576-row slices of the dense MLPs are not whole 128-row blocks), and Qwen3-235B into per-channel FP8
# (infer-tp8-dp16-fp8-channel.json), on DGX H100: bytes on the wire and the
# refit time `reshard simulate` predicts, for BF16 sent and requantized on the
# receiver against FP8 quantized by the sender; the BF16 refit into BF16
# weights beside them. Simulation is deterministic. Usage:
#   tools/bench/quant_bench.sh            (BUILD=build-dir, default build)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
ninja -C "$BUILD" -j2 reshard >/dev/null
BIN=$BUILD/reshard
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
C=samples/clusters/dgx-h100.json

# row NAME MODEL_DIR TRAIN INFER [compile flags...]
row() {
  local name=$1 dir=$2 train=$3 infer=$4
  shift 4
  "$BIN" compile -q --model "$dir/model.json" --from "$dir/$train" --to "$dir/$infer" --cluster $C "$@" \
    -o "$TMP/plan.rsplan"
  "$BIN" show "$TMP/plan.rsplan" --json >"$TMP/show.json"
  "$BIN" simulate "$TMP/plan.rsplan" --cluster $C --json -q >"$TMP/sim.json"
  python3 - "$name" "$TMP/show.json" "$TMP/sim.json" <<'PY'
import json, sys
name, show, sim = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
net, nvl = show["net"]["bytes"], show["nvlink"]["bytes"]
print(f"| {name} | {net / 1e9:.1f} GB | {nvl / 1e9:.1f} GB | {(net + nvl) / 1e9:.1f} GB | "
      f"{sim['lower_bound_seconds']:.2f} s | {sim['predicted_seconds']:.2f} s |")
PY
}

D=samples/deepseek-v3
# The BF16 reference at the same TP16 DP16, written by reshard init.
"$BIN" init -q --hf-config $D/config.json --name deepseek-v3 \
  --train megatron:pp=16,ep=16,etp=1,grouped-gemm,pp-layers=3,4,4,4,4,4,4,4,4,4,4,4,4,4,4,2 \
  --infer vllm:tp=16,engines=16,quant=none -o "$TMP/ds16"
echo "| DeepSeek-V3 PP16 EP16 -> TP16 DP16, DGX H100 | net | NVLink | on the wire | lower bound | predicted refit |"
echo "|---|---|---|---|---|---|"
row "BF16 -> BF16 weights (reference)" "$TMP/ds16" train.json infer.json
row "BF16 -> FP8 128x128, BF16 sent, requantized on the receiver" $D train-pp16-ep16.json infer-tp16-dp16-fp8.json \
  --requantize-on-receiver
row "BF16 -> FP8 128x128, FP8 + scales quantized by the sender" $D train-pp16-ep16.json infer-tp16-dp16-fp8.json

# Per-channel FP8 (vLLM's channel-wise scales) where training TP4 cuts the
# rows of o_proj: every o_proj scale needs amaxes from 4 training ranks.
Q=samples/qwen3-235b
echo
echo "| Qwen3-235B TP4 PP8 EP16 -> TP8 DP16, DGX H100 | net | NVLink | on the wire | lower bound | predicted refit |"
echo "|---|---|---|---|---|---|"
row "BF16 -> BF16 weights (reference)" $Q train-tp4-pp8-ep16.json infer-tp8-dp16.json
row "BF16 -> FP8 per-channel, BF16 sent, requantized on the receiver" $Q train-tp4-pp8-ep16.json \
  infer-tp8-dp16-fp8-channel.json --requantize-on-receiver
row "BF16 -> FP8 per-channel, FP8 + scales by the sender, o_proj by partial amaxes" $Q train-tp4-pp8-ep16.json \
  infer-tp8-dp16-fp8-channel.json
