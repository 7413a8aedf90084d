#!/usr/bin/env python3
"""A refit lands in a live SGLang engine: real Megatron-Core CPU ranks (or a
BF16 HF rank) in this venv (torch 2.15) refit into real SGLang 0.5.23 CPU
ranks (build/vllm-venv, torch 2.14) through one plan, twice with different
weights, through SGLang's own door: its weight-update session and reshard's
custom weight loader (rank_refit.py). After each refit every parameter,
buffer and derived MLA attribute (w_kc, w_vc, w_scale) of every SGLang rank
must equal, bit for bit, a fresh SGLang load of the HF checkpoint of the
same weights; no parameter or buffer moved in memory; every written and
derived tensor changed; and, taken between the plan's run and SGLang's
post_load_weights, exactly the derived attributes differ (MLA) or nothing
does.

Cases (CASES below): dense Llama, Megatron-Core TP2 PP2 -> SGLang TP4 (2 KV
heads, each replicated on 2 ranks); Qwen3-MoE, Megatron-Core TP2 PP2 EP2 ->
SGLang TP2 EP2 with attention DP 2; DeepSeek-style MLA with FP8 16x16 block
scales and a shared expert (held apart: --disable-shared-experts-fusion),
from one BF16 HF rank (Megatron-Core's MLA needs Transformer Engine, a GPU)
into SGLang TP2 EP2.

    build/venv/bin/python tests/sglang/refit_live.py --build build [--sglang-python P] [CASE ...]
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
VLLM_TESTS = os.path.join(ROOT, "tests", "vllm")
MEGATRON = os.path.join(ROOT, "tests", "megatron")
sys.path[:0] = [VLLM_TESTS, MEGATRON, os.path.join(ROOT, "tools")]

import torch  # noqa: E402

import checkpoint  # noqa: E402  (tests/vllm/checkpoint.py: HF checkpoints, FP8 as reshard's sender quantizes)
import launch  # noqa: E402  (tests/vllm/launch.py: one process per rank, all killed on a failure)

TIMEOUT_S = 600.0
ROUNDS = 2
TIMED_RUNS = 3
RECORDED = os.path.join(ROOT, "tests", "data", "recorded")

# name: source (a tests/megatron case, or "hf" with an HF config), the SGLang
# settings (engine.build_rank's), `reshard init --infer`.
CASES = {
    "dense-tp4": dict(megatron="dense-tp2-pp2", train="megatron:tp=2,pp=2,spec=local",
                      sglang=dict(tp=4), infer="sglang:tp=4"),
    "moe-tp2-ep2-attn-dp2": dict(megatron="moe-tp2-pp2-ep2", train="megatron:tp=2,pp=2,ep=2,etp=1,spec=local",
                                 sglang=dict(tp=2, ep=2, attn_dp=2), infer="sglang:tp=2,ep=2,attn-dp=2"),
    "mla-fp8-tp2-ep2": dict(hf="vllm-mla-tp2", infer_config="vllm-mla-fp8-tp2-dp2-ep",
                            sglang=dict(tp=2, ep=2, shared_experts="tp"), infer="sglang:tp=2,ep=2,shared-experts=tp"),
}


def load_json(path):
    with open(path) as f:
        return json.load(f)


def reshard_cli(build, *args):
    subprocess.run([os.path.join(build, "reshard"), *args], check=True, stdout=subprocess.DEVNULL)


def specs(build, case, work):
    """(model.json, train.json, infer.json), HF config of the checkpoints."""
    if "megatron" in case:
        config_path = os.path.join(ROOT, "tests", "data", "megatron", case["megatron"], "config.json")
        d = os.path.join(work, "specs")
        reshard_cli(build, "init", "-q", "--hf-config", config_path, "--train", case["train"], "--infer",
                    case["infer"], "-o", d)
        return (os.path.join(d, "model.json"), os.path.join(d, "train.json"), os.path.join(d, "infer.json")), \
            load_json(config_path)
    # a BF16 HF rank -> the FP8 checkpoint's layout: one model spec, two configs
    bf16 = os.path.join(RECORDED, case["hf"], "config.json")
    fp8 = os.path.join(RECORDED, case["infer_config"], "config.json")
    reshard_cli(build, "init", "-q", "--hf-config", bf16, "--name", "tiny-mla", "--train", "hf", "--infer", "hf",
                "-o", os.path.join(work, "train"))
    reshard_cli(build, "init", "-q", "--hf-config", fp8, "--name", "tiny-mla", "--train", "hf", "--infer",
                case["infer"], "-o", os.path.join(work, "infer"))
    assert load_json(os.path.join(work, "train", "model.json")) == load_json(os.path.join(work, "infer", "model.json"))
    return (os.path.join(work, "train", "model.json"), os.path.join(work, "train", "train.json"),
            os.path.join(work, "infer", "infer.json")), load_json(fp8)


def write_checkpoint(sglang_python, work, name, config, tensors):
    """HF tensors -> an HF checkpoint dir (FP8 per the config, as reshard's sender quantizes), in the SGLang venv."""
    pt = os.path.join(work, name + ".pt")
    torch.save({"config": config, "tensors": {k: v.contiguous() for k, v in tensors.items()}}, pt)
    out = os.path.join(work, name)
    subprocess.run([sglang_python, os.path.join(VLLM_TESTS, "write_checkpoint.py"), pt, out], check=True)
    return out


def hf_values(model_path, seed):
    """Random HF tensors of a model spec, each seeded by its name and `seed`."""
    out = {}
    for n, shape, dtype in checkpoint.expand(load_json(model_path)):
        key = int.from_bytes(hashlib.sha256(f"{n}/{seed}".encode()).digest()[:8], "little") & ((1 << 63) - 1)
        x = torch.randn(shape, generator=torch.Generator().manual_seed(key))
        out[n] = (1.0 + 0.1 * x if "norm" in n else 0.5 * x).to(dtype)
    return out


# -- the source ranks -------------------------------------------------------------------------------------

def _megatron_rank(rank, case_name, a, runs):
    """A tests/megatron model, new values each round (saved for the checkpoint), TrainerRefit."""
    import reshard
    import tiny_gpt
    from cases import CASES as MCASES
    case = MCASES[CASES[case_name]["megatron"]]
    tiny_gpt.parallel(case)
    model = tiny_gpt.build(case, wrap=True)
    refit = None
    for k in range(ROUNDS):
        tiny_gpt.fill(model, salt=k)  # a different model each round, as after training steps
        d = os.path.join(a["work"], f"round{k}")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"megatron{rank}.pt")
        torch.save({"coords": tiny_gpt.coords(),
                    "params": {n: t.clone() for n, t in tiny_gpt.named_params(model).items()}}, path + ".part")
        os.replace(path + ".part", path)  # whole, then renamed: the reader never sees a part-written file
        if refit is None:
            plan = reshard.Plan.open(a["plan"])
            session = reshard.Session(plan, rank, reshard.GlooTransport(rank, plan.num_ranks, store=a["store"],
                                                                        timeout_s=TIMEOUT_S))
            refit = reshard.TrainerRefit(session, model)
        refit.run()
    for _ in range(runs):  # the SGLang ranks' timed refits
        refit.run()


