#!/usr/bin/env python3
"""Real Megatron-Core 0.19.2 ranks (CPU, Gloo, the local layer spec: the TE
spec needs a GPU) for the architectures issue 31 added to `reshard init`,
built as Megatron-Bridge's GLM-4.5 and GPT-OSS providers configure a GPTModel
for them, each rank inside Float16Module (bf16, as RL training runs it);
writes or compares tests/data/archs/<case>/{config.json,dump.json} (every
rank's named_parameters() plus persistent buffers: tools/dump_state_dict.py).
InitArchs.RealRanksHaveZeroDifferences (tests/init_test.cc) runs `reshard init
--train megatron:...,spec=local` + `reshard check` on each dump.

    build/venv/bin/python tests/archs/record_megatron.py [--write] [CASE ...]

- GLM-4.5 (glm4_moe): add_qkv_bias, qk_layernorm, rotary_percent 0.5,
  moe_layer_freq with the first layer dense, a shared expert
  (moe_shared_expert_intermediate_size), the sigmoid router with its fp32
  expert_bias (moe_router_enable_expert_bias).
- gpt-oss: add_bias_linear (q/k/v/o, router and experts' biases),
  softmax_type "learnable" (core_attention.softmax_offset: the sinks),
  window_size / window_attn_skip_freq, glu_linear_offset 1 and
  activation_func_clamp_value 7 (no parameters of their own).
- Qwen3-Next (qwen3_next): experimental_attention_variant "gated_delta_net"
  with linear_attention_freq from the config's layer_types (GatedDeltaNet:
  in_proj, conv1d, A_log, dt_bias, out_norm, out_proj), attention_output_gate
  (linear_qkv holds each query group's queries, then their gates, then k, v),
  qk_layernorm, rotary_percent 0.25, every layer MoE with a shared expert and
  its gate (moe_shared_expert_gate: shared_experts.gate_weight [1, H]).
- Llama 4 (llama4, the text model of Llama4ForConditionalGeneration):
  moe_layer_freq from text_config.moe_layers (interleave_moe_layer_step 2:
  dense layers 0, 2, MoE layers 1, 3, as Llama4TextConfig counts them),
  ffn_hidden_size intermediate_size_mlp for the dense layers,
  moe_ffn_hidden_size and the shared expert intermediate_size, sigmoid top-1
  router applied on the input, qk_l2_norm (L2Norm: no parameters) on the RoPE
  layers only, no_rope_freq from no_rope_layers (1 = NoPE there, 0 here),
  rotary_interleaved.

Megatron-Core 0.19.2 builds Qwen3-Next only through
get_transformer_block_with_experimental_attention_variant_spec, which asserts
transformer_impl "transformer_engine" and takes TE modules
(experimental_attention_variant_module_specs.py, _get_backend_spec_provider);
get_gpt_decoder_layer_specs refuses the variant. So the local layers are put
together here from Megatron's own local modules, exactly as that function
lays them out, the TE-only pieces replaced as the local GPT spec replaces
them: GatedDeltaNet(in_proj ColumnParallelLinear, out_norm WrappedTorchNorm,
out_proj RowParallelLinear) with an unfused input_layernorm (the TE spec fuses
it into in_proj.layer_norm_weight), and the attention and MoE of
get_gpt_layer_local_spec. GatedDeltaNet's constructor refuses to run without
the flash-linear-attention package (`if not HAVE_FLA: raise ImportError`,
ssm/gated_delta_net/common.py _GDNBase.__init__), which it only needs in
forward (its kernels): the flag is set for the construction. WrappedTorchNorm
refuses layernorm_zero_centered_gamma (torch_norm.py), which Megatron-Bridge
sets for Qwen3-Next: it changes no name, shape or dtype (TE's norms then
compute with 1 + weight), so these ranks are built without it.

Megatron creates the router's expert_bias and the sinks on
torch.cuda.current_device(): on a CPU that is answered with "cpu". The
expert_bias is dumped in fp32, as TopKRouter keeps it from the first step on
(_maintain_float32_expert_bias: Float16Module's cast to bf16 is undone before
every forward and every state-dict load or save).
"""
import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path[:0] = [HERE, os.path.join(ROOT, "tests", "megatron"), os.path.join(ROOT, "tools")]

