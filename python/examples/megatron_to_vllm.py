"""Megatron-Core -> vLLM weight refit, written the way an RL framework calls reshard.

NOT YET RUN ON GPUS: the same classes (reshard.TrainerRefit on real
Megatron-Core ranks, reshard.vllm.WorkerRefit on real vLLM 0.33 ranks) run on
CPU over Gloo in tests/vllm/refit_live.py; the NCCL path has been exercised
only by tools/gpu-check.sh's loopback, not by this script.

Offline, once per (model, parallelism) pair:

    reshard init  --hf-config config.json --train megatron:tp=4,pp=8,ep=16 --infer vllm:tp=8,dp=16 -o specs/
    reshard compile --model specs/model.json --from specs/train.json --to specs/infer.json \
        --cluster specs/cluster.json -o refit.rsplan

(or reshard.compile(...) in Python). Every process of the job — training
ranks and inference workers alike — holds the plan file and its global rank
in the plan (training ranks first, then inference ranks, unless the cluster
spec places them otherwise).
"""

from __future__ import annotations

import torch  # first: reshard's NCCL transport uses the libnccl.so.2 torch has loaded

import reshard


def make_transport(plan: reshard.Plan, global_rank: int, device: int, broadcast_object) -> reshard.NcclTransport:
    """Communicators made by reshard over the refit job's processes: one per
    active plan rank (idle GPUs of partly used NVLink domains have none), the
    process of plan rank r being communicator rank plan.process_of(r).

    `broadcast_object(obj)` is the framework's way to ship a small object from
    process 0 to every process (a Ray object ref, torch.distributed's
    broadcast_object_list over an existing group, a key in a store)."""
    process = plan.process_of(global_rank)
    uid = broadcast_object(reshard.nccl.unique_id() if process == 0 else None)
    world = reshard.nccl.Communicator.init(len(plan.active_ranks), process, uid, device=device)
    # The NVLink channel: one communicator per NVLink domain of the plan's cluster.
    nvlink = world.split(color=plan.domains[global_rank], key=process)
    stream = torch.cuda.Stream(device=device)
    return reshard.NcclTransport(world, nvlink, stream=stream, timeout_s=120)


class PolicyRank:
    """A Megatron-Core training rank (one of plan.source_ranks)."""

    def __init__(self, model: torch.nn.Module, plan_path: str, global_rank: int, device: int, broadcast_object):
        self.plan = reshard.Plan.open(plan_path)
        self.transport = make_transport(self.plan, global_rank, device, broadcast_object)
        # Bound once (Float16Module / DDP wrappers are looked through); parameters the
        # framework replaces later (offload, resharding) are re-bound by name at each run.
        self.refit_ = reshard.TrainerRefit(reshard.Session(self.plan, global_rank, self.transport), model)

    def refit(self) -> reshard.RunStats:
        # After the optimizer step: the parameters hold the new weights.
        torch.cuda.current_stream().synchronize()  # the optimizer's writes are done
        return self.refit_.run()


class InferenceRank:
    """A vLLM 0.33 worker (one of plan.dest_ranks): its model's parameters are the destinations.

    reshard.vllm.WorkerRefit checks the engine's TP / PP / DP / EP and its
    kernels' weight layouts against the plan before any byte moves, then each
    run() writes the weights in place and recomputes what vLLM derives from
    them (MLA's W_UV / W_UK_T). The same as a vLLM weight-transfer engine:
    reshard.vllm.register(), then weight_transfer_config.backend = "reshard"."""

    def __init__(self, model: torch.nn.Module, vllm_config, plan_path: str, global_rank: int, device: int,
                 broadcast_object):
        import reshard.vllm

        self.plan = reshard.Plan.open(plan_path)
        self.transport = make_transport(self.plan, global_rank, device, broadcast_object)
        self.refit_ = reshard.vllm.WorkerRefit(reshard.Session(self.plan, global_rank, self.transport), model,
                                               vllm_config)

    def refit(self) -> reshard.RunStats:
        return self.refit_.run()  # returns when the weights, and what vLLM derives from them, are in place


def training_loop(policy: PolicyRank, steps: int, train_step, notify_inference) -> None:
    for _ in range(steps):
        train_step()
        stats = policy.refit()  # inference ranks call InferenceRank.refit() in the same step
        notify_inference(stats.seconds)
