#!/usr/bin/env python3
"""What one weight update costs through verl 0.9.1 on this machine's CPUs,
on the job of tests/verl/refit.py (a tiny Qwen3, FSDP2 over 2 Gloo ranks, fp32
masters -> vLLM 0.33 at TP 2), medians of --runs updates:

- reshard:    ``CheckpointEngineManager.update_weights`` with
              ``backend=reshard`` (verl's whole update: abort, KV-cache
              release, topology, both sides' updates, finalize, resumes);
- bare:       one ``Session.run()`` on every plan rank at once (the trainer
              ranks in their actors, the vLLM workers through
              ``collective_rpc``), no verl and no vLLM lifecycle: the
              plug-in's overhead is reshard minus bare;
- verl's own path, the parts that run on a CPU: on every trainer rank the
  stream ``get_per_tensor_param()`` consumed (FSDP2 ``full_tensor()`` of
  every parameter: the gather) and packed into buckets of
  ``update_weights_bucket_megabytes`` by verl's ``split_weight_chunks``, as
  the ``nccl`` backend's sender does before each broadcast
  (``nccl_checkpoint_engine.py`` ``send_weights``), the broadcast not run
  (NCCL); and on every vLLM worker the full tensors loaded through vLLM's
  weight loaders (``model.load_weights``), where verl's ``named_tensors``
  path ends (``update_weights_from_ipc``), the IPC transfer not run. Its
  total is a lower bound of verl's update: the transfers are left out.

Also counted on every trainer rank: the calls that gather a weight
(``DTensor.full_tensor``, ``all_gather_into_tensor``) per update, each way.

    flock /tmp/reshard-heavy.lock build/vllm-venv/bin/python tools/bench/verl_bench.py --runs 5 [--json out.json]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "verl"))

import refit  # noqa: E402  (sets the CPU environment before vLLM or verl is imported)

# the vLLM load below is a function sent through collective_rpc, which vLLM 0.33 pickles only when allowed
refit.ENV["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"


def load_through_vllm_loaders(worker, checkpoint_dir):
    """In a vLLM worker: the checkpoint's full tensors through the model's weight loaders; seconds."""
    from safetensors.torch import load_file

    full = load_file(os.path.join(checkpoint_dir, "model.safetensors"))
    t0 = time.perf_counter()
    worker.get_model().load_weights(iter(full.items()))
    return time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--work")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args(argv)
    work = a.work or tempfile.mkdtemp(prefix="reshard-verl-bench-")
    import ray

    with refit.job(work) as job:
        med = lambda xs: round(statistics.median(xs), 4)  # noqa: E731
        job.manager.update_weights(global_steps=0)  # connects: the first update, not timed
        ckpt = os.path.join(work, "bench-ckpt")
        job.actor_wg.dump_bf16(ckpt)
        out = {"runs": a.runs, "model_parameters": job.parameters,
               "plan_bytes": job.plan.net_bytes + job.plan.nvlink_bytes}
        reshard_s, bare_s, stream_s, load_s = [], [], [], []
        job.actor_wg.weight_gathers()
        for k in range(a.runs):
            t0 = time.perf_counter()
            job.manager.update_weights(global_steps=k + 1)
            reshard_s.append(time.perf_counter() - t0)
        out["reshard_gathers_per_update_per_rank"] = max(job.actor_wg.weight_gathers()) / a.runs
        print(f"reshard through verl's manager: {reshard_s}", flush=True)
        for _ in range(a.runs):
            t0 = time.perf_counter()
            trainer = job.actor_wg.bare_run()  # non-blocking: every trainer rank's run, with the workers' below
            worker = job.server.collective_rpc.remote("reshard_bare_run")
            ray.get(trainer + [worker])
            bare_s.append(time.perf_counter() - t0)
        print(f"bare Session.run(): {bare_s}", flush=True)
        bucket = int(job.cfg.actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes) << 20
        job.actor_wg.weight_gathers()
        for _ in range(a.runs):
            stream_s.append(max(job.actor_wg.verl_stream(bucket)))
            load_s.append(max(ray.get(job.server.collective_rpc.remote(load_through_vllm_loaders, args=(ckpt,)))))
        out["verl_gathers_per_update_per_rank"] = max(job.actor_wg.weight_gathers()) / a.runs
        out.update(reshard_update_s=med(reshard_s), bare_run_s=med(bare_s),
                   plugin_overhead_s=round(med(reshard_s) - med(bare_s), 4),
                   verl_stream_gather_and_buckets_s=med(stream_s), vllm_load_weights_s=med(load_s),
                   verl_cpu_parts_s=round(med(stream_s) + med(load_s), 4))
    print(json.dumps(out, indent=1), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
