#!/usr/bin/env python3
"""Builds every case of vllm_cases.py on real vLLM 0.33 CPU ranks (engine.py),
dumps each rank (tools/dump_state_dict.py: name, dtype, shape, strides of
every parameter and persistent buffer) and compares the dumps with the
recorded ones in tests/data/recorded/<case>/dump.json, or writes them there
(--write). Each case's checkpoint is a tiny random one (checkpoint.py) with
the tensors `reshard init` lists for its config.

    build/vllm-venv/bin/python tests/vllm/record.py --build build [--write] [CASE ...]

Exit 0: every dump equals the recorded one (or was written); 1 otherwise.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path[:0] = [HERE, os.path.join(ROOT, "tools"), os.path.join(ROOT, "tests", "recorded")]

import vllm_cases as cases  # noqa: E402
import checkpoint  # noqa: E402
import derive  # noqa: E402
import dump_state_dict  # noqa: E402
import launch  # noqa: E402


def make_checkpoint(reshard, name, directory, seed=1):
    """A random checkpoint of the case's config in `directory`; returns the config."""
    cfg = cases.config(name)
    spec_dir = os.path.join(directory, "spec")
    os.makedirs(directory, exist_ok=True)
    # init reads FP8 block quantization_configs only: the tensor list of a
    # compressed-tensors checkpoint comes from its unquantized config.
    plain = {k: v for k, v in cfg.items() if k != "quantization_config"} \
        if checkpoint.quant_kind(cfg) == "fp8-channel" else cfg
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(plain, f)
    subprocess.run([reshard, "init", "--hf-config", os.path.join(directory, "config.json"), "--train", "hf",
                    "--infer", "hf", "-o", spec_dir, "-q"], check=True)
    with open(os.path.join(spec_dir, "model.json")) as f:
        spec = json.load(f)
    values = checkpoint.random_values(checkpoint.expand(spec), seed)
    checkpoint.write(directory, cfg, checkpoint.checkpoint_tensors(cfg, values))
    return cfg


def settings(name):
    c = cases.CASES[name]
    return {"tp": c["tp"], "pp": c["pp"], "dp": c["dp"], "ep": c["ep"]}


def dump_case(reshard, name, work):
    """[rank dump] of the case, built on real vLLM ranks."""
    model_dir = os.path.join(work, name, "model")
    out = os.path.join(work, name, "dump")
    make_checkpoint(reshard, name, model_dir)
    os.makedirs(out, exist_ok=True)
    launch.run(cases.world(name), [os.path.join(HERE, "rank_dump.py"), model_dir, out, json.dumps(settings(name))],
               timeout_s=600, label=name, log_dir=os.path.join(work, name))
    ranks = []
    for r in range(cases.world(name)):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            ranks.append(json.load(f))
    return ranks


