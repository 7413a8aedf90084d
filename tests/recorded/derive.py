#!/usr/bin/env python3
"""Writes the recorded dumps of tests/data/recorded/megatron-te-*/: every
rank's parameters (name, dtype, shape) as Megatron-Core 0.19.2 with the
Transformer Engine layer spec would hold them -- TE cannot run here without a
GPU. The vLLM cases there are dumps of real vLLM 0.33 ranks
(tests/vllm/record.py); the vLLM rules below give their SOURCES.md the source
behind each name pattern, and check the bundled samples at full size.

The rules below are read from the frameworks' source, not from `reshard init`
(that would prove nothing): each parameter a rule emits names the source it
comes from (a key of SOURCES below), and each case's SOURCES.md lists, per
name pattern, that file and function. The dumps have the format of
tools/dump_state_dict.py (what `reshard check --state-dict` reads).

    python3 tests/recorded/derive.py [OUT]     (default OUT: tests/data/recorded)
    python3 tests/recorded/derive.py --samples OUT   (the samples' dumps, a few ranks each)

Deterministic: running it again rewrites the same files.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import dump_state_dict  # noqa: E402  (the dump writer the real runs use)

BF16, FP32, FP8 = "torch.bfloat16", "torch.float32", "torch.float8_e4m3fn"

MCORE = "megatron-core 0.19.2 (megatron/core/, as installed in the venv)"
TE = "TransformerEngine (NVIDIA/TransformerEngine, transformer_engine/pytorch/module/)"
VLLM = "vLLM (vllm-project/vllm, vllm/model_executor/)"

# Where each rule comes from. Megatron paths are relative to megatron/core/ of
# megatron-core 0.19.2 (line numbers of that installed copy); TE and vLLM are
# the stored source of the public repositories (commit where the index names one).
SOURCES = {
    # --- Megatron-Core 0.19.2 + TransformerEngine -------------------------------
    "mc.embedding": "models/common/embeddings/language_model_embedding.py LanguageModelEmbedding.__init__ "
    "l.56 (word_embeddings = tensor_parallel.VocabParallelEmbedding: rows = padded vocab / TP); padded vocab: "
    "Megatron-LM megatron/training/tokenizer/tokenizer.py _vocab_size_with_padding (a multiple of "
    "make_vocab_size_divisible_by x TP, default 128)",
    "mc.output": "models/gpt/gpt_model.py GPTModel.__init__ l.265-272 (output_layer = tensor_parallel."
    "ColumnParallelLinear unless MXFP8 output proj: [padded vocab / TP, hidden])",
    "mc.final_norm": "models/gpt/gpt_layer_specs.py get_gpt_decoder_block_spec (layer_norm=TENorm) -> "
    "extensions/transformer_engine.py TENorm.__new__ l.796-853 (te.pytorch.RMSNorm: `weight` [hidden], "
    "params_dtype)",
    "mc.te_qkv": "models/gpt/gpt_layer_specs.py get_gpt_layer_with_transformer_engine_submodules l.318-345 "
    "(linear_qkv=TELayerNormColumnParallelLinear, no input_layernorm: IdentityOp) -> transformer/attention.py "
    "SelfAttention (output (heads + 2 x query groups) x kv_channels, split over TP) -> "
    "extensions/transformer_engine.py TELayerNormColumnParallelLinear.__init__ l.1122-1315 "
    "(te.pytorch.LayerNormLinear, parallel_mode='column', params_dtype)",
    "te.ln_linear": "TE layernorm_linear.py LayerNormLinear.__init__ (registers `layer_norm_weight` "
    "[in_features] in params_dtype; `layer_norm_bias` only when normalization != 'RMSNorm'; `weight` "
    "[out_features / tp_size, in_features]; no `bias` Parameter when bias=False)",
    "mc.qk_norm": "models/gpt/gpt_layer_specs.py l.318 qk_norm = backend.layer_norm(for_qk=True) -> "
    "extensions/transformer_engine_spec_provider.py TESpecProvider.layer_norm (TENorm for TE >= 1.9); "
    "transformer/attention.py l.1722-1735 (hidden_size = hidden_size_per_attention_head)",
    "mc.te_proj": "extensions/transformer_engine.py TERowParallelLinear.__init__ l.1643-1730 (te.pytorch.Linear, "
    "parallel_mode='row': [hidden, in / TP]); transformer/attention.py / multi_latent_attention.py linear_proj",
    "mc.te_fc1_dense": "models/gpt/gpt_layer_specs.py get_mlp_module_spec_for_backend l.521-560 (dense MLP, "
    "TESpecProvider.fuse_layernorm_and_linear() is True -> linear_fc1 = TELayerNormColumnParallelLinear: the "
    "pre-MLP norm is `mlp.linear_fc1.layer_norm_weight`); l.336 pre_mlp_layernorm = IdentityOp when "
    "num_experts is None; transformer/mlp.py MLP.__init__ (fc1 out = 2 x ffn_hidden_size with "
    "gated_linear_unit)",
    "mc.te_fc2": "models/gpt/gpt_layer_specs.py get_mlp_module_spec_for_backend (linear_fc2 = "
    "TERowParallelLinear: [hidden, ffn / TP])",
    "mc.pre_mlp_norm": "models/gpt/gpt_layer_specs.py l.282/313/336 pre_mlp_layernorm = "
    "backend.layer_norm(has_residual=True) if num_experts (MoE layers only) -> TENorm (te.pytorch.RMSNorm "
    "or TEFusedResidualRMSNorm, both `weight` [hidden])",
    "mc.dense_layers": "models/gpt/gpt_layer_specs.py get_gpt_decoder_layer_specs l.563-673 (moe_layer_freq "
    "list: 0 = dense_layer_spec built with num_experts=None, 1 = moe_layer_spec) and "
    "get_gpt_decoder_block_spec (the stage's slice, layer numbers local to the stage)",
    "mc.router": "transformer/moe/router.py Router.__init__ l.61-84 (`weight` [num_moe_experts, hidden], "
    "cast to params_dtype; Float16Module casts to bf16 anyway)",
    "mc.expert_bias": "transformer/moe/router.py TopKRouter.__init__ l.178-198 (moe_router_enable_expert_bias: "
    "persistent buffer `expert_bias` [num_moe_experts] float32; `local_tokens_per_expert` is "
    "persistent=False) and _maintain_float32_expert_bias l.259-270 (kept float32 under Float16Module from "
    "the first forward / state_dict on)",
    "mc.grouped": "models/gpt/moe_module_specs.py get_moe_module_spec_for_backend -> "
    "extensions/transformer_engine_spec_provider.py TESpecProvider.grouped_mlp_modules (moe_grouped_gemm -> "
    "TEGroupedMLP with TEColumnParallelGroupedLinear / TERowParallelGroupedLinear) -> transformer/moe/"
    "experts.py TEGroupedMLP.__init__ l.182-250 (linear_fc1: num_local_experts GEMMs, out 2 x "
    "moe_ffn_hidden_size; linear_fc2: in moe_ffn_hidden_size) -> extensions/transformer_engine.py "
    "TEGroupedLinear.__init__ l.2106-2243 (explicit expert comm: out / in divided by expert TP before TE; "
    "moe_single_grouped_weight defaults False) -> TE grouped_linear.py GroupedLinear.__init__ "
    "(Parameters `weight{i}` [out, in] per GEMM i, params_dtype; `bias{i}` is a plain tensor, not a "
    "Parameter, when bias=False)",
    "mc.sequential": "extensions/transformer_engine_spec_provider.py TESpecProvider.grouped_mlp_modules "
    "(moe_grouped_gemm off, TE >= 1.7: SequentialMLP of TEColumnParallelLinear / TERowParallelLinear) -> "
    "transformer/moe/experts.py SequentialMLP.__init__ l.1267-1302 (local_experts = ModuleList of MLP with "
    "ffn_hidden_size = moe_ffn_hidden_size on the expert-TP group)",
    "mc.local_experts": "transformer/moe/moe_layer.py MoELayer.__init__ l.186-195 (num_local_experts = "
    "num_moe_experts / EP, local numbering from 0)",
    "mc.shared": "models/gpt/moe_module_specs.py _build_shared_experts (SharedExpertMLP with "
    "TEColumnParallelLinear / TERowParallelLinear) -> transformer/moe/shared_experts.py "
    "SharedExpertMLP.__init__ l.111-140 (ffn_hidden_size = moe_shared_expert_intermediate_size, the dense "
    "TP group; gate_weight only with moe_shared_expert_gate, off)",
    "mc.mla_norm_in": "models/gpt/gpt_layer_specs.py l.295-313 (MLA without mla_down_proj_fusion: "
    "input_layernorm = backend.layer_norm(has_residual=True) -> TENorm `weight` [hidden])",
    "mc.mla_down": "transformer/multi_latent_attention.py MLASelfAttention.__init__ l.524-601 "
    "(linear_q_down_proj [q_lora_rank, hidden] and linear_kv_down_proj [kv_lora_rank + qk_pos_emb_head_dim, "
    "hidden]; TELinear gets parallel_mode='duplicated': the full matrix on every rank)",
    "mc.mla_up": "transformer/multi_latent_attention.py MLASelfAttention.__init__ l.556-617 (linear_q_up_proj "
    "[heads x (qk_head_dim + qk_pos_emb_head_dim) / TP, q_lora_rank], linear_kv_up_proj [heads x "
    "(qk_head_dim + v_head_dim) / TP, kv_lora_rank]) with transformer/mla_qk_norm_config.py "
    "QKNormConfigResolver._resolve_mla_qk_layernorm (qk_layernorm=True and q/kv_layernorm IdentityOp in "
    "the TE spec: both up projections become TELayerNormColumnParallelLinear, the q_a / kv_a norms are "
    "their `layer_norm_weight`)",
    "mc.ranks": "parallel_state.py initialize_model_parallel l.601-617 (order 'tp-cp-ep-dp-pp': TP fastest, "
    "then DP, then PP), RankGenerator l.465, the expert rank generator l.887 (expert-TP fastest, then EP, "
    "then expert-DP, then PP); the real CPU runs of tests/data/megatron record these coordinates per rank",
    "mc.extra_state": "TE modules' `_extra_state` (TransformerEngineBaseModule.get_extra_state) is "
    "state_dict() only: neither a Parameter nor a registered buffer, so not in named_parameters() and not "
    "in the dump",
    # --- vLLM -----------------------------------------------------------------------
    "v.ranks": "rank r = dp_rank x TP + tp_rank (one engine group, TP fastest), the order of reshard's vLLM "
    "layouts; the expert rank under EP is vLLM's own (see the row of the experts)",
    "v.embed": "layers/vocab_parallel_embedding.py VocabParallelEmbedding.__init__ (pad_vocab_size to "
    "DEFAULT_VOCAB_PADDING_SIZE = 64, then num_embeddings_padded / TP rows per rank; unquantized: "
    "Fp8Config.get_quant_method returns a method only for LinearBase / FusedMoE / Attention)",
    "v.lm_head": "layers/vocab_parallel_embedding.py ParallelLMHead (a VocabParallelEmbedding: same padded "
    "rows); models/llama.py LlamaForCausalLM / deepseek_v2.py / qwen3_moe.py (untied: its own weight)",
    "v.norm": "layers/layernorm.py RMSNorm (`weight` [hidden_size] in the model dtype)",
    "v.qkv": "layers/linear.py QKVParallelLinear.__init__ (num_heads = total / TP; num_kv_heads = "
    "max(1, total_kv / TP), each replicated TP / total_kv times when TP > total_kv; weight "
    "[(num_heads + 2 x num_kv_heads) x head_dim, hidden]); models/llama.py LlamaAttention, "
    "models/qwen3_moe.py Qwen3MoeAttention (stacked_params_mapping q/k/v -> qkv_proj)",
    "v.qk_norm": "models/qwen3_moe.py Qwen3MoeAttention.__init__ (q_norm / k_norm = RMSNorm(head_dim))",
    "v.row": "layers/linear.py RowParallelLinear.__init__ (weight [out, in / TP])",
    "v.gate_up": "layers/linear.py MergedColumnParallelLinear.__init__ (output_sizes [ffn, ffn], each / TP: "
    "weight [2 x ffn / TP, hidden]); models/llama.py LlamaMLP, deepseek_v2.py DeepseekV2MLP "
    "(stacked_params_mapping gate_proj/up_proj -> gate_up_proj)",
    "v.moe_gate": "models/qwen3_moe.py Qwen3MoeSparseMoeBlock.__init__ (gate = ReplicatedLinear(hidden, "
    "num_experts, quant_config=None)); models/deepseek_v2.py DeepseekV2MoE.__init__ (gate = GateLinear, a "
    "ReplicatedLinear with quant_config=None, params_dtype = model dtype: "
    "layers/fused_moe/router/gate_linear.py GateLinear.__init__)",
    "v.score_bias": "models/deepseek_v2.py DeepseekV2MoE.__init__ (topk_method 'noaux_tc': "
    "gate.e_score_correction_bias = nn.Parameter(torch.empty(n_routed_experts, dtype=torch.float32)); "
    "the gate is registered before `experts`, so named_parameters() reports it there, not under the MoE "
    "runner that also references it)",
    "v.routed": "layers/fused_moe/routed_experts.py RoutedExperts (commit 002d6073aa03: 'This module owns "
    "the expert weight parameters (w13_weight, w2_weight, scales, etc.)', quant_method.create_weights("
    "layer=self)) held as `routed_experts` by the module models build as `experts`: FusedMoE.__init__ in "
    "layers/fused_moe/layer.py ('self.routed_experts = routed_experts', a stored version the index names no "
    "commit for) and runner/moe_runner.py MoERunner.__init__ (commit 01cb30845063, what FusedMoEFactory in "
    "models/deepseek_v2.py commit 002d6073aa03 builds): names `<prefix>.experts.routed_experts.w13_weight`; "
    "layers/fused_moe/unquantized_fused_moe_method.py create_weights (w13_weight [local experts, 2 x "
    "intermediate_per_partition, hidden], w2_weight [local experts, hidden, intermediate_per_partition]); "
    "the RoutedExperts buffers (_expert_map, expert_mask, routing tables) are persistent=False",
    "v.moe_parallel": "layers/fused_moe/config.py FusedMoEParallelConfig.flatten_tp_across_dp_and_pcp / make "
    "(flat size DP x TP, flat rank dp_rank x TP + tp_rank: without EP each expert's intermediate dim is "
    "split over the flat size; with enable_expert_parallel the experts are, ep_rank = flat rank, expert TP 1)",
    "v.expert_map": "layers/fused_moe/expert_map_manager.py determine_expert_map (expert_placement_strategy "
    "'linear', the default: base = E // ep_size, the first E % ep_size ranks hold base + 1, each a contiguous "
    "run starting at ep_rank x base + min(ep_rank, remainder))",
    "v.shared": "models/deepseek_v2.py DeepseekV2MoE.__init__ (shared_experts = DeepseekV2MLP with "
    "intermediate moe_intermediate_size x n_shared_experts, TP-sharded gate_up_proj / down_proj; "
    "registered before `experts`)",
    "v.shared_sp": "config/parallel.py ParallelConfig.use_sequence_parallel_moe (all2all_backend "
    "'allgather_reducescatter', the default, with enable_expert_parallel, TP > 1 and DP > 1) -> "
    "models/deepseek_v2.py DeepseekV2MoE.__init__ (shared_experts = DeepseekV2MLP(..., "
    "is_sequence_parallel=True): gate_up_proj / down_proj with disable_tp, whole on every rank; seen on real "
    "vLLM 0.33 ranks, tests/vllm)",
    "v.mla_fused_a": "models/deepseek_v2.py DeepseekV2MLAAttention.__init__ (q_lora_rank set: "
    "fused_qkv_a_proj = DeepSeekV2FusedQkvAProjLinear, a MergedColumnParallelLinear of [q_lora_rank, "
    "kv_lora_rank + qk_rope_head_dim] with disable_tp=True: the full matrix on every rank)",
    "v.mla_norms": "models/deepseek_v2.py DeepseekV2MLAAttention.__init__ (q_a_layernorm = "
    "RMSNorm(q_lora_rank), kv_a_layernorm = RMSNorm(kv_lora_rank))",
    "v.mla_up": "models/deepseek_v2.py DeepseekV2MLAAttention.__init__ (q_b_proj ColumnParallelLinear "
    "[heads x qk_head_dim / TP, q_lora_rank], kv_b_proj ColumnParallelLinear [heads x (qk_nope + v) / TP, "
    "kv_lora_rank], o_proj RowParallelLinear [hidden, heads x v_head_dim / TP]); the MLA wrapper "
    "(mla_attn) references the same modules, named_parameters() keeps the first path",
    "v.mla_layers": "models/deepseek_v2.py DeepseekV2DecoderLayer.__init__ (MoE when layer_idx >= "
    "first_k_dense_replace and layer_idx % moe_layer_freq == 0, else DeepseekV2MLP)",
    "v.fp8_linear": "layers/quantization/fp8.py Fp8LinearMethod.create_weights (checkpoint FP8 with "
    "weight_block_size [bn, bk]: weight float8_e4m3fn [out_per_partition, in_per_partition]; "
    "weight_scale_inv float32 [ceil(out_per_partition / bn), ceil(in_per_partition / bk)] -- 'The "
    "weight_scale_inv name is intentional for deepseekv3'; input_scale None with activation_scheme "
    "'dynamic') and quantization/utils/fp8_utils.py validate_fp8_block_shape (per-rank slices whole blocks; "
    "a merged layer's last part may be ragged)",
    "v.fp8_channel_linear": "layers/quantization/compressed_tensors/schemes/compressed_tensors_w8a8_fp8.py "
    "(commit 00cb05c39f77) CompressedTensorsW8A8Fp8.create_weights (create_fp8_weight_parameter: float8_e4m3fn "
    "[out_per_partition, in_per_partition]; create_fp8_scale_parameter with ChannelQuantScaleParameter: "
    "weight_scale float32 [sum(output_partition_sizes), 1]; no input_scale with dynamic per-token "
    "activations) and process_weights_after_loading (CHANNEL: `weight = weight.t()`, then "
    "Parameter(weight.data): the parameter is the transposed view, shape [in_per_partition, "
    "out_per_partition], its storage still [out, in] row-major)",
    "v.fp8_channel_moe": "layers/quantization/compressed_tensors/compressed_tensors_moe.py "
    "CompressedTensorsW8A8Fp8MoEMethod.create_weights (CHANNEL: w13_weight / w2_weight float8_e4m3fn as "
    "unquantized, w13_weight_scale float32 [local experts, 2 x I, 1], w2_weight_scale float32 [local "
    "experts, hidden, 1]); process_weights_after_loading replaces them with convert_to_fp8_moe_kernel_format's "
    "output (the Triton backend's layout assumed)",
    "v.fp8_moe": "layers/quantization/fp8.py Fp8MoEMethod.create_weights (block quant: w13_weight / "
    "w2_weight float8_e4m3fn, w13_weight_scale_inv float32 [local experts, 2 x ceil(I / bn), ceil(hidden / "
    "bk)], w2_weight_scale_inv float32 [local experts, ceil(hidden / bn), ceil(I / bk)], no input scales "
    "with activation_scheme 'dynamic')",
}


def cdiv(a, b):
    return -(-a // b)


class Rank:
    """One rank's parameters, in the order the modules register them."""

    def __init__(self, rank, meta):
        self.rank, self.meta, self.params, self.used = rank, meta, [], {}

    def add(self, name, dtype, shape, src, pattern, stride=None):
        assert src in SOURCES, src
        assert all(isinstance(s, int) and s > 0 for s in shape), (name, shape)
        p = {"name": name, "dtype": dtype, "shape": list(shape)}
        if stride is not None:  # a view, as tools/dump_state_dict.py records it
            p["stride"] = list(stride)
        self.params.append(p)
        self.used.setdefault(pattern, set()).add(src)


