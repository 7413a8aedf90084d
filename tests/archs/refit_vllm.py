#!/usr/bin/env python3
"""Refits into real vLLM 0.33 CPU ranks of the architectures issue 31 added
(glm4_moe, gpt_oss), of Qwen3-Next (qwen3_next) and of Llama 4 (llama4), bit for bit: one BF16
HF rank (plan rank 0: the model spec's tensors, or the checkpoint's where
the `hf` layout fuses them) refits twice, with other values each round, into
vLLM ranks built from a checkpoint of a third set of values, through the plan `reshard
init --train hf --infer vllm:...` + `reshard compile` make; after each round
every parameter and buffer of every vLLM rank must equal a fresh vLLM model
loaded from that round's checkpoint (tests/vllm/rank_refit.py, unchanged:
WorkerRefit binds the model once, runs the plan, then the engine's
post-processing). So the values land where vLLM's own loaders put them: GLM-4.5's
fp32 router and split shared experts, gpt-oss's alternating gate/up rows in
w13_weight and w13_bias, its sinks, and w2_bias real on the MoE's first rank
and zero on the others; Qwen3-Next's checkpoint tensors as the released model
fuses them (record_vllm.qwen3_next_tensors: self_attn.q_proj per head
[query; gate], linear_attn.in_proj_qkvz per key head [q; k; v; z], in_proj_ba
per key head [b; a], conv1d [q; k; v] channels, and the MTP layer mtp.*,
which vLLM skips): the HF rank binds those fused tensors, as the `hf` layout's
buffer rules name them, and the plan cuts them into vLLM's qkv_proj,
in_proj_qkvz, in_proj_ba and conv1d per TP rank (2 key heads each at TP2).
Llama 4 (record_vllm.LLAMA4, record_vllm.llama4_tensors): the checkpoint as
released (language_model.* with fused, transposed experts, a vision tower and
projector); the HF rank binds what the `hf` layout names: the checkpoint's
q_proj / k_proj (each head's RoPE pairs in alternate rows, which the plan
cuts into the model spec's even and odd rows and vLLM's qkv_proj regroups per
head as [even; odd], as its loader's permute_qk_weight_for_rotary does) and
the experts per expert as [out, in] (gate_proj[e] = gate_up_proj[e][:, :I].T,
up_proj[e] = gate_up_proj[e][:, I:].T, down_proj[e] = down_proj[e].T). The
vision tower and projector are not in the model spec and a refit leaves them
as loaded: every round's checkpoint keeps the initial checkpoint's vision
weights (llama4_values), so a fresh load must equal the refit engine there
too, which also shows the refit wrote nothing into them.

    build/vllm-venv/bin/python tests/archs/refit_vllm.py [CASE ...]
    PYTHONPATH=/tmp/vllm-tv build/vllm-venv/bin/python tests/archs/refit_vllm.py llama4-tp2 llama4-tp2-dp2-ep

(llama4: vLLM's mllama4.py needs torchvision==0.29.0, which the vLLM venv
leaves out: `pip install --no-deps --target /tmp/vllm-tv torchvision==0.29.0`,
record_vllm.check_imports.)

Qwen3-Next's vLLM ranks run this script's --rank mode: tests/vllm/rank_refit.py
after record_vllm.without_missing_cpu_conv_pack() (this CUDA wheel's CPU
conv1d weight prepack has no op behind it; without it the weight stays
[C/TP, 1, K], as a GPU rank holds it), in the refit engine and the fresh one.

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
INITIAL_SEED = 7  # the vLLM ranks' first weights (run_case); the rounds use 100 + k

# name: the tests/data/archs case whose config it uses, vLLM's settings, `reshard init --infer`.
CASES = {
    "glm4moe-tp2": dict(config="vllm-glm4moe-tp2", vllm=dict(tp=2, pp=1, dp=1, ep=False), infer="vllm:tp=2"),
    "glm4moe-tp2-dp2-ep": dict(config="vllm-glm4moe-tp2-dp2-ep", vllm=dict(tp=2, pp=1, dp=2, ep=True),
                               infer="vllm:tp=2,dp=2,ep"),
    "gptoss-tp2-dp2": dict(config="vllm-gptoss-tp2-dp2", vllm=dict(tp=2, pp=1, dp=2, ep=False),
                           infer="vllm:tp=2,dp=2"),
    "gptoss-tp2-dp2-ep": dict(config="vllm-gptoss-tp2-dp2-ep", vllm=dict(tp=2, pp=1, dp=2, ep=True),
                              infer="vllm:tp=2,dp=2,ep"),
    # record_vllm.QWEN3_NEXT: 4 linear key heads, so 2 per TP rank.
    "qwen3next-tp2": dict(config="vllm-qwen3next-tp2", vllm=dict(tp=2, pp=1, dp=1, ep=False), infer="vllm:tp=2"),
    "qwen3next-tp2-dp2-ep": dict(config="vllm-qwen3next-tp2-dp2-ep", vllm=dict(tp=2, pp=1, dp=2, ep=True),
                                 infer="vllm:tp=2,dp=2,ep"),
    # record_vllm.LLAMA4: 4 query heads, 2 KV heads (one per TP rank), 8 experts (4 per EP rank at DP2 EP).
    "llama4-tp2": dict(config="vllm-llama4-tp2", vllm=dict(tp=2, pp=1, dp=1, ep=False), infer="vllm:tp=2"),
    "llama4-tp2-dp2-ep": dict(config="vllm-llama4-tp2-dp2-ep", vllm=dict(tp=2, pp=1, dp=2, ep=True),
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


def checkpoint_values(config, seed, initial=lambda name: False):
    """Random values of the checkpoint record_vllm builds for the config (CHECKPOINT_TENSORS: Qwen3-Next's
    fused tensors and its MTP layer; Llama 4's), each seeded by its name and `seed`, as refit_live.hf_values;
    by INITIAL_SEED instead where initial(name)."""
    import hashlib

    import torch
    out = {}
    for n, shape in record_vllm.CHECKPOINT_TENSORS[config["model_type"]](config):
        s = INITIAL_SEED if initial(n) else seed
        key = int.from_bytes(hashlib.sha256(f"{n}/{s}".encode()).digest()[:8], "little") & ((1 << 63) - 1)
        x = torch.randn(shape, generator=torch.Generator().manual_seed(key))
        out[n] = (1.0 + 0.1 * x if "norm" in n else 0.5 * x).to(torch.bfloat16)
    return out


def llama4_values(config, seed):
    """Llama 4: (the checkpoint as released, with the initial checkpoint's vision tower and projector, which
    no refit writes; what the `hf` layout binds: language_model.*, the experts per expert as [out, in])."""
    ckpt = checkpoint_values(config, seed, initial=lambda n: not n.startswith("language_model."))
    I = config["text_config"]["intermediate_size"]
    bound = {}
    for n, t in ckpt.items():
        if not n.startswith("language_model."):
            continue  # the vision tower and projector: not in the model spec
        if n.endswith(".experts.gate_up_proj"):  # [E, H, 2I]: gate in columns 0..I, up in I..2I
            p = n[:-len("gate_up_proj")]
            for e in range(t.shape[0]):
                bound[f"{p}{e}.gate_proj.weight"] = t[e, :, :I].t().contiguous()
                bound[f"{p}{e}.up_proj.weight"] = t[e, :, I:].t().contiguous()
        elif n.endswith(".experts.down_proj"):  # [E, I, H]
            p = n[:-len("down_proj")]
            for e in range(t.shape[0]):
                bound[f"{p}{e}.down_proj.weight"] = t[e].t().contiguous()
        else:
            bound[n] = t  # q_proj / k_proj as the checkpoint holds them: the layout's fused buffers
    return ckpt, bound


def values(config, model, seed):
    """(the HF checkpoint's tensors, what the `hf` layout's rank binds) of one seed's values."""
    if config["model_type"] == "llama4":
        return llama4_values(config, seed)
    if config["model_type"] in record_vllm.CHECKPOINT_TENSORS:
        ckpt = checkpoint_values(config, seed)
        return ckpt, {n: t for n, t in ckpt.items() if not n.startswith("mtp.")}  # the main model's
    tensors = refit_live.hf_values(model, seed)
    return checkpoint_form(config, tensors), hf_buffers(config, tensors)


def source(plan_path, store, model, work, config, vllm_python, errors):
    """Plan rank 0: new values each round, bound in place (TrainerRefit), the checkpoint of the same values."""
    try:
        import reshard
        plan = reshard.Plan.open(plan_path)
        session = reshard.Session(plan, 0, reshard.GlooTransport(0, plan.num_ranks, store=store,
                                                                 timeout_s=refit_live.TIMEOUT_S))
        _, bound = values(config, model, 0)
        names = {b.name for b in session.buffers}
        if names != set(bound):
            raise ValueError(f"the HF rank binds {sorted(set(bound) - names)[:4]} the plan's rank 0 lacks, and "
                             f"lacks {sorted(names - set(bound))[:4]}")
        refit = reshard.TrainerRefit(session, bound)
        for k in range(ROUNDS):
            ckpt, new = values(config, model, 100 + k)
            for n, t in new.items():
                bound[n].copy_(t)  # in place: the bound memory
            d = os.path.join(work, f"round{k}")
            os.makedirs(d, exist_ok=True)
            refit_live.write_checkpoint(vllm_python, d, "model", config, ckpt)
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
    record_vllm.check_imports(config)  # llama4: torchvision
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
                                          values(config, model, INITIAL_SEED)[0])
    errors = []
    t = threading.Thread(target=source, daemon=True, args=(plan, store, model, work, config, vllm_python, errors))
    t.start()
    world = c["vllm"]["tp"] * c["vllm"]["pp"] * c["vllm"]["dp"]
    args = {"initial": initial, "settings": c["vllm"], "plan": plan, "store": store, "first": 1, "rounds": ROUNDS,
            "work": work, "timeout_s": refit_live.TIMEOUT_S, "timed_runs": 1, "via": "WorkerRefit"}
    t0 = time.time()
    # Qwen3-Next's GDN conv1d needs the CPU workaround (rank_main); the others run rank_refit.py as is.
    rank = ([os.path.abspath(__file__), "--rank"] if config["model_type"] == "qwen3_next"
            else [os.path.join(ROOT, "tests", "vllm", "rank_refit.py")])
    try:
        launch.run(world, rank + [json.dumps(args)],
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


def rank_main(argv):
    """One vLLM rank (launched by run_case): tests/vllm/rank_refit.py after
    record_vllm.without_missing_cpu_conv_pack(), as record_vllm.rank_main does for rank_dump.py."""
    import engine  # noqa: F401  (tests/vllm: sets the CPU environment before vLLM is imported)
    import rank_refit

    removed = record_vllm.without_missing_cpu_conv_pack()
    print(f"rank_main: removed {removed}", flush=True)
    sys.argv = [os.path.join(ROOT, "tests", "vllm", "rank_refit.py")] + argv
    rank_refit.main()


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
    if sys.argv[1:2] == ["--rank"]:
        rank_main(sys.argv[2:])
        sys.exit(0)
    sys.exit(main())
