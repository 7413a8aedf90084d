"""The standard Megatron-Core -> Hugging Face conversion (local layer spec,
SequentialMLP experts), in torch, from every rank's parameters: layers
renumbered from each pipeline stage's local numbering, linear_qkv
un-interleaved per query group after joining the TP shards, linear_fc1 split
into gate and up per (expert-)TP shard, vocab padding stripped, local experts
numbered globally. Replicas (DP, and TP for unsplit parameters) must agree."""
import torch

from cases import padded_vocab

# Megatron local name (after "decoder.layers.{i}.") -> (HF name after "model.layers.{L}.", how TP splits it)
LAYER = {
    "input_layernorm.weight": ("input_layernorm.weight", None),
    "pre_mlp_layernorm.weight": ("post_attention_layernorm.weight", None),
    "self_attention.linear_qkv.weight": ("self_attn.qkv", 0),
    "self_attention.linear_proj.weight": ("self_attn.o_proj.weight", 1),
    "self_attention.q_layernorm.weight": ("self_attn.q_norm.weight", None),
    "self_attention.k_layernorm.weight": ("self_attn.k_norm.weight", None),
    "mlp.linear_fc1.weight": ("mlp.fc1", 0),
    "mlp.linear_fc2.weight": ("mlp.down_proj.weight", 1),
    "mlp.router.weight": ("mlp.gate.weight", None),
}
EXPERT = {"linear_fc1.weight": ("fc1", 0), "linear_fc2.weight": ("down_proj.weight", 1)}


def _put(store, key, t, where):
    if key in store:
        if not torch.equal(store[key][0].view(torch.int16 if t.element_size() == 2 else torch.int32),
                           t.view(torch.int16 if t.element_size() == 2 else torch.int32)):
            raise AssertionError(f"replicas differ: {key} on {store[key][1]} and {where}")
        return
    store[key] = (t, where)


def megatron_to_hf(case, ranks, qkv_interleaved=True, fc1_gate_first=True):
    """ranks: {rank: (coords, {megatron name: tensor})} -> {HF name: tensor}.
    The flags give wrong conversions, for control: [q; k; v] not interleaved
    per group, fc1 as [up; gate]."""
    hf = case["hf"]
    vpp = case.get("vpp") or 1
    per_chunk = hf["num_hidden_layers"] // (case["pp"] * vpp)
    experts = hf.get("num_experts", 0)
    local_experts = experts // case["ep"] if experts else 0
    shards = {}  # (hf base name, split dim) -> {tp index: tensor}
    whole = {}
    for rank, (c, params) in sorted(ranks.items()):
        for name, t in params.items():
            where = f"rank {rank}"
            chunk = 0
            if vpp > 1:  # "model{c}." names virtual pipeline chunk c: stage pp's layers of virtual stage c
                head, name = name.split(".", 1)
                chunk = int(head[len("model"):])
            if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
                # Tied embeddings: the last stage's output_layer is a replica of the embedding.
                tied = hf.get("tie_word_embeddings", False)
                base = "model.embed_tokens.weight" if name.startswith("embedding") or tied else "lm_head.weight"
                _put(shards.setdefault((base, 0), {}), c["tp"], t, where)
            elif name == "decoder.final_layernorm.weight":
                _put(whole, "model.norm.weight", t, where)
            elif name.startswith("decoder.layers."):
                local, rest = name[len("decoder.layers."):].split(".", 1)
                layer = (chunk * case["pp"] + c["pp"]) * per_chunk + int(local)
                prefix = f"model.layers.{layer}."
                if rest.startswith("mlp.experts.local_experts."):
                    j, sub = rest[len("mlp.experts.local_experts."):].split(".", 1)
                    e = c["ep"] * local_experts + int(j)
                    base, dim = EXPERT[sub]
                    _put(shards.setdefault((f"{prefix}mlp.experts.{e}.{base}", dim), {}), c["etp"], t, where)
                else:
                    base, dim = LAYER[rest]
                    if dim is None:
                        _put(whole, prefix + base, t, where)
                    else:
                        _put(shards.setdefault((prefix + base, dim), {}), c["tp"], t, where)
            else:
                raise AssertionError(f"rank {rank}: unknown parameter {name}")
    out = {k: v[0] for k, v in whole.items()}
    heads, groups, hd = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]
    for (base, dim), by_tp in shards.items():
        parts = [by_tp[i][0] for i in sorted(by_tp)]
        if base.endswith(".fc1"):  # each shard is [gate_i; up_i]
            half = parts[0].shape[0] // 2
            first, second = ("gate_proj", "up_proj") if fc1_gate_first else ("up_proj", "gate_proj")
            out[base[:-3] + first + ".weight"] = torch.cat([p[:half] for p in parts])
            out[base[:-3] + second + ".weight"] = torch.cat([p[half:] for p in parts])
            continue
        full = torch.cat(parts, dim)
        if base.endswith(".qkv"):  # [q_g; k_g; v_g] per query group g
            g = full.view(groups if qkv_interleaved else 1, -1, full.shape[-1])
            n = groups if qkv_interleaved else 1
            q, k, v = g.split([heads * hd // n, groups * hd // n, groups * hd // n], dim=1)
            stem = base[:-3]
            out[stem + "q_proj.weight"] = q.reshape(heads * hd, -1)
            out[stem + "k_proj.weight"] = k.reshape(groups * hd, -1)
            out[stem + "v_proj.weight"] = v.reshape(groups * hd, -1)
        elif base in ("model.embed_tokens.weight", "lm_head.weight"):
            assert full.shape[0] == padded_vocab(case), (base, full.shape)
            out[base] = full[:hf["vocab_size"]]
        else:
            out[base] = full
    return {k: v.contiguous() for k, v in out.items()}
