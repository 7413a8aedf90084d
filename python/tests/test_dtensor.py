"""DTensor / FSDP2 trainers: reshard.layout_from_module, Session.bind_module
on DTensor parameters, and refits of each rank's own FSDP2 memory.

Real FSDP2 (torch.distributed.fsdp.fully_shard) and DTensor TP on 4 Gloo
processes, all cases in one launch (forked after importing torch and
reshard once; the module-scoped fixture runs them, the tests read what each
rank recorded). Models are plain torch.nn modules with Hugging Face names;
sizes make torch.chunk cut unevenly (vocabulary 250 -> 63, 63, 63, 61 rows;
TP2 x FSDP2 q_proj 90 -> 45 -> 23 / 22) and leave the last rank an empty
[0, ...] shard (a 3-row router over 4 ranks, 3 experts over 4 ranks).

Each case derives the layout on every rank (the same on all), compiles it
(rank 0, in-process) against a replicated HF layout on the same 4 ranks
(colocated: each rank receives every full tensor), binds the module
(bind_module: the DTensor locals) and the destination tensors, runs, and
compares every received tensor bit for bit with the DTensor's full_tensor()
in the model's dtype.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

import reshard
from reshard.dtensor import strip_wrappers
from conftest import CLUSTER, ROOT, reshard_binary

sys.path.insert(0, str(ROOT / "tools"))
import dump_state_dict  # noqa: E402

WORLD = 4
H, Q, KV, I, V, LAYERS, EXPERTS, MOE_I = 8, 90, 30, 22, 250, 2, 3, 14
WRAP = "_checkpoint_wrapped_module."


# -- models: plain torch.nn with HF names ------------------------------------------------

class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(H, Q, bias=False)
        self.k_proj = torch.nn.Linear(H, KV, bias=False)
        self.v_proj = torch.nn.Linear(H, KV, bias=False)
        self.o_proj = torch.nn.Linear(Q, H, bias=False)

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return self.o_proj(q + (k * v).repeat(1, 1, Q // KV))


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(H, 3, bias=False)  # a router: 3 rows over 4 ranks, the last one empty
        self.gate_proj = torch.nn.Linear(H, I, bias=False)
        self.up_proj = torch.nn.Linear(H, I, bias=False)
        self.down_proj = torch.nn.Linear(I, H, bias=False)

    def forward(self, x):
        y = self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))
        return y + self.gate(x).mean(-1, keepdim=True)


class Experts(torch.nn.Module):
    """transformers 5's fused experts: gate_up_proj [E, 2I, H], down_proj [E, H, I], no `.weight`."""

    def __init__(self):
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(torch.randn(EXPERTS, 2 * MOE_I, H))
        self.down_proj = torch.nn.Parameter(torch.randn(EXPERTS, H, MOE_I))


