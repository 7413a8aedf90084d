"""The FSDP2 cases of tests/fsdp2/run.py: tiny Hugging Face transformers
models (a dense Qwen3, a Qwen3-MoE with fused experts and a Qwen3-Next)
sharded by real FSDP2 / DTensor over 4 CPU processes.

Sizes are chosen so torch.chunk cuts unevenly (vocabulary 250 -> 63, 63, 63,
61 rows; hidden 30 -> 8, 8, 8, 6; intermediate 46 -> 12, 12, 12, 10) and so
that some tensors are smaller than the mesh (3 experts or the 3-row router
over 4 ranks: the last rank holds an empty [0, ...] shard). Heads stay whole
under TP2 (4 query heads, 2 KV heads), and every size vLLM splits over its
TP2 is even (vocabulary padded by vLLM to 256)."""

DENSE = {
    "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
    "vocab_size": 250, "hidden_size": 30, "intermediate_size": 46, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 64,
}

# transformers 5 fuses the experts: mlp.experts.gate_up_proj [E, 2I, H] (gate
# rows then up rows per expert) and mlp.experts.down_proj [E, H, I]; 3 experts
# over 4 ranks on dim 0: the last rank holds [0, 26, 30].
MOE = {
    "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
    "vocab_size": 250, "hidden_size": 30, "intermediate_size": 46, "moe_intermediate_size": 13,
    "num_experts": 3, "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "tie_word_embeddings": False, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 64, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
}

# FSDP2 refuses uneven shards on any dim but 0 ("FSDP does not support uneven
# sharding on dim 1: torch.Size([3, 26, 30]) (world size: 4)"), so the dim-1
# case needs 2I and H divisible by 4: gate_up_proj's 28 rows are 7 per rank
# (ranks 0, 1 hold gate rows, 2, 3 up rows: not what cutting each of gate and
# up would give), down_proj's H = 32 rows 8 per rank.
MOE_EVEN = dict(MOE, hidden_size=32, moe_intermediate_size=14)

# Qwen3-Next: a Gated DeltaNet layer then a gated full-attention layer, both
# MoE with a shared expert and shared_expert_gate. transformers 5 holds the
# checkpoint's fused q_proj [2 x 4 heads x 8, H] (per head [query; gate]),
# in_proj_qkvz [96, H] (per key head [q; k; v; z]), in_proj_ba [8, H] and
# conv1d [64, 1, 4] ([q; k; v] channels) as single parameters, which
# fully_shard chunks as a whole. Uneven here: the vocabulary, the router and
# the experts (3 over 4), shared_expert gate/up (10 rows -> 3, 3, 3, 1) and
# shared_expert_gate (1 row: 3 ranks empty), the norms (hidden 30 -> 8, 8, 8,
# 6). moe_intermediate_size 14: vLLM TP2 (no EP) cuts every expert's
# intermediate rows.
NEXT = {
    "model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"],
    "vocab_size": 250, "hidden_size": 30, "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "partial_rotary_factor": 0.25,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4, "num_experts": 3, "num_experts_per_tok": 2, "moe_intermediate_size": 14,
    "shared_expert_intermediate_size": 10, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
    "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "max_position_embeddings": 64,
}

CONFIGS = {"dense": DENSE, "moe": MOE, "moe-even": MOE_EVEN, "next": NEXT}

