#!/usr/bin/env python3
"""Real vLLM 0.33 ranks (CPU, Gloo) for the architectures `reshard init`
describes (glm4_moe, gpt_oss, qwen3_next, llama4): builds each case's ranks
with vLLM's own model classes and loaders (tests/vllm/engine.py, unchanged),
dumps what every rank holds (tools/dump_state_dict.py) and writes or
compares tests/data/archs/<case>/{config.json,dump.json}. InitArchs.RealRanksHaveZeroDifferences
(tests/init_test.cc) runs `reshard init` + `reshard check` on each dump.

    build/vllm-venv/bin/python tests/archs/record_vllm.py [--write] [CASE ...]

The checkpoint is random, with the tensors `reshard init --train hf` lists for
the config (tests/vllm/checkpoint.py), except gpt-oss's experts, which the
model spec holds per expert as [out, in] and the checkpoint fuses and
transposes (gate_up_proj [E, H, 2I] with gate and up in alternate columns,
gate_up_proj_bias [E, 2I], down_proj [E, I, H], down_proj_bias [E, H]:
transformers' GptOssExperts).

qwen3_next and llama4 do not need `reshard init`: their checkpoints are built
here (qwen3_next_tensors, llama4_tensors) with the names and shapes of the
released checkpoints (Qwen/Qwen3-Next-80B-A3B-Instruct;
meta-llama/Llama-4-Scout-17B-16E-Instruct / -Maverick-17B-128E-Instruct):
Qwen3-Next keeps its experts per expert and its fused in_proj_qkvz /
in_proj_ba, conv1d [C, 1, K] and its MTP layer (mtp.*, which the main model
skips); Llama 4 keeps its experts fused and transposed (gate_up_proj
[E, H, 2I], gate in the first I columns; down_proj [E, I, H]) under
language_model.model.*, with a tiny vision tower (vision_model.*) and
multi_modal_projector.

Two things these two need on this CPU, neither a change to vLLM:
- qwen3_next: the ranks run this script's rank_main (rank_dump.py after
  without_missing_cpu_conv_pack): the CUDA wheel has the Python wrapper of
  the CPU causal-conv weight prepack but not its op, so vLLM's CPU-only
  prepack of the GDN conv1d weight would fail; without the wrapper the
  weight stays [C/TP, 1, K], as a GPU rank holds it.
- llama4: vLLM's mllama4.py imports transformers' Llama4 image processor,
  which imports torchvision (vLLM pins torchvision==0.29.0;
  tools/vllm-requirements.txt leaves it out):

    pip install --no-deps --target /tmp/vllm-tv torchvision==0.29.0
    PYTHONPATH=/tmp/vllm-tv build/vllm-venv/bin/python tests/archs/record_vllm.py --write vllm-llama4-tp2
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
VLLM_TESTS = os.path.join(ROOT, "tests", "vllm")
sys.path[:0] = [VLLM_TESTS, os.path.join(ROOT, "tools")]

import checkpoint  # noqa: E402  (tests/vllm)
import launch  # noqa: E402  (tests/vllm)

DATA = os.path.join(ROOT, "tests", "data", "archs")

# GLM-4.5-Air's fields at toy sizes (attention_bias, one dense layer first,
# 1 shared expert, the MTP layer the main model skips) with GLM-4.5's q/k norms.
GLM = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": 64,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "intermediate_size": 128, "moe_intermediate_size": 32, "n_routed_experts": 8, "n_shared_experts": 1,
    "num_experts_per_tok": 2, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
    "routed_scaling_factor": 1.0, "norm_topk_prob": True, "attention_bias": True, "use_qk_norm": True,
    "partial_rotary_factor": 0.5, "num_nextn_predict_layers": 1, "vocab_size": 512, "rms_norm_eps": 1e-5,
    "rope_theta": 1000000, "max_position_embeddings": 256, "tie_word_embeddings": False, "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}

# gpt-oss-120b's fields (https://huggingface.co/openai/gpt-oss-120b config.json, samples/gpt-oss-120b)
# at toy sizes, BF16 (no quantization_config).
GPT_OSS = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 64,
    "num_local_experts": 8, "num_experts_per_tok": 2, "experts_per_token": 2, "vocab_size": 512,
    "attention_bias": True, "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"],
    "rms_norm_eps": 1e-5, "rope_theta": 150000, "max_position_embeddings": 256, "initial_context_length": 64,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 4.0, "original_max_position_embeddings": 64,
                     "rope_type": "yarn", "truncate": False},
    "swiglu_limit": 7.0, "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16",
}

# Qwen3-Next-80B-A3B-Instruct's fields (config.json: layer types from
# full_attention_interval, all layers MoE, gated attention, 1 shared expert
# with its sigmoid gate) at toy sizes: 4 layers (linear, full, linear, full),
# 4 key / 8 value linear-attention heads so that each TP2 rank holds two
# key-head groups of in_proj_qkvz.
QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 64,
    "num_hidden_layers": 4, "full_attention_interval": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "partial_rotary_factor": 0.25, "attention_bias": False, "attention_dropout": 0.0,
    "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "intermediate_size": 96,
    "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True, "output_router_logits": False,
    "router_aux_loss_coef": 0.001, "vocab_size": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000000,
    "rope_scaling": None, "max_position_embeddings": 256, "tie_word_embeddings": False, "hidden_act": "silu",
    "use_sliding_window": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
}

# Llama-4's fields (Scout's config.json; Maverick's interleave_moe_layer_step
# 2 so that dense and MoE layers alternate: moe_layers [1, 3]) at toy sizes:
# intermediate_size (experts and shared expert) != intermediate_size_mlp
# (the dense layers), layer 3 NoPE (no_rope_layers), chunked attention on the
# RoPE layers, a one-layer vision tower (hidden 32 = 4 heads of 8; its
# intermediate_size is 4 x hidden, as the pixel shuffle needs).
LLAMA4 = {
    "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
    "boi_token_index": 500, "eoi_token_index": 501, "image_token_index": 502, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "llama4_text", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 32, "intermediate_size_mlp": 96,
        "num_local_experts": 8, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "moe_layers": [1, 3],
        "no_rope_layers": [1, 1, 1, 0], "attention_chunk_size": 8192, "use_qk_norm": True,
        "attention_bias": False, "attention_dropout": 0.0, "vocab_size": 512, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                                                 "original_max_position_embeddings": 64, "rope_type": "llama3"},
        "max_position_embeddings": 1024, "hidden_act": "silu", "router_aux_loss_coef": 0.001,
        "router_jitter_noise": 0.0, "output_router_logits": False, "bos_token_id": 1, "eos_token_id": 2,
        "pad_token_id": 3, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
    "vision_config": {
        "model_type": "llama4_vision_model", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
        "intermediate_size": 128, "num_channels": 3, "image_size": 28, "patch_size": 14,
        "pixel_shuffle_ratio": 0.5, "projector_input_dim": 64, "projector_output_dim": 64,
        "vision_output_dim": 64, "multi_modal_projector_bias": False, "hidden_act": "gelu", "norm_eps": 1e-5,
        "rope_theta": 10000, "attention_dropout": 0.0, "projector_dropout": 0.0,
        "vision_feature_layer": -1, "vision_feature_select_strategy": "default",
    },
}

# name: config, vLLM settings (tp, pp, dp, ep) and the `reshard init --infer` that describes the ranks.
CASES = {
    "vllm-glm4moe-tp2": dict(config=GLM, tp=2, pp=1, dp=1, ep=False, infer="vllm:tp=2"),
    "vllm-glm4moe-tp2-dp2-ep": dict(config=GLM, tp=2, pp=1, dp=2, ep=True, infer="vllm:tp=2,dp=2,ep"),
    "vllm-gptoss-tp2": dict(config=GPT_OSS, tp=2, pp=1, dp=1, ep=False, infer="vllm:tp=2"),
    "vllm-gptoss-tp2-dp2": dict(config=GPT_OSS, tp=2, pp=1, dp=2, ep=False, infer="vllm:tp=2,dp=2"),
    "vllm-gptoss-tp2-dp2-ep": dict(config=GPT_OSS, tp=2, pp=1, dp=2, ep=True, infer="vllm:tp=2,dp=2,ep"),
    "vllm-qwen3next-tp2": dict(config=QWEN3_NEXT, tp=2, pp=1, dp=1, ep=False, infer="vllm:tp=2"),
    "vllm-qwen3next-tp2-dp2-ep": dict(config=QWEN3_NEXT, tp=2, pp=1, dp=2, ep=True, infer="vllm:tp=2,dp=2,ep"),
    "vllm-llama4-tp2": dict(config=LLAMA4, tp=2, pp=1, dp=1, ep=False, infer="vllm:tp=2"),
    "vllm-llama4-tp2-dp2-ep": dict(config=LLAMA4, tp=2, pp=1, dp=2, ep=True, infer="vllm:tp=2,dp=2,ep"),
}


def qwen3_next_layer_types(c):
    """transformers' Qwen3NextConfig: layer_types, else every
    full_attention_interval-th layer full attention (default 4)."""
    if c.get("layer_types"):
        return list(c["layer_types"])
    n = c.get("full_attention_interval", 4)
    return ["linear_attention" if (i + 1) % n else "full_attention" for i in range(c["num_hidden_layers"])]


def _qwen3_next_layer(p, c, kind):
    """[(name, shape)] of one Qwen3-Next decoder layer (transformers'
    Qwen3NextDecoderLayer; experts per expert as the released checkpoint
    stores them)."""
    H, I, E = c["hidden_size"], c["moe_intermediate_size"], c["num_experts"]
    out = []
    if kind == "linear_attention":
        hk, hv, nk, nv = (c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_num_key_heads"],
                          c["linear_num_value_heads"])
        kd, vd = hk * nk, hv * nv
        out += [(p + "linear_attn.in_proj_qkvz.weight", [2 * kd + 2 * vd, H]),
                (p + "linear_attn.in_proj_ba.weight", [2 * nv, H]),
                (p + "linear_attn.conv1d.weight", [2 * kd + vd, 1, c["linear_conv_kernel_dim"]]),
                (p + "linear_attn.dt_bias", [nv]), (p + "linear_attn.A_log", [nv]),
                (p + "linear_attn.norm.weight", [hv]), (p + "linear_attn.out_proj.weight", [H, vd])]
    else:
        nh, nkv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        out += [(p + "self_attn.q_proj.weight", [2 * nh * d, H]), (p + "self_attn.k_proj.weight", [nkv * d, H]),
                (p + "self_attn.v_proj.weight", [nkv * d, H]), (p + "self_attn.o_proj.weight", [H, nh * d]),
                (p + "self_attn.q_norm.weight", [d]), (p + "self_attn.k_norm.weight", [d])]
    for e in range(E):
        q = f"{p}mlp.experts.{e}."
        out += [(q + "gate_proj.weight", [I, H]), (q + "up_proj.weight", [I, H]), (q + "down_proj.weight", [H, I])]
    S = c["shared_expert_intermediate_size"]
    out += [(p + "mlp.gate.weight", [E, H]), (p + "mlp.shared_expert.gate_proj.weight", [S, H]),
            (p + "mlp.shared_expert.up_proj.weight", [S, H]), (p + "mlp.shared_expert.down_proj.weight", [H, S]),
            (p + "mlp.shared_expert_gate.weight", [1, H]),
            (p + "input_layernorm.weight", [H]), (p + "post_attention_layernorm.weight", [H])]
    return out


def qwen3_next_tensors(c):
    """[(name, shape)] of a Qwen3-Next checkpoint (all layers MoE, as the
    released models: decoder_sparse_step 1, no mlp_only_layers), its MTP
    layer included."""
    if c.get("mlp_only_layers") or c.get("decoder_sparse_step", 1) != 1:
        raise ValueError("qwen3_next_tensors: dense layers are not written")
    H, V = c["hidden_size"], c["vocab_size"]
    out = [("model.embed_tokens.weight", [V, H])]
    for i, kind in enumerate(qwen3_next_layer_types(c)):
        out += _qwen3_next_layer(f"model.layers.{i}.", c, kind)
    out += [("model.norm.weight", [H]), ("lm_head.weight", [V, H])]
    # The MTP module (vLLM's Qwen3NextMTP; Qwen3NextForCausalLM maps mtp.* to nothing).
    out += [("mtp.fc.weight", [H, 2 * H]), ("mtp.pre_fc_norm_embedding.weight", [H]),
            ("mtp.pre_fc_norm_hidden.weight", [H]), ("mtp.norm.weight", [H])]
    out += _qwen3_next_layer("mtp.layers.0.", c, "full_attention")
    return out


def llama4_tensors(c):
    """[(name, shape)] of a Llama-4 checkpoint (Llama4ForConditionalGeneration):
    language_model.* with fused, transposed experts on the MoE layers
    ((i + 1) % interleave_moe_layer_step == 0), vision_model.*, multi_modal_projector."""
    t, v = c["text_config"], c["vision_config"]
    H, V, nh, nkv, d = t["hidden_size"], t["vocab_size"], t["num_attention_heads"], t["num_key_value_heads"], \
        t["head_dim"]
    I, Imlp, E, step = t["intermediate_size"], t["intermediate_size_mlp"], t["num_local_experts"], \
        t["interleave_moe_layer_step"]
    out = [("language_model.model.embed_tokens.weight", [V, H])]
    for i in range(t["num_hidden_layers"]):
        p = f"language_model.model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", [nh * d, H]), (p + "self_attn.k_proj.weight", [nkv * d, H]),
                (p + "self_attn.v_proj.weight", [nkv * d, H]), (p + "self_attn.o_proj.weight", [H, nh * d])]
        if step > 0 and (i + 1) % step == 0:
            f = p + "feed_forward."
            out += [(f + "router.weight", [E, H]), (f + "experts.gate_up_proj", [E, H, 2 * I]),
                    (f + "experts.down_proj", [E, I, H]), (f + "shared_expert.gate_proj.weight", [I, H]),
                    (f + "shared_expert.up_proj.weight", [I, H]), (f + "shared_expert.down_proj.weight", [H, I])]
        else:
            f = p + "feed_forward."
            out += [(f + "gate_proj.weight", [Imlp, H]), (f + "up_proj.weight", [Imlp, H]),
                    (f + "down_proj.weight", [H, Imlp])]
        out += [(p + "input_layernorm.weight", [H]), (p + "post_attention_layernorm.weight", [H])]
    out += [("language_model.model.norm.weight", [H]), ("language_model.lm_head.weight", [V, H])]
    vh, vi, C, P = v["hidden_size"], v["intermediate_size"], v["num_channels"], v["patch_size"]
    patches = (v["image_size"] // P) ** 2 + 1
    out += [("vision_model.patch_embedding.linear.weight", [vh, C * P * P]), ("vision_model.class_embedding", [vh]),
            ("vision_model.positional_embedding_vlm", [patches, vh]),
            ("vision_model.layernorm_pre.weight", [vh]), ("vision_model.layernorm_pre.bias", [vh]),
            ("vision_model.layernorm_post.weight", [vh]), ("vision_model.layernorm_post.bias", [vh])]
    for i in range(v["num_hidden_layers"]):
        p = f"vision_model.model.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out += [(p + f"self_attn.{proj}.weight", [vh, vh]), (p + f"self_attn.{proj}.bias", [vh])]
        out += [(p + "mlp.fc1.weight", [vi, vh]), (p + "mlp.fc1.bias", [vi]), (p + "mlp.fc2.weight", [vh, vi]),
                (p + "mlp.fc2.bias", [vh])]
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out += [(p + norm + ".weight", [vh]), (p + norm + ".bias", [vh])]
    a = "vision_model.vision_adapter.mlp."
    out += [(a + "fc1.weight", [v["projector_input_dim"], vi]),
            (a + "fc2.weight", [v["projector_output_dim"], v["projector_input_dim"]])]
    if v.get("multi_modal_projector_bias"):
        out += [(a + "fc1.bias", [v["projector_input_dim"]]), (a + "fc2.bias", [v["projector_output_dim"]])]
    out += [("multi_modal_projector.linear_1.weight", [H, v["vision_output_dim"]])]
    return out


# model_type: its checkpoint's [(name, shape)], for the models `reshard init --train hf` does not list.
CHECKPOINT_TENSORS = {"qwen3_next": qwen3_next_tensors, "llama4": llama4_tensors}


def gpt_oss_checkpoint(values, config):
    """The model spec's per-expert [out, in] tensors fused as GptOssExperts holds them."""
    import torch

    out, experts = {}, {}
    pattern = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.(weight|bias)$")
    for name, x in values.items():
        m = pattern.match(name)
        if m:
            experts.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3), m.group(4))] = x
        else:
            out[name] = x
    E = config["num_local_experts"]
    for prefix, t in experts.items():
        # gate_up_proj [E, H, 2I]: column 2j is gate row j, column 2j + 1 up row j.
        gate_up = torch.stack([torch.stack([t[(e, "gate", "weight")], t[(e, "up", "weight")]], dim=1)
                               .reshape(-1, t[(e, "gate", "weight")].shape[1]) for e in range(E)])
        out[prefix + ".gate_up_proj"] = gate_up.transpose(1, 2).contiguous()
        out[prefix + ".gate_up_proj_bias"] = torch.stack(
            [torch.stack([t[(e, "gate", "bias")], t[(e, "up", "bias")]], dim=1).reshape(-1) for e in range(E)])
        out[prefix + ".down_proj"] = torch.stack([t[(e, "down", "weight")].t() for e in range(E)]).contiguous()
        out[prefix + ".down_proj_bias"] = torch.stack([t[(e, "down", "bias")] for e in range(E)])
    return out


