#!/usr/bin/env bash
# Python overhead: run() of a plan with >100k steps per rank
# (2 ranks over Gloo, the per-step plan of runtime_bench) through
# `import reshard` against the same plan driven by C++ Session::run, and
# bind_module of a 2000-parameter torch module.
#
# run(): each pass starts a fresh C++ pair and a fresh Python pair of ranks
# (same plan, same transport, same buffers), lets both settle, then alternates
# single runs between them (C++, Python, Python, C++, ...) so that the
# machine's load hits both alike; the figures are medians over all passes and
# the median of the paired ratios (each Python run against the C++ run beside
# it). A control (A/A: a second C++ pair in the Python pair's place) shows
# the method's own noise on this machine. Needs the package installed in $PY
# (tools/python_install.sh). Run it at a raised priority on a shared machine:
#   nice -n -5 tools/bench/python_overhead.sh
# Usage: tools/bench/python_overhead.sh [REPS per pass, default 21] [PASSES, default 7] [CONTROL_PASSES, default 3]
set -euo pipefail
cd "$(dirname "$0")/../.."
REPS=${1:-21}
PASSES=${2:-7}
CONTROL=${3:-3}
PY=${PY:-$(tools/venv.sh)}
ninja -C build -j2 python_overhead >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
build/python_overhead plans "$TMP"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg), nice $(nice)"
"$PY" tools/bench/python_overhead.py compare "$TMP/steps.rsplan" build/python_overhead "$REPS" "$PASSES"
if [ "$CONTROL" -gt 0 ]; then
  "$PY" tools/bench/python_overhead.py compare "$TMP/steps.rsplan" build/python_overhead "$REPS" "$CONTROL" control
fi
median() { sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
bind=$("$PY" tools/bench/python_overhead.py bind "$TMP/params.rsplan" 7 2>"$TMP/bindcpu")
n=$(echo "$bind" | cut -d' ' -f2)
med=$(echo "$bind" | cut -d' ' -f3- | tr ' ' '\n' | median)
cpu=$(cut -d' ' -f2- "$TMP/bindcpu" | tr ' ' '\n' | median)
"$PY" -c "print(f'bind_module of $n parameters: {$med*1e3:.2f} ms wall, {$cpu*1e3:.2f} ms CPU (medians of 7; target < 50 ms)')"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
alive=$("$PY" tools/bench/python_overhead.py alive 10000 21)
n=$(echo "$alive" | cut -d' ' -f2)
med=$(echo "$alive" | cut -d' ' -f3- | tr ' ' '\n' | median)
"$PY" -c "print(f'run() checking that $n bound tensors still hold their memory: {$med*1e3:.2f} ms ({$med*1e9/$n:.0f} ns per binding, median of 21)')"
