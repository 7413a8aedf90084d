#!/usr/bin/env bash
# `compile --simulate-fills` against the default compile and `--search-fills`
# on the large rows: for each, the default plan's prediction (`reshard
# simulate`), the --search-fills plan's (the fill the compiler's estimate
# finds fastest of the seven), then every fill --search-fills tries compiled
# and simulated, the fastest kept: its prediction, which fill it is, the
# plan's size and the compile's wall time.
# Predictions are deterministic; wall times are this machine's. Usage:
#   tools/bench/simulate_fills_bench.sh            (BUILD=build-dir, default build)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
ninja -C "$BUILD" -j2 reshard >/dev/null
BIN=$BUILD/reshard
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
S=samples

now() { date +%s.%N; }

# row NAME MODEL TRAIN INFER CLUSTER
row() {
  local name=$1 m=$2 t=$3 i=$4 c=$5 t0 t1 t2 t3
  local specs="--model $m --from $t --to $i --cluster $c"
  t0=$(now)
  # shellcheck disable=SC2086
  "$BIN" compile -q $specs -o "$TMP/d.rsplan"
  t1=$(now)
  # shellcheck disable=SC2086
  "$BIN" compile -q --search-fills $specs -o "$TMP/e.rsplan"
  t2=$(now)
  # shellcheck disable=SC2086
  "$BIN" compile --json --simulate-fills $specs -o "$TMP/s.rsplan" >"$TMP/s.json"
  t3=$(now)
  "$BIN" simulate -q --json "$TMP/d.rsplan" --cluster "$c" >"$TMP/d.json"
  "$BIN" simulate -q --json "$TMP/e.rsplan" --cluster "$c" >"$TMP/e.json"
  python3 - "$name" "$TMP/d.json" "$TMP/e.json" "$TMP/s.json" "$t0" "$t1" "$t2" "$t3" \
    "$(stat -c %s "$TMP/d.rsplan")" "$(stat -c %s "$TMP/e.rsplan")" <<'PY'
import json, sys
name, d, e, s = sys.argv[1], *(json.load(open(f)) for f in sys.argv[2:5])
t0, t1, t2, t3, dsize, esize = map(float, sys.argv[5:11])
lb = d["lower_bound_seconds"]
k = s["fills"][s["kept_fill"]]
how = k["round_fill"] + (f" >= {k['min_share']:g}" if k["min_share"] > 0 else "") + f", {k['staging_fill'] * 100:.0f}%"
print(f"| {name} | {d['predicted_seconds'] / lb:.4f}x, {dsize / 2**20:.1f} MiB, {t1 - t0:.1f} s | "
      f"{e['predicted_seconds'] / lb:.4f}x, {esize / 2**20:.1f} MiB, {t2 - t1:.1f} s | "
      f"{s['predicted_seconds'] / lb:.4f}x, {s['plan_bytes'] / 2**20:.1f} MiB, {t3 - t2:.1f} s | "
      f"{len(s['fills'])}: fill {s['kept_fill']} ({how}) |")
PY
}

echo "| plan | default: prediction / bound, plan, compile | --search-fills: the same | --simulate-fills: the same | fills simulated: kept |"
echo "|---|---|---|---|---|"
H=$S/clusters/dgx-h100.json
row "DeepSeek-V3, DGX H100" $S/deepseek-v3/model.json $S/deepseek-v3/train-pp16-ep16.json \
  $S/deepseek-v3/infer-tp32-dp8.json $H
row "DeepSeek-V3, GB200 NVL72" $S/deepseek-v3/model.json $S/deepseek-v3/train-pp16-ep16.json \
  $S/deepseek-v3/infer-tp32-dp8.json $S/clusters/gb200-nvl72.json
row "DeepSeek-V3 FP8 128x128 TP16" $S/deepseek-v3/model.json $S/deepseek-v3/train-pp16-ep16.json \
  $S/deepseek-v3/infer-tp16-dp16-fp8.json $H
row "Qwen3-235B -> TP8 DP16" $S/qwen3-235b/model.json $S/qwen3-235b/train-tp4-pp8-ep16.json \
  $S/qwen3-235b/infer-tp8-dp16.json $H
row "Qwen3-235B FP8 per-channel" $S/qwen3-235b/model.json $S/qwen3-235b/train-tp4-pp8-ep16.json \
  $S/qwen3-235b/infer-tp8-dp16-fp8-channel.json $H
row "Kimi-K2 1024 -> 512" $S/kimi-k2/model.json $S/kimi-k2/train-1024.json $S/kimi-k2/infer-512.json $H
