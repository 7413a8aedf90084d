"""The real-vLLM cases: each a Hugging Face config (tests/data/recorded/<case>/
config.json, or a Megatron case's) and vLLM's parallel settings, with the
`reshard init --infer` setting that must describe the same ranks."""
import copy
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
RECORDED = os.path.join(ROOT, "tests", "data", "recorded")


def recorded_config(case):
    with open(os.path.join(RECORDED, case, "config.json")) as f:
        return json.load(f)


def _fp8_channel(config):
    import checkpoint  # noqa: PLC0415 (vLLM's venv only)

    return dict(copy.deepcopy(config), quantization_config=checkpoint.COMPRESSED_FP8_CHANNEL)


# name: tp, pp, dp, ep (vLLM's settings), infer (reshard init's --infer), what,
# config: the HF config (a function: some add a quantization_config).
CASES = {
    "vllm-dense-tp4": dict(tp=4, pp=1, dp=1, ep=False, infer="vllm:tp=4",
                           what="Llama dense GQA at TP4 (2 KV heads, each replicated on 2 ranks)"),
    "vllm-dense-tp2-pp2": dict(tp=2, pp=2, dp=1, ep=False, infer="vllm:tp=2,pp=2", config_of="vllm-dense-tp4",
                               what="Llama dense GQA at TP2 PP2 (global layer numbers on each stage)"),
    "vllm-moe-tp2": dict(tp=2, pp=1, dp=1, ep=False, infer="vllm:tp=2", what="Qwen3-MoE at TP2"),
    "vllm-moe-tp2-dp2": dict(tp=2, pp=1, dp=2, ep=False, infer="vllm:tp=2,dp=2",
                             what="Qwen3-MoE at TP2 with built-in DP2, no EP (experts' intermediate dim over DP x TP)"),
    "vllm-moe-tp2-dp2-ep": dict(tp=2, pp=1, dp=2, ep=True, infer="vllm:tp=2,dp=2,ep",
                                what="Qwen3-MoE at TP2 DP2 with expert parallelism (EP4)"),
    "vllm-moe-tp2-fp8-channel": dict(tp=2, pp=1, dp=1, ep=False, infer="vllm:tp=2,quant=fp8-channel",
                                     quant="fp8-channel",
                                     what="Qwen3-MoE at TP2 from an FP8 per-channel (compressed-tensors) checkpoint"),
    "vllm-mla-dp3-ep-uneven": dict(tp=1, pp=1, dp=3, ep=True, infer="vllm:tp=1,dp=3,ep",
                                   what="DeepSeek-V3 style MLA + MoE at TP1 DP3 with expert parallelism "
                                        "(8 experts over 3 ranks: 3, 3, 2)"),
    "vllm-mla-tp2": dict(tp=2, pp=1, dp=1, ep=False, infer="vllm:tp=2",
                         what="DeepSeek-V3 style MLA + MoE + shared expert at TP2, BF16"),
    "vllm-mla-fp8-tp2-dp2-ep": dict(tp=2, pp=1, dp=2, ep=True, infer="vllm:tp=2,dp=2,ep",
                                    what="DeepSeek-V3 style FP8 checkpoint (16x16 block scales) at TP2 DP2 with "
                                         "expert parallelism (EP4)"),
}


def config(name):
    c = CASES[name]
    cfg = recorded_config(c.get("config_of", name))
    if c.get("quant") == "fp8-channel":
        cfg = _fp8_channel(cfg)
    return cfg


def world(name):
    c = CASES[name]
    return c["tp"] * c["pp"] * c["dp"]
