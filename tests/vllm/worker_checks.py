#!/usr/bin/env python3
"""reshard.vllm's checks on a real vLLM 0.33 rank (one CPU process, TP 1):
before any byte moves, an engine whose parallel sizes are not the plan's
inference layout is refused naming both, and a parameter held by a backend
whose layout reshard has not proven is refused naming the parameter and the
backend; a vLLM of another version is refused at import, in one line. Run in build/vllm-venv with RANK etc. set by launch.py; exits 1 on
the first failed check.

    build/vllm-venv/bin/python tests/vllm/worker_checks.py --build build
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path[:0] = [HERE]


def check(cond, what):
    if not cond:
        raise SystemExit(f"worker_checks: FAILED: {what}")
    print(f"ok: {what}", flush=True)


def rank_main(a):
    import engine
    model, config = engine.build(a["model"], tp=1)
    import reshard
    import reshard.vllm as rv

    # The engine against plans for TP 1 (its own) and TP 2 (not its own).
    rv.check_engine(reshard.Plan.open(a["plans"]["vllm:tp=1"]), config)
    try:
        rv.check_engine(reshard.Plan.open(a["plans"]["vllm:tp=2"]), config)
        check(False, "a TP 2 plan is refused for a TP 1 engine")
    except rv.EngineMismatchError as e:
        check(str(e) == "the plan's inference layout 'vllm-tp2' is TP 2 PP 1 DP 1 (no EP); this vLLM engine runs "
                        "TP 1 PP 1 DP 1 (no EP): compile the plan for the engine's settings (reshard init --infer "
                        "vllm:...)", f"a TP 2 plan is refused for a TP 1 engine, naming both: {e}")
    try:
        rv.check_engine(reshard.Plan.open(a["plans"]["vllm:tp=1,dp=2,ep"]), config)
        check(False, "an EP plan is refused for an engine without EP")
    except rv.EngineMismatchError as e:
        check("'vllm-tp1-dp2-ep2' is TP 1 PP 1 DP 2 EP 2" in str(e), f"an EP plan is refused for an engine without EP: {e}")
    # Kernel layouts: every backend of this engine is proven; without TritonExperts among the proven, the
    # experts' parameters are refused by name.
    check(rv.kernel_layout_problems(model) == [], "the Triton MoE and plain linear layers are proven layouts")
    saved = rv.PROVEN_KERNELS["experts"]
    rv.PROVEN_KERNELS["experts"] = ()
    try:
        problems = rv.kernel_layout_problems(model)
    finally:
        rv.PROVEN_KERNELS["experts"] = saved
    check(len(problems) == 4 and problems[0].startswith(
        "model.layers.0.mlp.experts.routed_experts.w13_weight, model.layers.0.mlp.experts.routed_experts.w2_weight: "
        "held by TritonExperts (experts backend), whose weight layout reshard has not proven"),
        f"unproven experts are refused naming parameter and backend: {problems[:1]}")
    only = rv.kernel_layout_problems(model, names={"model.layers.0.self_attn.qkv_proj.weight"})
    check(only == [], "only the modules whose parameters the plan writes are looked at")
    check(len(rv.mla_layers(model)) == 0, "a model without MLA has nothing derived to recompute")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rank-args", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_args:
        return rank_main(json.loads(a.rank_args))
    import launch
    import record
    work = tempfile.mkdtemp(prefix="reshard-worker-checks-")
    model_dir = os.path.join(work, "model")
    record.make_checkpoint(os.path.join(a.build, "reshard"), "vllm-moe-tp2", model_dir)
    plans = {}
    for infer in ("vllm:tp=1", "vllm:tp=2", "vllm:tp=1,dp=2,ep"):
        d = os.path.join(work, infer.replace(":", "-").replace(",", "-").replace("=", ""))
        subprocess.run([os.path.join(a.build, "reshard"), "init", "-q", "--hf-config",
                        os.path.join(model_dir, "config.json"), "--train", "hf", "--infer", infer, "-o", d], check=True)
        plans[infer] = os.path.join(d, "plan.rsplan")
        subprocess.run([os.path.join(a.build, "reshard"), "compile", "-q", "--model", os.path.join(d, "model.json"),
                        "--from", os.path.join(d, "train.json"), "--to", os.path.join(d, "infer.json"), "--cluster",
                        os.path.join(ROOT, "samples", "clusters", "dgx-h100.json"), "-o", plans[infer]], check=True)
    # Another vLLM version than the one the layouts were proven on: one clear line, unless asked for.
    code = "import vllm; vllm.__version__ = '0.34.0'; import reshard.vllm"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    last = (r.stderr.strip().splitlines() or [""])[-1]
    check(r.returncode == 1 and last == (
        "ImportError: reshard.vllm was proven against vLLM 0.33.0; this is vLLM 0.34.0, whose parameter layouts and "
        "post-processing may differ. Check the layout against a dump of a real rank (tools/dump_state_dict.py, "
        "`reshard check`) and set RESHARD_VLLM_ANY_VERSION=1 to use it."), f"another vLLM version is refused: {last}")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, RESHARD_VLLM_ANY_VERSION="1"))
    check(r.returncode == 0, "RESHARD_VLLM_ANY_VERSION=1 lets another version import")
    outs = launch.run(1, [os.path.abspath(__file__), "--rank-args", json.dumps({"model": model_dir, "plans": plans})],
                      timeout_s=300, label="worker-checks")
    print("\n".join(l for l in outs[0].splitlines() if l.startswith("ok: ")))


if __name__ == "__main__":
    main()