# Each case: the model, how it is sharded (mesh: "fsdp" 1-D over 4, "hsdp"
# dp_replicate 2 x dp_shard 2, "tp" dp_shard 2 x tp 2), the parameters'
# dtype (fp32: FSDP2's fp32 masters, bf16 compute through
# MixedPrecisionPolicy; bf16: model.to(bfloat16) before fully_shard), the
# experts' shard dim, activation checkpointing, the `reshard init --train`
# and `--infer` vLLM settings, and the hand-written layout in layouts/.
CASES = [
    dict(name="fsdp4-fp32", model="dense", mesh="fsdp", dtype="fp32",
         train="fsdp2:dp_shard=4,master=fp32", vllm="vllm:tp=2", layout="fsdp4-fp32.json",
         what="1-D FSDP2 over 4 ranks, fp32 masters (bf16 compute), uneven chunks"),
    dict(name="fsdp4-bf16", model="dense", mesh="fsdp", dtype="bf16",
         train="fsdp2:dp_shard=4,master=bf16", vllm="vllm:tp=2", layout="fsdp4-bf16.json",
         what="1-D FSDP2 over 4 ranks, bf16 parameters"),
    dict(name="hsdp2x2", model="dense", mesh="hsdp", dtype="fp32",
         train="fsdp2:dp_replicate=2,dp_shard=2,master=fp32", vllm="vllm:tp=2", layout="hsdp2x2.json",
         what="HSDP: dp_replicate 2 x dp_shard 2, fp32 masters"),
    dict(name="tp2-fsdp2", model="dense", mesh="tp", dtype="fp32",
         train="fsdp2:dp_shard=2,tp=2,master=fp32", vllm="vllm:tp=2", layout="tp2-fsdp2.json",
         what="TP2 (NeMo RL's plan) then FSDP2 over dp_shard 2 (_StridedShard), fp32 masters"),
    dict(name="moe-experts-dim0", model="moe", mesh="fsdp", dtype="fp32", experts_dim=0,
         train="fsdp2:dp_shard=4,master=fp32", vllm="vllm:tp=2,ep", layout="moe-experts-dim0.json",
         what="Qwen3-MoE, fused experts Shard(0) over 4 ranks (3 experts: rank 3 empty), fp32 masters"),
    dict(name="moe-experts-dim1", model="moe-even", mesh="fsdp", dtype="bf16", experts_dim=1,
         train="fsdp2:dp_shard=4,master=bf16,experts-dim=1", vllm="vllm:tp=2,ep", layout="moe-experts-dim1.json",
         what="Qwen3-MoE, fused experts Shard(1) (shard_placement_fn, as TorchTitan), bf16"),
    dict(name="fsdp4-ac", model="dense", mesh="fsdp", dtype="fp32", ac=True,
         train="fsdp2:dp_shard=4,master=fp32", vllm="vllm:tp=2", layout="fsdp4-fp32.json",
         what="1-D FSDP2 with activation checkpointing (checkpoint_wrapper: _checkpoint_wrapped_module. names)"),
    dict(name="fsdp4-next", model="next", mesh="fsdp", dtype="fp32",
         train="fsdp2:dp_shard=4,master=fp32", vllm="vllm:tp=2", layout="fsdp4-next.json",
         what="Qwen3-Next (Gated DeltaNet + gated attention, MoE + shared expert): fused q_proj, in_proj_qkvz, "
              "in_proj_ba, conv1d chunked whole over 4 ranks, fp32 masters; vLLM TP2 (A_log fp32)"),
]

BY_NAME = {c["name"]: c for c in CASES}

# Controls, so that a pass means something: `reshard check` of a case's real
# dumps against a layout for another setting must find differences (exit 1)
# naming what differs: init's layout for another --train, or init's own
# layout with the placements' "order" removed (FSDP cutting before TP: where
# a TP-local piece is uneven, 46 rows -> 23 | 23 -> 12 | 11, ranks hold other
# row counts; where sizes are even only the values tell, which the bit-exact
# refits check).
CHECK_CONTROLS = [
    ("fsdp4-fp32", "fsdp2:dp_shard=4,master=bf16", "wrong dtype"),  # fp32 masters are not bf16
    ("hsdp2x2", "fsdp2:dp_shard=4,master=fp32", "wrong shape"),  # HSDP shards over 2, not 4
    ("tp2-fsdp2", "fsdp2:dp_replicate=2,dp_shard=2,master=fp32", "wrong shape"),  # TP cuts q/k/v, o, mlp
    ("tp2-fsdp2", "no-order", "mlp.gate_proj.weight"),  # FSDP before TP
    ("moe-experts-dim1", "fsdp2:dp_shard=4,master=bf16", "mlp.experts.gate_up_proj"),  # experts on dim 0
]
