#!/usr/bin/env python3
"""Where one rank's NIC-received bytes go, by tensor: the breakdown behind a
row's `bytes` factor in `reshard simulate` (docs/benchmarks.md, "Rows
against the bound"; docs/simulation.md).

    reshard show PLAN --rank R --json > rank.json
    tools/bench/nic_ingress.py rank.json

Each network recv lands in the rank's staging; the bytes of it that the
round's unpacks read are counted against the tensor each unpack writes, in
the dtype they travel in, and the bytes the next round's forwards read
against the channel they leave on (a relayed stripe is counted both ways).
An unpack that quantizes on the receiver (the amax path, `quantize_scaled`)
reads its values from the staging region `src` in the training dtype: its
`bytes` are what it writes, so the values it reads are counted as `src`'s
elements at --values-bytes (2: BF16). Prints GB per tensor family (layer
numbers folded), then what nothing reads (should be none).
"""
import argparse
import collections
import json
import math
import re


def region_elements(text):
    """Elements of a region as `show` prints it: `... (shape):(stride)`."""
    shape = re.search(r"\(([\d,]+)\):\(", text)
    return math.prod(int(x) for x in shape.group(1).split(",")) if shape else 0


def family(dst):
    name = dst.split("'")[1] if "'" in dst else "staging (partial amax grids)"
    return re.sub(r"layers\.\d+", "layers.N", name)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rank_json", help="`reshard show PLAN --rank R --json` output")
    ap.add_argument("--values-bytes", type=int, default=2, help="bytes per value the amax path stages (BF16: 2)")
    args = ap.parse_args()
    rank = json.load(open(args.rank_json))["per_rank"][0]
    rounds = collections.defaultdict(list)
    for s in rank["program"]:
        rounds[s["round"]].append(s)
    by = collections.Counter()
    unread = 0
    for r, steps in sorted(rounds.items()):
        recvs = [(s["staging"], s["staging"] + s["bytes"]) for s in steps if s["kind"] == "recv" and s["channel"] == "net"]
        reads = []  # (begin, end, what)
        for s in steps:
            if s["kind"] != "unpack":
                continue
            n = s["bytes"]
            if s.get("quant", {}).get("kind") == "quantize_scaled":
                n = region_elements(s["src"]) * args.values_bytes
                what = family(s["dst"]) + " (values quantized here)"
            else:
                what = family(s["dst"])
            reads.append((s["staging"], s["staging"] + n, what))
        for s in rounds.get(r + 1, []):
            if s["kind"] == "forward":
                reads.append((s["staging"], s["staging"] + s["bytes"], "forwarded over " + s["channel"]))
        for a, b in recvs:
            by["(net received)"] += b - a
            spans = []
            for x, y, what in reads:
                x, y = max(x, a), min(y, b)
                if y > x:
                    by[what] += y - x
                    spans.append((x, y))
            spans.sort()
            cur, seen = a, 0
            for x, y in spans:
                x = max(x, cur)
                if y > x:
                    seen += y - x
                    cur = y
            unread += (b - a) - seen
    print(f"rank {rank['rank']} ({rank['side']}), NIC in {rank['net_received'] / 1e9:.4f} GB:")
    for what, n in sorted(by.items(), key=lambda kv: -kv[1]):
        if n >= 1e6:
            print(f"  {n / 1e9:9.4f} GB  {what}")
    print(f"  {unread / 1e9:9.4f} GB  received over the NIC, read by no step of this rank")


if __name__ == "__main__":
    main()