def make_checkpoint(reshard, cfg, directory, seed=1):
    if cfg["model_type"] in CHECKPOINT_TENSORS:
        import torch

        tensors = [(n, shape, torch.bfloat16) for n, shape in CHECKPOINT_TENSORS[cfg["model_type"]](cfg)]
        checkpoint.write(directory, cfg, checkpoint.checkpoint_tensors(cfg, checkpoint.random_values(tensors, seed)))
        return
    spec_dir = os.path.join(directory, "spec")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f)
    subprocess.run([reshard, "init", "--hf-config", os.path.join(directory, "config.json"), "--train", "hf",
                    "--infer", "hf", "-o", spec_dir, "-q"], check=True)
    with open(os.path.join(spec_dir, "model.json")) as f:
        spec = json.load(f)
    values = checkpoint.random_values(checkpoint.expand(spec), seed)
    if cfg["model_type"] == "gpt_oss":
        values = gpt_oss_checkpoint(values, cfg)
    checkpoint.write(directory, cfg, checkpoint.checkpoint_tensors(cfg, values))


def without_missing_cpu_conv_pack():
    """This CUDA wheel's vllm._custom_ops has the Python wrapper
    causal_conv1d_weight_pack but not its op (torch.ops._C has no CPU
    kernels), and dispatch_cpu_unquantized_gemm (layers/utils.py) asks
    hasattr(ops, "causal_conv1d_weight_pack") before it prepacks a
    [C, 1, 4] bf16 causal-conv weight on an AVX512-BF16 CPU: without the op
    the wrapper goes, so the conv weight stays [C, 1, K], as it does where
    that op is not built, and as a GPU rank holds it. Returns what it removed."""
    import torch
    from vllm import _custom_ops as ops

    if hasattr(ops, "causal_conv1d_weight_pack") and not hasattr(torch.ops._C, "causal_conv1d_weight_pack"):
        del ops.causal_conv1d_weight_pack
        return ["vllm._custom_ops.causal_conv1d_weight_pack (no torch.ops._C op behind it)"]
    return []