def sources_md(name, ranks):
    """How the case's dump was made, and the source behind each name pattern
    (tests/recorded/derive.py's rules, which agree with the real ranks)."""
    import engine
    import vllm

    if not engine.PATCHED:
        engine.kernel_selection_for_cpu()
    c = cases.CASES[name]
    lines = [f"# {name}: recorded from real vLLM {vllm.__version__} ranks", "",
             f"vLLM, {c['what']}. Every rank built and loaded by vLLM {vllm.__version__} itself on CPU (Gloo), one "
             f"process per rank: `tests/vllm/record.py --write {name}` (tools/test.d/25-vllm.sh checks it in CI).", "",
             f"- Settings: tensor_parallel_size {c['tp']}, pipeline_parallel_size {c['pp']}, data_parallel_size "
             f"{c['dp']}, enable_expert_parallel {c['ep']}; `reshard init --infer {c['infer']}` describes the same "
             "ranks (tests/recorded_dumps_test.cc).",
             "- How: `EngineArgs(..., dtype=\"bfloat16\", enforce_eager=True, load_format=\"safetensors\", "
             "distributed_executor_backend=\"external_launcher\", moe_backend=\"triton\")`, "
             "`init_distributed_environment(backend=\"gloo\")`, `initialize_model_parallel`, `get_model` "
             "(tests/vllm/engine.py): vLLM's own model classes, create_weights, weight loaders and "
             "process_weights_after_loading.",
             "- Changed for a CPU: kernel selection only (" + ", ".join(engine.PATCHED) + "): the CUDA kernels a "
             "GPU would pick for these checkpoints are selected; none runs (no forward).",
             "- Checkpoint: config.json here, random values for the tensors `reshard init --train hf` lists "
             "(tests/vllm/checkpoint.py), quantized as its quantization_config says.",
             "- The dump: named_parameters() then persistent buffers, strides where not contiguous "
             "(tools/dump_state_dict.py); rank r is vLLM's global rank, `vllm` its coordinates from vLLM's groups.",
             "- Tensors beyond the checkpoint (attention scales, MLA's W_UV / W_UK_T) are in the dump: "
             "`reshard check` names them as the engine's own (frameworks/vllm_engine.cc).", ""]
    rules = derive.VLLM_CASES.get(name)
    if rules:
        hf, what, rule = rules
        table = derive.sources_md(name, what, rule(derive.dims(hf)))
        lines += ["Where vLLM's source fixes each name pattern (tests/recorded/derive.py, read before this "
                  "recording; the real ranks agree with it):", ""]
        lines += table[table.index("| name pattern"):].splitlines()
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build folder (its reshard binary)")
    ap.add_argument("--write", action="store_true", help="write the dumps into tests/data/recorded/<case>/")
    ap.add_argument("--work", help="where to keep checkpoints, dumps and rank logs (default: a temporary folder)")
    ap.add_argument("case", nargs="*", help=f"cases (default: all): {', '.join(cases.CASES)}")
    a = ap.parse_args(argv)
    reshard = os.path.join(a.build, "reshard")
    names = a.case or list(cases.CASES)
    unknown = [n for n in names if n not in cases.CASES]
    if unknown:
        sys.exit(f"record.py: unknown case(s) {', '.join(unknown)}; known: {', '.join(cases.CASES)}")
    work = a.work or tempfile.mkdtemp(prefix="reshard-vllm-")
    bad = 0
    for name in names:
        start = time.time()
        ranks = dump_case(reshard, name, work)
        path = os.path.join(cases.RECORDED, name, "dump.json")
        if a.write:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            config = cases.recorded_config(cases.CASES[name].get("config_of", name))  # as init reads it
            dump_state_dict.write_json(path, ranks)
            with open(os.path.join(cases.RECORDED, name, "config.json"), "w") as f:
                json.dump(config, f, indent=2)
                f.write("\n")
            with open(os.path.join(cases.RECORDED, name, "SOURCES.md"), "w") as f:
                f.write(sources_md(name, ranks))
            print(f"{name}: wrote {path} ({len(ranks)} ranks, {time.time() - start:.1f} s)", flush=True)
            continue
        with open(path) as f:
            recorded = json.load(f)
        if recorded == ranks:
            print(f"{name}: {len(ranks)} ranks equal the recorded dump ({time.time() - start:.1f} s)", flush=True)
            continue
        bad += 1
        print(f"{name}: the real vLLM ranks differ from {path}:", flush=True)
        for r, (want, got) in enumerate(zip(recorded, ranks)):
            w = {p["name"]: p for p in want["params"]}
            g = {p["name"]: p for p in got["params"]}
            for n in sorted(set(w) | set(g)):
                if w.get(n) != g.get(n):
                    print(f"  rank {r}: {n}: recorded {w.get(n)}, real {g.get(n)}")
            if {k: v for k, v in want.items() if k != "params"} != {k: v for k, v in got.items() if k != "params"}:
                print(f"  rank {r}: metadata: recorded {[want.get(k) for k in ('framework', 'vllm')]}, "
                      f"real {[got.get(k) for k in ('framework', 'vllm')]}")
        if len(recorded) != len(ranks):
            print(f"  recorded {len(recorded)} ranks, real {len(ranks)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