DATA = os.path.join(ROOT, "tests", "data", "archs")

GLM = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": 64,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "intermediate_size": 128, "moe_intermediate_size": 32, "n_routed_experts": 4, "n_shared_experts": 1,
    "num_experts_per_tok": 2, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
    "routed_scaling_factor": 1.0, "norm_topk_prob": True, "attention_bias": True, "use_qk_norm": True,
    "partial_rotary_factor": 0.5, "num_nextn_predict_layers": 0, "vocab_size": 250, "rms_norm_eps": 1e-5,
    "rope_theta": 1000000, "max_position_embeddings": 128, "tie_word_embeddings": False, "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}

GPT_OSS = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 32,
    "num_local_experts": 4, "num_experts_per_tok": 2, "experts_per_token": 2, "vocab_size": 250,
    "attention_bias": True, "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"] * 2,
    "rms_norm_eps": 1e-5, "rope_theta": 150000, "max_position_embeddings": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16",
}

QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 64,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "intermediate_size": 96, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
    "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "norm_topk_prob": True, "layer_types": ["linear_attention", "full_attention"] * 2, "full_attention_interval": 2,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "partial_rotary_factor": 0.25, "attention_bias": False, "vocab_size": 250,
    "rms_norm_eps": 1e-6, "rope_theta": 10000000, "max_position_embeddings": 128, "tie_word_embeddings": False,
    "hidden_act": "silu", "torch_dtype": "bfloat16",
}

# As the release's config.json: Llama4ForConditionalGeneration, the text model under text_config (its
# tensors language_model.model.*, language_model.lm_head.weight); the vision tower is no part of a
# Megatron GPTModel.
LLAMA4 = {
    "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "llama4_text", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 32, "intermediate_size_mlp": 96,
        "num_local_experts": 8, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "moe_layers": [1, 3],
        "use_qk_norm": True, "no_rope_layers": [1, 1, 1, 0], "attention_chunk_size": 8192, "attention_bias": False,
        "vocab_size": 250, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 128,
        "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16",
    },
}

# name: HF config, Megatron settings, `reshard init --train` describing the ranks.
CASES = {
    "megatron-glm4moe-tp2-pp2-ep2": dict(hf=GLM, world=4, tp=2, pp=2, ep=2, etp=1,
                                         train="megatron:tp=2,pp=2,ep=2,etp=1,spec=local"),
    # Megatron-Core refuses biases in MoE with expert-TP (transformer_config.py: "Bias in Moe is only
    # supported when ETP==1"), and so does reshard init.
    "megatron-gptoss-tp2-pp2-ep2": dict(hf=GPT_OSS, world=4, tp=2, pp=2, ep=2, etp=1,
                                        train="megatron:tp=2,pp=2,ep=2,etp=1,spec=local"),
    # Both layer kinds (linear_attention, full_attention) on both PP stages.
    "megatron-qwen3next-tp2-pp2-ep2": dict(hf=QWEN3_NEXT, world=4, tp=2, pp=2, ep=2, etp=1,
                                           train="megatron:tp=2,pp=2,ep=2,etp=1,spec=local"),
    # A dense layer then a MoE layer on each PP stage; layer 3 (stage 1's second) NoPE.
    "megatron-llama4-tp2-pp2-ep2": dict(hf=LLAMA4, world=4, tp=2, pp=2, ep=2, etp=1,
                                        train="megatron:tp=2,pp=2,ep=2,etp=1,spec=local"),
}
VOCAB_DIVISIBLE = 128  # Megatron-LM's make_vocab_size_divisible_by default


def text_config(hf):
    """The language model's config: Llama4ForConditionalGeneration's text_config, or the config."""
    return hf.get("text_config", hf)


