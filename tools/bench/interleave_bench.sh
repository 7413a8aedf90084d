#!/usr/bin/env bash
# Row-interleaved fused buffers: vLLM's gpt-oss w13_weight
# alternates gate and up rows (interleave groups of one row). Its plan must
# match, within 1.15x, the control that holds the same bytes concatenated:
# plan size, compile time, validate time and predicted refit. Compile and
# validate are medians of REPS runs, measured interleaved with the control in
# the same loop (this machine is shared and noisy). Usage:
#   tools/bench/interleave_bench.sh [REPS]
set -euo pipefail
cd "$(dirname "$0")/../.."
REPS=${1:-5}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build -j2 reshard >/dev/null
BIN=build/reshard
S=tools/bench/specs/gpt-oss-120b
C=samples/clusters/dgx-h100.json
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
median() { sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
declare -A comp val
for _ in $(seq "$REPS"); do
  for v in interleaved concat; do
    /usr/bin/time -f "%e" -o "$TMP/t" "$BIN" compile -q --model $S/model.json --from $S/train.json \
      --to $S/infer-$v.json --cluster $C -o "$TMP/$v.rsplan"
    comp[$v]+="$(cat "$TMP/t") "
    /usr/bin/time -f "%e" -o "$TMP/t" "$BIN" validate "$TMP/$v.rsplan" >/dev/null
    val[$v]+="$(cat "$TMP/t") "
  done
done
printf "%-12s %10s %10s %11s %13s\n" "w13 layout" "plan_MiB" "compile_s" "validate_s" "predicted_ms"
declare -A size cs vs pred
for v in interleaved concat; do
  size[$v]=$(stat -c %s "$TMP/$v.rsplan")
  cs[$v]=$(printf '%s\n' ${comp[$v]} | median)
  vs[$v]=$(printf '%s\n' ${val[$v]} | median)
  pred[$v]=$("$BIN" simulate "$TMP/$v.rsplan" --cluster $C --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["predicted_seconds"] * 1e3)')
  printf "%-12s %10.2f %10.2f %11.2f %13.1f\n" "$v" "$(python3 -c "print(${size[$v]} / 1048576)")" "${cs[$v]}" \
    "${vs[$v]}" "${pred[$v]}"
done
python3 - "${size[interleaved]}" "${size[concat]}" "${cs[interleaved]}" "${cs[concat]}" "${vs[interleaved]}" \
  "${vs[concat]}" "${pred[interleaved]}" "${pred[concat]}" <<'PY'
import sys
v = [float(x) for x in sys.argv[1:]]
names = ["plan size", "compile", "validate", "predicted"]
print("ratios interleaved/concat (target <= 1.15): " +
      ", ".join(f"{n} {v[2*i] / v[2*i+1]:.2f}x" for i, n in enumerate(names)))
PY
