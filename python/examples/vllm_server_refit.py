"""A multi-rank trainer refits a running `vllm serve` through vLLM 0.33's own
weight-transfer doors, with reshard as the backend on both sides.

NOT YET RUN ON GPUS: the same calls (vllm serve with the "reshard" backend,
WeightTransferTrainerFactory.trainer_init on every trainer rank, vLLM's
HTTPVLLMWeightSyncClient, send_weights) run on CPU over Gloo in
tests/vllm/doors.py; the NCCL path (a unique id made by trainer rank 0 and
shared over the trainer's default process group) has not run.

Offline, once: the plan for this trainer and this engine (reshard init /
reshard compile), a file every process can read. The training ranks come
first in the plan, then the engine's workers (DP, PP, TP order).

The server: every vLLM process finds reshard's engines through the
`vllm.general_plugins` entry point of the installed package; the RL routes
need VLLM_SERVER_DEV_MODE=1 (vllm/entrypoints/launchers/api_server/routers.py):

    VLLM_SERVER_DEV_MODE=1 vllm serve Qwen/Qwen3-8B --tensor-parallel-size 2 \
        --weight-transfer-config '{"backend": "reshard"}'

The trainer: this module's `connect` on every rank once torch.distributed is
up, then `engine.send_weights()` on every rank after each optimizer step.
"""

from __future__ import annotations

import torch  # first: reshard's NCCL transport uses the libnccl.so.2 torch has loaded
import torch.distributed as dist
from vllm.distributed.weight_transfer import HTTPVLLMWeightSyncClient, ModuleSource
from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

import reshard.vllm_plugin
from reshard.vllm_trainer import ReshardTrainerInitInfo


def connect(model: torch.nn.Module, plan_path: str, server_url: str):
    """Every trainer rank: bind this rank's parameters of `model` (FSDP2 or
    Megatron-Core shards, in place) and connect to the engine's workers.
    Rank 0 sends the workers one init dict (the plan, rank_offset: each worker
    adds its own DP / PP / TP position) over HTTP."""
    # A trainer is not a vLLM process: vLLM loads no plug-ins here.
    reshard.vllm_plugin.register()
    return WeightTransferTrainerFactory.trainer_init(
        # no store: NCCL, the unique id made by rank 0 and shared over the default group
        ReshardTrainerInitInfo(rank=dist.get_rank(), plan_path=plan_path),
        client=HTTPVLLMWeightSyncClient(server_url),
        source=ModuleSource(model))


def train(model, optimizer, batches, plan_path: str, server_url: str) -> None:
    engine = connect(model, plan_path, server_url)
    for step, batch in enumerate(batches):
        model(batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        torch.cuda.current_stream().synchronize()  # the optimizer's writes are done before reshard reads them
        # Every rank sends its own shards; rank 0 also drives start / update / finish on the server.
        engine.send_weights(weight_version=str(step))
    engine.shutdown()