def config(case):
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    hf = text_config(case["hf"])
    kw = dict(
        num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
        num_attention_heads=hf["num_attention_heads"], num_query_groups=hf["num_key_value_heads"],
        kv_channels=hf["head_dim"], normalization="RMSNorm", layernorm_epsilon=hf["rms_norm_eps"],
        gated_linear_unit=True, tensor_model_parallel_size=case["tp"], pipeline_model_parallel_size=case["pp"],
        expert_model_parallel_size=case["ep"], expert_tensor_parallel_size=case["etp"], sequence_parallel=False,
        use_cpu_initialization=True, perform_initialization=False, params_dtype=torch.bfloat16, bf16=True,
        pipeline_dtype=torch.bfloat16, moe_grouped_gemm=False, moe_router_topk=hf["num_experts_per_tok"])
    if hf["model_type"] == "glm4_moe":  # Megatron-Bridge's GLM-4.5 provider
        k = hf["first_k_dense_replace"]
        kw.update(ffn_hidden_size=hf["intermediate_size"], activation_func=F.silu, add_bias_linear=False,
                  add_qkv_bias=hf["attention_bias"], qk_layernorm=hf["use_qk_norm"],
                  num_moe_experts=hf["n_routed_experts"], moe_ffn_hidden_size=hf["moe_intermediate_size"],
                  moe_shared_expert_intermediate_size=hf["moe_intermediate_size"] * hf["n_shared_experts"],
                  moe_layer_freq=[0] * k + [1] * (hf["num_hidden_layers"] - k),
                  moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
                  moe_router_pre_softmax=True, moe_router_dtype="fp32")
    elif hf["model_type"] == "qwen3_next":  # Megatron-Bridge's Qwen3-Next bridge (provider_bridge)
        n = hf["num_hidden_layers"]
        kw.update(ffn_hidden_size=hf["intermediate_size"], activation_func=F.silu, add_bias_linear=False,
                  add_qkv_bias=hf["attention_bias"], qk_layernorm=True, attention_output_gate=True,
                  num_moe_experts=hf["num_experts"], moe_ffn_hidden_size=hf["moe_intermediate_size"],
                  moe_shared_expert_intermediate_size=hf["shared_expert_intermediate_size"],
                  moe_shared_expert_gate=True,
                  moe_layer_freq=[int(i not in hf["mlp_only_layers"] and (i + 1) % hf["decoder_sparse_step"] == 0)
                                  for i in range(n)],
                  moe_router_pre_softmax=False, moe_router_dtype="fp32",
                  experimental_attention_variant="gated_delta_net",
                  linear_attention_freq=[int(t == "linear_attention") for t in hf["layer_types"]],
                  linear_conv_kernel_dim=hf["linear_conv_kernel_dim"],
                  linear_key_head_dim=hf["linear_key_head_dim"], linear_value_head_dim=hf["linear_value_head_dim"],
                  linear_num_key_heads=hf["linear_num_key_heads"],
                  linear_num_value_heads=hf["linear_num_value_heads"],
                  # Megatron-Bridge: True (TE norms); the local spec's WrappedTorchNorm refuses it (see above).
                  layernorm_zero_centered_gamma=False)
    elif hf["model_type"] == "llama4_text":  # Megatron-Bridge's Llama4ModelProvider (llama_provider.py)
        n = hf["num_hidden_layers"]
        kw.update(ffn_hidden_size=hf["intermediate_size_mlp"], activation_func=F.silu, add_bias_linear=False,
                  add_qkv_bias=hf["attention_bias"], num_moe_experts=hf["num_local_experts"],
                  moe_ffn_hidden_size=hf["intermediate_size"],
                  moe_shared_expert_intermediate_size=hf["intermediate_size"],
                  moe_layer_freq=[int(i in hf["moe_layers"]) for i in range(n)],
                  moe_router_score_function="sigmoid", moe_router_pre_softmax=False, moe_apply_probs_on_input=True,
                  qk_l2_norm=hf["use_qk_norm"], no_rope_freq=[1 - r for r in hf["no_rope_layers"]],
                  rotary_interleaved=True)
    else:  # Megatron-Bridge's GPT-OSS provider
        from megatron.core.activations import quick_gelu
        kw.update(ffn_hidden_size=hf["intermediate_size"], activation_func=quick_gelu, add_bias_linear=True,
                  add_qkv_bias=True, num_moe_experts=hf["num_local_experts"],
                  moe_ffn_hidden_size=hf["intermediate_size"], softmax_type="learnable",
                  window_size=(hf["sliding_window"] - 1, 0), window_attn_skip_freq=2, glu_linear_offset=1.0,
                  activation_func_clamp_value=hf["swiglu_limit"], bias_activation_fusion=False)
    return TransformerConfig(**kw)


