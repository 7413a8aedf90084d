"""The trainer side of vLLM 0.33's weight-transfer doors: ``"reshard"`` in
``WeightTransferTrainerFactory`` (``vllm/distributed/weight_transfer/factory.py``).

vLLM 0.33 builds the trainer side through
``WeightTransferTrainerFactory.trainer_init(init_info, client=, source=)``
on every trainer rank and refits with ``engine.send_weights()``; TRL's
server mode and SkyRL do the same, with ``source=ModuleSource(model)`` and
an ``HTTPVLLMWeightSyncClient`` or ``RayVLLMWeightSyncClient``
(``distributed/weight_transfer/clients.py``)::

    from vllm.distributed.weight_transfer import HTTPVLLMWeightSyncClient, ModuleSource
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
    from reshard.vllm_trainer import ReshardTrainerInitInfo

    engine = WeightTransferTrainerFactory.trainer_init(
        ReshardTrainerInitInfo(rank=trainer_rank, plan_path="refit.rsplan", store="/shared/fresh-dir"),
        client=HTTPVLLMWeightSyncClient("http://vllm:8000"), source=ModuleSource(model))
    engine.send_weights()          # every step, on every trainer rank

Unlike vLLM's broadcast engines, every trainer rank is a sender: each
binds its own shards of the module once (:class:`reshard.TrainerRefit`)
and runs its part of the plan; nothing is gathered. Trainer rank 0 also
drives the engine through the client (vLLM's convention:
``TrainerInitInfo.is_sender``): at ``trainer_init`` it sends the worker
init dict, the same for every worker (``rank_offset``: each worker adds
its own DP / PP / TP position), while its own session connects; at
``send_weights`` it calls ``start_weight_update``, then ``update_weights``
while its own part of the plan runs, then ``finish_weight_update``. The
other trainer ranks only run their parts.
"""

from __future__ import annotations

import base64
import threading
from dataclasses import asdict, dataclass
from typing import Any, Callable, ClassVar, Dict, Optional

from vllm.distributed.weight_transfer.base import TrainerInitInfo, TrainerWeightTransferEngine

from .refit import TrainerRefit
from .session import RunStats, Session
from .vllm import ReshardUpdateInfo, connect, decode_unique_id


@dataclass
class ReshardTrainerInitInfo(TrainerInitInfo):
    """One trainer rank's init info (``rank``: this trainer rank; rank 0 drives the engine)."""

    backend: ClassVar[str] = "reshard"

    plan_path: str  #: the compiled plan, the same file every process reads
    store: str = ""  #: Gloo rendezvous: a fresh directory every process sees, or HOST:PORT; "" for NCCL
    #: this rank's plan rank; None: the plan's training rank `rank` (plan.source_ranks[rank])
    plan_rank: Optional[int] = None
    #: the plan rank of the engine's first worker, sent to the workers; None: the plan's first inference rank
    rank_offset: Optional[int] = None
    #: NCCL: the unique id of the refit's communicator (reshard.nccl.unique_id() in process 0), standard
    #: base64; "" with a store: made by rank 0 and shared over torch.distributed's default group
    nccl_unique_id_b64: str = ""
    timeout_s: float = 120.0


def _module_of(source: Any) -> Any:
    """The module (or mapping of names to tensors) a session binds, from what trainer_init was given."""
    module = getattr(source, "_module", None)  # vLLM's ModuleSource keeps it there (base.py ModuleSource.__init__)
    if module is not None:
        return module
    if hasattr(source, "named_parameters") or isinstance(source, dict):
        return source
    raise TypeError(f"source: reshard binds a module's own tensors in place, so it takes vLLM's ModuleSource(model), "
                    f"a torch.nn.Module or a dict of names to tensors; got {type(source).__name__} (a WeightSource "
                    "that only yields tensors has nothing to bind)")


def _both(remote: Callable[[], Any], local: Callable[[], Any], what: str) -> Any:
    """Runs `remote` (an RPC to the engine) and `local` (this rank's side,
    which meets the workers inside the same connect or run) at once, and
    returns `local`'s result once both are done. The first failure is raised
    as soon as it happens: the other call may stay blocked until its own
    timeout (a worker that refused to connect never joins), on a daemon
    thread, so neither a wait here nor the interpreter's exit hangs on it
    (vLLM's NCCL trainer leaves its RPC thread the same way:
    ``nccl_engine.py`` ``send_weights``)."""
    done = threading.Condition()
    results: Dict[str, Any] = {}

    def call(key: str, fn: Callable[[], Any]) -> None:
        try:
            out = (True, fn())
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out = (False, e)
        with done:
            results[key] = out
            done.notify_all()

    threads = [threading.Thread(target=call, args=(k, f), daemon=True, name=f"reshard-{what}-{k}")
               for k, f in (("remote", remote), ("local", local))]
    for t in threads:
        t.start()
    with done:
        while True:
            failed = [r for r in results.values() if not r[0]]
            if failed:
                raise failed[0][1]
            if len(results) == 2:
                return results["local"][1]
            done.wait()


