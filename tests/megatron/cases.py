"""The tiny Megatron-Core GPT models the framework tests build on CPU: each a
Hugging Face config (what a user has) and Megatron's parallel settings.

Every case's recorded dump, config.json and hand-written reshard specs live in
tests/data/megatron/<case>/.
"""

# Llama-style dense GQA model: 8 query heads in 2 groups of 4, head dim 16.
DENSE = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 4,
    "vocab_size": 250,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}

# Qwen3-MoE-style: 4 experts (top 2), q/k norms, every layer MoE.
MOE = {
    "model_type": "qwen3_moe",
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 48,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 4,
    "vocab_size": 250,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}

# Megatron settings: tp, pp, dp (derived: world / (tp * pp)), ep, etp (expert
# tensor parallel; Megatron's default is tp), and make_vocab_size_divisible_by
# (Megatron-LM's default 128): the vocab is padded to a multiple of
# vocab_divisible * tp (megatron/training/tokenizer: _vocab_size_with_padding).
CASES = {
    # vocab 250 -> 256 rows, 128 per TP rank: the last rank holds 6 rows of padding.
    "dense-tp2-pp2": dict(hf=DENSE, world=4, tp=2, pp=2, ep=1, etp=None, vocab_divisible=128),
    # TP 4 > 2 query groups: linear_qkv split evenly by rows of the interleaved matrix.
    "dense-tp4-qg2": dict(hf=DENSE, world=4, tp=4, pp=1, ep=1, etp=None, vocab_divisible=16),
    # vocab 250 with 128 x TP4 -> 512: rank 1 holds 122 real rows, ranks 2 and 3 only padding.
    "dense-tp4-padded": dict(hf=dict(DENSE, num_key_value_heads=4), world=4, tp=4, pp=1, ep=1, etp=None,
                             vocab_divisible=128),
    # Tied embeddings at PP2: the last stage holds output_layer.weight, a copy of the
    # embedding that Megatron keeps equal to it (its specs are what `reshard init` writes).
    "dense-tied-tp2-pp2": dict(hf=dict(DENSE, tie_word_embeddings=True), world=4, tp=2, pp=2, ep=1, etp=None,
                               vocab_divisible=128),
    # Virtual pipeline stages: 2 chunks per stage of one layer each; stage p holds layers p and
    # p + 2, each chunk's layer numbered 0 (its specs are what `reshard init` writes).
    "dense-tp2-pp2-vpp2": dict(hf=DENSE, world=4, tp=2, pp=2, vpp=2, ep=1, etp=None, vocab_divisible=128),
    # MoE at TP2 PP2 EP2 with experts not tensor-parallel (etp 1): 4 ranks, DP 1.
    "moe-tp2-pp2-ep2": dict(hf=MOE, world=4, tp=2, pp=2, ep=2, etp=1, vocab_divisible=128),
    # MoE at TP2 PP2 DP2 EP2 with expert-TP 2 (Megatron's default etp = tp): 8 ranks.
    "moe-tp2-pp2-dp2-ep2-etp2": dict(hf=MOE, world=8, tp=2, pp=2, ep=2, etp=2, vocab_divisible=128),
}


def padded_vocab(case):
    """Megatron-LM's _vocab_size_with_padding: a multiple of vocab_divisible * tp."""
    multiple = case["vocab_divisible"] * case["tp"]
    v = case["hf"]["vocab_size"]
    return ((v + multiple - 1) // multiple) * multiple
