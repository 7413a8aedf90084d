"""What a vLLM tensor-parallel rank holds of a Llama-style model, built from
the Hugging Face tensors the way vLLM's weight loaders build it (vLLM 0.33,
vllm/model_executor/layers/linear.py QKVParallelLinear.weight_loader /
MergedColumnParallelLinear.weight_loader / RowParallelLinear.weight_loader,
vocab_parallel_embedding.py VocabParallelEmbedding.weight_loader): q rows
split by TP, the KV head of rank r is r / (TP / KV heads) when TP exceeds
them, gate_up_proj = [gate shard; up shard], o_proj / down_proj split by
columns, the vocabulary padded to a multiple of 64 and split evenly (the
real rows copied; the padding is left to the caller to ignore)."""


def vllm_rank(hf_cfg, hf, tp, r):
    """{vLLM name: tensor} of rank r; embed/lm_head only their real rows
    (returned as (tensor, real_rows) pairs)."""
    heads, kv, hd = hf_cfg["num_attention_heads"], hf_cfg["num_key_value_heads"], hf_cfg["head_dim"]
    q_rows = heads * hd // tp
    kv_head = r // (tp // kv) if kv < tp else None
    out = {}
    for name, t in hf.items():
        if name.endswith("self_attn.q_proj.weight"):
            stem = name[:-len("q_proj.weight")]
            k, v = hf[stem + "k_proj.weight"], hf[stem + "v_proj.weight"]
            if kv_head is not None:
                ks, vs = k[kv_head * hd:(kv_head + 1) * hd], v[kv_head * hd:(kv_head + 1) * hd]
            else:
                n = kv * hd // tp
                ks, vs = k[r * n:(r + 1) * n], v[r * n:(r + 1) * n]
            out[stem + "qkv_proj.weight"] = _cat([t[r * q_rows:(r + 1) * q_rows], ks, vs])
        elif name.endswith("mlp.gate_proj.weight"):
            stem = name[:-len("gate_proj.weight")]
            n = t.shape[0] // tp
            out[stem + "gate_up_proj.weight"] = _cat([t[r * n:(r + 1) * n], hf[stem + "up_proj.weight"][r * n:(r + 1) * n]])
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            n = t.shape[1] // tp
            out[name] = t[:, r * n:(r + 1) * n].contiguous()
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            padded = (t.shape[0] + 63) // 64 * 64
            per = padded // tp
            out[name] = t[r * per:min((r + 1) * per, t.shape[0])].contiguous()
        elif name.endswith(("k_proj.weight", "v_proj.weight", "up_proj.weight")):
            continue
        else:
            out[name] = t
    return out


def _cat(parts):
    import torch
    return torch.cat(parts).contiguous()