# --- the models' dimensions, from config.json (Hugging Face field names) -------------------

def dims(hf):
    d = dict(type=hf["model_type"], layers=hf["num_hidden_layers"], hidden=hf["hidden_size"],
             vocab=hf["vocab_size"], heads=hf["num_attention_heads"], tied=hf.get("tie_word_embeddings", False))
    d["kv_heads"] = hf.get("num_key_value_heads", d["heads"])
    d["head_dim"] = hf.get("head_dim", d["hidden"] // d["heads"])
    d["ffn"] = hf.get("intermediate_size")
    d["qk_norm"] = d["type"] in ("qwen3", "qwen3_moe")
    d["mla"] = d["type"] in ("deepseek_v3", "kimi_k2")  # Kimi-K2 is DeepseekV3ForCausalLM in both frameworks
    if d["type"] == "qwen3_moe":
        d.update(experts=hf["num_experts"], moe_ffn=hf["moe_intermediate_size"], first_moe=0, shared=0,
                 score_bias=False)
    elif d["mla"]:
        d.update(experts=hf["n_routed_experts"], moe_ffn=hf["moe_intermediate_size"],
                 first_moe=hf.get("first_k_dense_replace", 0), shared=hf.get("n_shared_experts") or 0,
                 score_bias=hf.get("topk_method") == "noaux_tc", q_lora=hf.get("q_lora_rank"),
                 kv_lora=hf["kv_lora_rank"], nope=hf["qk_nope_head_dim"], rope=hf["qk_rope_head_dim"],
                 v=hf["v_head_dim"])
        assert d["q_lora"], "the recorded MLA cases use q LoRA (DeepSeek-V3)"
    else:
        d.update(experts=0, first_moe=d["layers"], shared=0, score_bias=False)
    q = hf.get("quantization_config")
    d["fp8_block"] = tuple(q["weight_block_size"]) if q else None
    return d


def is_moe(d, layer):
    return d["experts"] > 0 and layer >= d["first_moe"]


# --- Megatron-Core 0.19.2, Transformer Engine layer spec, under Float16Module (bf16) ----------

def megatron_te(d, tp, pp, dp, ep, etp, grouped, vocab_divisible=128, pp_layers=None):
    """Every rank of GPTModel(transformer_layer_spec=TE spec) wrapped in Float16Module."""
    world = tp * pp * dp
    assert (tp * dp) % (ep * etp) == 0
    multiple = vocab_divisible * tp
    padded = cdiv(d["vocab"], multiple) * multiple
    stages = pp_layers or [d["layers"] // pp] * pp
    assert sum(stages) == d["layers"]
    H = d["hidden"]
    ranks = []
    for r in range(world):
        # parallel_state.RankGenerator: dense order tp-cp-ep-dp-pp (tp fastest); experts etp, ep, edp, pp.
        pp_r, w = divmod(r, tp * dp)
        dp_r, tp_r = divmod(w, tp)
        etp_r, ep_r = w % etp, (w // etp) % ep
        R = Rank(r, {"framework": "derived from " + MCORE + " + " + TE + " source (TE layer spec)",
                     "megatron": {"tp": tp_r, "pp": pp_r, "dp": dp_r, "ep": ep_r, "etp": etp_r}})
        if pp_r == 0:
            R.add("embedding.word_embeddings.weight", BF16, [padded // tp, H], "mc.embedding",
                  "embedding.word_embeddings.weight")
        first = sum(stages[:pp_r])
        for i in range(stages[pp_r]):
            g, L = first + i, f"decoder.layers.{i}."
            P = "decoder.layers.{i}."
            if d["mla"]:
                n, ql, kl = d["heads"], d["q_lora"], d["kv_lora"]
                R.add(L + "input_layernorm.weight", BF16, [H], "mc.mla_norm_in", P + "input_layernorm.weight")
                R.add(L + "self_attention.linear_proj.weight", BF16, [H, n * d["v"] // tp], "mc.te_proj",
                      P + "self_attention.linear_proj.weight")
                R.add(L + "self_attention.linear_q_down_proj.weight", BF16, [ql, H], "mc.mla_down",
                      P + "self_attention.linear_q_down_proj.weight")
                R.add(L + "self_attention.linear_q_up_proj.layer_norm_weight", BF16, [ql], "mc.mla_up",
                      P + "self_attention.linear_q_up_proj.layer_norm_weight")
                R.add(L + "self_attention.linear_q_up_proj.weight", BF16, [n * (d["nope"] + d["rope"]) // tp, ql],
                      "mc.mla_up", P + "self_attention.linear_q_up_proj.weight")
                R.add(L + "self_attention.linear_kv_down_proj.weight", BF16, [kl + d["rope"], H], "mc.mla_down",
                      P + "self_attention.linear_kv_down_proj.weight")
                R.add(L + "self_attention.linear_kv_up_proj.layer_norm_weight", BF16, [kl], "mc.mla_up",
                      P + "self_attention.linear_kv_up_proj.layer_norm_weight")
                R.add(L + "self_attention.linear_kv_up_proj.weight", BF16, [n * (d["nope"] + d["v"]) // tp, kl],
                      "mc.mla_up", P + "self_attention.linear_kv_up_proj.weight")
            else:
                hd, groups = d["head_dim"], d["kv_heads"]
                R.add(L + "self_attention.linear_proj.weight", BF16, [H, d["heads"] * hd // tp], "mc.te_proj",
                      P + "self_attention.linear_proj.weight")
                R.add(L + "self_attention.linear_qkv.layer_norm_weight", BF16, [H], "te.ln_linear",
                      P + "self_attention.linear_qkv.layer_norm_weight")
                R.add(L + "self_attention.linear_qkv.weight", BF16, [(d["heads"] + 2 * groups) * hd // tp, H],
                      "mc.te_qkv", P + "self_attention.linear_qkv.weight")
                if d["qk_norm"]:
                    R.add(L + "self_attention.q_layernorm.weight", BF16, [hd], "mc.qk_norm",
                          P + "self_attention.q_layernorm.weight")
                    R.add(L + "self_attention.k_layernorm.weight", BF16, [hd], "mc.qk_norm",
                          P + "self_attention.k_layernorm.weight")
            if not is_moe(d, g):
                R.add(L + "mlp.linear_fc1.layer_norm_weight", BF16, [H], "mc.te_fc1_dense",
                      P + "mlp.linear_fc1.layer_norm_weight (dense layers)")
                R.add(L + "mlp.linear_fc1.weight", BF16, [2 * d["ffn"] // tp, H], "mc.te_fc1_dense",
                      P + "mlp.linear_fc1.weight (dense layers)")
                R.add(L + "mlp.linear_fc2.weight", BF16, [H, d["ffn"] // tp], "mc.te_fc2",
                      P + "mlp.linear_fc2.weight (dense layers)")
                continue
            E, I = d["experts"], d["moe_ffn"]
            R.add(L + "pre_mlp_layernorm.weight", BF16, [H], "mc.pre_mlp_norm",
                  P + "pre_mlp_layernorm.weight (MoE layers)")
            R.add(L + "mlp.router.weight", BF16, [E, H], "mc.router", P + "mlp.router.weight")
            if d["score_bias"]:
                R.add(L + "mlp.router.expert_bias", FP32, [E], "mc.expert_bias", P + "mlp.router.expert_bias")
            for j in range(E // ep):
                if grouped:
                    R.add(L + f"mlp.experts.linear_fc1.weight{j}", BF16, [2 * I // etp, H], "mc.grouped",
                          P + "mlp.experts.linear_fc1.weight{j}")
                else:
                    R.add(L + f"mlp.experts.local_experts.{j}.linear_fc1.weight", BF16, [2 * I // etp, H],
                          "mc.sequential", P + "mlp.experts.local_experts.{j}.linear_fc1.weight")
            for j in range(E // ep):
                if grouped:
                    R.add(L + f"mlp.experts.linear_fc2.weight{j}", BF16, [H, I // etp], "mc.grouped",
                          P + "mlp.experts.linear_fc2.weight{j}")
                else:
                    R.add(L + f"mlp.experts.local_experts.{j}.linear_fc2.weight", BF16, [H, I // etp],
                          "mc.sequential", P + "mlp.experts.local_experts.{j}.linear_fc2.weight")
            R.used.setdefault("(local expert numbering j)", set()).add("mc.local_experts")
            if d["shared"]:
                S = d["shared"] * I
                R.add(L + "mlp.shared_experts.linear_fc1.weight", BF16, [2 * S // tp, H], "mc.shared",
                      P + "mlp.shared_experts.linear_fc1.weight")
                R.add(L + "mlp.shared_experts.linear_fc2.weight", BF16, [H, S // tp], "mc.shared",
                      P + "mlp.shared_experts.linear_fc2.weight")
        if d["experts"] and d["first_moe"] > 0:
            R.used.setdefault("(which layers are dense)", set()).add("mc.dense_layers")
        if pp_r == pp - 1:
            R.add("decoder.final_layernorm.weight", BF16, [H], "mc.final_norm", "decoder.final_layernorm.weight")
            assert not d["tied"]
            R.add("output_layer.weight", BF16, [padded // tp, H], "mc.output", "output_layer.weight")
        R.used.setdefault("(not listed: *._extra_state)", set()).add("mc.extra_state")
        R.used.setdefault("(rank numbering)", set()).add("mc.ranks")
        ranks.append(R)
    return ranks


# --- vLLM ---------------------------------------------------------------------------------------

def vllm(d, tp, dp=1, ep=False, quant=None):
    """Every rank of a vLLM engine group (ranks tp fastest, then DP), named_parameters() after loading."""
    H, flat = d["hidden"], dp * tp
    padded = cdiv(d["vocab"], 64) * 64
    fp8, channel = quant == "fp8-block", quant == "fp8-channel"
    if fp8:
        bn, bk = d["fp8_block"]
    ranks = []
    for r in range(dp * tp):
        dp_r, tp_r = divmod(r, tp)
        R = Rank(r, {"framework": "derived from " + VLLM + " source (see SOURCES.md for commits)",
                     "vllm": {"tp": tp_r, "dp": dp_r, "ep": (dp_r * tp + tp_r) if ep else None}})

        def linear(name, pattern, out, inp, src):
            """A LinearBase built with quant_config: FP8 block weights and their inverse scales, FP8
            per-channel weights (a transposed view after loading) and their scales, or bf16."""
            if fp8:
                R.add(name, FP8, [out, inp], "v.fp8_linear", pattern)
                R.add(name + "_scale_inv", FP32, [cdiv(out, bn), cdiv(inp, bk)], "v.fp8_linear", pattern + "_scale_inv")
            elif channel:
                R.add(name, FP8, [inp, out], "v.fp8_channel_linear", pattern, stride=[1, inp])
                R.add(name[:-len("weight")] + "weight_scale", FP32, [out, 1], "v.fp8_channel_linear",
                      pattern[:-len("weight")] + "weight_scale")
            R.used.setdefault(pattern, set()).add(src)
            if not fp8 and not channel:
                R.add(name, BF16, [out, inp], src, pattern)

        R.used.setdefault("(rank numbering)", set()).add("v.ranks")
        R.add("model.embed_tokens.weight", BF16, [padded // tp, H], "v.embed", "model.embed_tokens.weight")
        for g in range(d["layers"]):
            L, P = f"model.layers.{g}.", "model.layers.{g}."
            R.add(L + "input_layernorm.weight", BF16, [H], "v.norm", P + "input_layernorm.weight")
            if d["mla"]:
                n, ql, kl = d["heads"], d["q_lora"], d["kv_lora"]
                linear(L + "self_attn.fused_qkv_a_proj.weight", P + "self_attn.fused_qkv_a_proj.weight",
                       ql + kl + d["rope"], H, "v.mla_fused_a")
                R.add(L + "self_attn.q_a_layernorm.weight", BF16, [ql], "v.mla_norms",
                      P + "self_attn.q_a_layernorm.weight")
                linear(L + "self_attn.q_b_proj.weight", P + "self_attn.q_b_proj.weight",
                       n * (d["nope"] + d["rope"]) // tp, ql, "v.mla_up")
                R.add(L + "self_attn.kv_a_layernorm.weight", BF16, [kl], "v.mla_norms",
                      P + "self_attn.kv_a_layernorm.weight")
                linear(L + "self_attn.kv_b_proj.weight", P + "self_attn.kv_b_proj.weight",
                       n * (d["nope"] + d["v"]) // tp, kl, "v.mla_up")
                linear(L + "self_attn.o_proj.weight", P + "self_attn.o_proj.weight", H, n * d["v"] // tp, "v.mla_up")
            else:
                hd = d["head_dim"]
                kv_local = max(1, d["kv_heads"] // tp)
                linear(L + "self_attn.qkv_proj.weight", P + "self_attn.qkv_proj.weight",
                       (d["heads"] // tp + 2 * kv_local) * hd, H, "v.qkv")
                linear(L + "self_attn.o_proj.weight", P + "self_attn.o_proj.weight", H, d["heads"] * hd // tp, "v.row")
                if d["qk_norm"]:
                    R.add(L + "self_attn.q_norm.weight", BF16, [hd], "v.qk_norm", P + "self_attn.q_norm.weight")
                    R.add(L + "self_attn.k_norm.weight", BF16, [hd], "v.qk_norm", P + "self_attn.k_norm.weight")
            R.add(L + "post_attention_layernorm.weight", BF16, [H], "v.norm", P + "post_attention_layernorm.weight")
            if not is_moe(d, g):
                linear(L + "mlp.gate_up_proj.weight", P + "mlp.gate_up_proj.weight (dense layers)",
                       2 * d["ffn"] // tp, H, "v.gate_up")
                linear(L + "mlp.down_proj.weight", P + "mlp.down_proj.weight (dense layers)", H, d["ffn"] // tp,
                       "v.row")
                if d["mla"]:
                    R.used.setdefault("(which layers are dense)", set()).add("v.mla_layers")
                continue
            E, I = d["experts"], d["moe_ffn"]
            R.add(L + "mlp.gate.weight", BF16, [E, H], "v.moe_gate", P + "mlp.gate.weight")
            if d["score_bias"]:
                R.add(L + "mlp.gate.e_score_correction_bias", FP32, [E], "v.score_bias",
                      P + "mlp.gate.e_score_correction_bias")
            if d["shared"]:
                S = d["shared"] * I
                # sequence-parallel MoE (EP, TP > 1, DP > 1): the shared experts whole on every rank
                sp = ep and tp > 1 and dp > 1
                stp = 1 if sp else tp
                linear(L + "mlp.shared_experts.gate_up_proj.weight", P + "mlp.shared_experts.gate_up_proj.weight",
                       2 * S // stp, H, "v.shared_sp" if sp else "v.shared")
                linear(L + "mlp.shared_experts.down_proj.weight", P + "mlp.shared_experts.down_proj.weight",
                       H, S // stp, "v.shared_sp" if sp else "v.shared")
            if ep:  # linear placement: contiguous experts, the first E % flat ranks one more
                ep_r = dp_r * tp + tp_r
                El, Il = E // flat + (ep_r < E % flat), I
            else:
                assert I % flat == 0
                El, Il = E, I // flat
            X = L + "mlp.experts.routed_experts."
            XP = P + "mlp.experts.routed_experts."
            wdt = FP8 if fp8 or channel else BF16
            R.add(X + "w13_weight", wdt, [El, 2 * Il, H], "v.routed", XP + "w13_weight")
            R.add(X + "w2_weight", wdt, [El, H, Il], "v.routed", XP + "w2_weight")
            for w in ("w13_weight", "w2_weight"):
                R.used[XP + w].add("v.moe_parallel")
                if ep:
                    R.used[XP + w].add("v.expert_map")
            if fp8:
                R.used[XP + "w13_weight"].add("v.fp8_moe")
                R.used[XP + "w2_weight"].add("v.fp8_moe")
                R.add(X + "w13_weight_scale_inv", FP32, [El, 2 * cdiv(Il, bn), cdiv(H, bk)], "v.fp8_moe",
                      XP + "w13_weight_scale_inv")
                R.add(X + "w2_weight_scale_inv", FP32, [El, cdiv(H, bn), cdiv(Il, bk)], "v.fp8_moe",
                      XP + "w2_weight_scale_inv")
            if channel:
                R.used[XP + "w13_weight"].add("v.fp8_channel_moe")
                R.used[XP + "w2_weight"].add("v.fp8_channel_moe")
                R.add(X + "w13_weight_scale", FP32, [El, 2 * Il, 1], "v.fp8_channel_moe", XP + "w13_weight_scale")
                R.add(X + "w2_weight_scale", FP32, [El, H, 1], "v.fp8_channel_moe", XP + "w2_weight_scale")
        R.add("model.norm.weight", BF16, [H], "v.norm", "model.norm.weight")
        assert not d["tied"]
        R.add("lm_head.weight", BF16, [padded // tp, H], "v.lm_head", "lm_head.weight")
        ranks.append(R)
    return ranks


# --- the cases -----------------------------------------------------------------------------------

def load(path):
    with open(os.path.join(ROOT, path)) as f:
        return json.load(f)


# DeepSeek-V3 in miniature: MLA with q LoRA, one dense first layer, then MoE layers with 8 routed
# experts, a shared expert and the noaux_tc router bias.
TINY_DEEPSEEK = {
    "_name_or_path": "tiny-deepseek-v3",
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 4,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 32,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "vocab_size": 500,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "torch_dtype": "bfloat16",
}
# Its FP8 checkpoint form: DeepSeek-V3's quantization_config with a block small enough for the tiny
# dims (every per-rank slice at TP2 a whole number of 16-blocks, as vLLM requires).
TINY_DEEPSEEK_FP8 = dict(TINY_DEEPSEEK, _name_or_path="tiny-deepseek-v3-fp8", quantization_config={
    "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [16, 16]})

DENSE = load("tests/data/megatron/dense-tp2-pp2/config.json")    # llama, 8 heads in 2 groups, vocab 250
MOE = load("tests/data/megatron/moe-tp2-pp2-ep2/config.json")     # qwen3_moe, 4 experts, q/k norms

# name: (config, what, derive(d) -> ranks). The init settings for each are in
# tests/recorded_dumps_test.cc.
CASES = {
    "megatron-te-dense-tp2-pp2": (DENSE, "Megatron-Core TE spec, dense GQA, TP2 PP2",
                                  lambda d: megatron_te(d, tp=2, pp=2, dp=1, ep=1, etp=1, grouped=False)),
    "megatron-te-moe-grouped-tp2-pp2-ep2": (MOE, "Megatron-Core TE spec, MoE with TEGroupedMLP, TP2 PP2 EP2 "
                                            "expert-TP 1",
                                            lambda d: megatron_te(d, tp=2, pp=2, dp=1, ep=2, etp=1, grouped=True)),
    "megatron-te-moe-grouped-tp2-dp2-ep2-etp2": (MOE, "Megatron-Core TE spec, MoE with TEGroupedMLP, TP2 DP2 "
                                                 "EP2 expert-TP 2",
                                                 lambda d: megatron_te(d, tp=2, pp=1, dp=2, ep=2, etp=2,
                                                                       grouped=True)),
    "megatron-te-mla-tp2-pp2-ep2": (TINY_DEEPSEEK, "Megatron-Core TE spec, DeepSeek-V3 style MLA with a dense "
                                    "first layer, MoE with TEGroupedMLP and a shared expert, TP2 PP2 EP2 expert-TP 1",
                                    lambda d: megatron_te(d, tp=2, pp=2, dp=1, ep=2, etp=1, grouped=True)),
    "megatron-te-moe-sequential-tp2-ep2": (MOE, "Megatron-Core TE spec, MoE without grouped GEMM "
                                           "(SequentialMLP of TE linears), TP2 EP2 expert-TP 1",
                                           lambda d: megatron_te(d, tp=2, pp=1, dp=1, ep=2, etp=1, grouped=False)),
}


# What each framework's dumps assume, and what they leave out.
NOTES = {
    "megatron": [
        "Megatron-Core 0.19.2 is installed in the venv (megatron/core/package_info.py 0.19.2); the line numbers "
        "are that copy's. TransformerEngine is not installed (it needs a GPU): its modules' parameters are read "
        "from NVIDIA/TransformerEngine's stored source (layernorm_linear.py, grouped_linear.py, linear.py).",
        "The model is what get_model() builds for RL training: GPTModel with "
        "get_gpt_decoder_block_spec(use_transformer_engine=True) inside Float16Module (--bf16), so every "
        "parameter is bf16; the router's expert_bias buffer is float32 (mc.expert_bias).",
        "Settings as Megatron-Bridge's providers set them: normalization RMSNorm, gated_linear_unit, "
        "add_bias_linear False, qk_layernorm True for Qwen3 and for MLA (with it False, Megatron-Core 0.19.2 builds "
        "no q/kv norm at all: mla_qk_norm_config.py _resolve_disabled_qk_layernorm), "
        "moe_router_enable_expert_bias True for DeepSeek's noaux_tc router, moe_layer_freq [0] x "
        "first_k_dense_replace + [1] x the rest, mla_down_proj_fusion False, moe_single_grouped_weight False, "
        "use_te_op_fuser False, untied embeddings, make_vocab_size_divisible_by 128.",
        "The dump is named_parameters() plus persistent buffers (tools/dump_state_dict.py), as the real CPU runs "
        "record them.",
    ],
    "vllm": [
        "vLLM's source is read from the stored copy of vllm-project/vllm (the index holds many versions and "
        "names no release tag; the commits above are the stored versions read). The layout with the expert "
        "weights in a `routed_experts` submodule is the current one; a third-party RL framework's test notes "
        "'vLLM 0.25 hangs the fused-MoE expert weights off a nested routed_experts submodule', so these names "
        "hold from 0.25 on. That the version is exactly 0.33 is not confirmed by the stored source.",
        "The dump is named_parameters() after load_weights and process_weights_after_loading, the tensors a "
        "refit writes. Not in it: non-persistent buffers (rotary cos_sin_cache, RoutedExperts' _expert_map / "
        "expert_mask), MLA's derived W_UK_T / W_UV (plain attributes), and the FP8 KV-cache scales "
        "(q/k/v/prob_scale), which layers/quantization/kv_cache.py BaseKVCacheMethod."
        "process_weights_after_loading deletes.",
        "FP8 block scales: the shapes here are the as-created ones of create_weights. After loading, a "
        "third-party RL framework's compatibility code keeps `weight_scale_inv` from vLLM 0.14 on and notes that "
        "0.11 renamed it `weight_scale`; a stored fp8_utils.py version (the one reading `weight_scale`) "
        "transposes the linear scales on SM90 with CUTLASS block FP8 and requantizes them in place for DeepGEMM "
        "E8M0 (maybe_post_process_fp8_weight_block). Whether the current release transposes is not checked: on "
        "that path the scale shapes would differ.",
        "Model dtype bfloat16 (config torch_dtype), no EPLB, no sequence-parallel MoE, no shared-expert fusion "
        "into the routed experts (ROCm AITER only), expert placement 'linear'.",
    ],
}


# The vLLM cases are recorded from real vLLM 0.33 ranks by tests/vllm/record.py; these
# source-derived rules for them give each case's SOURCES.md its table of sources.
VLLM_CASES = {
    "vllm-dense-tp4": (DENSE, "vLLM, Llama dense GQA at TP4 (2 KV heads, each replicated on 2 ranks)",
                       lambda d: vllm(d, tp=4)),
    "vllm-moe-tp2": (MOE, "vLLM, Qwen3-MoE at TP2", lambda d: vllm(d, tp=2)),
    "vllm-moe-tp2-dp2": (MOE, "vLLM, Qwen3-MoE at TP2 with built-in DP2, no EP (experts' intermediate dim "
                         "over DP x TP)", lambda d: vllm(d, tp=2, dp=2)),
    "vllm-moe-tp2-dp2-ep": (MOE, "vLLM, Qwen3-MoE at TP2 DP2 with expert parallelism (EP4)",
                            lambda d: vllm(d, tp=2, dp=2, ep=True)),
    "vllm-moe-tp2-fp8-channel": (MOE, "vLLM, Qwen3-MoE at TP2 from an FP8 per-channel (compressed-tensors "
                                 "W8A8 FP8, dynamic per-token activations) checkpoint",
                                 lambda d: vllm(d, tp=2, quant="fp8-channel")),
    "vllm-mla-dp3-ep-uneven": (TINY_DEEPSEEK, "vLLM, DeepSeek-V3 style MLA + MoE at TP1 DP3 with expert "
                               "parallelism (EP3): 8 experts placed 3, 3, 2",
                               lambda d: vllm(d, tp=1, dp=3, ep=True)),
    "vllm-mla-tp2": (TINY_DEEPSEEK, "vLLM, DeepSeek-V3 style MLA + MoE + shared expert at TP2, BF16",
                     lambda d: vllm(d, tp=2)),
    "vllm-mla-fp8-tp2-dp2-ep": (TINY_DEEPSEEK_FP8, "vLLM, DeepSeek-V3 style FP8 checkpoint (16x16 block "
                                "scales) at TP2 DP2 with expert parallelism (EP4)",
                                lambda d: vllm(d, tp=2, dp=2, ep=True, quant="fp8-block")),
}

# The checked-in samples (samples/regenerate.sh writes them with `reshard init`) at their real sizes: the
# same rules, dumped for a few ranks each (every pipeline stage's first rank, and the last rank) into a
# scratch folder by `derive.py --samples OUT` for RecordedDumps.SamplesMatchTheFrameworksSource.
SAMPLES = [  # (sample, layout file, derive(d))
    ("tiny-dense", "train.json", lambda d: megatron_te(d, tp=2, pp=2, dp=2, ep=1, etp=1, grouped=False,
                                                       pp_layers=[1, 3])),
    ("tiny-dense", "infer.json", lambda d: vllm(d, tp=4)),
    ("tiny-dense", "infer-tp2-dp2.json", lambda d: vllm(d, tp=2, dp=2)),
    ("tiny-dense", "infer-tp1-dp4.json", lambda d: vllm(d, tp=1, dp=4)),
    ("tiny-moe", "train.json", lambda d: megatron_te(d, tp=2, pp=2, dp=2, ep=4, etp=1, grouped=False,
                                                     pp_layers=[1, 3])),
    ("tiny-moe", "infer.json", lambda d: vllm(d, tp=4, dp=2)),
    ("tiny-moe", "infer-ep.json", lambda d: vllm(d, tp=4, dp=2, ep=True)),
    ("qwen3-235b", "train-tp4-pp8-ep16.json",
     lambda d: megatron_te(d, tp=4, pp=8, dp=4, ep=16, etp=1, grouped=True, pp_layers=[11] + [12] * 6 + [11])),
    ("qwen3-235b", "infer-tp8-dp16.json", lambda d: vllm(d, tp=8)),               # 16 engines: engine 0
    ("qwen3-235b", "infer-tp4-dp32.json", lambda d: vllm(d, tp=4)),
    ("qwen3-235b", "infer-tp8-dp16-fp8-channel.json", lambda d: vllm(d, tp=8, quant="fp8-channel")),
    ("deepseek-v3", "train-pp16-ep16.json",
     lambda d: megatron_te(d, tp=1, pp=16, dp=16, ep=16, etp=1, grouped=True, pp_layers=[3] + [4] * 14 + [2])),
    ("deepseek-v3", "infer-tp32-dp8.json", lambda d: vllm(d, tp=32)),            # quant=none: a BF16 copy
    ("deepseek-v3", "infer-tp16-dp16-fp8.json", lambda d: vllm(d, tp=16, quant="fp8-block")),
    ("kimi-k2", "train-1024.json",
     lambda d: megatron_te(d, tp=4, pp=16, dp=16, ep=64, etp=1, grouped=True, pp_layers=[3] + [4] * 14 + [2])),
    ("kimi-k2", "infer-512.json", lambda d: vllm(d, tp=8, dp=16, ep=True)),      # 4 engines: engine 0
    ("moe-2.4t", "train-1024.json",
     lambda d: megatron_te(d, tp=4, pp=16, dp=16, ep=64, etp=1, grouped=True, pp_layers=[3] + [4] * 14 + [2])),
    ("moe-2.4t", "infer-512.json", lambda d: vllm(d, tp=8, dp=16, ep=True)),
]


def write_samples(out):
    for sample, layout, derive in SAMPLES:
        ranks = derive(dims(load(f"samples/{sample}/config.json")))
        keep = {0, len(ranks) - 1}
        for R in ranks:  # the first rank of every pipeline stage
            meta = R.meta.get("megatron")
            if meta and meta["tp"] == 0 and meta["dp"] == 0:
                keep.add(R.rank)
        path = os.path.join(out, sample, layout.replace(".json", ".dump.json"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        dump_state_dict.write_json(path, [dict({"rank": R.rank}, **R.meta, params=R.params)
                                          for R in ranks if R.rank in keep])
        print(f"{path}: {len(keep)} of {len(ranks)} ranks")


def sources_md(name, what, ranks):
    used = {}
    for R in ranks:
        for pattern, srcs in R.used.items():
            used.setdefault(pattern, set()).update(srcs)
    lines = [f"# {name}: where each name, shape and dtype comes from", "",
             f"{what}. Derived by tests/recorded/derive.py from the frameworks' source, not from a run",
             "(TransformerEngine and vLLM need a GPU). Shapes are per rank; every tensor is torch.bfloat16",
             "unless the pattern's row says otherwise.", "",
             "| name pattern | source (file: function, what it fixes) |", "|---|---|"]
    for pattern in sorted(used):
        cites = "<br>".join(SOURCES[s] for s in sorted(used[pattern]))
        lines.append(f"| `{pattern}` | {cites} |")
    megatron = name.startswith("megatron")
    lines += ["", "Sources: " + (MCORE + "; " + TE if megatron else VLLM) + ".", "", "Notes:", ""]
    lines += ["- " + n for n in NOTES["megatron" if megatron else "vllm"]]
    return "\n".join(lines) + "\n"


def main(argv):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default=os.path.join(ROOT, "tests", "data", "recorded"),
                    help="where to write <case>/{config.json,dump.json,SOURCES.md} (default: tests/data/recorded)")
    ap.add_argument("--samples", metavar="OUT", help="write the samples' dumps (a few ranks each) under OUT instead")
    a = ap.parse_args(argv[1:])
    if a.samples:
        return write_samples(a.samples)
    out = a.out
    for name, (hf, what, derive) in CASES.items():
        ranks = derive(dims(hf))
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(hf, f, indent=2)
            f.write("\n")
        dump_state_dict.write_json(os.path.join(d, "dump.json"),
                                   [dict({"rank": R.rank}, **R.meta, params=R.params) for R in ranks])
        with open(os.path.join(d, "SOURCES.md"), "w") as f:
            f.write(sources_md(name, what, ranks))
        print(f"{d}: {len(ranks)} ranks")


if __name__ == "__main__":
    main(sys.argv)
