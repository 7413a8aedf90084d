#!/usr/bin/env python3
"""The kernels vLLM 0.33 picks on Hopper and Blackwell, proven on real vLLM
CPU ranks (docs/kernels.md): each case selects its kernel classes the way a
GPU would pick them (patching only the selection: the classes' support
checks and vLLM's own moe_backend option), loads a vLLM rank (engine.py's
way: vLLM's model classes, loaders and process_weights_after_loading), and
refits it twice in place from a BF16 HF rank through one plan
(reshard.vllm.WorkerRefit). After each refit every parameter and buffer
equals, bit for bit (values and strides), a fresh vLLM load of the same
weights with the same kernels; nothing moves in memory; every written and
derived tensor changed. The control: between the plan's run and the engine's
post-processing, exactly the tensors vLLM derives differ from a fresh load
(the engine-formatted kernels' parameters and MLA's W_UV / W_UK_T).

Cases (TP 1; a DeepSeek-V3-style MLA + MoE model with 128-wide dimensions
unless said otherwise):
- sm90-fp8-ep: FP8 128x128 blocks as vLLM holds them on Hopper with expert
  parallelism and DeepGEMM off: CutlassFp8BlockScaledMMKernel linears
  (kept as loaded: the plan writes them directly) and FlashInferExperts
  (w13 as [up; gate], block scales clamped: the plan writes the checkpoint
  format, vLLM's own post-processing makes the kernel format);
- sm100-bf16: BF16 MoE as vLLM holds it on Blackwell:
  TrtLlmBf16ExpertsMonolithic (rows permuted in place into FlashInfer's
  block layout, checkpoint shapes kept). vLLM's post-processing calls
  FlashInfer's permutation helpers: needs flashinfer-python importable
  (tools/test.d/26-vllm-kernels.sh puts it on PYTHONPATH);
- fp8-channel: a Qwen3-MoE from a compressed-tensors per-channel FP8
  checkpoint as vLLM holds it on Hopper and Blackwell:
  CutlassFP8ScaledMMLinearKernel (transposed views) and vLLM's CUTLASS
  experts (TritonOrCutlassExperts, kept as loaded), both written directly.
Refusals on the same ranks, by vLLM's own selection: DeepGEMM block FP8
(DeepGemmFp8BlockScaledMMKernel: its post-processing needs CUDA) is refused
by name, and a kernel class docs/kernels.md does not list is refused naming
docs/kernels.md.

    build/vllm-venv/bin/python tests/vllm/kernels.py --build build [CASE ...]
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
sys.path[:0] = [HERE]

ROUNDS = 2
TIMEOUT_S = 600.0

# A DeepSeek-V3-style model whose every projection is a multiple of 128
# (vLLM's CUTLASS block FP8 takes 128-wide activation groups only) and whose
# MoE intermediate is 128 (FlashInfer's TRT-LLM block layout needs it).
BASE_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 256,
    "intermediate_size": 256, "moe_intermediate_size": 128, "num_hidden_layers": 2, "first_k_dense_replace": 1,
    "moe_layer_freq": 1, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2,
    "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
    "routed_scaling_factor": 2.5, "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 128,
    "kv_lora_rank": 128, "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "v_head_dim": 64, "vocab_size": 256,
    "hidden_act": "silu", "rms_norm_eps": 1e-06, "rope_theta": 10000, "max_position_embeddings": 128,
    "tie_word_embeddings": False, "attention_bias": False, "torch_dtype": "bfloat16",
}
FP8_BLOCK_128 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}

# name: quantization, vLLM's moe_backend, the FP8 block linear kernel selected (None: vLLM's CPU list, which
# names CUTLASS for per-channel FP8), the kernel classes that must hold the layers, the engine-formatted experts
# class (None: every kernel is written directly), and --infer's quant setting where the config cannot say it.
CASES = {
    "sm90-fp8-ep": dict(quant=FP8_BLOCK_128, moe_backend="flashinfer_cutlass", linear="CutlassFp8BlockScaledMMKernel",
                        experts="FlashInferExperts", formatted="FlashInferExperts", refusals=True,
                        what="FP8 128x128 blocks as on Hopper with EP and VLLM_USE_DEEP_GEMM=0: CUTLASS block "
                             "linears, FlashInfer CUTLASS experts"),
    "sm100-bf16": dict(quant=None, moe_backend="flashinfer_trtllm", linear=None,
                       experts="TrtLlmBf16ExpertsMonolithic", formatted="TrtLlmBf16ExpertsMonolithic",
                       needs="flashinfer", what="BF16 as on Blackwell: FlashInfer TRT-LLM experts"),
    # compressed-tensors per-channel FP8 (llm-compressor's FP8_DYNAMIC) on a Qwen3-MoE: vLLM CUTLASS experts
    # (TritonOrCutlassExperts, allowed for compressed-tensors) on sm90 and sm100, CUTLASS per-channel linears
    "fp8-channel": dict(quant="fp8-channel", base="vllm-moe-tp2", moe_backend="cutlass", linear=None,
                        held_linear="CutlassFP8ScaledMMLinearKernel", experts="TritonOrCutlassExperts",
                        formatted=None, infer_quant="fp8-channel",
                        what="per-channel FP8 (compressed-tensors) as on Hopper and Blackwell: CUTLASS "
                             "per-channel linears, vLLM CUTLASS experts"),
}


def base_config(case):
    """The case's unquantized HF config."""
    base = CASES[case].get("base")
    if base is None:
        return dict(BASE_CONFIG)
    import vllm_cases
    return vllm_cases.recorded_config(base)


