"""reshard as a vLLM weight-transfer engine and as a NeMo RL weight synchronizer.

NOT YET RUN: written against vLLM's WeightTransferEngine interface
(vllm/distributed/weight_transfer/base.py: init_transfer_engine,
start_weight_update, update_weights -> receive_weights,
finish_weight_update, shutdown, trainer_send_weights; engines registered in
the weight-transfer factory) as its sources read at the time of writing
(vLLM 0.33 is the project's stated version), and against the shape of NeMo
RL's refit hooks. Neither framework is installed in the test environment;
only reshard's own calls below are tested (python/tests).

The engine differs from vLLM's NCCL engine in one way: nothing is streamed
parameter by parameter. Both sides replay one precompiled plan; each
inference worker's parameters are bound once and written in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterator

import torch

import reshard

try:  # the interface, when vLLM is installed
    from vllm.distributed.weight_transfer.base import (WeightTransferEngine, WeightTransferInitInfo,
                                                       WeightTransferUpdateInfo)
except ImportError:  # keeps this file importable for reading
    WeightTransferEngine = object  # type: ignore[assignment,misc]

    class WeightTransferInitInfo:  # type: ignore[no-redef]
        pass

    class WeightTransferUpdateInfo:  # type: ignore[no-redef]
        pass


@dataclass
class ReshardInitInfo(WeightTransferInitInfo):
    plan_path: str  # the compiled plan, readable by every worker
    global_rank: int  # this worker's rank in the plan (an inference rank)
    nccl_unique_id: bytes  # made by plan rank 0 (reshard.nccl.unique_id()), shipped by the trainer
    timeout_s: float = 120.0


@dataclass
class ReshardUpdateInfo(WeightTransferUpdateInfo):
    step: int = 0  # for logs only: the plan says what moves


class ReshardWeightTransferEngine(WeightTransferEngine):  # type: ignore[misc]
    """Inference side: vLLM constructs it with (config, vllm_config, device, model)."""

    init_info_cls = ReshardInitInfo
    update_info_cls = ReshardUpdateInfo

    def init_transfer_engine(self, init_info: ReshardInitInfo) -> None:
        plan = reshard.Plan.open(init_info.plan_path)
        device = torch.device(self.device).index or 0
        self._world = reshard.nccl.Communicator.init(plan.num_ranks, init_info.global_rank,
                                                     init_info.nccl_unique_id, device=device)
        self._nvlink = self._world.split(color=plan.domains[init_info.global_rank], key=init_info.global_rank)
        self._transport = reshard.NcclTransport(self._world, self._nvlink, timeout_s=init_info.timeout_s)
        self._session = reshard.Session(plan, init_info.global_rank, self._transport)
        self._session.bind_module(self.model)

    def start_weight_update(self) -> None:
        # Parameters replaced since the last refit (post-processing) are re-bound.
        self._session.bind_module(self.model)

    def receive_weights(self, update_info: ReshardUpdateInfo) -> None:
        self._session.run()  # in place; returns when every destination byte is written

    def finish_weight_update(self) -> None:
        pass  # weights were applied in place

    def shutdown(self) -> None:
        self._session = None
        self._transport = None
        for c in (self._nvlink, self._world):
            if c is not None:
                c.destroy()

    @staticmethod
    def trainer_send_weights(iterator: Iterator[Any], trainer_args: Dict[str, Any]) -> None:
        """Trainer side: each training rank runs its own session (trainer_args["session"]);
        the iterator of (name, tensor) is not needed: the tensors were bound once."""
        trainer_args["session"].run()


class ReshardNemoRLSynchronizer:
    """The shape of a NeMo RL refit hook (policy worker side and generation
    worker side), not tied to a NeMo RL class: prepare once, then one call per
    step on every rank."""

    def __init__(self, plan_path: str, global_rank: int, transport: reshard.Transport):
        self.plan = reshard.Plan.open(plan_path)
        self.session = reshard.Session(self.plan, global_rank, transport)

    def prepare_refit_info(self, model: torch.nn.Module) -> Dict[str, Any]:
        self.session.bind_module(model)
        return {"buffers": len(self.session.buffers), "staging_bytes": self.session.staging_bytes}

    def update_weights(self) -> reshard.RunStats:
        return self.session.run()
