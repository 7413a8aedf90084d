#!/usr/bin/env python3
"""What the engine-side post-processing of a refit costs on this CPU: for each
engine-formatted kernel (docs/kernels.md; reshard.vllm.ENGINE_FORMATTED) a
real vLLM 0.33 CPU rank of a DeepSeek-V3-style model is built with that
kernel selected (tests/vllm/kernels.py's selection), and WorkerRefit's step
for one layer (reshard.vllm._Formatted.format: the layer's
process_weights_after_loading on the checkpoint format, the copy back into
the parameters' memory) is timed RUNS times per layer, with MLA's
W_UV / W_UK_T recomputation beside it. Prints per layer and per refit
(every layer of the rank) the median seconds and the expert bytes per second.

    build/vllm-venv/bin/python tools/bench/kernel_postprocess_bench.py \\
        [--hidden 1024] [--moe-intermediate 512] [--experts 16] [--layers 3] [--runs 5] [CASE ...]

Cases: sm90-fp8-ep (FlashInferExperts: [up; gate] swap, scale clamp) and
sm100-bf16 (TrtLlmBf16ExpertsMonolithic: in-place row permutation; needs
flashinfer-python on PYTHONPATH, as tools/test.d/26-vllm-kernels.sh installs it).
Needs the Python package (tools/python_install.sh build/vllm-venv/bin/python)
and build/reshard.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path[:0] = [os.path.join(ROOT, "tests", "vllm"), os.path.join(ROOT, "tests")]


def one(case, a):
    import engine  # noqa: F401  (the CPU environment before vLLM is imported)
    import kernels
    import torch
    from vllm.config import set_current_vllm_config

    import reshard.vllm as rv
    from reshard.plan import Buffer

    kernels.BASE_CONFIG.update(hidden_size=a.hidden, intermediate_size=a.hidden,
                               moe_intermediate_size=a.moe_intermediate, n_routed_experts=a.experts,
                               num_hidden_layers=a.layers + 1, q_lora_rank=128, kv_lora_rank=128)
    cfg = kernels.config(case)
    work = tempfile.mkdtemp(prefix="reshard-ppbench-")
    spec = os.path.join(work, "spec")
    with open(os.path.join(work, "config.json"), "w") as f:
        json.dump(kernels.BASE_CONFIG, f)
    subprocess.run([os.path.join(a.build, "reshard"), "init", "-q", "--hf-config", os.path.join(work, "config.json"),
                    "--train", "hf", "--infer", "hf", "-o", spec], check=True)
    kernels.write_checkpoint(os.path.join(work, "model"), cfg, kernels.hf_values(os.path.join(spec, "model.json"), 1))
    model, vcfg = kernels.build(os.path.join(work, "model"), case)
    names = {torch.float8_e4m3fn: "fp8_e4m3", torch.bfloat16: "bf16", torch.float32: "fp32"}
    layers = []
    for n, m in model.named_modules():
        if rv.engine_formatted(m):
            bufs = {p: Buffer(f"{n}.{p}", names[t.dtype], tuple(t.shape), False, True)
                    for p, t in m.named_parameters(recurse=False) if t.dtype in names and "bias" not in p}
            layers.append(rv._Formatted(n, m, bufs))
    mla = rv.mla_layers(model)
    per_layer, mla_s = [], []
    with torch.no_grad(), set_current_vllm_config(vcfg):
        for f in layers:
            ts = []
            for _ in range(a.runs):
                t0 = time.perf_counter()
                f.format()
                ts.append(time.perf_counter() - t0)
            per_layer.append(statistics.median(ts))
        for _, layer in mla:
            ts = []
            for _ in range(a.runs):
                t0 = time.perf_counter()
                layer.process_weights_after_loading(vcfg.model_config.dtype)
                ts.append(time.perf_counter() - t0)
            mla_s.append(statistics.median(ts))
    expert_bytes = sum(t.nbytes for f in layers for t in f.checkpoint.values())
    return {"case": case, "kernel": rv._kernel_of(layers[0].module)[1] if layers else None,
            "formatted_layers": len(layers), "expert_bytes_per_layer": expert_bytes // max(1, len(layers)),
            "format_s_per_layer": statistics.median(per_layer) if per_layer else None,
            "format_s_per_refit": sum(per_layer), "mla_layers": len(mla_s),
            "mla_s_per_layer": statistics.median(mla_s) if mla_s else None,
            "GB_per_s": expert_bytes / sum(per_layer) / 1e9 if per_layer else None,
            "threads": torch.get_num_threads()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--moe-intermediate", type=int, default=512)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--layers", type=int, default=3, help="MoE layers (one dense layer is added first)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("case", nargs="*")
    a = ap.parse_args()
    if a.one:
        print("RESULT " + json.dumps(one(a.one, a)), flush=True)
        return
    from free_port import free_port
    for case in a.case or ["sm90-fp8-ep", "sm100-bf16"]:
        env = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", case] + sys.argv[1:], env=env,
                           capture_output=True, text=True)
        lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        if not lines:
            sys.exit(f"kernel_postprocess_bench: {case} failed:\n{p.stderr[-3000:]}")
        print(lines[-1][len("RESULT "):], flush=True)


if __name__ == "__main__":
    main()