def config(case):
    """The checkpoint's HF config: the base with the case's quantization_config."""
    import checkpoint
    c = base_config(case)
    q = CASES[case]["quant"]
    if q == "fp8-channel":
        c["quantization_config"] = dict(checkpoint.COMPRESSED_FP8_CHANNEL)
    elif q:
        c["quantization_config"] = dict(q)
    return c


# -- kernel selection (the vLLM rank's process) -----------------------------------------------------------

def _always_supported(*_a, **_k):
    return True, None


def select_linear(name):
    """vLLM's block FP8 linear kernel list on this CPU becomes [name], its device check answers
    "supported" (can_implement, the check of the layer's shape and groups, stays vLLM's)."""
    from vllm.model_executor.kernels import linear as linear_kernels
    from vllm.platforms import PlatformEnum

    cls = {c.__name__: c for c in _block_kernels()}[name] if isinstance(name, str) else name
    cls.is_supported = classmethod(lambda c, compute_capability=None: (True, None))
    linear_kernels._POSSIBLE_FP8_BLOCK_KERNELS[PlatformEnum.CPU] = [cls]
    return cls


def _block_kernels():
    from vllm.model_executor.kernels.linear.scaled_mm.cutlass import CutlassFp8BlockScaledMMKernel
    from vllm.model_executor.kernels.linear.scaled_mm.deep_gemm import DeepGemmFp8BlockScaledMMKernel
    from vllm.model_executor.kernels.linear.scaled_mm.triton import TritonFp8BlockScaledMMKernel

    return [CutlassFp8BlockScaledMMKernel, DeepGemmFp8BlockScaledMMKernel, TritonFp8BlockScaledMMKernel]


def select_experts(name):
    """The experts class vLLM's MoE oracle returns for the case's moe_backend answers "supported"
    (fused_moe/modular_kernel.py FusedMoEExperts.is_supported_config: device, quantization, routing)."""
    if name == "FlashInferExperts":
        from vllm.model_executor.layers.fused_moe.experts.flashinfer_cutlass_moe import FlashInferExperts as cls
    elif name == "TrtLlmBf16ExpertsMonolithic":
        from vllm.model_executor.layers.fused_moe.experts.trtllm_bf16_moe import TrtLlmBf16ExpertsMonolithic as cls
    elif name == "TritonOrCutlassExperts":
        from vllm.model_executor.layers.fused_moe.experts.triton_cutlass_moe import TritonOrCutlassExperts as cls
    else:
        raise ValueError(name)
    cls.is_supported_config = staticmethod(_always_supported)
    return cls


