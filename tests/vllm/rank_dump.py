"""One real vLLM rank: build and load the model (engine.py), write its dump
(tools/dump_state_dict.py's format, strides included) to OUT/rank{R}.json.

    RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python rank_dump.py MODEL_DIR OUT '{"tp":2,...}'
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "tools")]

import engine  # noqa: E402  (sets the CPU environment before vLLM is imported)


def coordinates(settings):
    """This rank's (tp, pp, dp) ranks and its expert-parallel rank, from vLLM's own groups."""
    from vllm.distributed import parallel_state as ps

    tp = ps.get_tensor_model_parallel_rank()
    pp = ps.get_pp_group().rank_in_group
    dp = ps.get_dp_group().rank_in_group
    ep = ps.get_ep_group().rank_in_group if settings.get("ep") else None
    return {"tp": tp, "pp": pp, "dp": dp, "ep": ep}


def main():
    model_dir, out, settings = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    import vllm
    import dump_state_dict

    model, _ = engine.build(model_dir, **settings)
    rank = int(os.environ["RANK"])
    meta = {"framework": f"vLLM {vllm.__version__} (real, CPU: tests/vllm)", "vllm": coordinates(settings)}
    dump_state_dict.write(os.path.join(out, f"rank{rank}.json"), model, rank, meta=meta)


if __name__ == "__main__":
    main()
