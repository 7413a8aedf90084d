"""Builds, shards and trains a case of tests/fsdp2/cases.py on this rank
(real transformers models, real FSDP2 / DTensor over Gloo), and gives the
truth a refit must deliver: every parameter's full_tensor() in the model
spec's dtype (bf16), under Hugging Face checkpoint names, and the same
tensors re-fused and cut as vLLM's weight loaders hold them."""
import torch
import torch.distributed as dist

from cases import CONFIGS

WRAPPER = "_checkpoint_wrapped_module."


def build(case):
    """The case's model, seeded identically on every rank (no download: from its config)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = dict(CONFIGS[case["model"]])
    model_type = cfg.pop("model_type")
    cfg.pop("architectures", None)
    # The eager experts loop: torch's grouped_mm wants 16-byte strides, which the odd sizes here do not have.
    config = AutoConfig.for_model(model_type, experts_implementation="eager", **cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    if case["dtype"] == "bf16":
        model = model.to(torch.bfloat16)
    return model


def meshes(case):
    """(mesh for fully_shard, tp mesh or None, this rank's data-parallel index)."""
    from torch.distributed.device_mesh import init_device_mesh
    rank = dist.get_rank()
    if case["mesh"] == "fsdp":
        return init_device_mesh("cpu", (4,), mesh_dim_names=("dp_shard",)), None, rank
    if case["mesh"] == "hsdp":
        return init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard")), None, rank
    if case["mesh"] == "tp":
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
        return mesh["dp_shard"], mesh["tp"], mesh["dp_shard"].get_local_rank()
    raise ValueError(case["mesh"])


def tensor_parallel(model, tp_mesh):
    """NeMo RL's TP plan for Qwen (nemo_rl/models/dtensor/parallelize.py, no sequence parallelism).

    q_norm / k_norm act on each TP rank's own heads: they become Replicate
    DTensors over the heads-sharded activations (NeMo RL's Qwen3QKNorm, a
    SequenceParallel on the heads dim), so their gradients are reduced over
    TP. Left plain, each TP rank would train its own copy and the replicas
    would drift apart (seen here: the refit's copy then differs from another
    rank's)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)
    plan = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
        "lm_head": ColwiseParallel(output_layouts=Replicate()),
    }
    for i in range(len(model.model.layers)):
        p = f"model.layers.{i}."
        for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            plan[p + m] = ColwiseParallel()
        for m in ("self_attn.o_proj", "mlp.down_proj"):
            plan[p + m] = RowwiseParallel()
        for m in ("self_attn.q_norm", "self_attn.k_norm"):  # [batch, seq, heads, head_dim]: heads on dim 2
            plan[p + m] = SequenceParallel(sequence_dim=2, use_local_output=True)
    parallelize_module(model, tp_mesh, plan)


def shard(case, model):
    """TP (if any), activation checkpointing (if any), then fully_shard per decoder layer and the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import Shard
    dp_mesh, tp_mesh, dp_index = meshes(case)
    if tp_mesh is not None:
        tensor_parallel(model, tp_mesh)
    if case.get("ac"):
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            apply_activation_checkpointing, checkpoint_wrapper)
        layer_type = type(model.model.layers[0])
        apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper,
                                       check_fn=lambda m: isinstance(m, layer_type))
    kw = {"mesh": dp_mesh}
    if case["dtype"] == "fp32":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if case.get("experts_dim") == 1:
        # TorchTitan's _experts_shard_placement_fn when ranks outnumber experts.
        experts = {id(p) for n, p in model.named_parameters() if ".mlp.experts." in n}
        kw["shard_placement_fn"] = lambda p: Shard(1) if id(p) in experts else None
    for layer in model.model.layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return dp_index


