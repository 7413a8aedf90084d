#!/usr/bin/env python3
"""Real FSDP2 on CPU (Gloo, 4 processes, one launch for every case of
tests/fsdp2/cases.py): tiny transformers models (Qwen3, Qwen3-MoE with fused
experts, Qwen3-Next with its fused q_proj / in_proj_qkvz / in_proj_ba / conv1d)
sharded by torch's fully_shard / DTensor (1-D FSDP with fp32 masters
and with bf16, HSDP 2x2, TP2 x FSDP2, experts on dim 0 and on dim 1,
activation checkpointing), trained one AdamW step, then:

  a. `reshard init --hf-config CONFIG --train fsdp2:... --infer hf` (and
     `--infer vllm:...`) writes the specs;
  b. `reshard.layout_from_module(model, model.json, base=init's train.json)`
     on each rank gives the layout of the live module: the same on every
     rank, it compiles, binds the same buffers (name, dtype, shape) on every
     rank as init's, and passes `reshard check` too;
  c. each rank's dump (tools/dump_state_dict.py: DTensor local shapes) has
     zero differences with init's train.json (and with the hand-written
     layout in layouts/) under `reshard check`; controls: the same dumps
     against init's layouts for other settings (bf16 instead of fp32
     masters, FSDP over 4 instead of HSDP, HSDP instead of TP x FSDP, TP x
     FSDP without "order", experts on dim 0 instead of 1) must differ;
  d. each rank's own FSDP2 memory (Session.bind_module(model): the DTensor
     locals, bound in place) is refit through the runtime into one unsharded
     HF rank and into vLLM's TP ranks (fused qkv_proj / gate_up_proj, w13/w2
     experts; Qwen3-Next's GDN tensors, A_log in fp32), every received
     tensor equal bit for bit to the truth: the parameter's full_tensor() in
     bf16 (widened where vLLM holds fp32), re-fused as vLLM's weight loaders do
     (tests/fsdp2/models.py vllm_rank); the sources stay unchanged.

Any difference fails the run (exit 1) with what differs. Before that, one
AdamW step must change the weights (the refit moves trained values).

    build/venv/bin/python tests/fsdp2/run.py --build build [CASE ...]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path[:0] = [HERE, os.path.join(ROOT, "tools")]

from cases import BY_NAME, CASES, CHECK_CONTROLS, CONFIGS  # noqa: E402

WORLD = 4
TIMEOUT_S = 120.0
CLUSTER = os.path.join(ROOT, "samples", "clusters", "dgx-h100.json")


def sh(*cmd, what):
    """Runs a reshard command; a failure stops the run with its output."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{what}: `{' '.join(cmd)}` exited {p.returncode}:\n{p.stdout}{p.stderr}")
    return p.stdout


# -- before the ranks start: specs and plans -------------------------------------------------------
def prepare(case, build, tmp, hand_layouts):
    """Writes the case's config, init's specs (train -> hf, train -> vLLM) and
    compiles both plans; returns the paths the ranks and the checks use."""
    reshard = os.path.join(build, "reshard")
    d = os.path.join(tmp, case["name"])
    os.makedirs(os.path.join(d, "dump"))
    cfg = os.path.join(d, "config.json")
    with open(cfg, "w") as f:
        json.dump(CONFIGS[case["model"]], f, indent=1)
    hand = os.path.join(HERE, "layouts", case["layout"])
    paths = {"dir": d, "config": cfg, "hand": hand}
    if hand_layouts:  # the hand-written layout with init's model spec and HF / vLLM sides
        for side, infer in (("hf", "hf"), ("vllm", case["vllm"])):
            sh(reshard, "init", "--hf-config", cfg, "--train", "hf", "--infer", infer, "-o", os.path.join(d, side),
               what=f"{case['name']}: init")
        shutil.copy(hand, os.path.join(d, "hf", "train.json"))
        shutil.copy(hand, os.path.join(d, "vllm", "train.json"))
    else:
        for side, infer in (("hf", "hf"), ("vllm", case["vllm"])):
            sh(reshard, "init", "--hf-config", cfg, "--train", case["train"], "--infer", infer, "-o",
               os.path.join(d, side), what=f"{case['name']}: init")
    paths["model"] = os.path.join(d, "hf", "model.json")
    paths["train"] = os.path.join(d, "hf", "train.json")
    for side in ("hf", "vllm"):
        plan = os.path.join(d, f"{side}.rsplan")
        sh(reshard, "compile", "--model", os.path.join(d, side, "model.json"), "--from",
           os.path.join(d, side, "train.json"), "--to", os.path.join(d, side, "infer.json"), "--cluster", CLUSTER,
           "-o", plan, "-q", what=f"{case['name']}: compile {side}")
        sh(reshard, "validate", plan, what=f"{case['name']}: validate {side}")
        paths[side] = plan
        os.makedirs(os.path.join(d, f"store-{side}"))
    return paths


