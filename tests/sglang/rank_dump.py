"""One real SGLang rank: build and load the model (engine.py), write its dump
(tools/dump_state_dict.py's format, strides included, plus MLA's derived
attributes w_kc / w_vc / w_scale) to OUT/rank{R}.json.

    RANK=.. MASTER_PORT=.. python rank_dump.py MODEL_DIR OUT '{"tp": 2, "ep": 1, "attn_dp": 1}'
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "tools")]

import engine  # noqa: E402  (sets the CPU environment before SGLang is imported)


def main():
    model_dir, out, settings = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    import dump_state_dict

    model = engine.build_rank(model_dir, **settings)
    rank = int(os.environ["RANK"])
    dump = dump_state_dict.rank_dump(model, rank, meta={
        "framework": f"SGLang {engine.VERSION} (real, CPU: tests/sglang)", "sglang": engine.coordinates()})
    dump["params"] += [dump_state_dict.entry(n, t) for n, t in engine.derived_attributes(model).items()]
    dump_state_dict.write_json(os.path.join(out, f"rank{rank}.json"), dump)


if __name__ == "__main__":
    main()
