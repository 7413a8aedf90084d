#!/usr/bin/env bash
# A recompile after an inference-side change only: DeepSeek-V3,
# Megatron PP16 EP16 -> vLLM TP8 x DP4 with EP, 8 engines, on DGX H100. EPLB
# moves experts between EP ranks, which a layout says with "assign"; here 8
# pairs of experts swap ranks (seeded), against the linear placement written
# by `reshard init` and the same placement written as an explicit "assign";
# and the EPLB layout again with `--fill-of` the linear layout's plan (its
# round fill, no other fill tried), said byte-identical to its default
# compile or not.
# Prints compile medians of REPS runs, plan sizes and `simulate` against the
# lower bound. Usage: tools/bench/eplb_bench.sh [REPS]   (BUILD=build-dir)
# With BASE=path/to/an/older/reshard, that binary compiles each layout too,
# run for run with this one (a noisy machine slows both alike), and each row
# gets its median beside this build's.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPS=${1:-5}
BIN=${BUILD:-build}/reshard
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT

"$BIN" init -q --hf-config samples/deepseek-v3/config.json \
  --train megatron:pp=16,ep=16,etp=1,grouped-gemm,pp-layers=3,4,4,4,4,4,4,4,4,4,4,4,4,4,4,2 \
  --infer vllm:tp=8,dp=4,ep,engines=8,quant=none --cluster dgx-h100 -o "$d"
python3 - "$d" <<'EOF'
import json, random, sys
d = sys.argv[1]
layout = json.load(open(f"{d}/infer.json"))
ep = dict(layout["meshes"]["expert"])["ep"]
experts = 256
linear = [list(range(r * experts // ep, (r + 1) * experts // ep)) for r in range(ep)]
moved = [list(r) for r in linear]
rng = random.Random(1)
for _ in range(8):  # an EPLB step: 8 pairs of experts change ranks
    a, b = rng.sample(range(ep), 2)
    i, j = rng.randrange(len(moved[a])), rng.randrange(len(moved[b]))
    moved[a][i], moved[b][j] = moved[b][j], moved[a][i]
for name, assign in (("assign", linear), ("eplb", [sorted(r) for r in moved])):
    out = json.loads(json.dumps(layout))
    for p in out["placements"]:
        for spec in p.values():
            if isinstance(spec, dict) and spec.get("shard") == "expert":
                spec["assign"] = assign
    json.dump(out, open(f"{d}/infer-{name}.json", "w"))
EOF

median() { sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
# compile BINARY LAYOUT PLAN [FLAGS...]: prints its wall seconds
compile() {
  local s e bin=$1 layout=$2 plan=$3
  shift 3
  s=$(date +%s.%N)
  "$bin" compile -q --model "$d/model.json" --from "$d/train.json" --to "$d/$layout.json" --cluster "$d/cluster.json" \
    -o "$plan" "$@"
  e=$(date +%s.%N)
  python3 -c "print($e - $s)"
}

echo "| inference layout | compile (median of $REPS)${BASE:+ | previous binary (median, run for run)} | plan | predicted refit | lower bound | predicted / bound |"
echo "|---|---|${BASE:+---|}---|---|---|---|"
# The last row: the EPLB step's layout recompiled with --fill-of the linear
# layout's plan (one fill, no estimate); a previous binary without --fill-of
# compiles it as the row before.
base_fill_of=0
if [ -n "${BASE:-}" ] && [[ $("$BASE" compile --help) == *--fill-of* ]]; then base_fill_of=1; fi
for f in infer infer-assign infer-eplb infer-eplb--fill-of; do
  ts=() bs=() flags=() layout=$f
  if [ "$f" = infer-eplb--fill-of ]; then layout=infer-eplb flags=(--fill-of "$d/infer.rsplan"); fi
  for _ in $(seq "$REPS"); do
    ts+=("$(compile "$BIN" "$layout" "$d/$f.rsplan" "${flags[@]}")")
    if [ -n "${BASE:-}" ]; then
      if [ "$base_fill_of" = 1 ]; then bs+=("$(compile "$BASE" "$layout" "$d/base.rsplan" "${flags[@]}")")
      else bs+=("$(compile "$BASE" "$layout" "$d/base.rsplan")"); fi
    fi
  done
  med=$(printf '%s\n' "${ts[@]}" | median)
  base=""
  if [ -n "${BASE:-}" ]; then base=" $(printf '%.2f s |' "$(printf '%s\n' "${bs[@]}" | median)")"; fi
  "$BIN" simulate "$d/$f.rsplan" --cluster "$d/cluster.json" --json |
    python3 -c "
import json, sys
j = json.load(sys.stdin)
print(f\"| $f | {float('$med'):.2f} s |$base {$(stat -c %s "$d/$f.rsplan") / 2**20:.1f} MiB | {j['predicted_seconds']:.3f} s | \"
      f\"{j['lower_bound_seconds']:.3f} s | {j['ratio_to_bound']:.3f}x |\")"
done
if cmp -s "$d/infer-eplb.rsplan" "$d/infer-eplb--fill-of.rsplan"; then
  echo "infer-eplb with --fill-of: byte-identical to its default compile"
else
  echo "infer-eplb with --fill-of: differs from its default compile (another fill)"
fi
