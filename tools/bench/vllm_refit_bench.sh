#!/usr/bin/env bash
# reshard.vllm on real vLLM 0.33 CPU ranks (tests/vllm/refit_live.py, every
# case): per case, the medians over the vLLM ranks of a bare Session.run()
# and of WorkerRefit.run() (re-bind check + run + the engine's
# post-processing), N timed runs each after the checked refits, and the
# post-processing alone (WorkerRefit.finish) per checked refit, and the
# per-run check for replaced parameters alone (WorkerRefit.rebind_if_replaced).
#   tools/bench/vllm_refit_bench.sh [N]   (default 21)
# Needs build/ (ninja), build/venv and build/vllm-venv (tools/venv.sh,
# tools/vllm_venv.sh) with the package installed (tools/python_install.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-21}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
build/venv/bin/python tests/vllm/refit_live.py --build build --vllm-python build/vllm-venv/bin/python \
  --timed-runs "$n" --json "$out" >&2
python3 - "$out" "$n" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
print(f"| case | vLLM ranks | tensors / rank | Session.run() | WorkerRefit.run() | ratio | re-bind check | post-processing | of the run |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    b, w, f = r["bare_run_s"], r["worker_refit_run_s"], r["finish_s"]
    print(f"| {r['case']} | {r['vllm_ranks']} | {r['tensors_per_rank']} | {b * 1e3:.2f} ms | {w * 1e3:.2f} ms | "
          f"{w / b:.2f}x | {r['rebind_check_s'] * 1e3:.3f} ms | {f * 1e3:.3f} ms | {100 * f / b:.1f}% |")
print(f"\nmedians of {sys.argv[2]} runs each over every vLLM rank")
PY
