#!/usr/bin/env python3
"""A refit lands in a live vLLM engine: real Megatron-Core or FSDP2 CPU
ranks (this venv, torch 2.15) refit into real vLLM 0.33 CPU ranks
(build/vllm-venv, torch 2.14) through one plan, twice with different
weights; after each refit every parameter and buffer of every vLLM rank must
equal, bit for bit, a fresh vLLM model loaded from the HF checkpoint of the
same weights (tests/vllm/rank_refit.py). The vLLM ranks go through
reshard.vllm (WorkerRefit: bind once, run, the engine's post-processing;
the MLA case through its weight-transfer engine, made by vLLM's factory, with
one init dict for all four ranks: each finds its plan rank from rank_offset
and its DP / TP ranks), the training ranks through reshard.TrainerRefit.

Cases (CASES below): dense Llama into TP4 with replicated KV heads; Qwen3-MoE
into TP2 x DP2 with EP; Qwen3-MoE into per-channel FP8 (transposed views);
DeepSeek-style MLA with FP8 block scales, shared experts and EP (W_UV /
W_UK_T derived at load), from one BF16 HF rank (Megatron-Core's MLA needs
Transformer Engine, a GPU); FSDP2: a transformers Qwen3 (tests/fsdp2's dense
model and its tp2-fsdp2 setup: NeMo RL's TP plan with q_norm / k_norm as
SequenceParallel, then fully_shard over dp_shard 2, fp32 masters under a
bf16 MixedPrecisionPolicy) on 4 Gloo ranks with a process group of their own
(file:// init, apart from reshard's transport over all 6 plan ranks), one
AdamW step before each round, each rank's DTensor locals bound in place by
TrainerRefit, the plan converting fp32 -> bf16 as it sends, into vLLM TP2;
the checkpoint holds every parameter's full_tensor() in bf16.

    build/venv/bin/python tests/vllm/refit_live.py --build build [--vllm-python P] [CASE ...]
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
MEGATRON = os.path.join(ROOT, "tests", "megatron")
FSDP2 = os.path.join(ROOT, "tests", "fsdp2")
sys.path[:0] = [HERE, MEGATRON, os.path.join(ROOT, "tools")]

import torch  # noqa: E402

import checkpoint  # noqa: E402
import launch  # noqa: E402

TIMEOUT_S = 600.0
ROUNDS = 2
TIMED_RUNS = 5
RECORDED = os.path.join(ROOT, "tests", "data", "recorded")

# name: source (a tests/megatron case, or "hf" with an HF config), the vLLM
# settings, `reshard init --infer`, and the checkpoint's quantization.
CASES = {
    "dense-tp4": dict(megatron="dense-tp2-pp2", train="megatron:tp=2,pp=2,spec=local",
                      vllm=dict(tp=4, pp=1, dp=1, ep=False), infer="vllm:tp=4"),
    "moe-tp2-dp2-ep": dict(megatron="moe-tp2-pp2-ep2", train="megatron:tp=2,pp=2,ep=2,etp=1,spec=local",
                           vllm=dict(tp=2, pp=1, dp=2, ep=True), infer="vllm:tp=2,dp=2,ep"),
    "moe-fp8-channel": dict(megatron="moe-tp2-pp2-ep2", train="megatron:tp=2,pp=2,ep=2,etp=1,spec=local",
                            vllm=dict(tp=2, pp=1, dp=1, ep=False), infer="vllm:tp=2,quant=fp8-channel",
                            quant="fp8-channel"),
    "mla-fp8-tp2-dp2-ep": dict(hf="vllm-mla-tp2", infer_config="vllm-mla-fp8-tp2-dp2-ep",
                               vllm=dict(tp=2, pp=1, dp=2, ep=True), infer="vllm:tp=2,dp=2,ep",
                               via="weight-transfer-engine"),
    # a tests/fsdp2 case: transformers' Qwen3, NeMo RL's TP plan then fully_shard, fp32 masters
    "fsdp2-tp2xfsdp2": dict(fsdp2="tp2-fsdp2", vllm=dict(tp=2, pp=1, dp=1, ep=False), infer="vllm:tp=2"),
}


def fsdp2_modules():
    """(models, cases) of tests/fsdp2, imported with its own cases.py
    (tests/megatron, on the path for the Megatron cases, has one too)."""
    saved = sys.modules.pop("cases", None)
    sys.path.insert(0, FSDP2)
    try:
        import cases as fsdp2_cases
        import models
        assert models.CONFIGS is fsdp2_cases.CONFIGS
    finally:
        sys.path.remove(FSDP2)
        if saved is not None:
            sys.modules["cases"] = saved
        else:
            sys.modules.pop("cases", None)
    return models, fsdp2_cases


def load_json(path):
    with open(path) as f:
        return json.load(f)


def reshard_cli(build, *args):
    subprocess.run([os.path.join(build, "reshard"), *args], check=True, stdout=subprocess.DEVNULL)


def specs(build, case, work):
    """(model.json, train.json, infer.json, HF config of the checkpoints)."""
    if "megatron" in case:
        config_path = os.path.join(MEGATRON, "..", "data", "megatron", case["megatron"], "config.json")
        reshard_cli(build, "init", "-q", "--hf-config", config_path, "--train", case["train"], "--infer",
                    case["infer"], "-o", os.path.join(work, "specs"))
        config = load_json(config_path)
        d = os.path.join(work, "specs")
        paths = (os.path.join(d, "model.json"), os.path.join(d, "train.json"), os.path.join(d, "infer.json"))
    elif "fsdp2" in case:
        _, fsdp2_cases = fsdp2_modules()
        fcase = fsdp2_cases.BY_NAME[case["fsdp2"]]
        config = dict(fsdp2_cases.CONFIGS[fcase["model"]])
        config_path = os.path.join(work, "config.json")
        with open(config_path, "w") as f:
            json.dump(config, f, indent=1)
        d = os.path.join(work, "specs")
        reshard_cli(build, "init", "-q", "--hf-config", config_path, "--train", fcase["train"], "--infer",
                    case["infer"], "-o", d)
        paths = (os.path.join(d, "model.json"), os.path.join(d, "train.json"), os.path.join(d, "infer.json"))
    else:  # BF16 HF rank -> the FP8 checkpoint's layout: one model spec, two configs
        bf16 = os.path.join(RECORDED, case["hf"], "config.json")
        fp8 = os.path.join(RECORDED, case["infer_config"], "config.json")
        reshard_cli(build, "init", "-q", "--hf-config", bf16, "--name", "tiny-mla", "--train", "hf", "--infer", "hf",
                    "-o", os.path.join(work, "train"))
        reshard_cli(build, "init", "-q", "--hf-config", fp8, "--name", "tiny-mla", "--train", "hf", "--infer",
                    case["infer"], "-o", os.path.join(work, "infer"))
        assert load_json(os.path.join(work, "train", "model.json")) == load_json(os.path.join(work, "infer",
                                                                                             "model.json"))
        config = load_json(fp8)
        paths = (os.path.join(work, "train", "model.json"), os.path.join(work, "train", "train.json"),
                 os.path.join(work, "infer", "infer.json"))
    if case.get("quant") == "fp8-channel":
        config = dict(config, quantization_config=checkpoint.COMPRESSED_FP8_CHANNEL)
    return paths, config


def write_checkpoint(vllm_python, work, name, config, tensors):
    """HF tensors -> a vLLM checkpoint dir (quantized per config) in the vLLM venv; returns the dir."""
    pt = os.path.join(work, name + ".pt")
    torch.save({"config": config, "tensors": {k: v.contiguous() for k, v in tensors.items()}}, pt)
    out = os.path.join(work, name)
    subprocess.run([vllm_python, os.path.join(HERE, "write_checkpoint.py"), pt, out], check=True)
    return out


def hf_values(model_path, seed):
    """Random HF tensors of a model spec (the BF16 source rank, or the vLLM ranks' first weights),
    each seeded by its name and `seed`."""
    import hashlib
    out = {}
    for n, shape, dtype in checkpoint.expand(load_json(model_path)):
        key = int.from_bytes(hashlib.sha256(f"{n}/{seed}".encode()).digest()[:8], "little") & ((1 << 63) - 1)
        x = torch.randn(shape, generator=torch.Generator().manual_seed(key))
        out[n] = (1.0 + 0.1 * x if "norm" in n else 0.5 * x).to(dtype)
    return out


# -- the Megatron ranks (torch.multiprocessing, this venv) --------------------------------------------------

def _megatron_rank(rank, case_name, a, timed_runs=TIMED_RUNS):
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
        # written whole, then renamed: the reader (megatron_checkpoints) never sees a part-written file
        path = os.path.join(d, f"megatron{rank}.pt")
        torch.save({"coords": tiny_gpt.coords(), "params": {n: t.clone() for n, t in tiny_gpt.named_params(model).items()}},
                   path + ".part")
        os.replace(path + ".part", path)
        if refit is None:  # connected once round 0's checkpoint is being written (the vLLM ranks start slower)
            plan = reshard.Plan.open(a["plan"])
            session = reshard.Session(plan, rank, reshard.GlooTransport(rank, plan.num_ranks, store=a["store"],
                                                                        timeout_s=TIMEOUT_S))
            refit = reshard.TrainerRefit(session, model)
        refit.run()
    for _ in range(2 * timed_runs):  # the vLLM ranks time bare runs, then WorkerRefit runs
        refit.run()


def megatron_checkpoints(case_name, case, work, world, config, vllm_python, errors):
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
            ranks = {}
            for r, f in enumerate(files):
                g = torch.load(f, weights_only=False)
                ranks[r] = (g["coords"], g["params"])
            write_checkpoint(vllm_python, d, "model", config, convert.megatron_to_hf(mcase, ranks))
    except Exception as e:  # noqa: BLE001 - reported by the caller
        errors.append(e)


# -- the FSDP2 ranks (torch.multiprocessing, this venv) ------------------------------------------------------

FSDP2_WORLD = 4
FSDP2_PRELOAD = ["__main__", "torch", "torch.distributed.fsdp", "torch.distributed.tensor.parallel",
                 "transformers.models.auto.modeling_auto", "transformers.models.qwen3.modeling_qwen3", "reshard"]


def _fsdp2_entry(rank, case_name, a, timed_runs, vllm_python):
    import warnings
    warnings.filterwarnings("ignore")
    os.environ["OMP_NUM_THREADS"] = "1"
    import logging
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    import torch.distributed as dist
    torch.set_num_threads(1)
    # The trainer's own process group (FSDP2's and TP's collectives), apart from reshard's transport over
    # all plan ranks (train and vLLM).
    dist.init_process_group("gloo", init_method="file://" + os.path.join(a["work"], "fsdp2-pg"), rank=rank,
                            world_size=FSDP2_WORLD)
    try:
        _fsdp2_rank(rank, case_name, a, timed_runs, vllm_python)
    finally:
        dist.destroy_process_group()


def _fsdp2_rank(rank, case_name, a, timed_runs, vllm_python):
    """A tests/fsdp2 case's model, sharded (TP, then fully_shard) and trained
    one AdamW step per round; TrainerRefit binds this rank's DTensor locals
    (FSDP2's fp32 masters: the plan converts to bf16 as it sends). Rank 0
    writes each round's checkpoint from every parameter's full_tensor() in
    bf16 (a thread, while the refit runs)."""
    import reshard
    models, fsdp2_cases = fsdp2_modules()
    fcase = fsdp2_cases.BY_NAME[CASES[case_name]["fsdp2"]]
    model = models.build(fcase)
    dp_index = models.shard(fcase, model)
    refit, writer, failed, previous = None, None, [], None

    def write(d, truth):
        try:
            write_checkpoint(vllm_python, d, "model", a["config"], truth)
        except Exception as e:  # noqa: BLE001 - raised by the rank below
            failed.append(e)

    for k in range(ROUNDS):
        models.train_step(fcase, model, dp_index)  # a different model each round
        truth = models.truth(model)  # collective: every parameter's full_tensor() in bf16, under HF names
        if previous is not None:
            same = [n for n in truth if torch.equal(truth[n].view(torch.int16), previous[n].view(torch.int16))]
            if same:
                raise RuntimeError(f"FSDP2 rank {rank}: round {k}'s AdamW step left {same[:4]} as they were in bf16")
        previous = truth
        if rank == 0:
            if writer is not None:
                writer.join()
            d = os.path.join(a["work"], f"round{k}")
            os.makedirs(d, exist_ok=True)
            writer = threading.Thread(target=write, args=(d, truth), daemon=True)
            writer.start()
        if refit is None:  # connected once round 0's checkpoint is being written (the vLLM ranks start slower)
            plan = reshard.Plan.open(a["plan"])
            session = reshard.Session(plan, rank, reshard.GlooTransport(rank, plan.num_ranks, store=a["store"],
                                                                        timeout_s=TIMEOUT_S))
            refit = reshard.TrainerRefit(session, model)
            held = models.locals_of(model)
            for b in session.buffers:  # in place: the runtime reads FSDP2's own memory
                t = session.tensor(b.name)
                if t.numel() and t.data_ptr() != held[b.name].data_ptr():
                    raise RuntimeError(f"FSDP2 rank {rank}: {b.name} is bound at 0x{t.data_ptr():x}, not at the "
                                       f"DTensor local's 0x{held[b.name].data_ptr():x}")
        refit.run()
    for _ in range(2 * timed_runs):  # the vLLM ranks time bare runs, then WorkerRefit runs
        refit.run()
    if writer is not None:
        writer.join()
    if failed:
        raise failed[0]
    if refit.rebinds:
        raise RuntimeError(f"FSDP2 rank {rank}: TrainerRefit re-bound {refit.rebinds} times: the optimizer "
                           "replaced FSDP2's sharded parameters")


def hf_source(case, work, a, config, vllm_python, errors, timed_runs=TIMED_RUNS):
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
            write_checkpoint(vllm_python, d, "model", config, tensors)
            refit.run()
        for _ in range(2 * timed_runs):
            refit.run()
    except Exception as e:  # noqa: BLE001 - reported by the caller
        errors.append(e)


def source_failed(errors, ctx):
    """What went wrong on the source side (a thread's error, a Megatron rank that exited), or None."""
    if errors:
        return f"the source side: {errors[0]!r}"
    if ctx is not None:
        for i, p in enumerate(ctx.processes):
            if p.exitcode not in (None, 0):
                return f"{ctx.label} rank {i} exited with {p.exitcode}"
    return None


def rank_tracebacks(ctx):
    """The tracebacks of the source ranks that raised (torch.multiprocessing's error files)."""
    import pickle
    out = []
    for i, path in enumerate(getattr(ctx, "error_files", None) or []):
        try:
            if path and os.path.getsize(path):
                with open(path, "rb") as f:
                    out.append(f"\n{ctx.label} rank {i}: {pickle.load(f).rstrip()}")
        except Exception:  # noqa: BLE001 - nothing (more) to say
            pass
    return "".join(out)


def source_kind(case):
    return "Megatron-Core" if "megatron" in case else "FSDP2 (fp32 masters)" if "fsdp2" in case else "HF"


def run_case(name, build, vllm_python, work, timed_runs=TIMED_RUNS):
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
    assert p.dest_ranks == list(range(first, p.num_ranks)) and p.source_ranks == list(range(first)), \
        (p.source_ranks, p.dest_ranks)
    a = {"plan": plan, "store": store, "work": work, "model": model}
    # The vLLM ranks' first weights: other values, so that a refit that wrote nothing would fail.
    initial = write_checkpoint(vllm_python, work, "initial", config, hf_values(model, 7))
    errors = []
    threads, ctx = [], None
    if "megatron" in case:
        import ranks
        ctx = ranks.spawn(first, _megatron_rank, name, a, timed_runs, join=False)
        ctx.label = "Megatron"
        threads.append(threading.Thread(target=megatron_checkpoints, daemon=True,
                                        args=(name, case, work, first, config, vllm_python, errors)))
    elif "fsdp2" in case:
        import torch.multiprocessing as mp
        assert first == FSDP2_WORLD, (first, FSDP2_WORLD)
        # forkserver: one process imports torch, transformers and reshard, the ranks fork from it (4 spawned
        # interpreters importing them compete with the vLLM ranks' start for the CPUs), and none inherits
        # this process's threads or sessions
        mp.get_context("forkserver").set_forkserver_preload(FSDP2_PRELOAD)
        ctx = mp.start_processes(_fsdp2_entry, args=(name, dict(a, config=config), timed_runs, vllm_python),
                                 nprocs=FSDP2_WORLD, join=False, start_method="forkserver")
        ctx.label = "FSDP2"
    else:
        threads.append(threading.Thread(target=hf_source, daemon=True,
                                        args=(case, work, a, config, vllm_python, errors, timed_runs)))
    for t in threads:
        t.start()
    args = {"initial": initial, "settings": case["vllm"], "plan": plan, "store": store, "first": first,
            "rounds": ROUNDS, "work": work, "timeout_s": TIMEOUT_S, "timed_runs": timed_runs,
            "via": case.get("via", "WorkerRefit")}
    world = len(p.dest_ranks)
    t0 = time.time()
    done = False
    try:
        launch.run(world, [os.path.join(HERE, "rank_refit.py"), json.dumps(args)], timeout_s=TIMEOUT_S,
                   python=vllm_python, label=f"{name}-vllm", log_dir=work, abort=lambda: source_failed(errors, ctx))
        done = True
    except RuntimeError as e:
        raise SystemExit(f"{name}: {e}\n(errors on the source side: {errors!r}){rank_tracebacks(ctx)}")
    finally:
        if ctx is not None:
            for p in ctx.processes:  # after a failure the source ranks would wait for their peers' timeout
                p.join(timeout=60 if done and not errors else 1)
                if p.is_alive():
                    p.kill()
        for t in threads:
            t.join(timeout=60)
    if errors:
        raise SystemExit(f"{name}: the source side: {errors[0]!r}")
    if ctx is not None and any(p.exitcode != 0 for p in ctx.processes):
        raise SystemExit(f"{name}: {ctx.label} ranks exited with {[p.exitcode for p in ctx.processes]}"
                         f"{rank_tracebacks(ctx)}")
    wall = time.time() - t0
    results = [load_json(os.path.join(work, f"vllm-rank{r}.json")) for r in range(world)]
    bad = []
    for r in results:
        for k, rd in enumerate(r["rounds"]):
            bad += [f"rank {r['rank']} round {k}: {d}" for d in rd["differences"]]
            if rd["stale_without_finish"] != sorted(r["derived"]):
                bad.append(f"rank {r['rank']} round {k}: without the engine's post-processing these differ from a "
                           f"fresh load: {rd['stale_without_finish'][:4]}; expected exactly the derived "
                           f"{sorted(r['derived'])[:4]}")
            if rd["unchanged"]:
                bad.append(f"rank {r['rank']} round {k}: the refit left {rd['unchanged'][:4]} as they were")
        if r["moved"]:
            bad.append(f"rank {r['rank']}: tensors moved in memory: {r['moved'][:4]}")
        if "mla" in name and len(r["derived"]) != 2 * 4:
            bad.append(f"rank {r['rank']}: {len(r['derived'])} derived tensors recomputed, expected W_UV and "
                       "W_UK_T of 4 layers")
    if bad:
        raise SystemExit(f"{name}: the refit engine differs from a fresh load:\n  " + "\n  ".join(bad[:30]))
    tensors = results[0]["rounds"][0]["tensors"]
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    summary = {
        "case": name, "vllm_ranks": world, "source_ranks": first, "rounds": ROUNDS,
        "tensors_per_rank": tensors,
        "run_s": med([rd["run_s"] for r in results for rd in r["rounds"]]),
        "finish_s": med([rd["finish_s"] for r in results for rd in r["rounds"]]),
        "bare_run_s": med([r["bare_run_s"] for r in results]),
        "worker_refit_run_s": med([r["worker_refit_run_s"] for r in results]),
        "rebind_check_s": med([r["rebind_check_s"] for r in results]),
        "wall_s": round(wall, 1),
    }
    print(f"{name}: {ROUNDS} refits through {args['via']} from {first} {source_kind(case)} rank(s) into "
          f"{world} vLLM ranks: every parameter and buffer ({tensors} on rank 0) equals a fresh vLLM load, bit for "
          f"bit, after each; nothing moved in memory" + (f"; W_UV / W_UK_T recomputed" if "mla" in name else "")
          + (f" (without it they are stale: the comparison sees it)" if "mla" in name else "")
          + f" ({wall:.0f} s)", flush=True)
    print("  " + json.dumps(summary), flush=True)
    return summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--vllm-python", default=os.path.join(ROOT, "build", "vllm-venv", "bin", "python"))
    ap.add_argument("--work", help="keep checkpoints, plans and rank logs here (default: a temporary folder)")
    ap.add_argument("--timed-runs", type=int, default=TIMED_RUNS,
                    help=f"runs timed each way after the checked refits (default {TIMED_RUNS})")
    ap.add_argument("--json", metavar="FILE", help="write the cases' measurements here")
    ap.add_argument("case", nargs="*", help=f"cases (default: all): {', '.join(CASES)}")
    a = ap.parse_args(argv)
    names = a.case or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        sys.exit(f"refit_live.py: unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    if a.timed_runs < 1:
        sys.exit("refit_live.py: --timed-runs must be at least 1")
    work = a.work or tempfile.mkdtemp(prefix="reshard-refit-live-")
    summaries = [run_case(n, a.build, a.vllm_python, os.path.join(work, n), a.timed_runs) for n in names]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summaries, f, indent=1)


if __name__ == "__main__":
    main()
