#!/usr/bin/env python3
"""Refits into real vLLM 0.33 CPU ranks of the architectures issue 31 added
(glm4_moe, gpt_oss), bit for bit: one BF16 HF rank (plan rank 0: the model
spec's tensors) refits twice, with other values each round, into vLLM ranks
built from a checkpoint of a third set of values, through the plan `reshard
init --train hf --infer vllm:...` + `reshard compile` make; after each round
every parameter and buffer of every vLLM rank must equal a fresh vLLM model
loaded from that round's checkpoint (tests/vllm/rank_refit.py, unchanged:
WorkerRefit binds the model once, runs the plan, then the engine's
post-processing). So the values land where vLLM's own loaders put them: GLM-4.5's
fp32 router and split shared experts, gpt-oss's alternating gate/up rows in
w13_weight and w13_bias, its sinks, and w2_bias real on the MoE's first rank
and zero on the others.

    build/venv/bin/python tests/archs/refit_vllm.py [CASE ...]

gpt-oss's w2_bias on the MoE's other ranks is all padding in the layout: the
plan writes nothing there, and the zeros vLLM loaded must still equal a fresh
load's (should rank_refit.py list such a buffer as one the refit left
unchanged, that is expected and counted apart).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path[:0] = [HERE, os.path.join(ROOT, "tests", "vllm")]

import refit_live  # noqa: E402  (tests/vllm: write_checkpoint, hf_values; imports torch)
import launch  # noqa: E402
import record_vllm  # noqa: E402  (this folder: gpt-oss's checkpoint form)

DATA = os.path.join(ROOT, "tests", "data", "archs")
ROUNDS = 2

# name: the tests/data/archs case whose config it uses, vLLM's settings, `reshard init --infer`.
CASES = {
    "glm4moe-tp2": dict(config="vllm-glm4moe-tp2", vllm=dict(tp=2, pp=1, dp=1, ep=False), infer="vllm:tp=2"),
    "glm4moe-tp2-dp2-ep": dict(config="vllm-glm4moe-tp2-dp2-ep", vllm=dict(tp=2, pp=1, dp=2, ep=True),
                               infer="vllm:tp=2,dp=2,ep"),
    "gptoss-tp2-dp2": dict(config="vllm-gptoss-tp2-dp2", vllm=dict(tp=2, pp=1, dp=2, ep=False),
                           infer="vllm:tp=2,dp=2"),
    "gptoss-tp2-dp2-ep": dict(config="vllm-gptoss-tp2-dp2-ep", vllm=dict(tp=2, pp=1, dp=2, ep=True),
                              infer="vllm:tp=2,dp=2,ep"),
}


def checkpoint_form(config, tensors):
    """The model spec's tensors as the HF checkpoint names them (gpt-oss: fused, transposed experts)."""
    return record_vllm.gpt_oss_checkpoint(tensors, config) if config["model_type"] == "gpt_oss" else tensors


def hf_buffers(config, tensors):
    """What the `hf` layout binds: the model spec's tensors, but gpt-oss's expert biases fused as the
    checkpoint holds them (gate_up_proj_bias [E, 2I], gate and up alternating; down_proj_bias [E, H])."""
    if config["model_type"] != "gpt_oss":
        return dict(tensors)
    fused = record_vllm.gpt_oss_checkpoint(tensors, config)
    out = {n: t for n, t in tensors.items() if not n.endswith("_proj.bias") or ".experts." not in n}
    out.update({n: t for n, t in fused.items() if n.endswith("_proj_bias")})
    return out


def source(plan_path, store, model, work, config, vllm_python, errors):
    """Plan rank 0: new values each round, bound in place (TrainerRefit), the checkpoint of the same values."""
    try:
        import reshard
        plan = reshard.Plan.open(plan_path)
        session = reshard.Session(plan, 0, reshard.GlooTransport(0, plan.num_ranks, store=store,
                                                                 timeout_s=refit_live.TIMEOUT_S))
        tensors = refit_live.hf_values(model, 0)
        bound = hf_buffers(config, tensors)
        refit = reshard.TrainerRefit(session, bound)
        for k in range(ROUNDS):
            new = refit_live.hf_values(model, 100 + k)
            for n, t in tensors.items():
                t.copy_(new[n])
            for n, t in hf_buffers(config, tensors).items():
                bound[n].copy_(t)  # in place: the bound memory
            d = os.path.join(work, f"round{k}")
            os.makedirs(d, exist_ok=True)
            refit_live.write_checkpoint(vllm_python, d, "model", config, checkpoint_form(config, tensors))
            refit.run()
        for _ in range(2):  # rank_refit.py's timed runs (timed_runs=1: one bare, one WorkerRefit.run)
            refit.run()
    except Exception as e:  # noqa: BLE001 - reported by the caller
        errors.append(e)