def megatron_checkpoints(case, work, world, config, sglang_python, errors):
    """Per round: the Megatron ranks' parameters -> HF (tests/megatron/convert.py) -> a checkpoint."""
    import convert
    from cases import CASES as MCASES
    try:
        mcase = MCASES[case["megatron"]]
        for k in range(ROUNDS):
            d = os.path.join(work, f"round{k}")
            files = [os.path.join(d, f"megatron{r}.pt") for r in range(world)]
            t0 = time.time()
            while not all(os.path.exists(f) for f in files):
                if time.time() - t0 > TIMEOUT_S:
                    raise TimeoutError(f"round {k}: the Megatron ranks did not save their parameters")
                time.sleep(0.2)
            ranks = {r: (g["coords"], g["params"]) for r, g in
                     ((r, torch.load(f, weights_only=False)) for r, f in enumerate(files))}
            write_checkpoint(sglang_python, d, "model", config, convert.megatron_to_hf(mcase, ranks))
    except Exception as e:  # noqa: BLE001 - reported by the caller
        errors.append(e)


def hf_source(work, a, config, sglang_python, errors, runs):
    """The BF16 HF rank (plan rank 0): new values each round, TrainerRefit, the checkpoint of the same values."""
    try:
        import reshard
        plan = reshard.Plan.open(a["plan"])
        session = reshard.Session(plan, 0, reshard.GlooTransport(0, plan.num_ranks, store=a["store"],
                                                                 timeout_s=TIMEOUT_S))
        tensors = hf_values(a["model"], 0)
        refit = reshard.TrainerRefit(session, tensors)
        for k in range(ROUNDS):
            new = hf_values(a["model"], 100 + k)
            for n, t in tensors.items():
                t.copy_(new[n])  # in place: the bound memory
            d = os.path.join(work, f"round{k}")
            os.makedirs(d, exist_ok=True)
            write_checkpoint(sglang_python, d, "model", config, tensors)
            refit.run()
        for _ in range(runs):
            refit.run()
    except Exception as e:  # noqa: BLE001 - reported by the caller
        errors.append(e)


