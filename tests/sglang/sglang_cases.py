"""The real-SGLang cases: each a Hugging Face config (tests/data/recorded/<case>/
config.json, first taken from a vLLM case's) and SGLang's parallel
settings, with the `reshard init --infer` setting that must describe the
same ranks (tests/recorded_dumps_test.cc)."""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
RECORDED = os.path.join(ROOT, "tests", "data", "recorded")

# name: settings (engine.build_rank's keywords), infer (reshard init's --infer),
# config_of (the recorded case whose config.json it starts from), what.
CASES = {
    "sglang-dense-tp4": dict(settings=dict(tp=4), infer="sglang:tp=4", config_of="vllm-dense-tp4",
                             what="Llama dense GQA at TP4 (2 KV heads, each replicated on 2 ranks)"),
    "sglang-moe-tp2": dict(settings=dict(tp=2), infer="sglang:tp=2", config_of="vllm-moe-tp2",
                           what="Qwen3-MoE at TP2 (each expert's intermediate dim over TP)"),
    "sglang-moe-tp4-ep2-attn-dp2": dict(
        settings=dict(tp=4, ep=2, attn_dp=2), infer="sglang:tp=4,ep=2,attn-dp=2", config_of="vllm-moe-tp2",
        what="Qwen3-MoE at TP4 with EP2 (MoE TP2) and attention DP2 (attention TP2)"),
    "sglang-mla-tp2": dict(settings=dict(tp=2), infer="sglang:tp=2", config_of="vllm-mla-tp2",
                           what="DeepSeek-V3 style MLA + MoE + shared expert at TP2, BF16"),
    "sglang-mla-fp8-tp2": dict(settings=dict(tp=2), infer="sglang:tp=2", config_of="vllm-mla-fp8-tp2-dp2-ep",
                               what="DeepSeek-V3 style FP8 checkpoint (16x16 block scales) at TP2"),
    "sglang-mla-tp2-ep2-attn-dp2": dict(
        settings=dict(tp=2, ep=2, attn_dp=2), infer="sglang:tp=2,ep=2,attn-dp=2", config_of="vllm-mla-tp2",
        what="DeepSeek-V3 style MLA at TP2 with EP2 and attention DP2 (attention TP1)"),
    "sglang-mla-tp2-fused": dict(
        settings=dict(tp=2, shared_experts="fused"), infer="sglang:tp=2,shared-experts=fused",
        config_of="vllm-mla-tp2",
        what="DeepSeek-V3 style MLA at TP2 with the shared expert fused into the routed experts "
             "(--enforce-shared-experts-fusion)"),
}


def config(name):
    """The case's config.json: its own once recorded, else its source case's."""
    own = os.path.join(RECORDED, name, "config.json")
    path = own if os.path.exists(own) else os.path.join(RECORDED, CASES[name]["config_of"], "config.json")
    with open(path) as f:
        return json.load(f)


def world(name):
    return CASES[name]["settings"]["tp"]
