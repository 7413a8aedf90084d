#!/usr/bin/env python3
"""Builds each tiny Megatron-Core case on CPU and records what its ranks hold:
tests/data/megatron/<case>/dump.json (every rank's named_parameters() plus
persistent buffers, names without Float16Module's "module." prefix) and the
case's Hugging Face config.json.

    build/venv/bin/python tests/megatron/dump_cases.py [CASE ...] [-o tests/data/megatron]
"""
import argparse
import json
import os
import sys
import tempfile

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools")]

from cases import CASES  # noqa: E402
import ranks  # noqa: E402


def _dump_rank(rank, case_name, tmp):
    import importlib.metadata
    import dump_state_dict
    import tiny_gpt
    case = CASES[case_name]
    tiny_gpt.parallel(case)
    meta = {"framework": f"megatron-core {importlib.metadata.version('megatron-core')}", "megatron": tiny_gpt.coords()}
    model = tiny_gpt.build(case, wrap=True)
    dump_state_dict.write(os.path.join(tmp, f"rank{rank}.json"), model, rank, strip="module.", meta=meta)
    bare = tiny_gpt.build(case, wrap=False)
    dump_state_dict.write(os.path.join(tmp, f"bare{rank}.json"), bare, rank, meta=meta)


def dump_case(name, out_root):
    case = CASES[name]
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        ranks.spawn(case["world"], _dump_rank, name, tmp)
        for kind, file in (("rank", "dump.json"), ("bare", "dump-no-float16module.json")):
            dumps = []
            for r in range(case["world"]):
                with open(os.path.join(tmp, f"{kind}{r}.json")) as f:
                    dumps.append(json.load(f))
            import dump_state_dict
            dump_state_dict.write_json(os.path.join(out, file), dumps)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(case["hf"], f, indent=2)
        f.write("\n")
    print(f"{out}: {case['world']} ranks dumped")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*", help=f"default: all of {', '.join(CASES)}")
    ap.add_argument("-o", "--out", default=os.path.join(os.path.dirname(__file__), "..", "data", "megatron"))
    a = ap.parse_args()
    for name in a.cases or CASES:
        if name not in CASES:
            sys.exit(f"dump_cases: unknown case '{name}', expected one of {', '.join(CASES)}")
        dump_case(name, a.out)


if __name__ == "__main__":
    main()