def run_case(name, build, vllm_python, work):
    c = CASES[name]
    reshard_bin = os.path.join(build, "reshard")
    config_path = os.path.join(DATA, c["config"], "config.json")
    with open(config_path) as f:
        config = json.load(f)
    specs = os.path.join(work, "specs")
    subprocess.run([reshard_bin, "init", "-q", "--hf-config", config_path, "--train", "hf", "--infer", c["infer"],
                    "-o", specs], check=True)
    model = os.path.join(specs, "model.json")
    plan = os.path.join(work, "plan.rsplan")
    subprocess.run([reshard_bin, "compile", "-q", "--model", model, "--from", os.path.join(specs, "train.json"),
                    "--to", os.path.join(specs, "infer.json"), "--cluster", "dgx-h100", "-o", plan], check=True)
    store = os.path.join(work, "store")
    os.makedirs(store)
    # The vLLM ranks' first weights: other values, so that a refit that wrote nothing would fail.
    initial = refit_live.write_checkpoint(vllm_python, work, "initial", config,
                                          checkpoint_form(config, refit_live.hf_values(model, 7)))
    errors = []
    t = threading.Thread(target=source, daemon=True, args=(plan, store, model, work, config, vllm_python, errors))
    t.start()
    world = c["vllm"]["tp"] * c["vllm"]["pp"] * c["vllm"]["dp"]
    args = {"initial": initial, "settings": c["vllm"], "plan": plan, "store": store, "first": 1, "rounds": ROUNDS,
            "work": work, "timeout_s": refit_live.TIMEOUT_S, "timed_runs": 1, "via": "WorkerRefit"}
    t0 = time.time()
    try:
        launch.run(world, [os.path.join(ROOT, "tests", "vllm", "rank_refit.py"), json.dumps(args)],
                   timeout_s=refit_live.TIMEOUT_S, python=vllm_python, label=f"{name}-vllm", log_dir=work,
                   abort=lambda: f"the source: {errors[0]!r}" if errors else None)
    except RuntimeError as e:
        raise SystemExit(f"{name}: {e}")
    t.join(timeout=60)
    if errors:
        raise SystemExit(f"{name}: the source: {errors[0]!r}")
    bad, padding_only = [], []
    for r in range(world):
        with open(os.path.join(work, f"vllm-rank{r}.json")) as f:
            res = json.load(f)
        for k, rd in enumerate(res["rounds"]):
            bad += [f"rank {r} round {k}: {d}" for d in rd["differences"]]
            for n in rd["unchanged"]:
                if n.endswith(".w2_bias") and r > 0 and not c["vllm"]["ep"]:
                    padding_only.append(n)  # zeros on the MoE's other ranks, as vLLM loads them
                else:
                    bad.append(f"rank {r} round {k}: the refit left {n} as it was")
        if res["moved"]:
            bad.append(f"rank {r}: tensors moved in memory: {res['moved'][:4]}")
    if bad:
        raise SystemExit(f"{name}: the refit engine differs from a fresh load:\n  " + "\n  ".join(bad[:30]))
    print(f"{name}: {ROUNDS} refits from one HF rank into {world} real vLLM ranks ({c['infer']}): every parameter "
          f"and buffer equals a fresh vLLM load, bit for bit, after each"
          + (f"; {len(set(padding_only))} all-zero w2_bias buffers left as loaded" if padding_only else "")
          + f" ({time.time() - t0:.0f} s)", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--vllm-python", default=os.path.join(ROOT, "build", "vllm-venv", "bin", "python"))
    ap.add_argument("--work", help="keep checkpoints, plans and rank logs here (default: a temporary folder)")
    ap.add_argument("case", nargs="*", help=f"cases (default: all): {', '.join(CASES)}")
    a = ap.parse_args(argv)
    work = a.work or tempfile.mkdtemp(prefix="reshard-archs-refit-")
    for name in a.case or list(CASES):
        run_case(name, a.build, a.vllm_python, os.path.join(work, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