def build(model_dir, case):
    """(model, vllm_config) of one TP 1 rank with the case's kernels, as engine.build makes it
    (EngineArgs with the case's moe_backend)."""
    import engine
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model

    c = CASES[case]
    torch.set_num_threads(1)
    engine.kernel_selection_for_cpu()
    if c["linear"]:
        select_linear(c["linear"])
    select_experts(c["experts"])
    args = EngineArgs(model=model_dir, skip_tokenizer_init=True, dtype="bfloat16", enforce_eager=True,
                      load_format="safetensors", tensor_parallel_size=1, seed=0,
                      distributed_executor_backend="external_launcher", moe_backend=c["moe_backend"])
    cfg = args.create_engine_config()
    with set_current_vllm_config(cfg):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://{os.environ['MASTER_ADDR']}:"
                                                             f"{os.environ['MASTER_PORT']}")
        initialize_model_parallel(1, 1)
        model = get_model(vllm_config=cfg)
    return model, cfg


def kernels_held(model):
    """{module name: (kind, class)} of every module whose kernel decides its weights."""
    import reshard.vllm as rv

    return {n: k for n, m in model.named_modules() if (k := rv._kernel_of(m)) is not None}


def refusals(case, cfg, checkpoint_dir):
    """Fresh models of this engine with other kernels selected by vLLM's own selection: DeepGEMM block FP8,
    and a block FP8 class no table lists; returns what kernel_layout_problems said of each."""
    import engine
    import reshard.vllm as rv
    from vllm.model_executor.kernels.linear.scaled_mm.cutlass import CutlassFp8BlockScaledMMKernel
    from vllm.model_executor.kernels.linear.scaled_mm.deep_gemm import DeepGemmFp8BlockScaledMMKernel

    out = {}
    # DeepGEMM's can_implement asks for DeepGEMM on a GPU (should_use_deepgemm_for_fp8_linear): selection only.
    DeepGemmFp8BlockScaledMMKernel.can_implement = classmethod(lambda c, config: (True, None))
    unlisted = type("CutlassFp8BlockScaledMMKernelNext", (CutlassFp8BlockScaledMMKernel,), {})
    for label, cls in (("deepgemm", DeepGemmFp8BlockScaledMMKernel), ("unlisted", unlisted)):
        select_linear(cls)
        m = engine.fresh(cfg, checkpoint_dir)
        out[label] = {"held": sorted({k[1] for k in kernels_held(m).values()}),
                      "problems": rv.kernel_layout_problems(m)}
        del m
    select_linear(CASES[case]["linear"])
    return out