# -- on each of the 4 ranks ------------------------------------------------------------------------
def bits(t):
    import torch
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def same_bits(a, b):
    import torch
    return tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def _session(plan, rank, store, prefix):
    import reshard
    t = reshard.GlooTransport(plan.process_of(rank), len(plan.active_ranks), store=store, prefix=prefix,
                              timeout_s=TIMEOUT_S)
    return reshard.Session(plan, rank, t)


def _train_side(plan, rank, store, prefix, model, out):
    s = _session(plan, rank, store, prefix)
    s.bind_module(model)  # the DTensor locals: the memory FSDP2 holds (wrapper segments looked through)
    missing = s.missing()
    assert not missing, f"train rank {rank}: unbound after bind_module(model): {missing}"
    import models
    held = models.locals_of(model)
    for b in s.buffers:  # bound in place: the runtime reads FSDP2's own memory, no copy
        t = s.tensor(b.name)
        if t.numel() and t.data_ptr() != held[b.name].data_ptr():
            raise AssertionError(f"train rank {rank}: {b.name} is bound at 0x{t.data_ptr():x}, not at the DTensor "
                                 f"local's 0x{held[b.name].data_ptr():x}")
    out["stats"] = s.run()


def _infer_side(plan, rank, store, prefix, expect, out):
    import torch
    s = _session(plan, rank, store, prefix)
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    dest = {b.name: torch.full(b.shape, float("nan"), dtype=dtypes[b.dtype]) for b in s.buffers}
    assert s.bind_module(dest) == []
    out["stats"] = s.run()
    names = sorted(dest)
    if names != sorted(expect):
        raise AssertionError(f"infer rank {rank}: the plan's buffers {names} are not the expected {sorted(expect)}")
    bad = []
    for n in names:
        want = expect[n]
        got = dest[n][:want.shape[0]] if n in ("model.embed_tokens.weight", "lm_head.weight") else dest[n]
        if not same_bits(got, want):
            bad.append(f"{n} ({_first_difference(got, want)})")
    if bad:
        raise AssertionError(f"infer rank {rank}: {len(bad)} of {len(names)} received tensors differ from the "
                             f"truth: {', '.join(bad[:6])}")
    out["tensors"] = len(names)
    out["bytes"] = sum(t.numel() * t.element_size() for t in expect.values())


def _first_difference(got, want):
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {list(got.shape)}, the truth's {list(want.shape)}"
    ne = (bits(got) != bits(want)).flatten()
    i = int(ne.nonzero()[0])
    g, w = got.flatten()[i], want.flatten()[i]
    return (f"{int(ne.sum())} of {ne.numel()} elements, first at flat index {i}: {float(g)!r} "
            f"(0x{int(bits(g)) & 0xffff:04x}), the truth {float(w)!r} (0x{int(bits(w)) & 0xffff:04x})")


def refit(plan_path, store, prefix, rank, model, expect_of):
    """This process plays train rank `rank` and the infer ranks 4 + i with
    i % 4 == rank (threads: each session blocks in C++ with the GIL released)."""
    import reshard
    import torch.distributed as dist
    plan = reshard.Plan.open(plan_path)
    infer = [r for r in range(WORLD, plan.num_ranks) if (r - WORLD) % WORLD == rank]
    dist.barrier()  # every rank connects now (Gloo's file store waits 30 s at most for the addresses)
    jobs, outs = [], {}
    outs[rank] = {}
    jobs.append(threading.Thread(target=_guard, args=(_train_side, outs[rank], plan, rank, store, prefix, model,
                                                      outs[rank])))
    for r in infer:
        outs[r] = {}
        jobs.append(threading.Thread(target=_guard, args=(_infer_side, outs[r], plan, r, store, prefix,
                                                          expect_of(r - WORLD), outs[r])))
    for j in jobs:
        j.start()
    for j in jobs:
        j.join()
    for r, o in outs.items():
        if "error" in o:
            raise o["error"]
    return outs


