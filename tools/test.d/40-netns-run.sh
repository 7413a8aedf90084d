#!/usr/bin/env bash
# Functional test (not timed) of the multi-host runner: two Linux network
# namespaces joined by a veth pair stand for two hosts; `reshard run --ranks`
# runs half of a small plan's ranks in each, meeting through the TCP
# rendezvous that rank 0 serves, and checks every destination byte. Skipped,
# with a message, where namespaces cannot be created (not root, no iproute2,
# a container without CAP_NET_ADMIN). Cleans up also on failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${RESHARD_BIN:-build/reshard}"
skip() { echo "SKIP netns-run: $*"; exit 0; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"
[ -x "$bin" ] || { echo "netns-run: $bin is missing (build first)"; exit 1; }

tag="rs$$"
a="${tag}a" b="${tag}b"
work="$(mktemp -d)"
cleanup() {
  ip netns del "$a" 2>/dev/null || true
  ip netns del "$b" 2>/dev/null || true
  ip link del "${tag}va" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$a" 2>/dev/null || skip "cannot create network namespaces here (ip netns add failed)"
ip netns add "$b"
ip link add "${tag}va" type veth peer name "${tag}vb"
ip link set "${tag}va" netns "$a"
ip link set "${tag}vb" netns "$b"
ip -n "$a" addr add 10.231.0.1/24 dev "${tag}va"
ip -n "$b" addr add 10.231.0.2/24 dev "${tag}vb"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "${tag}va" up
ip -n "$b" link set "${tag}vb" up

"$bin" compile --model samples/tiny-dense/model.json --from samples/tiny-dense/train.json \
  --to samples/tiny-dense/infer.json --cluster samples/clusters/dgx-h100.json -o "$work/p.rsplan" >/dev/null
n=$("$bin" show "$work/p.rsplan" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["ranks"])')
half=$((n / 2))
port=$((20000 + $$ % 20000))
# Host A serves the rendezvous (it runs rank 0); host B connects to it.
ip netns exec "$a" "$bin" run "$work/p.rsplan" --ranks "0-$((half - 1))" --rendezvous "10.231.0.1:$port" \
  --timeout 30 --json >"$work/a.json" 2>"$work/a.err" &
pa=$!
ip netns exec "$b" "$bin" run "$work/p.rsplan" --ranks "$half-$((n - 1))" --rendezvous "10.231.0.1:$port" \
  --timeout 30 --json >"$work/b.json" 2>"$work/b.err" &
pb=$!
rc=0
wait $pa || rc=1
wait $pb || rc=1
for h in a b; do
  python3 - "$work/$h.json" "$h" <<'PY' || rc=1
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ok"] and r["wrong"] == 0 and r["failed_ranks"] == 0, r
print(f"netns-run host {sys.argv[2]}: ranks {r['first_rank']}-{r['first_rank'] + r['ranks'] - 1} of "
      f"{r['plan_ranks']}, {r['checked']} elements checked, {r['wrong']} wrong, {r['net_bytes']} net bytes sent")
PY
done
# The destination ranks are on host b: every element they need was checked there.
python3 -c 'import json,sys; a, b = (json.load(open(f)) for f in sys.argv[1:]); assert b["checked"] > 0 and a["wrong"] + b["wrong"] == 0' \
  "$work/a.json" "$work/b.json" || rc=1
if [ $rc != 0 ]; then
  echo "netns-run FAILED"; cat "$work"/*.err "$work"/*.json 2>/dev/null; exit 1
fi
echo "netns-run: ok"