def rank_main(a):
    import engine  # noqa: F401  (sets the CPU environment before vLLM is imported)
    import rank_refit
    import torch

    import reshard
    import reshard.vllm as rv

    case = a["case"]
    model, cfg = build(a["initial"], case)
    held = kernels_held(model)
    plan = reshard.Plan.open(a["plan"])
    g = a["first"]
    session = reshard.Session(plan, g, reshard.GlooTransport(g, plan.num_ranks, store=a["store"],
                                                             timeout_s=a["timeout_s"]))
    refit = rv.WorkerRefit(session, model, cfg)
    written = sorted(b.name for b in session.buffers if b.is_destination)
    derived = [n + "." + w for n, _ in refit._derived for w in ("W_UV", "W_UK_T")]
    formatted = sorted(f.name + "." + n for f in refit._formatted for n in f.buffers)
    tensors = engine.all_tensors(model)
    where = {n: (t.data_ptr(), t.untyped_storage().nbytes()) for n, t in tensors.items()}
    result = {"held": held, "written": len(written), "derived": derived, "formatted": formatted,
              "formatted_layers": refit.formatted_layers, "staging_bytes": refit.staging_bytes, "rounds": []}
    before = rank_refit.snapshot(model)
    for k in range(a["rounds"]):
        t0 = time.perf_counter()
        refit.rebind_if_replaced()
        stats = session.run()
        unfinished = rank_refit.snapshot(model)
        refit.finish()
        total = time.perf_counter() - t0
        state = rank_refit.snapshot(model)
        changed = [n for n in written + derived if not torch.equal(rank_refit.bits(state[n][0]),
                                                                   rank_refit.bits(before[n][0]))]
        ckpt = os.path.join(a["work"], f"round{k}", "model")
        rank_refit.wait_for(os.path.join(ckpt, "READY"), a["timeout_s"])
        fresh = engine.fresh(cfg, ckpt)
        fresh_tensors = engine.all_tensors(fresh)
        diffs = rank_refit.differences(state, fresh_tensors)
        stale = sorted(d.split(":")[0] for d in rank_refit.differences(unfinished, fresh_tensors))
        del fresh, fresh_tensors
        result["rounds"].append({"run_s": stats.seconds, "refit_s": total, "finish_s": refit.last_finish_s,
                                 "format_s": refit.last_format_s, "tensors": len(state), "differences": diffs,
                                 "stale_without_finish": stale,
                                 "unchanged": sorted(set(written + derived) - set(changed))})
        before = state
    result["moved"] = [n for n, t in engine.all_tensors(model).items()
                       if (t.data_ptr(), t.untyped_storage().nbytes()) != where.get(n)]
    if CASES[case].get("refusals"):
        result["refusals"] = refusals(case, cfg, os.path.join(a["work"], f"round{a['rounds'] - 1}", "model"))
    with open(os.path.join(a["work"], "vllm-rank.json"), "w") as f:
        json.dump(result, f)


# -- the driver (the BF16 HF rank, checkpoints, checks) ----------------------------------------------------

def reshard_cli(build_dir, *args):
    subprocess.run([os.path.join(build_dir, "reshard"), *args], check=True, stdout=subprocess.DEVNULL)


def hf_values(model_json, seed):
    """BF16 values of every tensor of the model spec, seeded by name and `seed`."""
    import checkpoint
    import torch

    with open(model_json) as f:
        spec = json.load(f)
    out = {}
    for n, shape, dtype in checkpoint.expand(spec):
        key = int.from_bytes(hashlib.sha256(f"{n}/{seed}".encode()).digest()[:8], "little") & ((1 << 63) - 1)
        x = torch.randn(shape, generator=torch.Generator().manual_seed(key))
        out[n] = (1.0 + 0.1 * x if "norm" in n else 0.5 * x).to(dtype)
    return out


def write_checkpoint(directory, cfg, values):
    import checkpoint

    checkpoint.write(directory, cfg, checkpoint.checkpoint_tensors(cfg, values))
    open(os.path.join(directory, "READY"), "w").close()


def hf_source(a, cfg, errors):
    """Plan rank 0: BF16 values, new each round, bound once (TrainerRefit); the checkpoint of the same values."""
    try:
        import reshard
        plan = reshard.Plan.open(a["plan"])
        session = reshard.Session(plan, 0, reshard.GlooTransport(0, plan.num_ranks, store=a["store"],
                                                                 timeout_s=TIMEOUT_S))
        tensors = hf_values(a["model"], 0)
        refit = reshard.TrainerRefit(session, tensors)
        for k in range(ROUNDS):
            for n, t in hf_values(a["model"], 100 + k).items():
                tensors[n].copy_(t)
            write_checkpoint(os.path.join(a["work"], f"round{k}", "model"), cfg, tensors)
            refit.run()
    except Exception as e:  # noqa: BLE001 - reported by the caller
        errors.append(e)


