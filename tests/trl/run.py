"""reshard.trl with real TRL 1.16 on CPU: a GRPO trainer refits a real vLLM
0.33 rank through TRL's own VLLMGeneration.sync_weights, replaced by the
plug-in with one colocated reshard refit.

This driver writes a tiny Qwen3 checkpoint and a tokenizer built locally
(no download), compiles the colocated plan (FSDP2 dp_shard 2 with fp32
masters -> two vLLM TP1 engines, one per process) and the plans the
refusals need, then runs tests/trl/rank.py on 2 Gloo processes
(tests/vllm/launch.py). Each process is one GRPOTrainer rank (FSDP2 through
accelerate) and one vLLM rank (built as tests/vllm/engine.py builds it).
Every check is made on both ranks; any failure fails the run.

    build/vllm-venv/bin/python tests/trl/run.py --build build [--bench N]
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, os.path.join(ROOT, "tests", "vllm"), os.path.join(ROOT, "tests", "fsdp2")]

from cases import DENSE  # noqa: E402  (tests/fsdp2: the tiny dense Qwen3)

WORLD = 2
# A colocated cluster: inference rank i on the GPU of training rank i (docs/specs.md, reshard.cluster/1).
CLUSTER = {"format": "reshard.cluster/1", "name": "trl-colocated", "gpus_per_domain": 2, "nic_gbps": 400,
           "nvlink_GBps": 450, "placement": "colocated"}


def write_model(directory, config):
    """A seeded tiny HF checkpoint (bf16 safetensors) and a word-level tokenizer of its vocabulary."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    cfg = dict(config)
    model_type = cfg.pop("model_type")
    hf = AutoConfig.for_model(model_type, **cfg, dtype="bfloat16", eos_token_id=1, pad_token_id=0, bos_token_id=2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf).to(torch.bfloat16)
    model.save_pretrained(directory)
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    vocab.update({f"w{i}": i for i in range(4, cfg["vocab_size"])})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                   unk_token="<unk>")
    fast.save_pretrained(directory)


def plan(work, name, config_dir, train, infer, cluster):
    """Specs from `reshard.init` and the compiled plan: its path."""
    import reshard

    out = os.path.join(work, name)
    specs = reshard.init(config_dir, train=train, infer=infer, cluster=cluster, out_dir=out)
    path = os.path.join(out, "plan.rsplan")
    reshard.compile(os.path.join(out, "model.json"), os.path.join(out, "train.json"), os.path.join(out, "infer.json"),
                    os.path.join(out, "cluster.json"), path)
    assert specs["train"]["name"] and specs["infer"]["name"]
    return path


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--bench", type=int, default=0, help="after the steps, time N syncs of each path")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args(argv)
    import launch

    t0 = time.time()
    work = tempfile.mkdtemp(prefix="reshard-trl-")
    try:
        model_dir = os.path.join(work, "model")
        write_model(model_dir, DENSE)
        other_dir = os.path.join(work, "other-model")
        write_model(other_dir, dict(DENSE, hidden_size=32, intermediate_size=48))
        cluster = os.path.join(work, "cluster.json")
        with open(cluster, "w") as f:
            json.dump(CLUSTER, f)
        plans = {
            "good": plan(work, "good", model_dir, "fsdp2:dp_shard=2", "vllm:tp=1,engines=2", cluster),
            # the same ranks, another FSDP2 mesh: HSDP dp_replicate 2 x dp_shard 1
            "train_mesh": plan(work, "train-mesh", model_dir, "fsdp2:dp_shard=1,dp_replicate=2",
                               "vllm:tp=1,engines=2", cluster),
            # the same ranks, another engine: one TP2 engine over both processes
            "infer_tp": plan(work, "infer-tp", model_dir, "fsdp2:dp_shard=2", "vllm:tp=2", cluster),
            "other_model": plan(work, "other-model", other_dir, "fsdp2:dp_shard=2", "vllm:tp=1,engines=2", cluster),
            "disjoint": plan(work, "disjoint", model_dir, "fsdp2:dp_shard=2", "vllm:tp=1,engines=2", "dgx-h100"),
        }
        setup_s = time.time() - t0
        args = {"work": work, "model": model_dir, "plans": plans, "steps": a.steps, "bench": a.bench}
        t1 = time.time()
        try:
            # Each rank's output to a file: a pipe read only at the end fills up and blocks the rank.
            outs = launch.run(WORLD, [os.path.join(HERE, "rank.py"), json.dumps(args)], timeout_s=900, label="trl",
                              log_dir=work)
            crashed = None
        except RuntimeError as e:  # a rank failed: its own record says what it checked first
            outs, crashed = [], e
        ranks_s = time.time() - t1
        results = []
        for r in range(WORLD):
            path = os.path.join(work, f"rank{r}.json")
            if os.path.exists(path):
                with open(path) as f:
                    results.append(json.load(f))
            else:
                results.append({"failures": ["wrote no record"], "log": []})
        if crashed is not None:
            results[0]["failures"].append(str(crashed))
        failures = [f"rank {r}: {x}" for r, res in enumerate(results) for x in res["failures"]]
        for r, res in enumerate(results):
            for line in res["log"]:
                print(f"rank {r}: {line}")
        if a.bench:
            print(json.dumps({"bench": [res.get("bench") for res in results]}, indent=1))
        print(f"trl: checkpoint and plans in {setup_s:.1f} s, 2 ranks in {ranks_s:.1f} s")
        if failures:
            for line in failures:
                print("FAIL", line)
            for r, out in enumerate(outs):
                print(f"--- rank {r} output (tail)\n{out[-3000:]}")
            return 1
        print("trl: all checks passed")
        return 0
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("work directory kept:", work)


if __name__ == "__main__":
    sys.exit(main())
