"""A multi-rank trainer refits a running SGLang server through reshard's door
into SGLang (reshard.sglang), written the way an RL job calls it.

WHAT IT NEEDS: an SGLang 0.5.23 server on GPUs, started with reshard's
custom weight loader, and a trainer whose ranks can reach it over HTTP and
over NCCL (or Gloo: --store). SGLang's server cannot serve on a CPU from
PyPI (its CPU kernels are not published), so this script has not run end to
end: the same calls into SGLang's weight-update session run on real SGLang
CPU ranks in tests/sglang/refit_live.py, without SGLang's HTTP server and
tokenizer manager in between.

Offline, once: the plan (the trainer's ranks first, then the engine's
workers in SGLang's rank order, tp_rank):

    reshard init --hf-config Qwen3-30B-A3B/config.json --train megatron:tp=4,ep=8 \\
        --infer sglang:tp=8,ep=8,attn-dp=8 --cluster dgx-h100 -o specs
    reshard compile --model specs/model.json --from specs/train.json --to specs/infer.json \\
        --cluster specs/cluster.json -o /shared/refit.rsplan

The engine, with reshard's loader allowed (the plug-in's hook, which returns
a refused refit as the call's error instead of ending the scheduler, comes
with the package's ``sglang.srt.plugins`` entry point):

    python -m sglang.launch_server --model-path Qwen3-30B-A3B --tp-size 8 --ep-size 8 --attn-dp-size 8 \\
        --custom-weight-loader reshard.sglang.load_refit

Every trainer rank, after each optimizer step (torchrun; a real trainer binds
its Megatron-Core model where this one binds a stand-in of the plan's tensors):

    torchrun --nproc-per-node 32 sglang_refit.py --plan /shared/refit.rsplan --url http://engine:30000 --tp 8
"""

from __future__ import annotations

import argparse
import base64
import os

import torch  # first: reshard's NCCL transport uses the libnccl.so.2 torch has loaded
import torch.distributed as dist

import reshard
import reshard.sglang


def transport(plan: reshard.Plan, rank: int, store: str, uid_b64: str) -> object:
    process, processes = plan.process_of(rank), len(plan.active_ranks)
    if store:
        return reshard.GlooTransport(process, processes, store=store, timeout_s=120)
    world = reshard.nccl.Communicator.init(processes, process, base64.b64decode(uid_b64),
                                           device=torch.cuda.current_device())
    return reshard.NcclTransport(world, world.split(color=plan.domains[rank], key=process), timeout_s=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--url", required=True, help="the SGLang server")
    ap.add_argument("--tp", type=int, required=True, help="the engine's TP size (its number of workers)")
    ap.add_argument("--store", default="", help="Gloo rendezvous (a shared directory); default NCCL")
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    dist.init_process_group("nccl" if not a.store else "gloo")
    if not a.store:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    plan = reshard.Plan.open(a.plan)
    rank = plan.source_ranks[dist.get_rank()]
    # The NCCL unique id: made by rank 0, sent to the trainer ranks here and to the workers in the request.
    box = [base64.b64encode(reshard.nccl.unique_id()).decode() if dist.get_rank() == 0 and not a.store else ""]
    dist.broadcast_object_list(box, src=0)
    request = reshard.sglang.RefitRequest(plan_path=a.plan, rank_offset=plan.dest_ranks[0], store=a.store,
                                          nccl_unique_id_b64=box[0])
    device = "cpu" if a.store else "cuda"
    # Stand-in for the trainer's model: this rank's buffers of the plan.
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    weights = {b.name: torch.zeros(b.shape, dtype=dtypes[b.dtype], device=device) for b in plan.buffers(rank)}
    refit = None
    for step in range(a.steps):
        # ... the optimizer step writes `weights` ...
        if device == "cuda":
            torch.cuda.current_stream().synchronize()
        request.step = step

        def run_local() -> None:
            nonlocal refit
            if refit is None:  # connects while the workers connect inside the first update
                refit = reshard.TrainerRefit(reshard.Session(plan, rank, transport(plan, rank, a.store, box[0])),
                                             weights)
            refit.run()

        if dist.get_rank() == 0:
            reply = reshard.sglang.refit_over_http(a.url, request, a.tp, run_local, weight_version=str(step))
            print(f"step {step}: {reply.get('message')}", flush=True)
        else:
            run_local()
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
