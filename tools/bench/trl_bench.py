"""Per sync on the CPU case of tests/trl: reshard.trl's sync_weights against
TRL 1.16's own VLLMGeneration.sync_weights (FSDP2 full_tensor() and vLLM
load_weights per parameter) on the same trainer, the same vLLM rank and the
same layout (tiny Qwen3, FSDP2 dp_shard 2 with fp32 masters, two vLLM TP1
engines, 2 Gloo processes), and the plug-in against a bare Session.run() of
its own session. Each path: one warm-up, then the median and minimum of N
syncs on each rank, every rank starting together (a barrier before each).

    build/vllm-venv/bin/python tools/bench/trl_bench.py [--n 20]

Run it on a quiet machine: the two ranks share the cores with whatever else runs.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20, help="timed syncs per path")
    a = ap.parse_args()
    cmd = [sys.executable, os.path.join(ROOT, "tests", "trl", "run.py"), "--steps", "1", "--bench", str(a.n)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(out.stderr[-3000:] if out.returncode else "")
    text = out.stdout
    start = text.find('{\n "bench"')
    if out.returncode or start < 0:
        print(text[-5000:])
        raise SystemExit(f"trl_bench: tests/trl/run.py failed (exit {out.returncode})")
    bench = json.JSONDecoder().raw_decode(text[start:])[0]["bench"]
    paths = [k for k in bench[0] if k.endswith(")") or k.startswith(("reshard", "bare"))]
    print(f"per sync, {a.n} timed syncs per path, median (min) ms on each of {len(bench)} ranks:")
    for k in paths:
        cells = ", ".join(f"{b[k]['median_ms']:.2f} ({b[k]['min_ms']:.2f})" for b in bench)
        print(f"  {k:48s} {cells}")
    trl = "TRL sync_weights (full_tensor + load_weights)"
    for r, b in enumerate(bench):
        print(f"  rank {r}: TRL's path / reshard.trl = {b[trl]['median_ms'] / b['reshard.trl sync_weights']['median_ms']:.1f}x; "
              f"plug-in over bare run = {b['reshard.trl sync_weights']['median_ms'] - b['bare Session.run()']['median_ms']:.2f} ms; "
              f"bytes sent by reshard: {b['bytes_sent']}")


if __name__ == "__main__":
    main()
