#!/usr/bin/env python3
"""The proof of tests/vllm/kernels.py for the kernels whose post-processing
needs a GPU (docs/kernels.md, "waits for a GPU run"): on one CUDA device,
vLLM 0.33 with its *default* kernel choice (nothing patched: DeepGEMM block
FP8 linears with UE8M0 requantization, DeepGEMM or FlashInfer TRT-LLM
experts, MLA's W_UV / W_UK_T computed under DeepGEMM), refitted twice in
place through reshard.vllm.WorkerRefit, and after each refit every parameter
and buffer compared, bit for bit (values and strides), with a fresh vLLM load
of the same weights; nothing may move in memory.

One process per case: a colocated plan (cluster "placement": "colocated")
whose one rank is both the BF16 HF source (its tensors on the GPU) and the
vLLM rank, over a one-rank NCCL communicator, so one GPU suffices. The
engine-formatted kernels the rank holds are added to
reshard.vllm.PROVEN_KERNELS (and STAGING_PROVEN) for the run: this is their
proof. Cases:
- fp8-block: a DeepSeek-V3-style FP8 128x128-block model with vLLM's defaults
  (sm90: FlashInfer/DeepGEMM linears, Triton experts at TP 1; sm100: DeepGEMM
  linears, TRT-LLM FP8 experts);
- fp8-block-deepgemm-moe: the same with VLLM_USE_DEEP_GEMM=1 set (vLLM then
  picks DeepGEMM experts: fused_moe/oracle/fp8.py select_fp8_moe_backend);
- bf16: the BF16 model (sm100: TRT-LLM BF16 experts; sm90: Triton).
Writes one JSON line per case and a verdict; exits 1 on any difference.

    python tests/vllm/kernels_gpu.py [--work DIR] [--cpu] [CASE ...]

--cpu runs the same flow on this CPU (Gloo, tests/vllm/engine.py's kernel
selection plus kernels.py's sm90-fp8-ep selection), to check the script
itself where no GPU is lent.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path[:0] = [HERE]

import kernels  # noqa: E402  (configs, values, checkpoints; imports no vLLM)

ROUNDS = 2
CASES = {
    "fp8-block": dict(quant=kernels.FP8_BLOCK_128, env={}),
    "fp8-block-deepgemm-moe": dict(quant=kernels.FP8_BLOCK_128, env={"VLLM_USE_DEEP_GEMM": "1"}),
    "bf16": dict(quant=None, env={}),
}


def case_config(name):
    c = dict(kernels.BASE_CONFIG)
    if CASES[name]["quant"]:
        c["quantization_config"] = dict(CASES[name]["quant"])
    return c


def bits(t):
    import torch
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def all_tensors(model):
    out = dict(model.named_parameters())
    out.update({n: b for n, b in model.named_buffers() if n not in out})
    return out


def snapshot(model):
    return {n: (t.detach().clone(), t.stride()) for n, t in all_tensors(model).items()}


def differences(state, fresh):
    import torch
    out = [f"only in the refit engine: {n}" for n in sorted(set(state) - set(fresh))]
    out += [f"only in the fresh engine: {n}" for n in sorted(set(fresh) - set(state))]
    for n in sorted(set(state) & set(fresh)):
        (a, stride), b = state[n], fresh[n]
        if a.dtype != b.dtype or a.shape != b.shape or stride != b.stride():
            out.append(f"{n}: {a.dtype}{list(a.shape)}:{list(stride)} vs fresh {b.dtype}{list(b.shape)}:"
                       f"{list(b.stride())}")
        elif not torch.equal(bits(a), bits(b)):
            out.append(f"{n}: values differ")
    return out


def build(model_dir, cpu):
    """(model, vllm_config) of one TP 1 rank: vLLM's defaults on the GPU; on --cpu, the CPU selection."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model

    moe_backend = "auto"
    if cpu:
        import engine
        engine.kernel_selection_for_cpu()
        kernels.select_linear("CutlassFp8BlockScaledMMKernel")
        kernels.select_experts("FlashInferExperts")
        moe_backend = "flashinfer_cutlass"
    args = EngineArgs(model=model_dir, skip_tokenizer_init=True, dtype="bfloat16", enforce_eager=True,
                      load_format="safetensors", tensor_parallel_size=1, seed=0, moe_backend=moe_backend,
                      distributed_executor_backend="external_launcher", gpu_memory_utilization=0.5)
    if not cpu:
        torch.cuda.set_device(0)
    cfg = args.create_engine_config()
    with set_current_vllm_config(cfg):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo" if cpu else "nccl",
                                     distributed_init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}")
        initialize_model_parallel(1, 1)
        model = get_model(vllm_config=cfg)
    return model, cfg