def train_step(case, model, dp_index, steps=1):
    """One forward/backward and an AdamW step: the refit moves trained weights."""
    g = torch.Generator().manual_seed(100 + dp_index)
    ids = torch.randint(0, CONFIGS[case["model"]]["vocab_size"], (2, 12), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    for _ in range(steps):
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
    return float(out.loss)


def hf_name(name):
    return name.replace(WRAPPER, "")


def truth(model, dtype=torch.bfloat16):
    """{HF checkpoint name: full tensor in `dtype`} (collective: every rank
    calls full_tensor() on every parameter in the same order). Fused experts
    are split per expert as transformers' checkpoint conversion does:
    gate_up_proj[e] = [gate_proj; up_proj], down_proj[e] = down_proj."""
    out = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p.detach()
        full = full.detach().to(dtype).contiguous()
        name = hf_name(name)
        if name.endswith("mlp.experts.gate_up_proj"):
            stem = name[:-len("gate_up_proj")]
            inter = full.shape[1] // 2
            for e in range(full.shape[0]):
                out[f"{stem}{e}.gate_proj.weight"] = full[e, :inter].contiguous()
                out[f"{stem}{e}.up_proj.weight"] = full[e, inter:].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            stem = name[:-len("down_proj")]
            for e in range(full.shape[0]):
                out[f"{stem}{e}.down_proj.weight"] = full[e].contiguous()
        else:
            out[name] = full
    return out


def locals_of(model):
    """{name: local shard} of every parameter as the rank holds it (DTensor
    locals: the memory FSDP2 keeps), wrapper segments removed."""
    out = {}
    for name, p in model.named_parameters():
        t = p.to_local() if hasattr(p, "to_local") else p
        out[hf_name(name)] = t.detach()
    return out


def vllm_rank(cfg, hf, tp, r, ep=False):
    """{vLLM name: (expected tensor, real rows)} of vLLM TP rank r, built from
    the HF tensors as vLLM 0.33's weight loaders build it: qkv_proj = [q; k; v]
    shards (QKVParallelLinear), gate_up_proj = [gate; up] shards
    (MergedColumnParallelLinear), o_proj / down_proj column shards
    (RowParallelLinear), the vocabulary padded to a multiple of 64 and split
    evenly (VocabParallelEmbedding / ParallelLMHead; real rows only), and the
    experts stacked as FusedMoE's w13_weight [E_local, 2I, H] ([gate; up] per
    expert) and w2_weight [E_local, H, I]: under expert parallelism whole
    experts, the first ranks holding one expert more (linear placement),
    otherwise every expert with its intermediate rows cut (w13: [rows(gate);
    rows(up)], w2: cols(down)).

    Qwen3-Next (recorded from real vLLM 0.33 TP2 ranks): q_proj is per head
    [query; gate], so rows(q_proj) hold whole heads; in_proj_qkvz and
    in_proj_ba are contiguous row blocks of the checkpoint's fused tensors;
    conv1d [q; k; v] channels cut per part (rows of each); dt_bias (bf16) and
    A_log (fp32: the bf16 values widened) cut by value heads; out_proj
    columns; norm, router and shared_expert_gate whole; the shared expert a
    dense MLP (gate_up_proj = [rows(gate); rows(up)], down_proj columns)."""
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    assert kv % tp == 0 and heads % tp == 0
    out = {}

    def rows(t, n, i):
        assert t.shape[0] % n == 0, (t.shape, n)
        per = t.shape[0] // n
        return t[i * per:(i + 1) * per]

    def cols(t):
        assert t.shape[-1] % tp == 0, (t.shape, tp)
        per = t.shape[-1] // tp
        return t[..., r * per:(r + 1) * per].contiguous()

    for name, t in hf.items():
        if name.endswith(("linear_attn.in_proj_qkvz.weight", "linear_attn.in_proj_ba.weight", "linear_attn.dt_bias")):
            out[name] = rows(t, tp, r)
        elif name.endswith("linear_attn.A_log"):
            out[name] = rows(t, tp, r).float()  # vLLM allocates A_log in fp32
        elif name.endswith("linear_attn.conv1d.weight"):
            kd = cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
            out[name] = torch.cat([rows(t[:kd], tp, r), rows(t[kd:2 * kd], tp, r), rows(t[2 * kd:], tp, r)])
        elif name.endswith("linear_attn.out_proj.weight"):
            out[name] = cols(t)
        elif name.endswith("mlp.shared_expert.gate_proj.weight"):
            stem = name[:-len("gate_proj.weight")]
            out[stem + "gate_up_proj.weight"] = torch.cat([rows(t, tp, r), rows(hf[stem + "up_proj.weight"], tp, r)])
        elif name.endswith("mlp.shared_expert.down_proj.weight"):
            out[name] = cols(t)
        elif name.endswith("mlp.shared_expert.up_proj.weight"):
            continue
        elif name.endswith("self_attn.q_proj.weight"):
            stem = name[:-len("q_proj.weight")]
            out[stem + "qkv_proj.weight"] = torch.cat([rows(t, tp, r), rows(hf[stem + "k_proj.weight"], tp, r),
                                                       rows(hf[stem + "v_proj.weight"], tp, r)])
        elif name.endswith("mlp.gate_proj.weight") and ".experts." not in name:
            stem = name[:-len("gate_proj.weight")]
            out[stem + "gate_up_proj.weight"] = torch.cat([rows(t, tp, r), rows(hf[stem + "up_proj.weight"], tp, r)])
        elif name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")) and ".experts." not in name:
            per = t.shape[1] // tp
            out[name] = t[:, r * per:(r + 1) * per].contiguous()
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            per = (t.shape[0] + 63) // 64 * 64 // tp
            out[name] = t[r * per:min((r + 1) * per, t.shape[0])].contiguous()
        elif ".experts." in name or name.endswith(("k_proj.weight", "v_proj.weight", "mlp.up_proj.weight")):
            continue
        else:
            out[name] = t
    if "num_experts" in cfg:
        n = cfg["num_experts"]
        if ep:  # whole experts, linear placement
            base, extra = divmod(n, tp)
            first = r * base + min(r, extra)
            mine = range(first, first + base + (1 if r < extra else 0))
            cut_rows, cut_cols = (lambda t: t), (lambda t: t)
        else:  # every expert, its intermediate rows cut over TP
            mine = range(n)
            cut_rows, cut_cols = (lambda t: rows(t, tp, r)), cols
        for layer in range(cfg["num_hidden_layers"]):
            s = f"model.layers.{layer}.mlp.experts."
            w13 = [torch.cat([cut_rows(hf[f"{s}{e}.gate_proj.weight"]), cut_rows(hf[f"{s}{e}.up_proj.weight"])])
                   for e in mine]
            w2 = [cut_cols(hf[f"{s}{e}.down_proj.weight"]) for e in mine]
            out[s + "routed_experts.w13_weight"] = torch.stack(w13)
            out[s + "routed_experts.w2_weight"] = torch.stack(w2)
    return {k: v.contiguous() for k, v in out.items()}
