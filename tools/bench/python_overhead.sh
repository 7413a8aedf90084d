#!/usr/bin/env bash
# Python overhead (issue 15): run() of a plan with >100k steps per rank
# (2 ranks over Gloo, the per-step plan of runtime_bench) through
# `import reshard` against the same plan driven by C++ Session::run, and
# bind_module of a 2000-parameter torch module. Medians; C++ and Python
# pairs alternate ROUNDS times so that machine load hits both alike.
# Needs the package installed in $PY (tools/test.d/30-python.sh does it).
# Usage: tools/bench/python_overhead.sh [REPS per pair, default 5] [ROUNDS, default 3]
set -euo pipefail
cd "$(dirname "$0")/../.."
REPS=${1:-5}
ROUNDS=${2:-3}
PY=${PY:-$(tools/venv.sh)}
ninja -C build -j2 python_overhead >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
build/python_overhead plans "$TMP"
pair() {  # pair cpp|py -> appends the slower rank's times to $TMP/<kind>
  local kind=$1 store
  store=$(mktemp -d -p "$TMP")
  if [ "$kind" = cpp ]; then
    build/python_overhead run "$TMP/steps.rsplan" 0 "$store" "$REPS" >"$TMP/r0" &
    build/python_overhead run "$TMP/steps.rsplan" 1 "$store" "$REPS" >"$TMP/r1"
  else
    "$PY" tools/bench/python_overhead.py run "$TMP/steps.rsplan" 0 "$store" "$REPS" >"$TMP/r0" 2>>"$TMP/wrapper0" &
    "$PY" tools/bench/python_overhead.py run "$TMP/steps.rsplan" 1 "$store" "$REPS" >"$TMP/r1" 2>>"$TMP/wrapper1"
  fi
  wait
  paste <(tr ' ' '\n' <"$TMP/r0" | tail -n +2) <(tr ' ' '\n' <"$TMP/r1" | tail -n +2) |
    awk '{print ($1 > $2 ? $1 : $2)}' >>"$TMP/$kind"
}
for _ in $(seq "$ROUNDS"); do pair cpp; pair py; done
median() { sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
cat "$TMP/wrapper0" "$TMP/wrapper1" >"$TMP/wrapper"
"$PY" - "$TMP/cpp" "$TMP/py" "$TMP/wrapper" <<'PYEOF'
import statistics, sys
cpp, py = ([float(x) for x in open(f).read().split()] for f in sys.argv[1:3])
wrap = [float(x) for line in open(sys.argv[3]) for x in line.split()[1:]]
for name, f in (("min", min), ("median", statistics.median)):
    c, p = f(cpp), f(py)
    print(f"run() of 104000 steps/rank, {name} of {len(cpp)} runs: C++ {c*1e3:.2f} ms, Python {p*1e3:.2f} ms, "
          f"difference {100*(p-c)/c:+.2f}% (target within 5%)")
# Deterministic part: what the Python layer adds around the same C++ call.
w, base = statistics.median(wrap), min(py)
print(f"Python wrapper (run() wall minus the runtime's own seconds): median {w*1e6:.0f} us = "
      f"{100*w/base:.2f}% of the fastest run")
PYEOF
bind=$("$PY" tools/bench/python_overhead.py bind "$TMP/params.rsplan" 7 2>"$TMP/bindcpu")
n=$(echo "$bind" | cut -d' ' -f2)
med=$(echo "$bind" | cut -d' ' -f3- | tr ' ' '\n' | median)
cpu=$(cut -d' ' -f2- "$TMP/bindcpu" | tr ' ' '\n' | median)
"$PY" -c "print(f'bind_module of $n parameters: {$med*1e3:.2f} ms wall, {$cpu*1e3:.2f} ms CPU (medians of 7; target < 50 ms)')"