def specs(build_dir, case, work):
    """(model.json, train.json, infer.json): a BF16 HF rank -> vLLM TP 1 with the case's quantization."""
    plain = base_config(case)
    q = CASES[case].get("infer_quant")
    # init reads FP8 block quantization_configs; per-channel FP8 is --infer's quant= on the plain config
    infer_cfg, infer = (plain, f"vllm:tp=1,quant={q}") if q else (config(case), "vllm:tp=1")
    paths = {}
    for side, cfg, infer in (("train", plain, "hf"), ("infer", infer_cfg, infer)):
        d = os.path.join(work, side)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        reshard_cli(build_dir, "init", "-q", "--hf-config", os.path.join(d, "config.json"), "--name", "tiny-dsv3",
                    "--train", "hf", "--infer", infer, "-o", d)
        paths[side] = d
    with open(os.path.join(paths["train"], "model.json")) as f, open(os.path.join(paths["infer"], "model.json")) as g:
        assert json.load(f) == json.load(g), "the BF16 and the quantized config describe other models"
    return (os.path.join(paths["train"], "model.json"), os.path.join(paths["train"], "train.json"),
            os.path.join(paths["infer"], "infer.json"))


def check_case(name, r):
    """What is wrong with one case's rank result (a list of lines)."""
    c = CASES[name]
    bad = []
    held = {tuple(k) for k in r["held"].values()}
    linear = c["linear"] or c.get("held_linear")
    want = {("experts", c["experts"])} | ({("linear", linear)} if linear else set())
    if not want <= held:
        bad.append(f"the rank holds {sorted(held)}, not {sorted(want)}: the selection did not take")
    layers = [n for n, k in r["held"].items() if k[1] == c["formatted"]]
    if sorted(r["formatted_layers"]) != sorted(layers) or (c["formatted"] and not layers):
        bad.append(f"engine-formatted layers {r['formatted_layers']}, expected the {c['formatted']} layers {layers}")
    for k, rd in enumerate(r["rounds"]):
        bad += [f"round {k}: {d}" for d in rd["differences"]]
        stale = set(rd["stale_without_finish"])
        allowed = set(r["derived"]) | set(r["formatted"])
        # Under BF16, MLA's W_UV / W_UK_T are views of kv_b_proj: never stale; under FP8, copies.
        derived = set(r["derived"]) if c["quant"] else set()
        if not derived <= stale or not stale <= allowed or (c["formatted"] and not stale & set(r["formatted"])):
            bad.append(f"round {k}: without the engine's post-processing {sorted(stale)[:6]} differ from a fresh "
                       f"load; expected {sorted(derived)[:4]}, some of {r['formatted'][:4]}, nothing else")
        if rd["unchanged"]:
            bad.append(f"round {k}: the refit left {rd['unchanged'][:4]} as they were")
    if r["moved"]:
        bad.append(f"tensors moved in memory: {r['moved'][:4]}")
    if "refusals" in r:
        dg = r["refusals"]["deepgemm"]
        if "DeepGemmFp8BlockScaledMMKernel" not in dg["held"] or not any(
                "held by DeepGemmFp8BlockScaledMMKernel (linear backend)" in p and "tools/gpu-check-kernels.sh" in p
                for p in dg["problems"]):
            bad.append(f"DeepGEMM block FP8 is not refused by name: {dg}")
        un = r["refusals"]["unlisted"]
        if "CutlassFp8BlockScaledMMKernelNext" not in un["held"] or not any(
                "held by CutlassFp8BlockScaledMMKernelNext (linear backend)" in p and "docs/kernels.md does not list"
                in p for p in un["problems"]):
            bad.append(f"a kernel no table lists is not refused naming docs/kernels.md: {un}")
    return bad


