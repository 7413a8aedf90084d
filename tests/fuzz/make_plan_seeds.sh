#!/usr/bin/env bash
# Writes the plan harness's seed corpus (tests/fuzz/seeds/plan/): the small
# samples and the quantized specs of make_spec_seeds.py, compiled by the
# given reshard binary. Usage: tests/fuzz/make_plan_seeds.sh build/reshard
# The seeds it wrote before schema 2 hold unpacked programs (version 1, still
# read) and stay as they are, so that the fuzzer reaches the program checks;
# packed-tiny-dense-* are schema 2 plans, whose programs are zstd frames.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-build/reshard}
out=tests/fuzz/seeds/plan
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
s=samples/tiny-dense
for to in infer infer-tp1-dp4; do
  for strategy in direct gather; do
    "$bin" compile --model $s/model.json --from $s/train.json --to $s/$to.json \
      --cluster samples/clusters/dgx-h100.json --strategy $strategy --staging-mb 2 -o "$tmp/p" >/dev/null
    cp "$tmp/p" "$out/tiny-dense-$to-$strategy"
  done
done
# The quantized seeds of the spec harness, split into their four files.
for f in tests/fuzz/seeds/spec/quant-*.json; do
  name=$(basename "$f" .json)
  python3 - "$f" "$tmp" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for key in ("model", "from", "to", "cluster"):
    json.dump(doc[key], open(f"{sys.argv[2]}/{key}.json", "w"))
PY
  "$bin" compile --model "$tmp/model.json" --from "$tmp/from.json" --to "$tmp/to.json" \
    --cluster "$tmp/cluster.json" -o "$tmp/p" >/dev/null
  cp "$tmp/p" "$out/$name"
done
