"""TRL 1.16 GRPO with reshard as the weight sync, colocate mode: every
process trains its FSDP2 shards and serves one vLLM rank, and after each
optimizer step one reshard refit writes the vLLM rank in place from the
shards of every process, without gathering a parameter.

NOT YET RUN ON GPUS: a colocated vllm.LLM needs a GPU (vLLM's PyPI wheel has
no CPU ops). The same plug-in, on a real GRPOTrainer (FSDP2 over Gloo) and a
real vLLM 0.33 rank in each process, runs on CPU in tests/trl (docs/trl.md
says where that proof stops).

Needs: 8 GPUs (one process per GPU), TRL 1.16.0, vLLM 0.33.0, the reshard
package, and the plan, compiled once for this trainer and engine (a cluster
file with "placement": "colocated": inference rank i on training rank i's GPU):

    reshard init --hf-config Qwen3-0.6B/config.json --train fsdp2:dp_shard=8 \\
        --infer vllm:tp=1,engines=8 --cluster colocated.json -o specs
    reshard compile --model specs/model.json --from specs/train.json --to specs/infer.json \\
        --cluster specs/cluster.json -o grpo.rsplan

Run (accelerate's FSDP2 config, version 2):

    accelerate launch --num_processes 8 --use_fsdp --fsdp_version 2 \\
        python/examples/trl_grpo.py Qwen/Qwen3-0.6B grpo.rsplan
"""

from __future__ import annotations

import sys


def main(model_id: str, plan: str) -> None:
    import torch  # first: reshard's NCCL transport uses the libnccl.so.2 torch has loaded
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    import reshard.trl

    def reward(completions, **kwargs):
        return [-abs(20 - len(c)) / 20 for c in completions]

    prompts = Dataset.from_dict({"prompt": ["The capital of France is", "Two plus two is"] * 64})
    trainer = GRPOTrainer(
        model=model_id, reward_funcs=reward, train_dataset=prompts,
        args=GRPOConfig(output_dir="grpo-out", use_vllm=True, vllm_mode="colocate", bf16=True, max_steps=10,
                        per_device_train_batch_size=4, num_generations=4, report_to="none"))
    # The three lines: the trainer, then this on every rank, then train().
    sync = reshard.trl.attach(trainer, plan)
    trainer.train()
    print(f"rank {trainer.accelerator.process_index}: {sync.syncs} refits, the last "
          f"{sync.last_seconds * 1e3:.1f} ms ({torch.cuda.get_device_name()})")


def missing() -> str:
    """What this machine lacks to run the example ('' when nothing)."""
    try:
        import torch
    except ImportError:
        return "PyTorch"
    if not torch.cuda.is_available():
        return "a CUDA GPU per process (a colocated vllm.LLM cannot be built on a CPU)"
    for name, version in (("trl", "1.16.0"), ("vllm", "0.33.0")):
        try:
            mod = __import__(name)
        except ImportError:
            return f"{name} {version}"
        if mod.__version__.split("+")[0] != version:
            return f"{name} {version} (found {mod.__version__})"
    return ""


if __name__ == "__main__":
    need = missing()
    if need or len(sys.argv) != 3:
        print(__doc__)
        raise SystemExit(f"trl_grpo.py needs {need}" if need else "usage: trl_grpo.py MODEL PLAN")
    main(sys.argv[1], sys.argv[2])