def rank_main(argv):
    """One rank (launched by dump_case): tests/vllm/rank_dump.py, after
    without_missing_cpu_conv_pack()."""
    import engine  # noqa: F401  (tests/vllm: sets the CPU environment before vLLM is imported)
    import rank_dump

    without_missing_cpu_conv_pack()
    sys.argv = [os.path.join(VLLM_TESTS, "rank_dump.py")] + argv
    rank_dump.main()


def check_imports(cfg):
    """vLLM's mllama4.py imports transformers' Llama4 image processor, which
    imports torchvision: vLLM 0.33 pins torchvision==0.29.0, which
    tools/vllm-requirements.txt leaves out (media packages). The ranks
    inherit PYTHONPATH, e.g. one where `pip install --no-deps --target DIR
    torchvision==0.29.0` put it."""
    import importlib.util

    if cfg["model_type"] == "llama4" and importlib.util.find_spec("torchvision") is None:
        raise SystemExit("record_vllm: llama4 needs torchvision==0.29.0 (vLLM 0.33's pin; mllama4.py imports "
                         "transformers' Llama4 image processor): install it in the vLLM venv, or "
                         "`pip install --no-deps --target DIR torchvision==0.29.0` and set PYTHONPATH=DIR")


def dump_case(reshard, name, work):
    c = CASES[name]
    check_imports(c["config"])
    model_dir, out = os.path.join(work, name, "model"), os.path.join(work, name, "dump")
    make_checkpoint(reshard, c["config"], model_dir)
    os.makedirs(out, exist_ok=True)
    world = c["tp"] * c["pp"] * c["dp"]
    settings = {k: c[k] for k in ("tp", "pp", "dp", "ep")}
    # Qwen3-Next's GDN conv1d needs the CPU workaround above; the other models run rank_dump.py as is.
    rank = ([os.path.abspath(__file__), "--rank"] if c["config"]["model_type"] == "qwen3_next"
            else [os.path.join(VLLM_TESTS, "rank_dump.py")])
    launch.run(world, rank + [model_dir, out, json.dumps(settings)],
               python=sys.executable, timeout_s=900, label=name, log_dir=os.path.join(work, name))
    ranks = []
    for r in range(world):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            ranks.append(json.load(f))
    return ranks


