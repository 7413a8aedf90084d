#!/usr/bin/env bash
# Simulated refit times: for each seed configuration, the
# physical lower bound, `gather`, `direct --no-nvlink-exchange` and `direct`
# predicted by `reshard simulate`, and the ratios; NVIDIA's reported times
# printed beside them. Simulation is
# deterministic: the predicted seconds do not vary between runs; the wall time
# of the DeepSeek-V3 simulation is a median of REPS runs. Usage:
#   tools/bench/simulate_bench.sh [REPS]
set -euo pipefail
cd "$(dirname "$0")/../.."
REPS=${1:-3}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build -j2 reshard >/dev/null
BIN=build/reshard
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
S=samples

median() { sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }

# sim NAME STRATEGY MODEL TRAIN INFER CLUSTER [compile flags...] -> $TMP/NAME.STRATEGY.json
sim() {
  local name=$1 st=$2 m=$3 t=$4 i=$5 c=$6
  shift 6
  "$BIN" compile -q --model "$m" --from "$t" --to "$i" --cluster "$c" --strategy "$st" "$@" -o "$TMP/plan.rsplan"
  "$BIN" simulate "$TMP/plan.rsplan" --cluster "$c" --json -q >"$TMP/$name.$st.json"
}

row() {  # name model train infer cluster nvidia
  local name=$1 m=$2 t=$3 i=$4 c=$5 nvidia=$6
  sim "$name" direct "$m" "$t" "$i" "$c"
  sim "$name.plain" direct "$m" "$t" "$i" "$c" --no-nvlink-exchange
  sim "$name" gather "$m" "$t" "$i" "$c"
  python3 - "$name" "$nvidia" "$TMP/$name.direct.json" "$TMP/$name.plain.direct.json" "$TMP/$name.gather.json" <<'PY'
import json, sys
name, nvidia = sys.argv[1], sys.argv[2]
d, p, g = (json.load(open(f)) for f in sys.argv[3:6])
lb = d["lower_bound_seconds"]
dt, pt, gt = d["predicted_seconds"], p["predicted_seconds"], g["predicted_seconds"]
print(f"| {name} | {lb:.2f} s | {gt:.2f} s | {pt:.2f} s | {dt:.2f} s | {dt / lb:.2f}x | {pt / dt:.2f}x | {gt / dt:.1f}x "
      f"| {nvidia} | {d['wall_seconds']:.0f} / {p['wall_seconds']:.0f} / {g['wall_seconds']:.0f} s |")
PY
}

echo "| configuration | lower bound | gather | direct --no-nvlink-exchange | direct | direct / bound | exchange speedup | gather / direct | NVIDIA reported (baseline -> Reshard) | simulation wall (direct / plain / gather) |"
echo "|---|---|---|---|---|---|---|---|---|---|"
row "Qwen3-235B TP4 PP8 EP16 -> TP8 DP16, DGX H100" $S/qwen3-235b/model.json $S/qwen3-235b/train-tp4-pp8-ep16.json \
  $S/qwen3-235b/infer-tp8-dp16.json $S/clusters/dgx-h100.json "6.4 s -> 1.9 s"
row "Qwen3-235B TP4 PP8 EP16 -> TP4 DP32, DGX H100" $S/qwen3-235b/model.json $S/qwen3-235b/train-tp4-pp8-ep16.json \
  $S/qwen3-235b/infer-tp4-dp32.json $S/clusters/dgx-h100.json "-"
row "DeepSeek-V3 PP16 EP16 -> TP32 DP8, DGX H100" $S/deepseek-v3/model.json $S/deepseek-v3/train-pp16-ep16.json \
  $S/deepseek-v3/infer-tp32-dp8.json $S/clusters/dgx-h100.json "14.9 s -> 2.6 s"
row "DeepSeek-V3 PP16 EP16 -> TP32 DP8, GB200 NVL72" $S/deepseek-v3/model.json $S/deepseek-v3/train-pp16-ep16.json \
  $S/deepseek-v3/infer-tp32-dp8.json $S/clusters/gb200-nvl72.json "6.1 s -> 2.3 s"
row "MoE 2.4T 1024 -> 512 ranks, DGX H100" $S/moe-2.4t/model.json $S/moe-2.4t/train-1024.json \
  $S/moe-2.4t/infer-512.json $S/clusters/dgx-h100.json "4.3 s (Reshard)"

# Wall time of simulating the DeepSeek-V3 direct plan (target: under 60 s).
"$BIN" compile -q --model $S/deepseek-v3/model.json --from $S/deepseek-v3/train-pp16-ep16.json \
  --to $S/deepseek-v3/infer-tp32-dp8.json --cluster $S/clusters/dgx-h100.json -o "$TMP/ds.rsplan"
walls=()
for _ in $(seq "$REPS"); do
  /usr/bin/time -f "%e" -o "$TMP/t" "$BIN" simulate "$TMP/ds.rsplan" --cluster $S/clusters/dgx-h100.json -q >/dev/null
  walls+=("$(cat "$TMP/t")")
done
echo
echo "simulate DeepSeek-V3 direct plan (DGX H100): median $(printf '%s\n' "${walls[@]}" | median) s of $REPS runs (target < 60 s)"
