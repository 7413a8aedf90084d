"""Builds one rank of a tiny Megatron-Core GPT model on CPU (Gloo, the local
layer spec, use_cpu_initialization, sequence parallelism off, bf16 as RL
training runs it) and fills its parameters with values that identify them.

Must run inside a process of a torch.distributed Gloo group of `case["world"]`
ranks; `parallel(case)` initializes Megatron's model-parallel groups on it.
"""
import hashlib

import torch
import torch.nn.functional as F

from megatron.core import parallel_state as ps
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.module import Float16Module
from megatron.core.transformer.transformer_config import TransformerConfig

from cases import padded_vocab


def parallel(case):
    ps.initialize_model_parallel(
        tensor_model_parallel_size=case["tp"], pipeline_model_parallel_size=case["pp"],
        virtual_pipeline_model_parallel_size=case.get("vpp"),
        expert_model_parallel_size=case["ep"], expert_tensor_parallel_size=case["etp"])


def coords():
    """This rank's Megatron coordinates, as parallel_state reports them."""
    return {"tp": ps.get_tensor_model_parallel_rank(), "pp": ps.get_pipeline_model_parallel_rank(),
            "dp": ps.get_data_parallel_rank(), "ep": ps.get_expert_model_parallel_rank(),
            "etp": ps.get_expert_tensor_parallel_rank()}


def config(case, bf16=True):
    hf = case["hf"]
    moe = hf.get("num_experts")
    kw = dict(
        num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
        num_attention_heads=hf["num_attention_heads"], num_query_groups=hf["num_key_value_heads"],
        kv_channels=hf["head_dim"], ffn_hidden_size=hf["intermediate_size"],
        normalization="RMSNorm", layernorm_epsilon=hf["rms_norm_eps"], gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, add_qkv_bias=False,
        tensor_model_parallel_size=case["tp"], pipeline_model_parallel_size=case["pp"],
        expert_model_parallel_size=case["ep"], expert_tensor_parallel_size=case["etp"],
        sequence_parallel=False, use_cpu_initialization=True, perform_initialization=False,
        params_dtype=torch.bfloat16 if bf16 else torch.float32, bf16=bf16, pipeline_dtype=torch.bfloat16,
        virtual_pipeline_model_parallel_size=case.get("vpp"),
        qk_layernorm=hf["model_type"] == "qwen3_moe")
    if moe:
        kw.update(num_moe_experts=moe, moe_ffn_hidden_size=hf["moe_intermediate_size"],
                  moe_router_topk=hf["num_experts_per_tok"], moe_grouped_gemm=False)
    return TransformerConfig(**kw)


class Chunks(torch.nn.Module):
    """A rank's virtual pipeline chunks under "model0.", "model1.", ... (the
    names of Megatron's checkpoints: state_dict['model%d' % i])."""

    def __init__(self, chunks):
        super().__init__()
        for i, c in enumerate(chunks):
            self.add_module(f"model{i}", c)


def build(case, wrap=True):
    """This rank's GPTModel; with `wrap`, inside Float16Module as Megatron's
    get_model() does when bf16 is on (which casts every parameter to bf16).
    With virtual pipeline stages (case["vpp"]), the rank's model chunks, each
    built as get_model() builds it (vp_stage i), under Chunks."""
    if case.get("vpp"):
        chunks = [_build(case, wrap, i) for i in range(case["vpp"])]
        return Chunks([c.module if wrap else c for c in chunks])  # Float16Module casts its module in place
    return _build(case, wrap)


def named_params(model):
    """{name: tensor} as the layouts name them: without Float16Module's "module."."""
    return {n[len("module."):] if n.startswith("module.") else n: p.data for n, p in model.named_parameters()}


def first_chunk(model):
    """The GPTModel holding this rank's first layers."""
    return model.model0 if isinstance(model, Chunks) else model.module


def _build(case, wrap, vp_stage=None):
    cfg = config(case)
    spec = get_gpt_layer_local_spec(num_experts=cfg.num_moe_experts, moe_grouped_gemm=False,
                                    qk_layernorm=cfg.qk_layernorm, normalization="RMSNorm")
    # Tied embeddings at PP > 1: setup_embeddings_and_output_layer moves the
    # embedding and its last-stage copy to the GPU to all-reduce them; on CPU
    # (Gloo) they stay where they are.
    cuda = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self
    try:
        model = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=padded_vocab(case),
                         max_sequence_length=case["hf"]["max_position_embeddings"],
                         pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
                         post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
                         vp_stage=vp_stage,
                         share_embeddings_and_output_weights=case["hf"]["tie_word_embeddings"],
                         position_embedding_type="rope", rotary_base=int(case["hf"]["rope_theta"]))
    finally:
        torch.Tensor.cuda = cuda
    return Float16Module(cfg, model) if wrap else model


def fill(model, salt=None):
    """Overwrites every parameter with pseudo-random values seeded by what
    identifies its data: the name and pipeline stage, plus the TP rank for
    tensor-parallel parameters and the EP / expert-TP ranks for experts. So
    data-parallel replicas (and TP replicas of unsplit parameters) are equal,
    as in training, and every shard differs from every other. A `salt` gives
    another model of the same kind (tests/vllm/refit_live.py: one per refit)."""
    c = coords()
    for name, p in model.named_parameters():
        expert = ".experts." in name
        key = [name, c["pp"]]
        if name.endswith("output_layer.weight") and getattr(p, "shared_embedding", False):
            # Tied embeddings at PP > 1: Megatron keeps the last stage's copy equal to
            # the first stage's embedding (setup_embeddings_and_output_layer).
            key = [name[:-len("output_layer.weight")] + "embedding.word_embeddings.weight", 0]
        if expert:
            key += [c["ep"], c["etp"] if getattr(p, "tensor_model_parallel", False) else -1]
        elif getattr(p, "tensor_model_parallel", False):
            key += [c["tp"]]
        if salt is not None:
            key.append(salt)
        seed = int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:8], "little") & ((1 << 63) - 1)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype))
