#!/usr/bin/env python3
"""Builds every case of sglang_cases.py on real SGLang 0.5.23 CPU ranks
(engine.py, one process per rank), dumps each rank (rank_dump.py: name,
dtype, shape, strides of every parameter, persistent buffer and MLA derived
attribute) and compares the dumps with the recorded ones in
tests/data/recorded/<case>/dump.json, or writes them there (--write). Each
case's checkpoint is a tiny random one (tests/vllm/checkpoint.py) with the
tensors `reshard init` lists for its config.

    build/vllm-venv/bin/python tests/sglang/record.py --build build [--write] [CASE ...]

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
sys.path[:0] = [HERE, os.path.join(ROOT, "tools"), os.path.join(ROOT, "tests", "vllm")]

import checkpoint  # noqa: E402  (tests/vllm/checkpoint.py)
import dump_state_dict  # noqa: E402
import launch  # noqa: E402  (tests/vllm/launch.py)
import sglang_cases as cases  # noqa: E402


def make_checkpoint(reshard, name, directory, seed=1):
    """A random checkpoint of the case's config in `directory`."""
    cfg = cases.config(name)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f)
    spec_dir = os.path.join(directory, "spec")
    subprocess.run([reshard, "init", "--hf-config", os.path.join(directory, "config.json"), "--train", "hf",
                    "--infer", "hf", "-o", spec_dir, "-q"], check=True)
    with open(os.path.join(spec_dir, "model.json")) as f:
        spec = json.load(f)
    values = checkpoint.random_values(checkpoint.expand(spec), seed)
    checkpoint.write(directory, cfg, checkpoint.checkpoint_tensors(cfg, values))


def dump_case(reshard, name, work):
    """[rank dump] of the case, built on real SGLang ranks."""
    model_dir = os.path.join(work, name, "model")
    out = os.path.join(work, name, "dump")
    make_checkpoint(reshard, name, model_dir)
    os.makedirs(out, exist_ok=True)
    launch.run(cases.world(name), [os.path.join(HERE, "rank_dump.py"), model_dir, out,
                                   json.dumps(cases.CASES[name]["settings"])],
               timeout_s=600, label=name, log_dir=os.path.join(work, name))
    ranks = []
    for r in range(cases.world(name)):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            ranks.append(json.load(f))
    return ranks


def sources_md(name):
    import engine

    version = engine.VERSION
    c = cases.CASES[name]
    s = c["settings"]
    return "\n".join([
        f"# {name}: recorded from real SGLang {version} ranks", "",
        f"SGLang, {c['what']}. Every rank built and loaded by SGLang {version} itself on CPU (Gloo), one "
        f"process per rank: `tests/sglang/record.py --write {name}` (tools/test.d/26-sglang.sh checks it in CI).", "",
        f"- Settings: `engine.build_rank(..., {', '.join(f'{k}={v!r}' for k, v in s.items())})`; "
        f"`reshard init --infer {c['infer']}` describes the same ranks (tests/recorded_dumps_test.cc).",
        "- How (tests/sglang/engine.py): `ServerArgs(device=\"cpu\", dtype=\"bfloat16\", load_format=\"safetensors\", "
        "...)`, `runtime_context.publish` with the rank's `SpawnRanks`, `bootstrap.init_parallel_runtime` (Gloo), "
        "`init_layer_runtime`, the MoE / GEMM configs, the expert-location metadata, then "
        "`load_model_with_memory_saver`: SGLang's own model classes, DefaultModelLoader, load_weights, "
        "post_load_weights and process_weights_after_loading. No platform detected: every layer takes its "
        "generic (GPU-side) path. `adjust_config_with_unaligned_cpu_tp` is not applied.",
        "- Changed for a CPU: " + ", ".join(engine.rope_for_cpu()) + " (the rope implementation only; no loader).",
        "- Checkpoint: config.json here, random values for the tensors `reshard init --train hf` lists "
        "(tests/vllm/checkpoint.py), quantized as its quantization_config says.",
        "- The dump: named_parameters(), persistent buffers, then MLA's derived attributes `self_attn.w_kc`, "
        "`w_vc` (and `w_scale` under FP8), strides where not contiguous; rank r is SGLang's TP rank, `sglang` "
        "its coordinates from SGLang's own context (attention TP / DP, MoE EP / TP).",
        "- Tensors beyond the checkpoint (FP8 `attn_mqa` / `attn_mha` `k_scale` / `v_scale`, MLA's w_kc / w_vc / "
        "w_scale): `reshard check` names them as the engine's own (frameworks/sglang_engine.cc).", ""])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build folder (its reshard binary)")
    ap.add_argument("--write", action="store_true", help="write the dumps into tests/data/recorded/<case>/")
    ap.add_argument("--work", help="where to keep checkpoints, dumps and rank logs (default: a temporary folder)")
    ap.add_argument("case", nargs="*", help=f"cases (default: all): {', '.join(cases.CASES)}")
    a = ap.parse_args(argv)
    import engine

    engine.check_version()
    reshard = os.path.join(a.build, "reshard")
    names = a.case or list(cases.CASES)
    unknown = [n for n in names if n not in cases.CASES]
    if unknown:
        sys.exit(f"record.py: unknown case(s) {', '.join(unknown)}; known: {', '.join(cases.CASES)}")
    work = a.work or tempfile.mkdtemp(prefix="reshard-sglang-")
    bad = 0
    for name in names:
        start = time.time()
        ranks = dump_case(reshard, name, work)
        folder = os.path.join(cases.RECORDED, name)
        path = os.path.join(folder, "dump.json")
        if a.write:
            config = cases.config(name)
            os.makedirs(folder, exist_ok=True)
            dump_state_dict.write_json(path, ranks)
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(config, f, indent=2)
                f.write("\n")
            with open(os.path.join(folder, "SOURCES.md"), "w") as f:
                f.write(sources_md(name))
            print(f"{name}: wrote {path} ({len(ranks)} ranks, {time.time() - start:.1f} s)", flush=True)
            continue
        with open(path) as f:
            recorded = json.load(f)
        if recorded == ranks:
            print(f"{name}: {len(ranks)} ranks equal the recorded dump ({time.time() - start:.1f} s)", flush=True)
            continue
        bad += 1
        print(f"{name}: the real SGLang ranks differ from {path}:", flush=True)
        for r, (want, got) in enumerate(zip(recorded, ranks)):
            w = {p["name"]: p for p in want["params"]}
            g = {p["name"]: p for p in got["params"]}
            for n in sorted(set(w) | set(g)):
                if w.get(n) != g.get(n):
                    print(f"  rank {r}: {n}: recorded {w.get(n)}, real {g.get(n)}")
            meta = ("framework", "sglang")
            if [want.get(k) for k in meta] != [got.get(k) for k in meta]:
                print(f"  rank {r}: metadata: recorded {[want.get(k) for k in meta]}, real {[got.get(k) for k in meta]}")
        if len(recorded) != len(ranks):
            print(f"  recorded {len(recorded)} ranks, real {len(ranks)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
