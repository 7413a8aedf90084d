#!/usr/bin/env python3
"""Real vLLM 0.33 ranks (CPU, Gloo) for the architectures issue 31 added to
`reshard init` (glm4_moe, gpt_oss): builds each case's ranks with vLLM's own
model classes and loaders (tests/vllm/engine.py, unchanged), dumps what every
rank holds (tools/dump_state_dict.py) and writes or compares
tests/data/archs/<case>/{config.json,dump.json}. InitArchs.RealRanksHaveZeroDifferences
(tests/init_test.cc) runs `reshard init` + `reshard check` on each dump.

    build/vllm-venv/bin/python tests/archs/record_vllm.py [--write] [CASE ...]

The checkpoint is random, with the tensors `reshard init --train hf` lists for
the config (tests/vllm/checkpoint.py), except gpt-oss's experts, which the
model spec holds per expert as [out, in] and the checkpoint fuses and
transposes (gate_up_proj [E, H, 2I] with gate and up in alternate columns,
gate_up_proj_bias [E, 2I], down_proj [E, I, H], down_proj_bias [E, H]:
transformers' GptOssExperts).
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

# name: config, vLLM settings (tp, pp, dp, ep) and the `reshard init --infer` that describes the ranks.
CASES = {
    "vllm-glm4moe-tp2": dict(config=GLM, tp=2, pp=1, dp=1, ep=False, infer="vllm:tp=2"),
    "vllm-glm4moe-tp2-dp2-ep": dict(config=GLM, tp=2, pp=1, dp=2, ep=True, infer="vllm:tp=2,dp=2,ep"),
    "vllm-gptoss-tp2": dict(config=GPT_OSS, tp=2, pp=1, dp=1, ep=False, infer="vllm:tp=2"),
    "vllm-gptoss-tp2-dp2": dict(config=GPT_OSS, tp=2, pp=1, dp=2, ep=False, infer="vllm:tp=2,dp=2"),
    "vllm-gptoss-tp2-dp2-ep": dict(config=GPT_OSS, tp=2, pp=1, dp=2, ep=True, infer="vllm:tp=2,dp=2,ep"),
}


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


def dump_case(reshard, name, work):
    c = CASES[name]
    model_dir, out = os.path.join(work, name, "model"), os.path.join(work, name, "dump")
    make_checkpoint(reshard, c["config"], model_dir)
    os.makedirs(out, exist_ok=True)
    world = c["tp"] * c["pp"] * c["dp"]
    settings = {k: c[k] for k in ("tp", "pp", "dp", "ep")}
    launch.run(world, [os.path.join(VLLM_TESTS, "rank_dump.py"), model_dir, out, json.dumps(settings)],
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
    sys.exit(main())