def padded_vocab(case):
    multiple = VOCAB_DIVISIBLE * case["tp"]
    return -(-text_config(case["hf"])["vocab_size"] // multiple) * multiple


def _local_block(cfg, layer_specs):
    """This PP stage's slice of per-layer specs, as get_gpt_decoder_block_spec slices them."""
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    offset = get_transformer_layer_offset(cfg)
    local = layer_specs[offset:offset + get_num_layers_to_build(cfg)]
    return TransformerBlockSubmodules(layer_specs=local, layer_norm=LocalSpecProvider().layer_norm(rms_norm=True))


def hybrid_block_spec(cfg):
    """Qwen3-Next's layers as get_transformer_layer_with_experimental_attention_variant_spec lays them
    out (attention pattern from linear_attention_freq, MLP pattern from moe_layer_freq), with the local
    modules: see the docstring."""
    import copy

    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
        get_linear_attention_pattern, get_moe_layer_pattern)
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.ssm.gated_delta_net import GatedDeltaNet, GatedDeltaNetSubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec

    local = LocalSpecProvider()
    gdn = ModuleSpec(module=GatedDeltaNet, submodules=GatedDeltaNetSubmodules(
        in_proj=local.column_parallel_linear(), out_norm=local.layer_norm(rms_norm=True),
        out_proj=local.row_parallel_linear()))
    layers = []
    for linear, moe in zip(get_linear_attention_pattern(cfg), get_moe_layer_pattern(cfg)):
        spec = copy.deepcopy(get_gpt_layer_local_spec(
            num_experts=cfg.num_moe_experts if moe else None, moe_grouped_gemm=cfg.moe_grouped_gemm,
            qk_layernorm=cfg.qk_layernorm, normalization="RMSNorm"))
        if linear:
            spec.submodules.self_attention = gdn
            spec.submodules.sharded_state_dict_keys_map = {"input_layernorm.": "self_attention.in_proj.layer_norm_"}
        layers.append(spec)
    return _local_block(cfg, layers)


def llama4_block_spec(cfg):
    """get_gpt_decoder_block_spec with L2Norm on q and k (qk_l2_norm) on the RoPE layers only, as
    Llama4TextAttention (qk_norm only where use_rope) and Megatron-Bridge's get_llama4_layer_spec."""
    import copy

    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_layer_specs
    from megatron.core.transformer.identity_op import IdentityOp

    layers = []
    for spec, nope in zip(get_gpt_decoder_layer_specs(cfg, False, "RMSNorm", qk_l2_norm=cfg.qk_l2_norm),
                          cfg.no_rope_freq):
        spec = copy.deepcopy(spec)
        if nope:
            spec.submodules.self_attention.submodules.q_layernorm = IdentityOp
            spec.submodules.self_attention.submodules.k_layernorm = IdentityOp
        layers.append(spec)
    return _local_block(cfg, layers)