def source_failed(errors, ctx):
    if errors:
        return f"the source side: {errors[0]!r}"
    if ctx is not None:
        for i, p in enumerate(ctx.processes):
            if p.exitcode not in (None, 0):
                return f"Megatron rank {i} exited with {p.exitcode}"
    return None


def run_case(name, build, sglang_python, work, timed_runs=TIMED_RUNS):
    case = CASES[name]
    os.makedirs(work, exist_ok=True)
    (model, train, infer), config = specs(build, case, work)
    plan = os.path.join(work, "plan.rsplan")
    reshard_cli(build, "compile", "--model", model, "--from", train, "--to", infer, "--cluster",
                os.path.join(ROOT, "samples", "clusters", "dgx-h100.json"), "-o", plan)
    import reshard
    p = reshard.Plan.open(plan)
    store = os.path.join(work, "store")
    os.makedirs(store)
    first = p.dest_ranks[0]
    assert p.dest_ranks == list(range(first, p.num_ranks)) and p.source_ranks == list(range(first))
    a = {"plan": plan, "store": store, "work": work, "model": model}
    # The SGLang ranks' first weights: other values, so that a refit that wrote nothing would fail.
    initial = write_checkpoint(sglang_python, work, "initial", config, hf_values(model, 7))
    errors, threads, ctx = [], [], None
    if "megatron" in case:
        import ranks
        ctx = ranks.spawn(first, _megatron_rank, name, a, timed_runs, join=False)
        threads.append(threading.Thread(target=megatron_checkpoints, daemon=True,
                                        args=(case, work, first, config, sglang_python, errors)))
    else:
        threads.append(threading.Thread(target=hf_source, daemon=True,
                                        args=(work, a, config, sglang_python, errors, timed_runs)))
    for t in threads:
        t.start()
    args = {"initial": initial, "settings": case["sglang"], "plan": plan, "store": store, "first": first,
            "rounds": ROUNDS, "work": work, "timeout_s": TIMEOUT_S, "timed_runs": timed_runs}
    world = len(p.dest_ranks)
    t0 = time.time()
    done = False
    try:
        launch.run(world, [os.path.join(HERE, "rank_refit.py"), json.dumps(args)], timeout_s=TIMEOUT_S,
                   python=sglang_python, label=f"{name}-sglang", log_dir=work,
                   abort=lambda: source_failed(errors, ctx))
        done = True
    except RuntimeError as e:
        raise SystemExit(f"{name}: {e}\n(errors on the source side: {errors!r})")
    finally:
        if ctx is not None:
            for proc in ctx.processes:
                proc.join(timeout=60 if done and not errors else 1)
                if proc.is_alive():
                    proc.kill()
        for t in threads:
            t.join(timeout=60)
    if errors:
        raise SystemExit(f"{name}: the source side: {errors[0]!r}")
    if ctx is not None and any(proc.exitcode != 0 for proc in ctx.processes):
        raise SystemExit(f"{name}: Megatron ranks exited with {[proc.exitcode for proc in ctx.processes]}")
    wall = time.time() - t0
    results = [load_json(os.path.join(work, f"sglang-rank{r}.json")) for r in range(world)]
    bad = []
    for r in results:
        for k, rd in enumerate(r["rounds"]):
            bad += [f"rank {r['rank']} round {k}: {d}" for d in rd["differences"]]
            if rd["stale_without_post_load"] != rd["derived"]:
                bad.append(f"rank {r['rank']} round {k}: between the plan's run and post_load_weights these differ "
                           f"from a fresh load: {rd['stale_without_post_load'][:4]}; expected exactly the derived "
                           f"{rd['derived'][:4]}")
            if rd["unchanged"]:
                bad.append(f"rank {r['rank']} round {k}: the refit left {rd['unchanged'][:4]} as they were")
        if r["moved"]:
            bad.append(f"rank {r['rank']}: parameters or buffers moved in memory: {r['moved'][:4]}")
        if r["rebinds"]:
            bad.append(f"rank {r['rank']}: re-bound {r['rebinds']} times: SGLang replaced bound parameters")
        derived = r["rounds"][0]["derived"]
        if "mla" in name and len([n for n in derived if n.endswith((".w_kc", ".w_vc"))]) != 2 * 4:
            bad.append(f"rank {r['rank']}: derived {derived[:6]}, expected w_kc and w_vc of 4 layers")
    if bad:
        raise SystemExit(f"{name}: the refit engine differs from a fresh load:\n  " + "\n  ".join(bad[:30]))
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    r0 = results[0]
    summary = {"case": name, "sglang_ranks": world, "source_ranks": first, "rounds": ROUNDS,
               "tensors_per_rank": r0["rounds"][0]["tensors"], "derived_per_rank": len(r0["rounds"][0]["derived"]),
               "derived_reassigned": r0["derived_reassigned"][:3],
               "run_s": med([r["run_s"] for r in results]), "post_load_s": med([r["post_load_s"] for r in results]),
               "end_s": med([r["end_s"] for r in results]), "refit_s": med([r["refit_s"] for r in results]),
               "wall_s": round(wall, 1)}
    src = "Megatron-Core" if "megatron" in case else "HF"
    print(f"{name}: {ROUNDS} refits through SGLang's weight-update session and reshard's loader from {first} {src} "
          f"rank(s) into {world} SGLang ranks: every parameter, buffer and derived attribute "
          f"({summary['tensors_per_rank']} on rank 0) equals a fresh SGLang load, bit for bit, after each; no "
          f"parameter or buffer moved in memory" + ("; w_kc / w_vc re-derived (stale without it)" if "mla" in name
                                                    else "") + f" ({wall:.0f} s)", flush=True)
    print("  " + json.dumps(summary), flush=True)
    return summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--sglang-python", default=os.path.join(ROOT, "build", "vllm-venv", "bin", "python"))
    ap.add_argument("--work", help="keep checkpoints, plans and rank logs here (default: a temporary folder)")
    ap.add_argument("--timed-runs", type=int, default=TIMED_RUNS,
                    help=f"refits timed after the checked ones (default {TIMED_RUNS})")
    ap.add_argument("--json", metavar="FILE", help="write the cases' measurements here")
    ap.add_argument("case", nargs="*", help=f"cases (default: all): {', '.join(CASES)}")
    a = ap.parse_args(argv)
    names = a.case or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        sys.exit(f"refit_live.py: unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    if a.timed_runs < 1:
        sys.exit("refit_live.py: --timed-runs must be at least 1")
    work = a.work or tempfile.mkdtemp(prefix="reshard-sglang-refit-")
    summaries = [run_case(n, a.build, a.sglang_python, os.path.join(work, n), a.timed_runs) for n in names]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summaries, f, indent=1)


if __name__ == "__main__":
    main()
