"""Writes a tiny Hugging Face checkpoint (config.json + model.safetensors)
for vLLM to load: the tensors of a reshard model spec (what `reshard init`
writes for the config), values from a seed or given, quantized the way the
config's quantization_config says:

- "quant_method": "fp8" with "weight_block_size" [bn, bk] (DeepSeek-V3's
  FP8 checkpoints): every linear projection (`*_proj*.weight`) stored as
  float8_e4m3fn with `weight_scale_inv` float32 [ceil(out/bn), ceil(in/bk)],
  scale = amax of the block / 448;
- "quant_method": "compressed-tensors", FP8 per channel (what llm-compressor
  writes for FP8_DYNAMIC): `weight` float8_e4m3fn, `weight_scale` float32
  [out, 1]; the router (`mlp.gate`) and lm_head stay bf16 (its "ignore").

Embeddings, norms, routers and lm_head are never quantized (DeepSeek-V3's
checkpoints keep them in BF16).
"""
import json
import os

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
FP8_MAX = 448.0

# compressed-tensors FP8 per channel, dynamic per-token activations: the
# quantization_config llm-compressor's FP8_DYNAMIC scheme writes.
COMPRESSED_FP8_CHANNEL = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "quantization_status": "compressed",
    "ignore": ["lm_head", "re:.*mlp.gate$"],
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False,
                    "observer": "minmax"},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                              "dynamic": True, "observer": None},
    }},
}


def expand(model_spec):
    """[(name, shape, dtype)] of every concrete tensor of a reshard.model/1 spec."""
    dims = model_spec.get("dims", {})
    default = model_spec.get("dtype", "bf16")
    out = []
    for t in model_spec["tensors"]:
        names = [(t["name"], {})]
        for dim, size in dims.items():
            r = t.get("range", {}).get(dim, [0, size])
            intervals = r if r and isinstance(r[0], list) else [r]  # [lo, hi] or a list of them
            if "{" + dim + "}" in t["name"]:
                names = [(n.replace("{" + dim + "}", str(i)), dict(at, **{dim: i})) for n, at in names
                         for lo, hi in intervals for i in range(lo, hi)]
        for n, _ in names:
            out.append((n, list(t["shape"]), DTYPES[t.get("dtype", default)]))
    return out


def is_quantized(name, shape):
    """The linear projections (q_a_proj, kv_a_proj_with_mqa, gate_proj, ...),
    as DeepSeek-V3's FP8 checkpoints store them; not embeddings, norms,
    routers or lm_head."""
    module = name.rsplit(".", 1)[0].rsplit(".", 1)[-1]
    return len(shape) == 2 and name.endswith(".weight") and "proj" in module


def random_values(tensors, seed):
    """Deterministic values: norms near 1, the rest small (like a trained model's scale)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape, dtype in tensors:
        x = torch.randn(shape, generator=g)
        if "norm" in name:
            x = 1.0 + 0.1 * x
        elif "bias" in name:
            x = 0.1 * x
        else:
            x = 0.05 * x
        out[name] = x.to(dtype)
    return out


def _scale(amax):
    """amax / 448 in float32, 1.0 where the block is all zeros: reshard's
    ScaleFromAmax (runtime/quant_rules.h), so that a checkpoint written here
    holds the bits a refit into FP8 writes (quantized as FloatToE4m3 does:
    x / scale rounded to nearest even, saturating at 448)."""
    amax = amax.float()
    return torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))


def quantize_block(w, bn, bk):
    """(float8_e4m3fn weight, float32 scale_inv [ceil(out/bn), ceil(in/bk)])."""
    out, inp = w.shape
    rb, cb = -(-out // bn), -(-inp // bk)
    wf = w.float()
    pad = torch.zeros(rb * bn, cb * bk)
    pad[:out, :inp] = wf.abs()
    amax = pad.view(rb, bn, cb, bk).amax(dim=(1, 3))
    scale = _scale(amax)
    full = scale.repeat_interleave(bn, 0)[:out].repeat_interleave(bk, 1)[:, :inp]
    return (wf / full).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale.float()


def quantize_channel(w):
    """(float8_e4m3fn weight, float32 scale [out, 1])."""
    scale = _scale(w.float().abs().amax(dim=1, keepdim=True))
    return (w.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale.float()


def quant_kind(config):
    q = config.get("quantization_config")
    if not q:
        return None
    if q.get("quant_method") == "fp8" and q.get("weight_block_size"):
        return "fp8-block"
    if q.get("quant_method") == "compressed-tensors":
        return "fp8-channel"
    raise ValueError(f"checkpoint: unsupported quantization_config {q}")


def checkpoint_tensors(config, values):
    """The checkpoint's tensors from logical (unquantized) values: quantized
    as the config says, or as they are when `values` already holds the
    quantized weights and their scales."""
    kind = quant_kind(config)
    out = {}
    for name, x in values.items():
        if kind and is_quantized(name, list(x.shape)) and x.dtype != torch.float8_e4m3fn:
            if kind == "fp8-block":
                bn, bk = config["quantization_config"]["weight_block_size"]
                out[name], out[name + "_scale_inv"] = quantize_block(x, bn, bk)
            else:
                out[name], out[name.replace(".weight", ".weight_scale")] = quantize_channel(x)
        else:
            out[name] = x.contiguous()
    return out


def write(directory, config, tensors):
    """config.json and model.safetensors (tensors as given) into `directory`."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    tmp = os.path.join(directory, "model.safetensors.tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata={"format": "pt"})
    os.replace(tmp, os.path.join(directory, "model.safetensors"))
