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

# name: HF config, Megatron settings, `reshard init --train` describing the ranks.
CASES = {
    "megatron-glm4moe-tp2-pp2-ep2": dict(hf=GLM, world=4, tp=2, pp=2, ep=2, etp=1,
                                         train="megatron:tp=2,pp=2,ep=2,etp=1,spec=local"),
    # Megatron-Core refuses biases in MoE with expert-TP (transformer_config.py: "Bias in Moe is only
    # supported when ETP==1"), and so does reshard init.
    "megatron-gptoss-tp2-pp2-ep2": dict(hf=GPT_OSS, world=4, tp=2, pp=2, ep=2, etp=1,
                                        train="megatron:tp=2,pp=2,ep=2,etp=1,spec=local"),
}
VOCAB_DIVISIBLE = 128  # Megatron-LM's make_vocab_size_divisible_by default


def config(case):
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    hf = case["hf"]
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
    return -(-case["hf"]["vocab_size"] // multiple) * multiple


def build(case):
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer.module import Float16Module

    cfg = config(case)
    spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization="RMSNorm")
    current_device = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"  # expert_bias, softmax_offset: created "on the GPU"
    try:
        model = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=padded_vocab(case),
                         max_sequence_length=case["hf"]["max_position_embeddings"],
                         pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
                         share_embeddings_and_output_weights=False, position_embedding_type="rope",
                         rotary_percent=case["hf"].get("partial_rotary_factor", 1.0),
                         rotary_base=int(case["hf"]["rope_theta"]))
    finally:
        torch.cuda.current_device = current_device
    return Float16Module(cfg, model)


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
