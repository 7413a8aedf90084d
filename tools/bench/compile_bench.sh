#!/usr/bin/env bash
# Compile-time benchmark: compile time, peak memory and plan size for
# the seed configurations, plus opening and verifying one rank's program and
# validating the whole plan. Medians of REPS runs. Usage:
#   tools/bench/compile_bench.sh [REPS]
# With BASE=path/to/an/older/reshard, that binary's compiles run interleaved
# with this build's, run for run, and each row gets their medians, peak
# memory and plan sizes side by side (a noisy machine then slows both alike),
# and how many times as fast this build's median is: against an older
# binary, that ratio is the machine-independent reading of a speed-up (a
# target of half the time is a ratio of 2).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPS=${1:-3}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build -j2 reshard plan_open_bench >/dev/null
BIN=build/reshard
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

median() { sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }

row() {  # name model train infer cluster strategy target_s target_mib
  local name=$1 m=$2 t=$3 i=$4 c=$5 st=$6
  local plan="$TMP/$name.rsplan" secs=() rss=() bsecs=() brss=()
  for _ in $(seq "$REPS"); do
    /usr/bin/time -f "%e %M" -o "$TMP/time" "$BIN" compile -q --model "$m" --from "$t" --to "$i" --cluster "$c" \
      --strategy "$st" -o "$plan"
    read -r s k <"$TMP/time"
    secs+=("$s"); rss+=("$k")
    if [ -n "${BASE:-}" ]; then
      /usr/bin/time -f "%e %M" -o "$TMP/time" "$BASE" compile -q --model "$m" --from "$t" --to "$i" --cluster "$c" \
        --strategy "$st" -o "$TMP/base.rsplan"
      read -r s k <"$TMP/time"
      bsecs+=("$s"); brss+=("$k")
    fi
  done
  local s_med k_med size open val
  s_med=$(printf '%s\n' "${secs[@]}" | median)
  if [ -n "${BASE:-}" ]; then
    local b_med
    b_med=$(printf '%s\n' "${bsecs[@]}" | median)
    printf "%-34s base:  %9.2f s %7.0f MiB %8.2f MiB plan; this build %.2fx as fast\n" "$name" "$b_med" \
      "$(( $(printf '%s\n' "${brss[@]}" | median) / 1024 ))" "$(python3 -c "print($(stat -c %s "$TMP/base.rsplan") / 1048576)")" \
      "$(python3 -c "print($b_med / $s_med)")"
  fi
  k_med=$(printf '%s\n' "${rss[@]}" | median)
  size=$(stat -c %s "$plan")
  local last=$(( $("$BIN" show "$plan" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["ranks"])') - 1 ))
  open=$(build/plan_open_bench "$plan" "$last" 5)
  /usr/bin/time -f "%e" -o "$TMP/vtime" "$BIN" validate "$plan" >/dev/null
  val=$(cat "$TMP/vtime")
  printf "%-34s %-7s %9.2f %10.0f %10.2f %12.2f %11.2f   %s\n" "$name" "$st" "$s_med" "$((k_med / 1024))" \
    "$(python3 -c "print($size / 1048576)")" "$open" "$val" "$7 s, $8 MiB RSS, 64 MiB plan, 50 ms open"
}

printf "%-34s %-7s %9s %10s %10s %12s %11s   %s\n" "configuration" "strat" "compile_s" "peak_MiB" "plan_MiB" \
  "open_rank_ms" "validate_s" "targets"
S=samples
row "qwen3-235b tp4pp8ep16->tp8dp16" $S/qwen3-235b/model.json $S/qwen3-235b/train-tp4-pp8-ep16.json \
  $S/qwen3-235b/infer-tp8-dp16.json $S/clusters/dgx-h100.json direct 2 1024
row "deepseek-v3 pp16ep16->tp32dp8" $S/deepseek-v3/model.json $S/deepseek-v3/train-pp16-ep16.json \
  $S/deepseek-v3/infer-tp32-dp8.json $S/clusters/dgx-h100.json direct 2 1024
row "kimi-k2 1024->512 ranks" $S/kimi-k2/model.json $S/kimi-k2/train-1024.json $S/kimi-k2/infer-512.json \
  $S/clusters/dgx-h100.json direct 10 4096