def _guard(fn, out, *args):
    try:
        fn(*args)
    except BaseException as e:  # noqa: BLE001 - re-raised by the rank's main thread
        out["error"] = e


def rank_main(rank, cases, paths):
    import reshard  # noqa: F401 - before anything loads another runtime
    import torch
    import dump_state_dict
    import models
    for case in cases:
        p = paths[case["name"]]
        t0 = time.time()
        model = models.build(case)
        dp_index = models.shard(case, model)
        init = models.truth(model)
        loss = models.train_step(case, model, dp_index)
        truth = models.truth(model)  # collective: every rank gets every full tensor
        changed = sum(not same_bits(truth[n], init[n]) for n in truth)
        if changed < len(truth) // 2:
            raise RuntimeError(f"case {case['name']}: the training step changed only {changed} of {len(truth)} tensors")
        del init
        t_train = time.time() - t0
        # what the rank holds: each DTensor's local shape (its placements and mesh beside)
        dump_state_dict.write(os.path.join(p["dir"], "dump", f"rank{rank}.json"), model, rank)
        result = {"loss": loss, "train_s": t_train, "changed": changed, "tensors": len(truth)}
        # every rank derives the layout from its DTensors; base: init's buffer rules for what
        # is no model tensor (the fused experts)
        reshard.layout_from_module(model, p["model"], base=p["train"],
                                   path=os.path.join(p["dir"], f"from-module{rank}.json"))
        try:
            _refits(case, p, rank, model, truth, result)
        except BaseException as e:
            raise RuntimeError(f"case {case['name']}, rank {rank}: {e}") from e
        result["s"] = time.time() - t0
        with open(os.path.join(p["dir"], f"result{rank}.json"), "w") as f:
            json.dump(result, f)
        if rank == 0:
            print(f"  {case['name']}: ranks done in {result['s']:.1f} s", flush=True)
        del model, truth
        torch.distributed.barrier()


def _refits(case, p, rank, model, truth, result):
    import models
    before = {n: t.clone() for n, t in models.locals_of(model).items()}
    cfg = CONFIGS[case["model"]]
    r_hf = refit(p["hf"], os.path.join(p["dir"], "store-hf"), "hf", rank, model, lambda i: truth)
    vtp = int(case["vllm"].split("tp=")[1].split(",")[0])
    ep = ",ep" in case["vllm"]
    r_vllm = refit(p["vllm"], os.path.join(p["dir"], "store-vllm"), "vllm", rank, model,
                   lambda i: models.vllm_rank(cfg, truth, vtp, i, ep=ep))
    for n, t in models.locals_of(model).items():
        assert same_bits(t, before[n]), f"rank {rank}: the refit changed its source {n}"
    result["hf"] = {r: {k: v for k, v in o.items() if k in ("tensors", "bytes")} for r, o in r_hf.items()
                    if r != rank}
    result["vllm"] = {r: {k: v for k, v in o.items() if k in ("tensors", "bytes")} for r, o in r_vllm.items()
                      if r != rank}
    result["train_bytes_sent"] = r_hf[rank]["stats"].bytes_sent


def _preload():
    import reshard  # noqa: F401
    import torch  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.tensor.parallel  # noqa: F401
    import transformers.models.qwen3.modeling_qwen3  # noqa: F401
    import transformers.models.qwen3_moe.modeling_qwen3_moe  # noqa: F401
    import transformers.models.qwen3_next.modeling_qwen3_next  # noqa: F401