class Moe(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(H, EXPERTS, bias=False)
        # a model tensor held as a persistent buffer, whole on every rank (DeepSeek's router bias)
        self.gate.register_buffer("e_score_correction_bias", torch.randn(EXPERTS))
        self.experts = Experts()


class Layer(torch.nn.Module):
    def __init__(self, moe):
        super().__init__()
        self.input_layernorm = torch.nn.RMSNorm(H)
        self.self_attn = Attention()
        self.post_attention_layernorm = torch.nn.RMSNorm(H)
        self.mlp = Moe() if moe else Mlp()

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(torch.nn.Module):
    def __init__(self, moe):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(V, H)
        self.layers = torch.nn.ModuleList([Layer(moe) for _ in range(LAYERS)])
        self.norm = torch.nn.RMSNorm(H)


class CausalLM(torch.nn.Module):
    def __init__(self, moe=False):
        super().__init__()
        self.model = Inner(moe)
        self.lm_head = torch.nn.Linear(H, V, bias=False)

    def forward(self, ids):
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(self.model.norm(x))


def model_spec(moe=False):
    heads = {"dim": 0, "size": 15}
    t = [
        {"name": "model.embed_tokens.weight", "shape": [V, H]},
        {"name": "model.layers.{layer}.input_layernorm.weight", "shape": [H]},
        {"name": "model.layers.{layer}.self_attn.q_proj.weight", "shape": [Q, H], "heads": heads},
        {"name": "model.layers.{layer}.self_attn.k_proj.weight", "shape": [KV, H], "heads": heads},
        {"name": "model.layers.{layer}.self_attn.v_proj.weight", "shape": [KV, H], "heads": heads},
        {"name": "model.layers.{layer}.self_attn.o_proj.weight", "shape": [H, Q], "heads": {"dim": 1, "size": 15}},
        {"name": "model.layers.{layer}.post_attention_layernorm.weight", "shape": [H]},
    ]
    if moe:
        t += [
            {"name": "model.layers.{layer}.mlp.gate.weight", "shape": [EXPERTS, H]},
            {"name": "model.layers.{layer}.mlp.gate.e_score_correction_bias", "shape": [EXPERTS], "dtype": "fp32"},
            {"name": "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight", "shape": [MOE_I, H]},
            {"name": "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight", "shape": [MOE_I, H]},
            {"name": "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight", "shape": [H, MOE_I]},
        ]
    else:
        t += [
            {"name": "model.layers.{layer}.mlp.gate.weight", "shape": [3, H]},
            {"name": "model.layers.{layer}.mlp.gate_proj.weight", "shape": [I, H]},
            {"name": "model.layers.{layer}.mlp.up_proj.weight", "shape": [I, H]},
            {"name": "model.layers.{layer}.mlp.down_proj.weight", "shape": [H, I]},
        ]
    t += [{"name": "model.norm.weight", "shape": [H]}, {"name": "lm_head.weight", "shape": [V, H]}]
    dims = {"layer": LAYERS, "expert": EXPERTS} if moe else {"layer": LAYERS}
    return {"format": "reshard.model/1", "name": "tiny-moe" if moe else "tiny", "dtype": "bf16", "dims": dims,
            "tensors": t}


# The buffer rules for what is no model tensor: the fused experts.
MOE_BASE = {"format": "reshard.layout/1", "name": "base", "ranks": WORLD, "meshes": {"m": [["dp_shard", WORLD]]},
            "placements": [], "buffers": [
                {"name": "model.layers.{layer}.mlp.experts.gate_up_proj",
                 "parts": ["model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight",
                           "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight"], "concat": 0},
                {"name": "model.layers.{layer}.mlp.experts.down_proj",
                 "tensor": "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight"}]}


TORCH = {"bf16": torch.bfloat16, "fp32": torch.float32}


def instances(spec):
    """{HF name: (shape, torch dtype)} of every instance of every model tensor."""
    import itertools

    out = {}
    for t in spec["tensors"]:
        dims = [d for d in spec["dims"] if "{" + d + "}" in t["name"]]
        for idx in itertools.product(*(range(spec["dims"][d]) for d in dims)):
            n = t["name"]
            for d, i in zip(dims, idx):
                n = n.replace("{" + d + "}", str(i))
            out[n] = (t["shape"], TORCH[t.get("dtype", spec["dtype"])])
    return out


def full_layout(spec):
    """Every tensor whole on each of the 4 ranks, named "full." + its HF name
    (colocated with the training ranks: distinct names bind without side=)."""
    return {"format": "reshard.layout/1", "name": "full", "model": spec["name"], "ranks": WORLD,
            "meshes": {"r": [["dp", WORLD]]}, "placements": [{"match": t["name"]} for t in spec["tensors"]],
            "buffers": [{"name": "full." + t["name"], "tensor": t["name"]} for t in spec["tensors"]]}


# -- the ranks ---------------------------------------------------------------------------------

def _truth(model, spec):
    """{HF name: full tensor in the model tensor's dtype} (collective: full_tensor())."""
    out = {}
    whole = [(n, b) for n, b in model.named_buffers()]
    for name, p in list(model.named_parameters()) + whole:
        full = (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()
        name = strip_wrappers(name)
        if name.endswith("mlp.experts.gate_up_proj"):
            stem = name[:-len("gate_up_proj")]
            for e in range(full.shape[0]):
                out[f"{stem}{e}.gate_proj.weight"] = full[e, :MOE_I].contiguous()
                out[f"{stem}{e}.up_proj.weight"] = full[e, MOE_I:].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            stem = name[:-len("down_proj")]
            for e in range(full.shape[0]):
                out[f"{stem}{e}.down_proj.weight"] = full[e].contiguous()
        else:
            out[name] = full
    want = instances(spec)
    assert set(out) == set(want)
    return {n: t.to(want[n][1]).contiguous() for n, t in out.items()}


def _refit(case, rank, tmp, model, spec, layout, result, before_run=None):
    """Compile (rank 0), bind the module and fresh destinations, run, compare with full_tensor()."""
    import torch.distributed as dist

    d = Path(tmp) / case
    plan_path = d / "plan.rsplan"
    if rank == 0:
        cluster = json.loads(Path(CLUSTER).read_text())
        cluster.update(name="colocated", placement="colocated")
        for name, obj in (("model", spec), ("train", layout), ("infer", full_layout(spec)), ("cluster", cluster)):
            (d / f"{name}.json").write_text(json.dumps(obj))
        result["compile"] = reshard.compile(d / "model.json", d / "train.json", d / "infer.json", d / "cluster.json",
                                            plan_path, staging_mb=2)["summary"]
    dist.barrier()
    plan = reshard.Plan.open(plan_path)
    s = reshard.Session(plan, rank, reshard.GlooTransport(rank, WORLD, store=str(d), prefix=case, timeout_s=60))
    unused = s.bind_module(model, missing_ok=True)
    dest = {n: torch.full(shape, float("nan"), dtype=dt) for n, (shape, dt) in instances(spec).items()}
    assert s.bind_module(dest, prefix="full.", missing_ok=True) == []
    result["unused"] = unused
    result["missing"] = s.missing()
    # the training side's buffers (a zero-size one is neither read nor written: no source)
    train = [b for b in s.buffers if not b.name.startswith("full.")]
    result["zero_size"] = sorted(b.name for b in train if 0 in b.shape)
    result["source_buffers"] = sorted((b.name, b.dtype, list(b.shape)) for b in train)
    if before_run is not None:
        before_run(s)
    truth = _truth(model, spec)
    stats = s.run()
    bits = {torch.bfloat16: torch.int16, torch.float32: torch.int32}
    wrong = [n for n, t in dest.items() if not torch.equal(t.view(bits[t.dtype]), truth[n].view(bits[t.dtype]))]
    result["refit"] = {"checked": len(dest), "wrong": wrong, "bytes": stats.bytes_received}
    return s


def _layout(case, rank, tmp, model, spec, **kw):
    """layout_from_module on this rank, written to a file of its own (rank 0
    later compares them), and the rank's dump for `reshard check`."""
    path = Path(tmp) / case / f"layout{rank}.json"
    layout = reshard.layout_from_module(model, spec, path=path, **kw)
    assert json.loads(path.read_text()) == layout
    dump_state_dict.write(str(Path(tmp) / case / f"dump{rank}.json"), model, rank)
    return layout


def _fsdp4_ac_adamw(rank, tmp, result):
    """1-D FSDP2 over 4 ranks, fp32 masters under a bf16 MixedPrecisionPolicy,
    activation-checkpointed layers (names with _checkpoint_wrapped_module.):
    bind, one AdamW step, refit the trained weights."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (apply_activation_checkpointing,
                                                                             checkpoint_wrapper)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = CausalLM()
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper,
                                   check_fn=lambda m: isinstance(m, Layer))
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp_policy)
    fully_shard(model, mp_policy=mp_policy)
    names = [n for n, _ in model.named_parameters()]
    result["wrapped_names"] = [n for n in names if WRAP in n][:1]
    spec = model_spec()
    layout = _layout("fsdp4", rank, tmp, model, spec)
    result["layout"] = layout
    params = dict(model.named_parameters())
    router = params[f"model.layers.0.{WRAP}mlp.gate.weight"]
    result["router_local"] = list(router.to_local().shape)

    def step(s):
        # What bind_module bound: each DTensor's local tensor (FSDP2's sharded parameter).
        ptrs = {strip_wrappers(n): p._local_tensor.data_ptr() for n, p in params.items()}
        bound = {b.name: s._s.bound_ptr(i) for i, b in enumerate(s.buffers) if b.is_source and 0 not in b.shape}
        result["bound_locals"] = len(bound) > 10 and all(ptr == ptrs[n] for n, ptr in bound.items())
        ids = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(rank))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        before = {n: p.to_local().detach().clone() for n, p in params.items()}
        loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1).float(), ids.flatten())
        # reshard-after-forward freed the all-gathered parameters; the sharded ones stay
        s.check_bindings()
        # the bound memory is FSDP2's sharded parameter storage (torch 2.15's FSDPParam)
        layer = model.model.layers[0]
        fsdp_params = layer._get_fsdp_state()._fsdp_param_group.fsdp_params
        result["fsdp_storage"] = all(fp._sharded_param_data.data_ptr() == fp.sharded_param._local_tensor.data_ptr()
                                     for fp in fsdp_params if fp.sharded_param._local_tensor.numel())
        result["unsharded_freed"] = all(fp._unsharded_param.untyped_storage().nbytes() == 0 for fp in fsdp_params)
        loss.backward()
        opt.step()
        opt.zero_grad()
        s.check_bindings()
        result["same_memory_after_step"] = all(p._local_tensor.data_ptr() == ptrs[strip_wrappers(n)]
                                               for n, p in params.items())
        result["changed"] = sum(not torch.equal(before[n], p.to_local()) for n, p in params.items()
                                if p.to_local().numel())

    s = _refit("fsdp4", rank, tmp, model, spec, layout, result, before_run=step)
    # bind() takes a DTensor too (its local tensor); a framework that gives the
    # DTensor a new local tensor (FSDP2's reset_sharded_param) is caught before a run.
    head = params["lm_head.weight"]
    s.bind("lm_head.weight", head)
    old = head._local_tensor
    head._local_tensor = old.clone()
    try:
        s.check_bindings()
    except reshard.BindError as e:
        result["stale"] = str(e)
    head._local_tensor = old
    s.check_bindings()
    # a zero-size buffer takes a 0-byte tensor, even one at address 0
    if rank == WORLD - 1:
        empty = torch.empty(0, H)
        result["empty_ptr"] = empty.data_ptr()
        s.bind("model.layers.0.mlp.gate.weight", empty)
        s.check_bindings()


def _hsdp2x2(rank, tmp, result):
    """HSDP: mesh (dp_replicate 2, dp_shard 2), placements (Replicate(), Shard(0)), bf16 parameters."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(1)
    model = CausalLM().to(torch.bfloat16)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    spec = model_spec()
    result["placements"] = str(model.lm_head.weight.placements)
    layout = _layout("hsdp", rank, tmp, model, spec)
    result["layout"] = layout
    _refit("hsdp", rank, tmp, model, spec, layout, result)


def _tp2_fsdp2(rank, tmp, result):
    """TP2 (column-parallel q/k/v/gate/up/lm_head, row-parallel o/down, the
    embedding's vocabulary) then FSDP2 over dp 2: column-parallel weights cut
    TP first, then FSDP (_StridedShard), unevenly (q_proj 90 -> 45 -> 23 / 22)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(2)
    model = CausalLM()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    plan = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate()), "lm_head": ColwiseParallel()}
    for i in range(LAYERS):
        for m in ("q_proj", "k_proj", "v_proj"):
            plan[f"model.layers.{i}.self_attn.{m}"] = ColwiseParallel()
        plan[f"model.layers.{i}.self_attn.o_proj"] = RowwiseParallel()
        for m in ("gate_proj", "up_proj"):
            plan[f"model.layers.{i}.mlp.{m}"] = ColwiseParallel()
        plan[f"model.layers.{i}.mlp.down_proj"] = RowwiseParallel()
    parallelize_module(model, mesh["tp"], plan)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    q = model.model.layers[0].self_attn.q_proj.weight
    result["q_placements"] = str(q.placements)
    result["q_local"] = list(q.to_local().shape)
    spec = model_spec()
    layout = _layout("tp", rank, tmp, model, spec)
    result["layout"] = layout
    _refit("tp", rank, tmp, model, spec, layout, result)


def _moe(rank, tmp, result, experts_dim):
    """Fused experts through a base layout's buffer rules: Shard(0) (3 experts
    over 4 ranks, the last one empty) or Shard(1) (shard_placement_fn, as
    TorchTitan when ranks outnumber experts); bf16 parameters with fp32 norms."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    case = f"moe{experts_dim}"
    torch.manual_seed(3)
    model = CausalLM(moe=True).to(torch.bfloat16)
    for n, p in model.named_parameters():
        if "norm" in n:
            p.data = p.data.float()
    for layer in model.model.layers:
        layer.mlp.gate.e_score_correction_bias = layer.mlp.gate.e_score_correction_bias.float()
    kw = {}
    if experts_dim == 1:
        kw["shard_placement_fn"] = lambda p: Shard(1) if p.ndim == 3 else None
    for layer in model.model.layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    gu = model.model.layers[0].mlp.experts.gate_up_proj
    result["gate_up_local"] = list(gu.to_local().shape)
    spec = model_spec(moe=True)
    try:
        reshard.layout_from_module(model, spec)
    except reshard.LayoutError as e:
        result["no_base"] = str(e)
    layout = _layout(case, rank, tmp, model, spec, base=MOE_BASE)
    result["layout"] = layout
    _refit(case, rank, tmp, model, spec, layout, result)


def _errors(rank, tmp, result):
    """What layout_from_module refuses, each naming the parameter."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    torch.manual_seed(4)
    model = CausalLM()
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    spec = model_spec()
    good = dict(model.named_parameters())
    mesh = init_device_mesh("cpu", (WORLD,))
    backwards = DeviceMesh("cpu", torch.arange(WORLD).flip(0))  # every rank makes it: it creates a group
    out = {}

    def refused(what, params, **kw):
        try:
            reshard.layout_from_module(params, spec, **kw)
            out[what] = None
        except reshard.LayoutError as e:
            out[what] = str(e)

    norm = "model.norm.weight"
    refused("partial", dict(good, **{norm: DTensor.from_local(torch.zeros(H), mesh, [Partial()])}))
    plain = CausalLM()
    fully_shard(plain.model.layers[0])  # the rest stays plain
    refused("mixed", plain)
    refused("mesh", dict(good, **{norm: distribute_tensor(torch.zeros(H), backwards, [Shard(0)], src_data_rank=None)}))
    q1 = "model.layers.1.self_attn.q_proj.weight"
    refused("disagree", dict(good, **{q1: distribute_tensor(torch.zeros(Q, H), mesh, [Replicate()], src_data_rank=None)}))
    wrong_local = DTensor.from_local(torch.zeros(3), mesh, [Shard(0)], run_check=False, shape=torch.Size([H]),
                                     stride=(1,))
    refused("local", dict(good, **{norm: wrong_local}))
    refused("twice", dict(good, **{"_orig_mod." + norm: distribute_tensor(torch.zeros(H), mesh, [Shard(0)],
                                                                             src_data_rank=None)}))
    refused("unknown", dict(good, **{"model.layers.0.mlp.experts.gate_up_proj": good[q1]}))
    refused("missing", {n: p for n, p in good.items() if not n.startswith("lm_head")})
    refused("shape", dict(good, **{norm: distribute_tensor(torch.zeros(H + 1), mesh, [Shard(0)],
                                                              src_data_rank=None)}))
    refused("plain only", {n: p.full_tensor() for n, p in good.items()})
    # a flattened mesh dim (TorchTitan's dp_shard_cp): cuts by its root axes in turn where that is the same cut
    ab = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))["a", "b"]._flatten("ab")
    flat_norm = distribute_tensor(torch.zeros(H), ab, [Shard(0)], src_data_rank=None)
    out["flattened"] = reshard.layout_from_module(dict(good, **{norm: flat_norm}), spec)
    refused("flattened uneven", dict(good, **{"lm_head.weight": distribute_tensor(torch.zeros(V, H), ab, [Shard(0)],
                                                                                  src_data_rank=None)}))
    # wrapper segments anywhere are looked through, in any combination
    wrapped = {n.replace("model.layers.0.", "_orig_mod.model.layers.0._checkpoint_wrapped_module."): p
               for n, p in good.items()}
    out["wrapped"] = reshard.layout_from_module(wrapped, spec) == reshard.layout_from_module(good, spec)
    result["errors"] = out


CASES = {"fsdp4": _fsdp4_ac_adamw, "hsdp": _hsdp2x2, "tp": _tp2_fsdp2, "moe0": lambda r, t, res: _moe(r, t, res, 0),
         "moe1": lambda r, t, res: _moe(r, t, res, 1), "errors": _errors}


def _rank(rank, tmp):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    results = {}
    try:
        for case, fn in CASES.items():
            (Path(tmp) / case).mkdir(exist_ok=True)
            results[case] = {}
            fn(rank, tmp, results[case])
            dist.barrier()
    except BaseException:
        results["failure"] = traceback.format_exc()
        Path(tmp, f"rank{rank}.json").write_text(json.dumps(results))
        os._exit(1)
    Path(tmp, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Every case on 4 ranks; {rank: {case: what it recorded}}."""
    tmp = tmp_path_factory.mktemp("fsdp2")
    # Forked children inherit this process's objects; a Gloo transport an
    # earlier test left as garbage would be destroyed in a child, where its
    # event loop is not running (Gloo aborts: "epoll_ctl: No such file or
    # directory"). Collect it here and keep the children's GC off the rest.
    gc.collect()
    gc.freeze()
    try:
        mp.start_processes(_rank, args=(str(tmp),), nprocs=WORLD, join=True, start_method="fork")
    except Exception as e:  # noqa: BLE001 - the ranks' own tracebacks say more
        failures = [json.loads(p.read_text()).get("failure", "") for p in sorted(tmp.glob("rank*.json"))]
        pytest.fail(f"the ranks failed: {e}\n" + "\n".join(f for f in failures if f))
    finally:
        gc.unfreeze()
    return {r: json.loads((tmp / f"rank{r}.json").read_text()) for r in range(WORLD)}, tmp


def _same_layout_everywhere(ranks, case):
    got, tmp = ranks
    layouts = [json.loads((tmp / case / f"layout{r}.json").read_text()) for r in range(WORLD)]
    assert all(x == layouts[0] for x in layouts)
    return got[0][case]["layout"]


def _refit_exact(ranks, case):
    got, _ = ranks
    for r in range(WORLD):
        res = got[r][case]
        assert res["missing"] == [] and res["unused"] == []
        assert res["refit"]["wrong"] == [] and res["refit"]["checked"] > 0 and res["refit"]["bytes"] > 0


def _placement(layout, match):
    return next({k: v for k, v in p.items() if k not in ("match", "mesh")} for p in layout["placements"]
                if p["match"] == match)


# -- the tests ---------------------------------------------------------------------------------

def test_fsdp2_1d_layout(ranks):
    layout = _same_layout_everywhere(ranks, "fsdp4")
    assert layout["ranks"] == 4 and layout["meshes"] == {"fsdp": [["dp_shard", 4]]}
    assert layout["dtype"] == "fp32"  # fp32 masters of a bf16 model
    chunk = {"dp_shard": {"shard": 0, "split": "chunk"}}
    assert [p["match"] for p in layout["placements"]] == [t["name"] for t in model_spec()["tensors"]]
    assert _placement(layout, "lm_head.weight") == chunk
    assert _placement(layout, "model.layers.{layer}.self_attn.q_proj.weight") == dict(chunk, split_heads=True)
    assert "buffers" not in layout


def test_fsdp2_1d_binds_and_refits_after_an_adamw_step(ranks):
    got, _ = ranks
    for r in range(WORLD):
        res = got[r]["fsdp4"]
        assert res["wrapped_names"] and WRAP in res["wrapped_names"][0]  # bind_module looked through them
        assert res["bound_locals"] and res["same_memory_after_step"] and res["changed"] > 10
        assert res["fsdp_storage"] and res["unsharded_freed"]
    # the router's 3 rows over 4 ranks: the last rank holds [0, 8] and binds zero-size buffers
    assert [got[r]["fsdp4"]["router_local"] for r in range(WORLD)] == [[1, H], [1, H], [1, H], [0, H]]
    assert got[3]["fsdp4"]["zero_size"] == [f"model.layers.{i}.mlp.gate.weight" for i in range(LAYERS)]
    assert ["lm_head.weight", "fp32", [61, H]] in got[3]["fsdp4"]["source_buffers"]
    assert ["lm_head.weight", "fp32", [63, H]] in got[0]["fsdp4"]["source_buffers"]
    assert "'lm_head.weight': its memory moved" in got[0]["fsdp4"]["stale"]
    assert got[3]["fsdp4"]["empty_ptr"] == 0
    _refit_exact(ranks, "fsdp4")


def test_hsdp_2x2(ranks):
    layout = _same_layout_everywhere(ranks, "hsdp")
    got, _ = ranks
    assert got[0]["hsdp"]["placements"] == "(Replicate(), Shard(dim=0))"
    assert layout["meshes"] == {"fsdp": [["dp_replicate", 2], ["dp_shard", 2]]} and "dtype" not in layout
    assert _placement(layout, "lm_head.weight") == {"dp_replicate": "replicate",
                                                    "dp_shard": {"shard": 0, "split": "chunk"}}
    _refit_exact(ranks, "hsdp")


def test_tp2_x_fsdp2_strided_uneven(ranks):
    layout = _same_layout_everywhere(ranks, "tp")
    got, _ = ranks
    assert got[0]["tp"]["q_placements"] == "(_StridedShard(dim=0, sf=2), Shard(dim=0))"
    # q_proj 90 rows: TP 45 each, then FSDP 23 / 22
    assert [got[r]["tp"]["q_local"] for r in range(WORLD)] == [[23, H], [23, H], [22, H], [22, H]]
    assert layout["meshes"] == {"fsdp": [["dp", 2], ["tp", 2]]}
    chunk = {"shard": 0, "split": "chunk"}
    assert _placement(layout, "model.layers.{layer}.self_attn.q_proj.weight") == {
        "dp": chunk, "tp": chunk, "order": ["tp", "dp"], "split_heads": True}
    assert _placement(layout, "model.layers.{layer}.self_attn.o_proj.weight") == {
        "dp": chunk, "tp": {"shard": 1, "split": "chunk"}}
    assert _placement(layout, "model.embed_tokens.weight") == {"dp": chunk, "tp": chunk, "order": ["tp", "dp"]}
    # not parallelized by TP: on the dp submesh, replicated over tp
    assert _placement(layout, "model.norm.weight") == {"dp": chunk, "tp": "replicate"}
    _refit_exact(ranks, "tp")


@pytest.mark.parametrize("dim", [0, 1])
def test_fused_experts_through_base_rules(ranks, dim):
    case = f"moe{dim}"
    layout = _same_layout_everywhere(ranks, case)
    got, _ = ranks
    assert "'model.layers.0.mlp.experts.gate_up_proj'" in got[0][case]["no_base"] and "base=" in got[0][case]["no_base"]
    gate_up, down = layout["buffers"][:2]
    chunk = {"shard": 0, "split": "chunk"}
    if dim == 0:  # 3 experts over 4 ranks: the last one holds [0, 28, 8]
        assert [got[r][case]["gate_up_local"] for r in range(WORLD)] == [[1, 28, H]] * 3 + [[0, 28, H]]
        assert "shard" not in gate_up
        assert _placement(layout, "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight") == {
            "dp_shard": {"shard": "expert", "split": "chunk"}}
        assert "model.layers.0.mlp.experts.gate_up_proj" in got[3][case]["zero_size"]
    else:  # the fused dim cut as a whole: 28 rows, 7 per rank (ranks 0, 1 gate rows, 2, 3 up rows)
        assert [got[r][case]["gate_up_local"] for r in range(WORLD)] == [[3, 7, H]] * 4
        assert gate_up["shard"] == {"axis": "dp_shard", "split": "chunk"}
        assert _placement(layout, "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight") == {
            "dp_shard": "replicate"}
        assert _placement(layout, "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight") == {"dp_shard": chunk}
    assert gate_up["dtype"] == down["dtype"] == "bf16" and layout["default_buffers"] is True
    assert _placement(layout, "model.layers.{layer}.mlp.gate.e_score_correction_bias") == {"dp_shard": "replicate"}
    assert "dtype" not in layout  # bf16 parameters, fp32 norms: rules for the norms
    norms = [b for b in layout["buffers"][2:] if "norm" in b["name"]]
    assert len(norms) == 3 and all(b["dtype"] == "fp32" and b["tensor"] == b["name"] for b in norms)
    _refit_exact(ranks, case)


@pytest.mark.parametrize("case", ["fsdp4", "hsdp", "tp", "moe0", "moe1"])
def test_reshard_check_finds_no_difference_with_the_dumps(ranks, case):
    """tools/dump_state_dict.py's dumps (local shapes, wrapper segments
    removed) against the layout: zero differences on every rank."""
    _, tmp = ranks
    d = tmp / case
    r = subprocess.run([str(reshard_binary()), "check", "--layout", str(d / "layout0.json"), "--model",
                        str(d / "model.json"), "--state-dict"] + [str(d / f"dump{i}.json") for i in range(WORLD)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_refused_modules_name_the_parameter(ranks):
    got, _ = ranks
    e = got[0]["errors"]["errors"]
    assert "'model.norm.weight': placement Partial(sum) on mesh dim 0 has no layout" in e["partial"]
    assert e["mixed"].startswith("'model.embed_tokens.weight' is a plain tensor, while 'model.layers.0.")
    assert "'model.norm.weight': its mesh (dp_shard=4) holds ranks [3, 2, 1, 0], not 0..3 in row-major" in e["mesh"]
    assert e["disagree"].startswith("'model.layers.0.self_attn.q_proj.weight' and 'model.layers.1.self_attn.q_proj."
                                    "weight' are both 'model.layers.{layer}.self_attn.q_proj.weight' but are placed "
                                    "differently: (Shard(0)) on mesh 'fsdp' vs (Replicate()) on mesh 'fsdp'")
    assert "'model.norm.weight': this rank (dp_shard=0) holds a local shard of shape [3], the layout of (Shard(0)) " \
           "over [8] says [2]" in e["local"]
    assert "'_orig_mod.model.norm.weight': two parameters are named 'model.norm.weight'" in e["twice"]
    assert e["unknown"].startswith("'model.layers.0.mlp.experts.gate_up_proj' ('model.layers.0.mlp.experts."
                                   "gate_up_proj') is no instance of a tensor of model 'tiny'")
    assert e["missing"].startswith("the module holds no parameter for the model's 'lm_head.weight'")
    assert e["shape"] == "'model.norm.weight' has shape [9], the model's 'model.norm.weight' is [8]"
    assert e["plain only"].startswith("the module has no DTensor parameters")
    assert e["wrapped"] is True
    flat = e["flattened"]
    assert flat["meshes"] == {"fsdp": [["dp_shard", 4]], "fsdp1": [["a", 2], ["b", 2]]}
    assert next(p for p in flat["placements"] if p["match"] == "model.norm.weight") == {
        "match": "model.norm.weight", "mesh": "fsdp1", "a": {"shard": 0, "split": "chunk"},
        "b": {"shard": 0, "split": "chunk"}}
    assert e["flattened uneven"].startswith("'lm_head.weight': a flattened mesh dim cuts tensor dim 0 (size 250) "
                                            "unevenly over a, b")


def test_strip_wrappers():
    assert strip_wrappers("model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight") == \
        "model.layers.0.mlp.up_proj.weight"
    assert strip_wrappers("_orig_mod.model._fsdp_wrapped_module.norm.weight") == "model.norm.weight"
    assert strip_wrappers("model.my_orig_mod.weight") == "model.my_orig_mod.weight"


def test_layout_errors_without_a_process_group(tmp_path):
    with pytest.raises(reshard.LayoutError, match="expected a reshard.model/1 spec"):
        reshard.layout_from_module(CausalLM(), {"format": "reshard.layout/1"})
    with pytest.raises(reshard.LayoutError, match="has no DTensor parameters .'model.embed_tokens.weight' is a plain"):
        reshard.layout_from_module(CausalLM(), model_spec())
    assert issubclass(reshard.LayoutError, reshard.CompileError)
