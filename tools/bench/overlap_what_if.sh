#!/usr/bin/env bash
# What overlapping rounds would buy: the runtime keeps one round's
# messages in flight, and a NIC idles while its partners finish the round
# (bound_gap.sh's "idle"). `simulate --what-if-overlap N` predicts a runtime
# that keeps N rounds in flight; such a runtime needs N + 1 staging arenas of
# a round's size where today's needs 2, so each depth is compared at the same
# staging memory: the plan compiled with --staging-mb 512 x 2 / (N + 1).
# Usage: tools/bench/overlap_what_if.sh   (BUILD=build-dir, default build)
. "$(dirname "$0")/gap_rows.sh"

ratio() {  # PLAN CLUSTER DEPTH
  "$BIN" simulate -q "$1" --cluster "$2" --json --what-if-overlap "$3" |
    python3 -c "import json, sys; print(f\"{json.load(sys.stdin)['ratio_to_bound']:.3f}x\")"
}

row() {  # LABEL MODEL TRAIN INFER CLUSTER
  local cells=()
  for spec in 512:0 512:2 341:2 256:3; do
    local mb=${spec%:*} depth=${spec#*:}
    [[ -f $tmp/p$mb.rsplan ]] ||
      "$BIN" compile -q --staging-mb "$mb" --model "$2" --from "$3" --to "$4" --cluster "$5" -o "$tmp/p$mb.rsplan"
    cells+=("$(ratio "$tmp/p$mb.rsplan" "$5" "$depth")")
  done
  rm -f "$tmp"/p*.rsplan
  echo "| $1 | ${cells[0]} | ${cells[1]} | ${cells[2]} | ${cells[3]} |"
}

echo "| row | today (512 MiB, 1 in flight) | 2 in flight, 512 MiB (needs 768) | 2 in flight, 341 MiB (same memory) | 3 in flight, 256 MiB (same memory) |"
echo "|---|---|---|---|---|"
gap_rows row