def build(case):
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.ssm.gated_delta_net import common as gdn_common
    from megatron.core.ssm.gated_delta_net import gdn as gdn_module
    from megatron.core.transformer.module import Float16Module

    cfg = config(case)
    hf = text_config(case["hf"])
    if cfg.experimental_attention_variant == "gated_delta_net":
        spec = hybrid_block_spec(cfg)
    elif cfg.qk_l2_norm:
        spec = llama4_block_spec(cfg)
    else:
        spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization="RMSNorm")
    saved = torch.cuda.current_device, gdn_common.HAVE_FLA, gdn_module.chunk_gated_delta_rule
    # expert_bias, softmax_offset, GatedDeltaNet's conv1d / dt_bias / A_log: created "on the GPU".
    torch.cuda.current_device = lambda: "cpu"
    # GatedDeltaNet needs FLA's kernels in forward only; it keeps chunk_gated_delta_rule as
    # self.gated_delta_rule and asserts it is set: a stand-in that says why, if ever called.
    gdn_common.HAVE_FLA, gdn_module.chunk_gated_delta_rule = True, _no_fla_kernel
    try:
        model = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=padded_vocab(case),
                         max_sequence_length=hf["max_position_embeddings"],
                         pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
                         share_embeddings_and_output_weights=False, position_embedding_type="rope",
                         rotary_percent=hf.get("partial_rotary_factor", 1.0),
                         rotary_base=int(hf["rope_theta"]))
    finally:
        torch.cuda.current_device, gdn_common.HAVE_FLA, gdn_module.chunk_gated_delta_rule = saved
    return Float16Module(cfg, model)


def _no_fla_kernel(*args, **kwargs):
    raise ImportError("flash-linear-attention is not installed: these ranks are built for their state dict only")


def _dump_rank(rank, name, tmp):
    import importlib.metadata

    import dump_state_dict
    from megatron.core import parallel_state as ps

    case = CASES[name]
    ps.initialize_model_parallel(tensor_model_parallel_size=case["tp"], pipeline_model_parallel_size=case["pp"],
                                 expert_model_parallel_size=case["ep"], expert_tensor_parallel_size=case["etp"])
    coords = {"tp": ps.get_tensor_model_parallel_rank(), "pp": ps.get_pipeline_model_parallel_rank(),
              "dp": ps.get_data_parallel_rank(), "ep": ps.get_expert_model_parallel_rank(),
              "etp": ps.get_expert_tensor_parallel_rank()}
    meta = {"framework": f"megatron-core {importlib.metadata.version('megatron-core')}", "megatron": coords}
    model = build(case)
    # Float16Module casts the router's expert_bias buffer to bf16; TopKRouter puts it back to fp32
    # before every forward and every state-dict load or save (_maintain_float32_expert_bias):
    # what a training rank holds from its first step on.
    for m in model.modules():
        if hasattr(m, "_maintain_float32_expert_bias"):
            m._maintain_float32_expert_bias()
    dump_state_dict.write(os.path.join(tmp, f"rank{rank}.json"), model, rank, strip="module.", meta=meta)


def dump_case(name):
    import ranks  # tests/megatron: one Gloo process per rank

    case = CASES[name]
    with tempfile.TemporaryDirectory() as tmp:
        ranks.spawn(case["world"], _dump_rank, name, tmp)
        out = []
        for r in range(case["world"]):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                out.append(json.load(f))
    return out


def main(argv=None):
    import dump_state_dict

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="write the dumps into tests/data/archs/<case>/")
    ap.add_argument("case", nargs="*", help=f"cases (default: all): {', '.join(CASES)}")
    a = ap.parse_args(argv)
    bad = 0
    for name in a.case or list(CASES):
        dumps = dump_case(name)
        d = os.path.join(DATA, name)
        if a.write:
            os.makedirs(d, exist_ok=True)
            dump_state_dict.write_json(os.path.join(d, "dump.json"), dumps)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(CASES[name]["hf"], f, indent=2)
                f.write("\n")
            print(f"{name}: wrote {d} ({len(dumps)} ranks)", flush=True)
            continue
        with open(os.path.join(d, "dump.json")) as f:
            same = json.load(f) == dumps
        bad += not same
        print(f"{name}: {'equal to' if same else 'DIFFERENT from'} the recorded dump", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
