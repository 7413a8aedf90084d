#!/usr/bin/env bash
# Where the time above the lower bound goes, for the rows of gap_rows.sh:
# `simulate` splits predicted / bound at the refit's busiest link
# (sim/simulate.h, GapOf):
#   bytes: that link's bytes at its bandwidth against the bound (1.00 where
#          the bound's bytes are spread evenly over its links)
#   idle:  the prediction against that link's busy time (1 / its
#          utilization): waiting on partners inside rounds
# Where the busiest GPU's HBM work (packs, copies, unpacks) outlasts that
# link's bytes (colocated rows), both are read off that HBM instead.
# Usage: tools/bench/bound_gap.sh   (BUILD=build-dir, default build)
. "$(dirname "$0")/gap_rows.sh"

report() {  # LABEL PLAN CLUSTER
  "$BIN" simulate -q "$2" --cluster "$3" --json | python3 -c "
import json, sys
s = json.load(sys.stdin)
g = s['gap']
what = (f\"GPU {g['rank']} HBM: {g['hbm_seconds'] * 1e3:.3f} ms\" if g['resource'] == 'hbm'
        else f\"{g['link']}: {g['link_bytes'] / 1e9:.2f} GB\")
print(f\"| $1 | {s['ratio_to_bound']:.3f}x | {s['bound']['binding']} | {what} | \"
      f\"{g['bytes_factor']:.3f} | {g['idle_factor']:.3f} ({100 / g['idle_factor']:.1f}% busy) |\")"
}

compile() {  # LABEL MODEL TRAIN INFER CLUSTER
  "$BIN" compile -q --model "$2" --from "$3" --to "$4" --cluster "$5" -o "$tmp/p.rsplan"
  report "$1" "$tmp/p.rsplan" "$5"
}

echo "| row | predicted / bound | binding term | busiest link (or GPU HBM) | bytes | idle |"
echo "|---|---|---|---|---|---|"
gap_rows compile
# Training and inference on the same 8 GPUs (docs/benchmarks.md, Colocated).
python3 -c "
import json
c = json.load(open('$H'))
c.update(name='colocated', placement='colocated')
json.dump(c, open('$tmp/colocated.json', 'w'))"
init_row compile "Qwen3-30B-A3B colocated, Megatron -> TP8" $C/qwen3-30b-a3b.json megatron:tp=2,ep=8,etp=1,grouped-gemm \
  vllm:tp=8 "$tmp/colocated.json"
init_row compile "Qwen3-30B-A3B colocated, FSDP2 -> TP2 DP4 EP" $C/qwen3-30b-a3b.json fsdp2:dp_shard=8,master=bf16 \
  vllm:tp=2,dp=4,ep "$tmp/colocated.json"
