#!/usr/bin/env bash
# Quantized refit (issue 7): DeepSeek-V3 from BF16 training (PP16 EP16) into
# FP8 128x128 block-scaled inference weights (TP32 DP8, the
# infer-tp32-dp8-fp8.json variant) on DGX H100: bytes on the wire and the
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
S=samples/deepseek-v3
C=samples/clusters/dgx-h100.json

# row NAME INFER [compile flags...]
row() {
  local name=$1 infer=$2
  shift 2
  "$BIN" compile -q --model $S/model.json --from $S/train-pp16-ep16.json --to "$infer" --cluster $C "$@" \
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

echo "| DeepSeek-V3 PP16 EP16 -> TP32 DP8, DGX H100 | net | NVLink | on the wire | lower bound | predicted refit |"
echo "|---|---|---|---|---|---|"
row "BF16 -> BF16 weights (reference)" $S/infer-tp32-dp8.json
row "BF16 -> FP8 128x128, BF16 sent, requantized on the receiver" $S/infer-tp32-dp8-fp8.json --requantize-on-receiver
row "BF16 -> FP8 128x128, FP8 + scales quantized by the sender" $S/infer-tp32-dp8-fp8.json