def _entry(rank, port, cases, paths):
    import warnings
    warnings.filterwarnings("ignore")
    sys.path[:0] = [HERE, os.path.join(ROOT, "tools")]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import logging
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    # Qwen3-Next: causal_conv1d / chunk_gated_delta_rule warn of their reference PyTorch paths (no kernels on CPU)
    logging.getLogger("transformers.integrations.hub_kernels").setLevel(logging.ERROR)
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        rank_main(rank, cases, paths)
    finally:
        dist.destroy_process_group()


# -- after the ranks: the checks that read their files ---------------------------------------------
def buffers_by_rank(plan_path):
    import reshard
    plan = reshard.Plan.open(plan_path)
    return {r: sorted((b.name, b.dtype, tuple(b.shape)) for b in plan.buffers(r)) for r in range(WORLD)}


def _same_file(a, b):
    with open(a) as f, open(b) as g:
        return f.read() == g.read()


def check(case, p, build):
    """`reshard check` of the dumps against init's train.json (and the hand
    layout), layout_from_module's layout against init's; returns the line's parts."""
    reshard = os.path.join(build, "reshard")
    name = case["name"]
    dumps = [os.path.join(p["dir"], "dump", f"rank{r}.json") for r in range(WORLD)]
    parts = []
    for what, layout in (("init's train.json", p["train"]), ("the hand layout", p["hand"])):
        proc = subprocess.run([reshard, "check", "--layout", layout, "--model", p["model"], "--state-dict", *dumps],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{name}: reshard check of {what} ({layout}) against the real ranks' dumps exited "
                             f"{proc.returncode}:\n{proc.stdout}{proc.stderr}")
    same = _same_file(p["train"], p["hand"])
    parts.append("reshard check: 0 differences on 4 ranks (" +
                 ("the hand-written layout, --hand-layouts)" if same else "init's layout and the hand-written one)"))
    for name_, other, expect in CHECK_CONTROLS:
        if name_ != name or _same_file(p["train"], p["hand"]):
            continue
        if other == "no-order":
            with open(p["train"]) as f:
                layout = json.load(f)
            if not [pl for pl in layout["placements"] if pl.pop("order", None)]:
                raise SystemExit(f"{name}: init's layout has no placement with an \"order\" (TP before FSDP)")
            control = os.path.join(p["dir"], "control-no-order.json")
            with open(control, "w") as f:
                json.dump(layout, f, indent=1)
            what = "init's layout without \"order\" (FSDP cutting before TP)"
        else:
            d = os.path.join(p["dir"], "control-" + other.replace(":", "-").replace(",", "-").replace("=", ""))
            sh(reshard, "init", "--hf-config", p["config"], "--train", other, "--infer", "hf", "-o", d,
               what=f"{name}: init for the check control")
            control = os.path.join(d, "train.json")
            what = f"init's `--train {other}` layout"
        proc = subprocess.run([reshard, "check", "--layout", control, "--model", p["model"], "--state-dict", *dumps],
                              capture_output=True, text=True)
        if proc.returncode != 1 or expect not in proc.stdout:
            raise SystemExit(f"{name}: control: reshard check of the real dumps against {what} should find "
                             f"differences naming '{expect}', it exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
        n = sum(1 for line in proc.stdout.splitlines() if line.startswith("rank "))
        parts.append(f"control: against {what} check finds {n} differences")
    init_bufs = buffers_by_rank(p["hf"])
    hand_plan = os.path.join(p["dir"], "hand.rsplan")
    sh(reshard, "compile", "--model", p["model"], "--from", p["hand"], "--to",
       os.path.join(p["dir"], "hf", "infer.json"), "--cluster", CLUSTER, "-o", hand_plan, "-q",
       what=f"{name}: compile the hand layout")
    if buffers_by_rank(hand_plan) != init_bufs:
        raise SystemExit(f"{name}: init's layout and the hand-written {p['hand']} bind different buffers")
    mod = [os.path.join(p["dir"], f"from-module{r}.json") for r in range(WORLD)]
    if all(os.path.exists(m) for m in mod):
        with open(mod[0]) as f:
            first = json.load(f)
        for m in mod[1:]:
            with open(m) as f:
                if json.load(f) != first:
                    raise SystemExit(f"{name}: layout_from_module gives another layout on {m} than on rank 0")
        plan = os.path.join(p["dir"], "from-module.rsplan")
        sh(reshard, "compile", "--model", p["model"], "--from", mod[0], "--to",
           os.path.join(p["dir"], "hf", "infer.json"), "--cluster", CLUSTER, "-o", plan, "-q",
           what=f"{name}: compile layout_from_module's layout")
        got = buffers_by_rank(plan)
        if got != init_bufs:
            diff = [r for r in range(WORLD) if got[r] != init_bufs[r]]
            r = diff[0]
            only_mod = sorted(set(got[r]) - set(init_bufs[r]))[:4]
            only_init = sorted(set(init_bufs[r]) - set(got[r]))[:4]
            raise SystemExit(f"{name}: layout_from_module's layout binds other buffers than init's on ranks {diff}; "
                             f"rank {r}: only layout_from_module {only_mod}, only init {only_init}")
        proc = subprocess.run([reshard, "check", "--layout", mod[0], "--model", p["model"], "--state-dict", *dumps],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{name}: reshard check of layout_from_module's layout exited {proc.returncode}:\n"
                             f"{proc.stdout}{proc.stderr}")
        parts.append("layout_from_module: the same buffers as init's on every rank")
    else:
        parts.append("layout_from_module: MISSING")
    return parts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*", help=f"default: all of {', '.join(c['name'] for c in CASES)}")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build folder (its reshard binary)")
    ap.add_argument("--hand-layouts", action="store_true", help="train on the hand-written layouts in "
                    "tests/fsdp2/layouts/ instead of `reshard init --train fsdp2:...`")
    ap.add_argument("--keep", help="keep the specs, plans and dumps in this (new) directory")
    a = ap.parse_args()
    for n in a.cases:
        if n not in BY_NAME:
            sys.exit(f"run.py: unknown case '{n}', expected one of {', '.join(BY_NAME)}")
    cases = [BY_NAME[n] for n in a.cases] if a.cases else CASES
    build = os.path.abspath(a.build)
    t0 = time.time()
    tmp = a.keep or tempfile.mkdtemp(prefix="reshard-fsdp2-")
    os.makedirs(tmp, exist_ok=True)
    try:
        paths = {c["name"]: prepare(c, build, tmp, a.hand_layouts) for c in cases}
        t_prep = time.time() - t0
        import torch.multiprocessing as mp
        sys.path.insert(0, os.path.join(HERE, ".."))
        from free_port import free_port  # tests/free_port.py: below the ephemeral range
        port = free_port()
        # fork: the ranks inherit torch, transformers and reshard imported once here
        # (4 spawned interpreters importing them on 2 cores took 15-20 s).
        _preload()
        mp.start_processes(_entry, args=(port, cases, paths), nprocs=WORLD, join=True,
                           start_method="fork")
        t_ranks = time.time() - t0 - t_prep
        for c in cases:
            p = paths[c["name"]]
            res = []
            for r in range(WORLD):
                with open(os.path.join(p["dir"], f"result{r}.json")) as f:
                    res.append(json.load(f))
            parts = check(c, p, build)
            hf = {k: v for r in res for k, v in r["hf"].items()}
            vl = {k: v for r in res for k, v in r["vllm"].items()}
            print(f"{c['name']}: {c['what']}")
            print(f"  one AdamW step (loss {res[0]['loss']:.3f}) changed {res[0]['changed']} of {res[0]['tensors']} "
                  "HF tensors; " + "; ".join(parts))
            print(f"  hf: {sum(v['tensors'] for v in hf.values())} tensors "
                  f"({sum(v['bytes'] for v in hf.values())} bytes) bit-exact against full_tensor() in bf16; "
                  f"vllm ({c['vllm']}): {sum(v['tensors'] for v in vl.values())} tensors on {len(vl)} ranks "
                  f"bit-exact against the truth re-fused as vLLM's loaders do (sources: Session.bind_module(model)); "
                  f"{max(r['s'] for r in res):.1f} s")
        print(f"fsdp2: {len(cases)} cases on {WORLD} processes in {time.time() - t0:.1f} s "
              f"(specs and plans {t_prep:.1f} s, ranks {t_ranks:.1f} s)")
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