class ReshardTrainerWeightTransferEngine(TrainerWeightTransferEngine[ReshardTrainerInitInfo]):
    """A trainer rank's side of every refit: its part of the plan, run over
    its own tensors; rank 0 also drives the engine through the client."""

    init_info_cls = ReshardTrainerInitInfo

    def __init__(self, *, client: Any, source: Any = None, is_sender: bool = True, rank: int = 0,
                 refit: Optional[TrainerRefit] = None, worker_init: Optional[Dict[str, Any]] = None):
        super().__init__(client=client, source=source, is_sender=is_sender, rank=rank)
        self.refit = refit
        self.worker_init = worker_init  #: the dict the workers got (on every rank)
        self.stats: Optional[RunStats] = None
        self.step = 0

    @classmethod
    def trainer_init(cls, init_info: ReshardTrainerInitInfo, *, client: Any, source: Any = None
                     ) -> "ReshardTrainerWeightTransferEngine":
        from . import Plan

        if source is None:
            raise ValueError("reshard's trainer engine needs source=ModuleSource(model) (or the module): it binds "
                             "this rank's tensors of it")
        module = _module_of(source)
        plan = Plan.open(init_info.plan_path)
        rank = init_info.plan_rank
        if rank is None:
            if not 0 <= init_info.rank < len(plan.source_ranks):
                raise ValueError(f"trainer rank {init_info.rank}: the plan has {len(plan.source_ranks)} training "
                                 "ranks; give plan_rank")
            rank = plan.source_ranks[init_info.rank]
        uid = decode_unique_id(init_info.nccl_unique_id_b64, "ReshardTrainerInitInfo") \
            if init_info.nccl_unique_id_b64 else b""
        if not init_info.store and not uid:
            uid = _shared_unique_id()
        worker_init = {"plan_path": init_info.plan_path,
                       "rank_offset": plan.dest_ranks[0] if init_info.rank_offset is None else init_info.rank_offset,
                       "store": init_info.store, "timeout_s": init_info.timeout_s}
        if uid:
            worker_init["nccl_unique_id_b64"] = base64.b64encode(uid).decode()

        def session() -> Session:
            device = 0
            if uid:
                import torch

                device = torch.cuda.current_device()
            return Session(plan, rank, connect(plan, rank, store=init_info.store, nccl_unique_id=uid,
                                               timeout_s=init_info.timeout_s, device=device))

        if init_info.is_sender:
            # The workers connect inside the RPC and this rank inside Session(): both at once.
            s = _both(lambda: client.init_weight_transfer_engine(worker_init), session, "init")
        else:
            s = session()
        return cls(client=client, source=source, is_sender=init_info.is_sender, rank=init_info.rank,
                   refit=TrainerRefit(s, module), worker_init=worker_init)

    def send_weights(self, weight_version: Optional[str] = None) -> None:
        """One refit, on every trainer rank: this rank's part of the plan; on
        rank 0 also the engine's start / update / finish (the workers' parts
        run inside ``update_weights``, at the same time as this rank's)."""
        if self.refit is None:
            raise RuntimeError("the engine was shut down")
        refit = self.refit
        if not self.is_sender:
            self.stats = refit.run()
            return
        self.client.start_weight_update()
        info = asdict(ReshardUpdateInfo(step=self.step))
        self.stats = _both(lambda: self.client.update_weights(info), refit.run, "update")
        if weight_version is None:
            self.client.finish_weight_update()
        else:
            self.client.finish_weight_update(weight_version)
        self.step += 1

    def shutdown(self) -> None:
        self.refit = None  # the session and its transport go with it


def _shared_unique_id() -> bytes:
    """An NCCL unique id made by trainer rank 0 and shared over
    torch.distributed's default group (the trainer's own: every trainer rank
    calls trainer_init). Any one process may make the id every rank then
    joins with (ncclGetUniqueId)."""
    import torch.distributed as dist

    from . import nccl

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("ReshardTrainerInitInfo: give store (Gloo) or nccl_unique_id_b64 (NCCL); without either, "
                         "the trainer's torch.distributed default group must exist to share a unique id")
    box = [nccl.unique_id() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
