#!/usr/bin/env python3
"""The refit proof on real Megatron-Core: each rank of a tiny Megatron GPT
model (CPU, Gloo) binds its own parameter memory through the runtime's C API
and runs its program of a plan compiled from the case's train.json into `hf`
(one rank, unsharded Hugging Face names); the HF rank's result must equal,
bit for bit, the standard Megatron -> HF conversion of the same parameters.
Where the case has a vllm-tp4.json, a second plan moves the same memory into
four vLLM-style TP ranks, compared with shards built the way vLLM's weight
loaders build them.

    build/venv/bin/python tests/megatron/refit.py --build build [CASE ...]
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
sys.path[:0] = [HERE, os.path.join(ROOT, "tools")]

import torch  # noqa: E402

from cases import CASES  # noqa: E402
import convert  # noqa: E402
import ranks  # noqa: E402
import vllm_shards  # noqa: E402
from reshard_ctypes import Runtime  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data", "megatron")
TIMEOUT_S = 600.0  # for connecting too: the ranks start Python, torch and Megatron first
DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def hf_layout(model):
    """One rank holding every tensor whole, under its own (HF) name."""
    return {"format": "reshard.layout/1", "name": "hf", "model": model["name"], "ranks": 1,
            "meshes": {"one": [["hf", 1]]}, "placements": [{"match": "*", "mesh": "one", "hf": "replicate"}]}


def hf_tensors(model):
    """An empty tensor for every concrete HF tensor of the model spec."""
    out = {}
    for t in model["tensors"]:
        names = [t["name"]]
        for dim, size in model.get("dims", {}).items():
            names = [n.replace("{" + dim + "}", str(i)) for n in names for i in range(size)] \
                if any("{" + dim + "}" in n for n in names) else names
        for n in names:
            out[n] = torch.full(t["shape"], float("nan"), dtype=DTYPE[t.get("dtype", model.get("dtype", "bf16"))])
    return out


def probe_input(case):
    """A fixed activation [sequence 3, batch 1, hidden] for the attention probe."""
    g = torch.Generator().manual_seed(1234)
    return torch.randn(3, 1, case["hf"]["hidden_size"], generator=g).to(torch.bfloat16)


def check_attention(name, case, got, dest):
    """The query, key and value heads Megatron's SelfAttention computes on each
    first-stage rank from its linear_qkv shard equal those of the refit HF
    q/k/v_proj (and q/k norms) for the heads that rank is responsible for."""
    hf = case["hf"]
    heads, groups, hd, tp = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"], case["tp"]
    x = probe_input(case).float()
    eps = hf["rms_norm_eps"]

    def proj(w, norm):
        y = (x @ dest[f"model.layers.0.self_attn.{w}_proj.weight"].float().T).view(3, 1, -1, hd)
        n = dest.get(f"model.layers.0.self_attn.{norm}_norm.weight")
        return y if n is None else torch.nn.functional.rms_norm(y, (hd,), n.float(), eps)

    want = {"q": proj("q", "q"), "k": proj("k", "k"), "v": proj("v", "none")}
    checked = 0
    for r, g in got.items():
        if g["qkv"] is None:
            continue
        t = g["coords"]["tp"]
        q_heads = range(t * heads // tp, (t + 1) * heads // tp)
        kv = [t // (tp // groups)] if groups < tp else range(t * groups // tp, (t + 1) * groups // tp)
        for part, mine, idx in zip("qkv", g["qkv"], (q_heads, kv, kv)):
            ref = want[part][:, :, list(idx), :]
            if mine.shape != ref.shape or not torch.allclose(mine.float(), ref, rtol=0.05, atol=0.05):
                raise SystemExit(f"{name}: rank {r}: Megatron's {part} heads {list(idx)} differ from the refit "
                                 f"HF weights' (max diff {(mine.float() - ref).abs().max():.3g})"
                                 if mine.shape == ref.shape else f"{name}: rank {r}: {part} shape {mine.shape}")
        checked += 1
    return checked


def _megatron_rank(rank, case_name, plans, tmp, lib):
    import importlib.metadata
    import dump_state_dict
    import tiny_gpt
    case = CASES[case_name]
    tiny_gpt.parallel(case)
    model = tiny_gpt.build(case, wrap=True)
    tiny_gpt.fill(model)
    meta = {"framework": f"megatron-core {importlib.metadata.version('megatron-core')}", "megatron": tiny_gpt.coords()}
    dump_state_dict.write(os.path.join(tmp, f"dump{rank}.json"), model, rank, strip="module.", meta=meta)
    params = tiny_gpt.named_params(model)
    qkv = None
    if tiny_gpt.coords()["pp"] == 0:  # Megatron's own reading of linear_qkv on the first layer
        attn = tiny_gpt.first_chunk(model).decoder.layers[0].self_attention
        cuda_device = torch.cuda.current_device
        # With TP > query groups Megatron all-gathers linear_qkv's output into a
        # buffer it allocates on torch.cuda.current_device(): on CPU, the CPU.
        torch.cuda.current_device = lambda: torch.device("cpu")
        try:
            with torch.no_grad():
                qkv = attn.get_query_key_value_tensors(probe_input(case))[:3]
        finally:
            torch.cuda.current_device = cuda_device
    saved = {n: t.clone() for n, t in params.items()}
    torch.save({"coords": tiny_gpt.coords(), "params": saved, "qkv": qkv}, os.path.join(tmp, f"rank{rank}.pt"))
    for i, (plan, store) in enumerate(plans):
        # Gloo's file store waits 30 s at most for the other ranks' addresses, whatever the
        # transport's timeout: connect only once every rank is ready.
        torch.distributed.barrier()
        open(os.path.join(tmp, f"ready{i}_{rank}"), "w").close()
        Runtime(lib).refit(plan, rank, store, params, timeout_s=TIMEOUT_S)
    for n, t in params.items():  # the sources are read, never written
        assert same_bits(t, saved[n]), f"rank {rank}: the refit changed its source {n}"


def check_dumps(name, build, tmp, world, specs):
    """The live dump equals the recorded one, and `reshard check` finds no difference with train.json."""
    d = os.path.join(DATA, name)
    live = []
    for r in range(world):
        with open(os.path.join(tmp, f"dump{r}.json")) as f:
            live.append(json.load(f))
    with open(os.path.join(d, "dump.json")) as f:
        recorded = json.load(f)
    if live != recorded:
        diff = [r for r in range(world) if live[r] != recorded[r]]
        raise SystemExit(f"{name}: the installed Megatron-Core's ranks {diff} differ from {d}/dump.json "
                         f"(re-record with tests/megatron/dump_cases.py {name})")
    files = [os.path.join(tmp, f"dump{r}.json") for r in range(world)]
    subprocess.run([os.path.join(build, "reshard"), "check", "--layout", os.path.join(specs, "train.json"), "--model",
                    os.path.join(specs, "model.json"), "--state-dict", *files], check=True)


def bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def same_bits(a, b):
    return a.shape == b.shape and torch.equal(bits(a), bits(b))


def compile_plan(build, d, model_path, to, plan):
    subprocess.run([os.path.join(build, "reshard"), "compile", "--model", model_path, "--from",
                    os.path.join(d, "train.json"), "--to", to, "--cluster",
                    os.path.join(ROOT, "samples", "clusters", "dgx-h100.json"), "-o", plan, "-q"], check=True)
    subprocess.run([os.path.join(build, "reshard"), "validate", plan], check=True, stdout=subprocess.DEVNULL)


def wait_ready(tmp, i, world, t0):
    while not all(os.path.exists(os.path.join(tmp, f"ready{i}_{r}")) for r in range(world)):
        if time.time() - t0 > TIMEOUT_S:
            raise TimeoutError(f"the Megatron ranks were not ready within {TIMEOUT_S} s")
        time.sleep(0.2)


def run_ranks(lib, plan, first, tensors, store):
    """Runs destination ranks first, first + 1, ... (one thread each: ctypes releases the GIL)."""
    errors, stats = [], []

    def one(i, t):
        try:
            stats.append(Runtime(lib).refit(plan, first + i, store, t, timeout_s=TIMEOUT_S))
        except Exception as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i, t), daemon=True) for i, t in enumerate(tensors)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return stats


def refit_case(name, build, specs_root=DATA):
    """Megatron ranks run each plan (train.json -> hf, then -> vllm-tp4.json
    where the case has one) on their own parameter memory; this process runs
    the destination ranks and compares what they received."""
    case = CASES[name]
    world = case["world"]
    d = os.path.join(specs_root, name)  # model.json, train.json [, vllm-tp4.json]
    model_path = os.path.join(d, "model.json")
    with open(model_path) as f:
        model = json.load(f)
    lib = os.path.join(build, "libreshard_runtime.so")
    with tempfile.TemporaryDirectory() as tmp:
        hf = os.path.join(tmp, "hf.json")
        with open(hf, "w") as f:
            json.dump(hf_layout(model), f)
        dests = [("hf", hf)]
        if os.path.exists(os.path.join(d, "vllm-tp4.json")):
            dests.append(("vllm-tp4", os.path.join(d, "vllm-tp4.json")))
        plans = []
        for i, (dname, layout) in enumerate(dests):
            plans.append((os.path.join(tmp, f"{dname}.rsplan"), os.path.join(tmp, f"store{i}")))
            compile_plan(build, d, model_path, layout, plans[-1][0])
            os.makedirs(plans[-1][1])
        t0 = time.time()
        ctx = ranks.spawn(world, _megatron_rank, name, plans, tmp, lib, join=False)
        result = {}

        def destinations():  # beside the Megatron processes
            try:
                wait_ready(tmp, 0, world, t0)
                got = {r: torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(world)}
                result["got"] = got
                want = convert.megatron_to_hf(case, {r: (g["coords"], g["params"]) for r, g in got.items()})
                result["want"] = want
                result["hf"] = hf_tensors(model)
                result["hf_stats"] = run_ranks(lib, plans[0][0], world, [result["hf"]], plans[0][1])[0]
                if len(plans) > 1:
                    wait_ready(tmp, 1, world, t0)
                    result["vllm"] = [vllm_dest(case, want, r) for r in range(4)]
                    run_ranks(lib, plans[1][0], world, [v[0] for v in result["vllm"]], plans[1][1])
            except Exception as e:  # noqa: BLE001 - reported below
                result["error"] = e

        thread = threading.Thread(target=destinations, daemon=True)
        thread.start()
        try:
            while not ctx.join(timeout=1):
                if "error" in result:  # the Megatron ranks would wait for the destinations until their timeout
                    print(f"{name}: the destination ranks: {result['error']!r}", file=sys.stderr)
                    os._exit(1)
        except Exception as e:  # a Megatron rank failed: the destinations would wait for it until their timeout
            print(f"{name}: {e}", file=sys.stderr)
            os._exit(1)
        thread.join()
        if "error" in result:
            raise SystemExit(f"{name}: the destination ranks: {result['error']!r}")
        check_dumps(name, build, tmp, world, d)
        got, want, dest = result["got"], result["want"], result["hf"]
        by_rank = {r: (g["coords"], g["params"]) for r, g in got.items()}
        # Controls: the values tell the conventions apart (a wrong conversion would not match).
        for wrong in (dict(qkv_interleaved=False), dict(fc1_gate_first=False)):
            other = convert.megatron_to_hf(case, by_rank, **wrong)
            if all(torch.equal(other[n], want[n]) for n in want):
                raise SystemExit(f"{name}: the control conversion {wrong} gives the same tensors")
        assert sorted(want) == sorted(dest), (sorted(set(want) ^ set(dest)))
        bad = [n for n in want if not same_bits(want[n], dest[n])]
        if bad:
            raise SystemExit(f"{name}: {len(bad)} of {len(want)} HF tensors differ from the Megatron -> HF "
                             f"conversion, first {bad[0]}")
        probed = check_attention(name, case, got, dest)
        nbytes = sum(t.numel() * t.element_size() for t in want.values())
        print(f"{name}: hf: {len(want)} tensors ({nbytes} bytes) from {world} Megatron ranks, bit-exact against "
              f"the Megatron -> HF conversion; Megatron's own q/k/v heads on {probed} ranks match them "
              f"({result['hf_stats'].steps} steps on the HF rank)")
        if "vllm" in result:
            n = 0
            for r, (dest_r, want_r) in enumerate(result["vllm"]):
                for k, w in want_r.items():
                    got_r = dest_r[k][:w.shape[0]]  # vocab padding rows: nobody writes them
                    if not same_bits(w, got_r):
                        raise SystemExit(f"{name}: vllm-tp4 rank {r}: {k} differs from vLLM's weight loaders' shard")
                    n += 1
            print(f"{name}: vllm-tp4: {n} tensors on 4 ranks bit-exact against shards built as vLLM's weight "
                  f"loaders build them")
        print(f"{name}: {time.time() - t0:.1f} s")


def vllm_dest(case, want, r):
    """(tensors to bind, expected) of vLLM TP4 rank r: the expected shards,
    and NaN-filled buffers of their shapes (vocab padded to a multiple of 64)."""
    expect = vllm_shards.vllm_rank(case["hf"], want, 4, r)
    bind = {}
    for k, w in expect.items():
        shape = list(w.shape)
        if k in ("model.embed_tokens.weight", "lm_head.weight"):
            shape[0] = (case["hf"]["vocab_size"] + 63) // 64 * 64 // 4
        bind[k] = torch.full(shape, float("nan"), dtype=w.dtype)
    return bind, expect


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*", help=f"default: all of {', '.join(CASES)}")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build folder (reshard, libreshard_runtime.so)")
    ap.add_argument("--specs", default=DATA, help="take each case's model.json, train.json (and vllm-tp4.json) from "
                    "SPECS/<case>/ instead of tests/data/megatron/<case>/ (e.g. what `reshard init` wrote)")
    a = ap.parse_args()
    for name in a.cases or CASES:
        if name not in CASES:
            sys.exit(f"refit: unknown case '{name}', expected one of {', '.join(CASES)}")
        refit_case(name, os.path.abspath(a.build), os.path.abspath(a.specs))


if __name__ == "__main__":
    main()