def main(argv=None):
    import dump_state_dict

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build folder (its reshard binary)")
    ap.add_argument("--write", action="store_true", help="write the dumps into tests/data/archs/<case>/")
    ap.add_argument("--work", help="where to keep checkpoints, dumps and rank logs (default: a temporary folder)")
    ap.add_argument("case", nargs="*", help=f"cases (default: all): {', '.join(CASES)}")
    a = ap.parse_args(argv)
    reshard = os.path.join(a.build, "reshard")
    work = a.work or tempfile.mkdtemp(prefix="reshard-archs-")
    bad = 0
    for name in a.case or list(CASES):
        start = time.time()
        ranks = dump_case(reshard, name, work)
        d = os.path.join(DATA, name)
        if a.write:
            os.makedirs(d, exist_ok=True)
            dump_state_dict.write_json(os.path.join(d, "dump.json"), ranks)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(CASES[name]["config"], f, indent=2)
                f.write("\n")
            print(f"{name}: wrote {d} ({len(ranks)} ranks, {time.time() - start:.1f} s)", flush=True)
            continue
        with open(os.path.join(d, "dump.json")) as f:
            same = json.load(f) == ranks
        bad += not same
        print(f"{name}: {'equal to' if same else 'DIFFERENT from'} the recorded dump ({time.time() - start:.1f} s)",
              flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank"]:
        rank_main(sys.argv[2:])
        sys.exit(0)
    sys.exit(main())
