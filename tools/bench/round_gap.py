#!/usr/bin/env python3
"""Where a row's `idle` goes, round by round: the busiest link's time in each
round against the time its bytes need (docs/benchmarks.md, "Rows against
the bound"; docs/simulation.md).

    tools/bench/round_gap.py PLAN CLUSTER [--rounds]

Runs `reshard simulate PLAN --cluster CLUSTER --json --trace` (the busiest
link and the timeline) and `reshard show PLAN --rank R --json` (that rank's
steps), with BIN (default build/reshard). A rank's transfers of a round on
one path are one slice of the timeline, from posting them to the last
completion; the next round's slice starts once they completed. The time
above the link's busy time (its bytes at its bandwidth) is split into:
  short rounds   rounds that give the link under 90% of its median round's
                 bytes; the round lasts as long as its partners' transfers
  full rounds    the other rounds: flows sharing the partners' links end later
  between        time between the rank's slices on that path (local work
                 the pipeline did not hide, waiting for a partner to post)
  after          from the link's last round to the end of the refit
Prints the split in ms and as a share of the predicted time; --rounds lists
every round.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan")
    ap.add_argument("cluster")
    ap.add_argument("--rounds", action="store_true", help="list every round")
    args = ap.parse_args()
    binary = os.environ.get("BIN", "build/reshard")
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = os.path.join(tmp, "trace.json")
        sim = json.loads(run([binary, "simulate", "-q", args.plan, "--cluster", args.cluster, "--json",
                              "--trace", trace_path]))
        with open(trace_path) as f:
            trace = json.load(f)["traceEvents"]
    gap = sim["gap"]
    if not gap or not sim["busiest_links"] or sim["busiest_links"][0]["bytes"] == 0:
        sys.exit("round_gap: no link carries anything in this plan")
    # The busiest link (where simulate reads the gap off a GPU's HBM
    # instead, the link is split all the same, and the HBM named).
    link = sim["busiest_links"][0]
    if gap["resource"] == "hbm":
        print(f"note: GPU {gap['rank']}'s HBM work ({gap['hbm_seconds'] * 1e3:.3f} ms) outlasts every link's bytes; "
              f"it is {gap['bytes_factor']:.3f}x the bound, busy {100 / gap['idle_factor']:.1f}% of the refit")
    rank, path, inbound = link["rank"], link["path"], link["direction"] == "in"
    bandwidth = link["bytes"] / (link["utilization"] * sim["predicted_seconds"])
    show = json.loads(run([binary, "show", args.plan, "--rank", str(rank), "--json"]))
    program = next(r for r in show["per_rank"] if r["rank"] == rank)["program"]
    per_round = {}
    for step in program:
        if step["kind"] not in ("send", "forward", "recv") or step.get("channel") != path:
            continue
        if step.get("peer") == rank or (step["kind"] == "recv") != inbound:
            continue
        per_round[step["round"]] = per_round.get(step["round"], 0) + step["bytes"]
    track = 1 if path == "net" else 2
    slices = sorted((e for e in trace if e.get("ph") == "X" and e["pid"] == rank and e["tid"] == track),
                    key=lambda e: e["ts"])
    if not slices:
        sys.exit(f"round_gap: rank {rank} has no {path} transfers in the timeline")
    median = statistics.median(per_round.values()) if per_round else 0
    split = {"short rounds": 0.0, "full rounds": 0.0, "between": 0.0, "after": 0.0}
    busy = 0.0
    end = 0.0
    rows = []
    for e in slices:
        r = e["args"]["round"]
        t0, dur = e["ts"] * 1e-6, e["dur"] * 1e-6
        split["between"] += max(0.0, t0 - end)
        end = t0 + dur
        need = per_round.get(r, 0) / bandwidth
        busy += need
        short = per_round.get(r, 0) < 0.9 * median
        split["short rounds" if short else "full rounds"] += max(0.0, dur - need)
        rows.append((r, per_round.get(r, 0), need, dur, short))
    split["after"] = max(0.0, sim["predicted_seconds"] - end)
    T = sim["predicted_seconds"]
    print(f"{args.plan}: predicted {T * 1e3:.3f} ms, {sim['ratio_to_bound']:.3f}x the bound; busiest link "
          f"{link['link']}: {link['bytes'] / 1e9:.3f} GB, busy {busy * 1e3:.3f} ms ({100 * busy / T:.1f}%), "
          f"{len(slices)} rounds, median {median / 1e9:.3f} GB a round")
    for k, v in split.items():
        print(f"  {k:13s} {v * 1e3:8.3f} ms  {100 * v / T:5.1f}%")
    rest = T - busy - sum(split.values())
    print(f"  {'(overlap)':13s} {rest * 1e3:8.3f} ms  {100 * rest / T:5.1f}%  (rounds shorter than their bytes need: "
          "a slice counts from posting, the bytes of other rounds' slices overlap it)")
    if args.rounds:
        print("round    GB      need ms   slice ms")
        for r, b, need, dur, short in rows:
            print(f"{r:5d} {b / 1e9:7.3f} {need * 1e3:9.3f} {dur * 1e3:9.3f}{'  short' if short else ''}")


if __name__ == "__main__":
    main()
