#!/usr/bin/env python3
"""Qwen3-Next's norms refit out of real Megatron-Core 0.19.2 ranks (CPU, Gloo,
local modules: tests/archs/record_megatron.py builds them, TP2 PP2 EP2 ETP1)
through the layout `reshard init --train megatron:...,spec=local` writes,
into one rank holding every tensor of the model spec whole, and what each
norm computes on both sides.

The local spec's norm (WrappedTorchNorm, torch.nn.RMSNorm) computes
x * gamma and cannot be zero-centered (transformer/torch_norm.py), while the
checkpoint's Qwen3NextRMSNorm computes x * (1 + w) and the linear-attention
Qwen3NextRMSNormGated x * w (times its gate): init's layout says the
zero-centered norms are held as 1 + w ("transform": {"offset": 1}) and
out_norm as w. Each Megatron rank fills its parameters with random values,
records what each of its norm modules computes on a random input, and runs
its program of the plan on its own parameter memory (the runtime's C API of
--build, as tests/megatron/refit.py); this process runs the HF rank. Checks:
- every HF element is written, and each norm weight equals the Megatron
  gamma less the layout's offset, rounded to bf16 (what the plan's senders
  compute);
- HF's own norm module (transformers 5.20.2 modeling_qwen3_next.py) with the
  refit weight computes what Megatron's computed, up to bf16 rounding; and,
  as a control, the same comparison without the offset fails for every
  zero-centered norm, so the check sees a missing or wrong offset.

Transformer Engine (the TE spec, where Megatron-Bridge's
layernorm_zero_centered_gamma holds out_norm as w - 1) needs a GPU: that
layout is checked by compile, validate and `run --local` only.

    build/venv/bin/python tests/archs/megatron_norm_offsets.py --build build
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path[:0] = [HERE, os.path.join(ROOT, "tests", "megatron"), os.path.join(ROOT, "tools")]

import torch  # noqa: E402

CASE = "megatron-qwen3next-tp2-pp2-ep2"
DATA = os.path.join(ROOT, "tests", "data", "archs", CASE)
TIMEOUT_S = 600.0
# Megatron's norm modules (suffix of the module name) -> the HF tensor they hold.
NORMS = {"input_layernorm": "input_layernorm.weight", "pre_mlp_layernorm": "post_attention_layernorm.weight",
         "self_attention.q_layernorm": "self_attn.q_norm.weight",
         "self_attention.k_layernorm": "self_attn.k_norm.weight",
         "self_attention.out_norm": "linear_attn.norm.weight"}


def hf_name(module_name, pp, layers_per_stage):
    """The HF tensor of a Megatron norm module on pipeline stage `pp`."""
    if module_name.endswith("decoder.final_layernorm"):
        return "model.norm.weight"
    rest = module_name.split("decoder.layers.", 1)[1]
    local, suffix = rest.split(".", 1)
    return f"model.layers.{pp * layers_per_stage + int(local)}.{NORMS[suffix]}"


def _rank(rank, plan, store, tmp, lib):
    import record_megatron as rm
    from megatron.core import parallel_state as ps
    from reshard_ctypes import Runtime

    case = rm.CASES[CASE]
    ps.initialize_model_parallel(tensor_model_parallel_size=case["tp"], pipeline_model_parallel_size=case["pp"],
                                 expert_model_parallel_size=case["ep"], expert_tensor_parallel_size=case["etp"])
    model = rm.build(case)
    params = {n[len("module."):] if n.startswith("module.") else n: p.data for n, p in model.named_parameters()}
    pp = ps.get_pipeline_model_parallel_rank()
    with torch.no_grad():
        # By name and stage: the replicas of a tensor on other TP, EP or DP ranks hold the same
        # values, as a trained model's do. Norms near 1, as trained gammas held as 1 + w are.
        for n, p in params.items():
            gp = torch.Generator().manual_seed(zlib.crc32(f"{pp}:{n}".encode()))
            p.copy_(torch.randn(p.shape, generator=gp) * 0.25 + (1.0 if "norm" in n else 0.0))
    g = torch.Generator().manual_seed(100 + rank)
    norms = {}
    with torch.no_grad():
        for name, m in model.named_modules():
            if not any(name.endswith(s) for s in list(NORMS) + ["decoder.final_layernorm"]):
                continue
            x = torch.randn(5, m.weight.shape[0], generator=g).to(torch.bfloat16)
            norms[name] = (x, m(x), m.weight.detach().clone())
    torch.save({"pp": pp, "norms": norms}, os.path.join(tmp, f"rank{rank}.pt"))
    torch.distributed.barrier()
    open(os.path.join(tmp, f"ready{rank}"), "w").close()
    Runtime(lib).refit(plan, rank, store, params, timeout_s=TIMEOUT_S)


def offsets(train):
    """Megatron buffer name (a layer's, with {layer.local}) -> its rule's offset."""
    return {r["name"]: r.get("transform", {}).get("offset", 0) for r in train["buffers"]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build folder (reshard, libreshard_runtime.so)")
    a = ap.parse_args(argv)
    import ranks
    import record_megatron as rm
    from refit import hf_layout, hf_tensors, run_ranks
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNorm, Qwen3NextRMSNormGated

    case = rm.CASES[CASE]
    world = case["world"]
    reshard = os.path.join(a.build, "reshard")
    lib = os.path.join(a.build, "libreshard_runtime.so")
    with tempfile.TemporaryDirectory() as tmp:
        specs = os.path.join(tmp, "specs")
        subprocess.run([reshard, "init", "-q", "--hf-config", os.path.join(DATA, "config.json"), "--train",
                        "megatron:tp=2,pp=2,ep=2,etp=1,spec=local", "--infer", "hf", "-o", specs], check=True)
        with open(os.path.join(specs, "model.json")) as f:
            model = json.load(f)
        hf_path = os.path.join(tmp, "hf.json")  # one rank, every tensor of the model spec whole
        with open(hf_path, "w") as f:
            json.dump(hf_layout(model), f)
        plan = os.path.join(tmp, "p.rsplan")
        subprocess.run([reshard, "compile", "-q", "--model", os.path.join(specs, "model.json"), "--from",
                        os.path.join(specs, "train.json"), "--to", hf_path, "--cluster", "dgx-h100", "-o", plan],
                       check=True)
        subprocess.run([reshard, "validate", plan], check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(specs, "train.json")) as f:
            offset_of = offsets(json.load(f))
        store = os.path.join(tmp, "store")
        os.makedirs(store)
        t0 = time.time()
        ctx = ranks.spawn(world, _rank, plan, store, tmp, lib, join=False)
        # Gloo's file store waits 30 s at most for the other ranks: connect once every rank is ready.
        while not all(os.path.exists(os.path.join(tmp, f"ready{r}")) for r in range(world)):
            ctx.join(timeout=0.2)  # raises if a rank failed
            if time.time() - t0 > TIMEOUT_S:
                raise SystemExit(f"the Megatron ranks were not ready within {TIMEOUT_S} s")
        hf = hf_tensors(model)
        run_ranks(lib, plan, world, [hf], store)
        while not ctx.join():
            pass
        print(f"{CASE}: refit out of {world} Megatron-Core ranks in {time.time() - t0:.1f} s", flush=True)
        # Every instance the model spec has (a family with a "range" has only those layers).
        def exists(name):
            for t in model["tensors"]:
                rng = t.get("range", {}).get("layer")
                if rng is None or "{layer}" not in t["name"]:
                    continue
                head, tail = t["name"].split("{layer}")
                if name.startswith(head) and name.endswith(tail) and name[len(head):len(name) - len(tail)].isdigit():
                    layer = int(name[len(head):len(name) - len(tail)])
                    runs = rng if isinstance(rng[0], list) else [rng]
                    return any(lo <= layer < hi for lo, hi in runs)
            return True
        unwritten = [n for n, t in hf.items() if exists(n) and torch.isnan(t.float()).any()]
        if unwritten:
            raise SystemExit(f"elements never written: {unwritten[:4]}")
        hf_cfg = rm.text_config(case["hf"])
        per_stage = hf_cfg["num_hidden_layers"] // case["pp"]
        eps = hf_cfg["rms_norm_eps"]
        checked = controls = 0
        for r in range(world):
            got = torch.load(os.path.join(tmp, f"rank{r}.pt"))
            for name, (x, y_meg, gamma) in got["norms"].items():
                target = hf_name(name, got["pp"], per_stage)
                rule = ("decoder.final_layernorm.weight" if "final_layernorm" in name else
                        "decoder.layers.{layer.local}." + name.split("decoder.layers.", 1)[1].split(".", 1)[1] + ".weight")
                offset = offset_of[rule]
                w = hf[target]
                want = (gamma.float() - offset).to(torch.bfloat16)
                if not torch.equal(w, want):
                    raise SystemExit(f"rank {r}: {target} is not {name}'s gamma less {offset}")
                gated = name.endswith("out_norm")
                m = (Qwen3NextRMSNormGated(w.shape[0], eps=eps) if gated else Qwen3NextRMSNorm(w.shape[0], eps=eps))
                gate = torch.randn(x.shape).to(torch.bfloat16)

                def hf_out(weight):
                    with torch.no_grad():
                        m.weight.copy_(weight)
                        return m(x, gate) if gated else m(x)
                meg = (y_meg.float() * torch.nn.functional.silu(gate.float())).to(torch.bfloat16) if gated else y_meg
                y = hf_out(w.to(m.weight.dtype))
                if not torch.allclose(y.float(), meg.float(), rtol=0.03, atol=0.03):
                    raise SystemExit(f"rank {r}: HF's {type(m).__name__} with the refit {target} differs from "
                                     f"Megatron's {name} (max {(y.float() - meg.float()).abs().max():.3g})")
                checked += 1
                if offset != 0:  # control: the raw gamma, as a refit without the offset would write it
                    y0 = hf_out(gamma.to(m.weight.dtype))
                    if torch.allclose(y0.float(), meg.float(), rtol=0.03, atol=0.03):
                        raise SystemExit(f"rank {r}: control: {target} without its offset computes the same")
                    controls += 1
        print(f"{CASE}: {checked} norms compute what Megatron-Core's did ({controls} zero-centered ones differ "
              f"without the offset)", flush=True)
        if checked == 0 or controls == 0:
            raise SystemExit("nothing checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
