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
    "$PY" tools/bench/python_overhead.py run "$TMP/steps.rsplan" 0 "$store" "$REPS" >"$TMP/r0" &
    "$PY" tools/bench/python_overhead.py run "$TMP/steps.rsplan" 1 "$store" "$REPS" >"$TMP/r1"
  fi
  wait
  paste <(tr ' ' '\n' <"$TMP/r0" | tail -n +2) <(tr ' ' '\n' <"$TMP/r1" | tail -n +2) |
    awk '{print ($1 > $2 ? $1 : $2)}' >>"$TMP/$kind"
}
for _ in $(seq "$ROUNDS"); do pair cpp; pair py; done
median() { sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
cpp=$(median <"$TMP/cpp")
py=$(median <"$TMP/py")
"$PY" - "$cpp" "$py" <<'PYEOF'
import sys
cpp, py = map(float, sys.argv[1:])
print(f"run() of 104000 steps/rank: C++ {cpp*1e3:.2f} ms, Python {py*1e3:.2f} ms, "
      f"overhead {100*(py-cpp)/cpp:+.2f}% (target within 5%)")
PYEOF
bind=$("$PY" tools/bench/python_overhead.py bind "$TMP/params.rsplan" 7)
n=$(echo "$bind" | cut -d' ' -f2)
med=$(echo "$bind" | cut -d' ' -f3- | tr ' ' '\n' | median)
"$PY" -c "print(f'bind_module of $n parameters: {$med*1e3:.2f} ms (median of 7; target < 50 ms)')"