def run_case(name, build_dir, work):
    import launch
    import reshard

    os.makedirs(work, exist_ok=True)
    model, train, infer = specs(build_dir, name, work)
    plan = os.path.join(work, "plan.rsplan")
    reshard_cli(build_dir, "compile", "--model", model, "--from", train, "--to", infer, "--cluster",
                os.path.join(ROOT, "samples", "clusters", "dgx-h100.json"), "-o", plan)
    p = reshard.Plan.open(plan)
    assert p.source_ranks == [0] and p.dest_ranks == [1], (p.source_ranks, p.dest_ranks)
    store = os.path.join(work, "store")
    os.makedirs(store)
    cfg = config(name)
    initial = os.path.join(work, "initial")
    write_checkpoint(initial, cfg, hf_values(model, 7))  # other values: a refit that wrote nothing fails
    a = {"case": name, "plan": plan, "store": store, "work": work, "model": model, "initial": initial, "first": 1,
         "rounds": ROUNDS, "timeout_s": TIMEOUT_S}
    errors = []
    source = threading.Thread(target=hf_source, args=(a, cfg, errors), daemon=True)
    source.start()
    t0 = time.time()
    try:
        launch.run(1, [os.path.abspath(__file__), "--rank-args", json.dumps(a)], timeout_s=TIMEOUT_S,
                   label=f"{name}-vllm", log_dir=work, abort=lambda: errors and f"the HF rank: {errors[0]!r}")
    except RuntimeError as e:
        raise SystemExit(f"kernels.py {name}: {e}")
    source.join(timeout=60)
    if errors:
        raise SystemExit(f"kernels.py {name}: the HF rank: {errors[0]!r}")
    with open(os.path.join(work, "vllm-rank.json")) as f:
        r = json.load(f)
    bad = check_case(name, r)
    if bad:
        raise SystemExit(f"kernels.py {name}: the refit engine differs from a fresh load:\n  " + "\n  ".join(bad[:30]))
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    summary = {"case": name, "tensors": r["rounds"][0]["tensors"], "formatted_layers": len(r["formatted_layers"]),
               "staging_bytes": r["staging_bytes"], "run_s": med([rd["run_s"] for rd in r["rounds"]]),
               "finish_s": med([rd["finish_s"] for rd in r["rounds"]]),
               "format_s_per_layer": med([s for rd in r["rounds"] for s in rd["format_s"]] or [None]),
               "wall_s": round(time.time() - t0, 1)}
    kinds = sorted({k[1] for k in r["held"].values()})
    print(f"{name}: {CASES[name]['what']}: {ROUNDS} refits from a BF16 HF rank; every parameter and buffer "
          f"({summary['tensors']}) equals a fresh vLLM load bit for bit after each, nothing moved; kernels held: "
          f"{', '.join(kinds)}; "
          + (f"{', '.join(r['formatted_layers'])} re-formatted by vLLM's own post-processing (stale without it: "
             "the comparison sees it)" if r["formatted_layers"] else "every kernel written directly")
          + ("; DeepGEMM refused by name, an unlisted kernel refused naming docs/kernels.md" if "refusals" in r
             else "") + f" ({summary['wall_s']:.0f} s)", flush=True)
    print("  " + json.dumps(summary), flush=True)
    return summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--work", help="keep checkpoints, plans and rank logs here (default: a temporary folder)")
    ap.add_argument("--json", metavar="FILE", help="write the cases' measurements here")
    ap.add_argument("--rank-args", help=argparse.SUPPRESS)
    ap.add_argument("case", nargs="*", help=f"cases (default: all): {', '.join(CASES)}")
    a = ap.parse_args(argv)
    if a.rank_args:
        return rank_main(json.loads(a.rank_args))
    names = a.case or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        sys.exit(f"kernels.py: unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    import importlib.util
    missing = [n for n in names if CASES[n].get("needs") and importlib.util.find_spec(CASES[n]["needs"]) is None]
    if missing:
        sys.exit(f"kernels.py: {', '.join(missing)} need(s) {CASES[missing[0]]['needs']} importable (vLLM's "
                 "post-processing of that kernel calls it): tools/test.d/26-vllm-kernels.sh puts it on PYTHONPATH")
    work = a.work or tempfile.mkdtemp(prefix="reshard-kernels-")
    summaries = [run_case(n, a.build, os.path.join(work, n)) for n in names]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summaries, f, indent=1)


if __name__ == "__main__":
    main()
