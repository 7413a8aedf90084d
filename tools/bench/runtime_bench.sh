#!/usr/bin/env bash
# End-to-end runtime throughput of `reshard run --local` on the tiny samples,
# direct vs gather. Usage: tools/bench/runtime_bench.sh [build-dir] [repeats]
# (Per-step overhead and pack/unpack-vs-memcpy micro benchmarks are not written yet.)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build}"
repeats="${2:-3}"
bin="$build/reshard"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
s="$root/samples"
printf '%-34s %-7s %12s %10s %10s\n' sample strategy bytes seconds GB/s
for case in tiny-dense:infer.json tiny-dense:infer-tp2-dp2.json tiny-moe:infer.json tiny-moe:infer-ep.json; do
  d="${case%%:*}"; infer="${case##*:}"
  for strategy in direct gather; do
    "$bin" compile --model "$s/$d/model.json" --from "$s/$d/train.json" --to "$s/$d/$infer" \
      --cluster "$s/clusters/dgx-h100.json" --strategy "$strategy" -o "$tmp/p.rsplan" >/dev/null
    best=""
    for _ in $(seq "$repeats"); do
      line="$("$bin" run "$tmp/p.rsplan" --local --json 2>/dev/null)"
      best="$(python3 -c '
import json, sys
r = json.loads(sys.argv[1]); b = sys.argv[2]
if not r["ok"]: sys.exit("run failed: " + sys.argv[1])
if b and float(b.split()[1]) <= r["seconds"]: print(b)
else: print(r["bytes"], r["seconds"], r["gbps"])' "$line" "$best")"
    done
    read -r bytes seconds gbps <<<"$best"
    printf '%-34s %-7s %12s %10.4f %10.4f\n' "$d/$infer" "$strategy" "$bytes" "$seconds" "$gbps"
  done
done
