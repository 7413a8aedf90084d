#!/usr/bin/env python3
"""reshard as verl's checkpoint engine: make the plan from the job's verl
config, then print the lines that select the backend (docs/verl.md).

Needs the reshard package; not verl (the plan is made offline, anywhere).
The job itself needs verl 0.9.1 and vLLM 0.33 on every trainer and rollout
node, the rollout on GPUs of its own (``rollout.nnodes`` > 0), and the plan
file where every process reads it.

    python verl_backend.py --config my_ppo_job.yaml -o /shared/refit
    python verl_backend.py --model /models/Qwen3-8B --trainer-gpus 16 --rollout-gpus 8 --rollout-tp 2 -o /shared/refit

``--config`` takes verl's composed config (``OmegaConf.save`` of the job's
config, or a YAML with the same keys); without it, the few settings the plan
depends on are given as options.
"""
import argparse
import json

import reshard.verl


def job_config(a):
    if a.config:
        from omegaconf import OmegaConf

        return OmegaConf.load(a.config)
    return {"actor_rollout_ref": {
        "model": {"path": a.model},
        "actor": {"strategy": "fsdp2", "fsdp_config": {"fsdp_size": a.fsdp_size, "model_dtype": "fp32"}},
        "rollout": {"name": "vllm", "nnodes": 1, "n_gpus_per_node": a.rollout_gpus,
                    "tensor_model_parallel_size": a.rollout_tp, "data_parallel_size": 1,
                    "pipeline_model_parallel_size": 1, "expert_parallel_size": 1}},
        "trainer": {"nnodes": 1, "n_gpus_per_node": a.trainer_gpus}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="the job's verl config (YAML)")
    ap.add_argument("--model", help="the model's directory (its config.json), without --config")
    ap.add_argument("--trainer-gpus", type=int, default=8)
    ap.add_argument("--fsdp-size", type=int, default=-1)
    ap.add_argument("--rollout-gpus", type=int, default=8)
    ap.add_argument("--rollout-tp", type=int, default=2)
    ap.add_argument("--cluster", default="dgx-h100")
    ap.add_argument("-o", "--out", required=True, help="where the specs and refit.rsplan go")
    a = ap.parse_args()
    if not a.config and not a.model:
        ap.error("give --config (the job's verl config) or --model (the model's directory)")
    config = job_config(a)
    print("reshard.init arguments:", json.dumps(reshard.verl.plan_args(config)))
    plan = reshard.verl.make_plan(config, a.out, cluster=a.cluster)
    p = reshard.Plan.open(plan)
    print(f"plan: {plan} ({p.inputs['source_layout']} -> {p.inputs['dest_layout']}, model {p.inputs['model']})")
    print("verl config:")
    for line in reshard.verl.config_lines(plan):
        print("    " + line)


if __name__ == "__main__":
    main()