def fresh(cfg, model_dir):
    """A second model of the same engine loaded from `model_dir` (tests/vllm/engine.py fresh, on any device)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model

    ctx = cfg.compilation_config.static_forward_context
    saved_ctx, saved_model = dict(ctx), cfg.model_config.model
    ctx.clear()
    cfg.model_config.model = model_dir
    try:
        with set_current_vllm_config(cfg):
            return get_model(vllm_config=cfg)
    finally:
        cfg.model_config.model = saved_model
        ctx.clear()
        ctx.update(saved_ctx)


def case_main(name, work, cpu):
    """One case in this process: returns its result dict."""
    import torch

    import reshard
    import reshard.vllm as rv

    device = "cpu" if cpu else "cuda"
    cfg_json = case_config(name)
    specs = reshard.init(kernels.BASE_CONFIG, train="hf", infer="hf", name="tiny-dsv3")
    infer = reshard.init(cfg_json, train="hf", infer="vllm:tp=1", name="tiny-dsv3")
    assert specs["model"] == infer["model"], "the BF16 and the quantized config describe other models"
    with open(os.path.join(ROOT, "samples", "clusters", "dgx-h100.json")) as f:
        cluster = dict(json.load(f), name="one-gpu-colocated", placement="colocated")
    paths = {}
    for key, spec in (("model", specs["model"]), ("train", specs["train"]), ("infer", infer["infer"]),
                      ("cluster", cluster)):
        paths[key] = os.path.join(work, key + ".json")
        with open(paths[key], "w") as f:
            json.dump(spec, f)
    plan_path = os.path.join(work, "plan.rsplan")
    reshard.compile(paths["model"], paths["train"], paths["infer"], paths["cluster"], plan_path)
    plan = reshard.Plan.open(plan_path)
    assert list(plan.active_ranks) == [0], f"not one colocated rank: {plan.active_ranks}"

    initial = os.path.join(work, "initial")
    kernels.write_checkpoint(initial, cfg_json, kernels.hf_values(paths["model"], 7))
    model, cfg = build(initial, cpu)
    held = {n: k for n, m in model.named_modules() if (k := rv._kernel_of(m)) is not None}
    proving = sorted({cls for kind, cls in held.values() if cls in rv.ENGINE_FORMATTED})
    for kind, cls in held.values():
        if cls in proving and cls not in rv.PROVEN_KERNELS[kind]:
            rv.PROVEN_KERNELS[kind] = rv.PROVEN_KERNELS[kind] + (cls,)
    rv.STAGING_PROVEN = tuple(proving)

    if cpu:
        os.makedirs(os.path.join(work, "store"), exist_ok=True)
        transport = reshard.GlooTransport(0, 1, store=os.path.join(work, "store"), timeout_s=120)
    else:
        transport = rv.connect(plan, 0, nccl_unique_id=reshard.nccl.unique_id(), device=0)
    session = reshard.Session(plan, 0, transport)
    source = {n: t.to(device) for n, t in kernels.hf_values(paths["model"], 0).items()}
    session.bind_module(source, side="train")
    t0 = time.perf_counter()
    refit = rv.WorkerRefit(session, model, cfg)
    bind_s = time.perf_counter() - t0
    formatted = sorted(f.name + "." + n for f in refit._formatted for n in f.buffers)
    derived = [n + "." + w for n, _ in refit._derived for w in ("W_UV", "W_UK_T")]
    where = {n: (t.data_ptr(), t.untyped_storage().nbytes()) for n, t in all_tensors(model).items()}
    result = {"case": name, "device": torch.cuda.get_device_name(0) if not cpu else "cpu",
              "capability": list(torch.cuda.get_device_capability(0)) if not cpu else None,
              "held": sorted({f"{k[0]}:{k[1]}" for k in held.values()}), "proving": proving,
              "formatted_layers": refit.formatted_layers, "staging_bytes": refit.staging_bytes,
              "bind_s": bind_s, "rounds": [], "env": CASES[name]["env"]}
    for k in range(ROUNDS):
        for n, t in kernels.hf_values(paths["model"], 100 + k).items():
            source[n].copy_(t)
        ckpt = os.path.join(work, f"round{k}")
        kernels.write_checkpoint(ckpt, cfg_json, {n: t.cpu() for n, t in source.items()})
        t0 = time.perf_counter()
        refit.rebind_if_replaced()
        stats = session.run()
        if not cpu:
            torch.cuda.synchronize()
        unfinished = snapshot(model)
        t1 = time.perf_counter()
        refit.finish()
        if not cpu:
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        state = snapshot(model)
        f = fresh(cfg, ckpt)
        ft = all_tensors(f)
        diffs = differences(state, ft)
        stale = sorted(d.split(":")[0] for d in differences(unfinished, ft))
        del f, ft
        result["rounds"].append({"run_s": stats.seconds, "finish_s": t2 - t1, "format_s": refit.last_format_s,
                                 "refit_s": t2 - t0, "differences": diffs[:30], "stale_without_finish": stale[:30]})
    result["moved"] = [n for n, t in all_tensors(model).items()
                       if (t.data_ptr(), t.untyped_storage().nbytes()) != where.get(n)]
    result["ok"] = not result["moved"] and all(not rd["differences"] for rd in result["rounds"])
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", help="keep checkpoints and plans here (default: a temporary folder)")
    ap.add_argument("--cpu", action="store_true", help="run the flow on this CPU (a check of the script)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("case", nargs="*", help=f"cases (default: all): {', '.join(CASES)}")
    a = ap.parse_args(argv)
    work = a.work or tempfile.mkdtemp(prefix="reshard-kernels-gpu-")
    if a.one:
        if a.cpu:
            import engine  # noqa: F401  (the CPU environment before vLLM is imported)
        os.makedirs(os.path.join(work, a.one), exist_ok=True)
        r = case_main(a.one, os.path.join(work, a.one), a.cpu)
        print("RESULT " + json.dumps(r), flush=True)
        return 0 if r["ok"] else 1
    names = a.case or (["fp8-block"] if a.cpu else list(CASES))
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from free_port import free_port
    failed = []
    for n in names:
        env = dict(os.environ, **CASES[n]["env"], MASTER_PORT=str(free_port()))
        t0 = time.time()
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--work", work, "--one", n]
                           + (["--cpu"] if a.cpu else []), env=env, capture_output=True, text=True, timeout=240)
        lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        if not lines:
            failed.append(n)
            print(f"{n}: FAILED (exit {p.returncode}, {time.time() - t0:.0f} s):\n{p.stderr[-4000:]}", flush=True)
            continue
        r = json.loads(lines[-1][len("RESULT "):])
        print(json.dumps(r), flush=True)
        if not r["ok"]:
            failed.append(n)
        print(f"{n}: {'ok' if r['ok'] else 'DIFFERS'} on {r['device']}: kernels {', '.join(r['held'])}; "
              f"engine-formatted {len(r['formatted_layers'])} layer(s) ({', '.join(r['proving']) or 'none'}); "
              f"{time.time() - t0:.0f} s", flush=True)
    print("kernels_gpu: " + ("every case equals a fresh vLLM load after each refit" if not failed
                             else f"FAILED: {', '.join(failed)}"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
