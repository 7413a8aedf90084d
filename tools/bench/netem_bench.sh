#!/usr/bin/env bash
# `reshard simulate` against a real, shaped network. One Linux network
# namespace per GPU, each with two veth links: a "NIC" into one bridge shaped
# to 100 Mbit/s per direction (tc tbf on both ends), and an "NVLink" into a
# second bridge shaped to 400 Mbit/s. Every rank is a `reshard run --ranks g`
# process in its namespace (Gloo, TCP rendezvous served by rank 0's namespace,
# nvlink-channel messages over the NVLink link). Plans are compiled from the
# bundled samples scaled up (x16 per dim, about 110 MB of BF16 for tiny-dense)
# for a matching cluster spec, each with and without --no-nvlink-exchange,
# run three times; the table shows predicted, measured (median) and the lower
# bound. Run as root on Linux; creates and removes namespaces, veths and
# bridges (also on failure or Ctrl-C). Takes minutes.
# Usage: tools/bench/netem_bench.sh [build-dir] [--reps N] [--only NAME]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="$root/build"
reps=3
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    *) build="$1"; shift ;;
  esac
done
bin="$build/reshard"
[ "$(id -u)" = 0 ] || { echo "netem_bench: needs root (network namespaces, tc)"; exit 1; }
[ -x "$bin" ] || { echo "netem_bench: $bin missing: build first"; exit 1; }
NIC_RATE=${NIC_RATE:-100mbit}
NVL_RATE=${NVL_RATE:-400mbit}
MAXG=16
tag="rsn$$"
work="$(mktemp -d)"
cleanup() {
  for g in $(seq 0 $((MAXG - 1))); do ip netns del "${tag}g$g" 2>/dev/null || true; done
  ip link del "${tag}bn" 2>/dev/null || true
  ip link del "${tag}bv" 2>/dev/null || true
  [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

shape() {  # dev rate
  tc qdisc replace dev "$1" root tbf rate "$2" burst 256kb latency 100ms
}
ip link add "${tag}bn" type bridge
ip link add "${tag}bv" type bridge
ip link set "${tag}bn" up
ip link set "${tag}bv" up
for g in $(seq 0 $((MAXG - 1))); do
  ns="${tag}g$g"
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  for kind in n v; do
    ip link add "${tag}${kind}h$g" type veth peer name "${tag}${kind}$g"
    ip link set "${tag}${kind}$g" netns "$ns"
    ip link set "${tag}${kind}h$g" master "${tag}b${kind}"
    ip link set "${tag}${kind}h$g" up
    ip -n "$ns" link set "${tag}${kind}$g" up
    rate=$NIC_RATE; [ $kind = v ] && rate=$NVL_RATE
    ip -n "$ns" addr add "10.7$([ $kind = n ] && echo 0 || echo 1).$((g / 200)).$((g % 200 + 1))/16" dev "${tag}${kind}$g"
    shape "${tag}${kind}h$g" "$rate"                      # towards the GPU
    ip netns exec "$ns" tc qdisc replace dev "${tag}${kind}$g" root tbf rate "$rate" burst 256kb latency 100ms  # from it
  done
done
nic_ip() { echo "10.70.$(($1 / 200)).$(($1 % 200 + 1))"; }
nvl_ip() { echo "10.71.$(($1 / 200)).$(($1 % 200 + 1))"; }

# Scaled samples and cluster specs matching the shaped links.
python3 - "$root/samples" "$work" <<'PY'
import json, os, sys, copy
src, out = sys.argv[1], sys.argv[2]
K = 16
def scale_model(m):
    m = copy.deepcopy(m)
    for t in m["tensors"]:
        t["shape"] = [d * K for d in t["shape"]]
    return m
def scale_layout(l):
    l = copy.deepcopy(l)
    for b in l.get("buffers", []):
        if "shape" in b: b["shape"] = [d * K for d in b["shape"]]
    return l
for d in ("tiny-dense", "tiny-moe"):
    os.makedirs(f"{out}/{d}", exist_ok=True)
    for f in os.listdir(f"{src}/{d}"):
        j = json.load(open(f"{src}/{d}/{f}"))
        j = scale_model(j) if f == "model.json" else scale_layout(j)
        json.dump(j, open(f"{out}/{d}/{f}", "w"))
for gpd in (2, 4, 8):
    json.dump({"format": "reshard.cluster/1", "name": f"netem-{gpd}", "gpus_per_domain": gpd,
               "nic_gbps": 0.1, "nvlink_GBps": 0.05, "hbm_GBps": 2.0,
               "nic_latency_us": 200.0, "nvlink_latency_us": 200.0, "placement": "disjoint",
               "sources": ["tools/bench/netem_bench.sh: tc tbf 100 Mbit/s NIC, 400 Mbit/s NVLink veths; "
                           "hbm_GBps: CPU pack/unpack, an assumption"]},
              open(f"{out}/netem-{gpd}.json", "w"))
PY

# name | sample | from | to | cluster | compile flags
plans=(
  "tp2-tp4|tiny-dense|train|infer|netem-4|"
  "tp2-tp4-staging|tiny-dense|train|infer|netem-4|--staging-mb 4"
  "dp4-one-domain|tiny-dense|train|infer-tp1-dp4|netem-4|"
  "dp4-two-domains|tiny-dense|train|infer-tp1-dp4|netem-2|"
  "moe-ep-tp|tiny-moe|train|infer|netem-4|"
  "tp2-tp4-gather|tiny-dense|train|infer|netem-4|--strategy gather"
)
printf "%-28s %5s %7s %12s %12s %8s %10s\n" plan ranks rounds predicted_s measured_s ratio bound_s
results="$work/results.txt"
: >"$results"
port=31000
for spec in "${plans[@]}"; do
  IFS='|' read -r name sample from to cluster flags <<<"$spec"
  for ex in "" "--no-nvlink-exchange"; do
    [ "$flags" = "--strategy gather" ] && [ -n "$ex" ] && continue
    full="$name${ex:+-noex}"
    [ -n "$only" ] && [ "$only" != "$full" ] && continue
    plan="$work/$full.rsplan"
    # shellcheck disable=SC2086
    "$bin" compile -q --model "$work/$sample/model.json" --from "$work/$sample/$from.json" \
      --to "$work/$sample/$to.json" --cluster "$work/$cluster.json" $flags $ex -o "$plan"
    sim="$("$bin" simulate -q --json "$plan" --cluster "$work/$cluster.json")"
    n=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["ranks"])' "$sim")
    [ "$n" -le $MAXG ] || { echo "$full: $n ranks > $MAXG namespaces"; exit 1; }
    times=()
    for rep in $(seq 1 "$reps"); do
      port=$((port + 1))
      pids=()
      for g in $(seq 0 $((n - 1))); do
        ip netns exec "${tag}g$g" "$bin" run "$plan" --ranks "$g" --rendezvous "$(nic_ip 0):$port" \
          --listen "$(nic_ip "$g")" --nvlink-listen "$(nvl_ip "$g")" --timeout 300 --json \
          >"$work/r$g.json" 2>"$work/r$g.err" &
        pids+=($!)
      done
      fail=0
      for p in "${pids[@]}"; do wait "$p" || fail=1; done
      if [ $fail = 1 ]; then
        echo "$full: run failed"; grep -hv "ranks finished" "$work"/r*.err; cat "$work"/r*.json; exit 1
      fi
      t=$(python3 - "$work" "$n" <<'PY'
import json, sys
w, n = sys.argv[1], int(sys.argv[2])
rs = [json.load(open(f"{w}/r{g}.json")) for g in range(n)]
assert all(r["ok"] and r["wrong"] == 0 for r in rs), [r for r in rs if not r["ok"]]
print(max(r["seconds"] for r in rs))
PY
)
      times+=("$t")
    done
    python3 - "$full" "$sim" "${times[@]}" <<'PY' | tee -a "$results"
import json, statistics, sys
name, sim, times = sys.argv[1], json.loads(sys.argv[2]), [float(t) for t in sys.argv[3:]]
m = statistics.median(times)
p = sim["predicted_seconds"]
print(f"{name:<28} {sim['ranks']:>5} {sim['rounds']:>7} {p:>12.2f} {m:>12.2f} {m / p:>7.2f}x {sim['lower_bound_seconds']:>10.2f}"
      f"   runs: {' '.join(f'{t:.2f}' for t in times)}")
PY
  done
done
