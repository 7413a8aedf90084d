"""reshard.slime: slime's Megatron actors refit its SGLang engines through one reshard plan.

slime (``slime/backends/megatron_utils/actor.py`` ``MegatronTrainRayActor.init``)
picks its weight updater by name: for ``--update-weight-mode full`` over NCCL
without ``--colocate`` that is ``UpdateWeightFromDistributed``
(``update_weight/update_weight_from_distributed.py``), which all-gathers every
tensor to the first rank of each pipeline stage (TP, then EP), converts it to
Hugging Face names and broadcasts it whole, bucket by bucket, to every GPU
of every engine (``/update_weights_from_distributed``), each engine in turn
under ``rollout_engine_lock``.

:class:`ReshardUpdateWeight` is that class with its transfer replaced: every
Megatron rank binds its own parameters once and replays its part of one
precompiled plan; the engines' workers replay theirs inside SGLang's
weight-update session through reshard's custom weight loader
(:mod:`reshard.sglang`). Nothing is gathered, converted or broadcast.
slime's ``connect_rollout_engines`` / ``update_weights`` / ``pop_metrics`` /
``disconnect_rollout_engines`` keep their meaning, so the actor drives it
unchanged.

What a slime user writes (no slime code changes)::

    RESHARD_PLAN=/shared/refit.rsplan RESHARD_STORE=/shared/reshard-store \\
    python train.py ... --custom-megatron-init-path reshard.slime.apply \\
        --sglang-custom-weight-loader reshard.sglang.load_refit

``--custom-megatron-init-path`` is slime's own hook, called with ``args`` on
every Megatron rank at the end of ``initialize.py`` ``init`` (before the
actor picks its updater); :func:`apply` puts :class:`ReshardUpdateWeight` in
the actor module's place of ``UpdateWeightFromDistributed``. The upstream
change it stands for: a ``--custom-weight-updater-path`` in slime naming the
class the actor builds (``load_function``, as slime's other ``--custom-*``
paths). The plan's training ranks are the Megatron world (global rank
order); its inference ranks are the engines' GPUs, engine after engine, in
the order of ``engine_gpu_counts``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any, Dict, Iterator, List, Optional, Sequence

try:
    from slime.backends.megatron_utils.update_weight.update_weight_from_distributed import (
        UpdateWeightFromDistributed as _Base)
except ImportError as _e:  # one line, what to do
    raise ImportError("reshard.slime needs slime (https://github.com/THUDM/slime) and its Megatron-Core, Ray and "
                      f"SGLang in this Python environment: {_e}") from None

from .refit import TrainerRefit
from .session import Session

__all__ = ["ReshardUpdateWeight", "apply", "engine_offsets"]

#: Where slime's actor looks up the class it builds (actor.py: `update_weight_cls = UpdateWeightFromDistributed`).
_ACTOR_MODULE = "slime.backends.megatron_utils.actor"


def apply(args: Any = None) -> None:
    """slime's ``--custom-megatron-init-path`` hook: from now on this
    process's actor builds :class:`ReshardUpdateWeight` where it would build
    ``UpdateWeightFromDistributed``. Raises when no plan is named (``RESHARD_PLAN``)."""
    import importlib
    import sys

    plan = os.environ.get("RESHARD_PLAN", "") or getattr(args, "reshard_plan", None)
    if not plan:
        raise ValueError("reshard.slime.apply: name the plan in RESHARD_PLAN (a file every trainer and engine "
                         "process reads), e.g. RESHARD_PLAN=/shared/refit.rsplan")
    # Called from slime's init, inside MegatronTrainRayActor.init: the actor module is already imported.
    actor = sys.modules.get(_ACTOR_MODULE) or importlib.import_module(_ACTOR_MODULE)
    actor.UpdateWeightFromDistributed = ReshardUpdateWeight


def engine_offsets(plan: Any, engine_gpu_counts: Sequence[int]) -> List[int]:
    """The plan rank of each engine's first GPU: the plan's inference ranks,
    engine after engine. Raises ValueError when the engines' GPUs are not the plan's inference ranks."""
    total = sum(engine_gpu_counts)
    if total != len(plan.dest_ranks):
        raise ValueError(f"the rollout engines have {total} GPUs ({list(engine_gpu_counts)} per engine); the plan "
                         f"'{plan.path}' has {len(plan.dest_ranks)} inference ranks: compile it for these engines")
    out, at = [], plan.dest_ranks[0]
    for c in engine_gpu_counts:
        out.append(at)
        at += c
    return out


class _Chunks(Mapping):
    """The tensors of every model chunk under the plan's names (``model{c}.``
    prefixes for virtual pipeline stages), read anew at each access so that
    a re-bind sees what Megatron replaced."""

    def __init__(self, session: Session, chunks: Sequence[Any]):
        self._session, self._chunks = session, list(chunks)

    def _all(self) -> Dict[str, Any]:
        if len(self._chunks) == 1:
            return dict(self._session.module_tensors(self._chunks[0]))
        return {n: t for c, m in enumerate(self._chunks) for n, t in self._session.module_tensors(m, f"model{c}.")}

    def __getitem__(self, name: str) -> Any:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def items(self):  # one pass, not one per name
        return self._all().items()


class ReshardUpdateWeight(_Base):
    """slime's distributed weight updater, its transfer done by one reshard plan.

    ``connect_rollout_engines`` records the engines and each one's first
    plan rank; the first ``update_weights`` connects every trainer rank's
    session (the engines' workers connect inside the same call) and binds
    this rank's parameters once. Each ``update_weights``, on rank 0: pause
    generation, flush the caches, ``/begin_weight_update`` on every engine,
    then ``/update_weights_from_tensor`` with reshard's loader on every
    engine at once (one plan spans them all, so they are not taken one at a
    time); on every rank its part of the plan; then ``/end_weight_update``
    and resume generation."""

    def __init__(self, args, model, weights_getter, *, model_name, quantization_config) -> None:
        super().__init__(args, model, weights_getter, model_name=model_name,
                         quantization_config=quantization_config)
        from . import Plan

        self.plan_path = os.environ.get("RESHARD_PLAN", "") or getattr(args, "reshard_plan", "")
        if not self.plan_path:
            raise ValueError("ReshardUpdateWeight: name the plan in RESHARD_PLAN")
        self.store = os.environ.get("RESHARD_STORE", "") or getattr(args, "reshard_store", "") or ""
        self.timeout_s = float(os.environ.get("RESHARD_TIMEOUT_S", "120"))
        self.plan = Plan.open(self.plan_path)
        self.refit: Optional[TrainerRefit] = None
        self.offsets: List[int] = []
        self._nccl_uid_b64 = ""

    def connect_rollout_engines(self, rollout_engines, rollout_engine_lock, engine_gpu_counts=None,
                                engine_gpu_offsets=None, engine_parallel_configs=None) -> None:
        """Records the engines and their first plan ranks (no process group: the plan's session is made at the
        first update)."""
        import torch.distributed as dist

        self.rollout_engines = rollout_engines
        self.rollout_engine_lock = rollout_engine_lock
        counts = list(engine_gpu_counts or [self.args.rollout_num_gpus_per_engine] * len(rollout_engines))
        self._engine_gpu_counts = counts
        self.offsets = engine_offsets(self.plan, counts)
        world = dist.get_world_size()
        if world != len(self.plan.source_ranks):
            raise ValueError(f"the Megatron world has {world} ranks; the plan '{self.plan_path}' has "
                             f"{len(self.plan.source_ranks)} training ranks: compile it for this trainer")

    def disconnect_rollout_engines(self) -> None:
        self.refit = None  # the session and its transport go with it

    def _request(self, engine_index: int, step: int):
        from .sglang import RefitRequest

        return RefitRequest(plan_path=self.plan_path, rank_offset=self.offsets[engine_index], store=self.store,
                            nccl_unique_id_b64=self._nccl_uid_b64, timeout_s=self.timeout_s, step=step)

    def update_weights(self) -> None:
        import ray
        import torch
        import torch.distributed as dist
        from slime.utils.distributed_utils import get_gloo_group

        from .sglang import LOADER, refit_payload

        self.weight_version += 1
        first = self.refit is None
        if first and not self.store:
            # the NCCL unique id travels to the engines in the requests: made before rank 0 sends them
            import base64

            from . import nccl
            box = [base64.b64encode(nccl.unique_id()).decode() if dist.get_rank() == 0 else ""]
            dist.broadcast_object_list(box, src=0)
            self._nccl_uid_b64 = box[0]
        refs = []
        t0 = time.perf_counter()
        if dist.get_rank() == 0:
            ray.get([e.pause_generation.remote() for e in self.rollout_engines])
            ray.get([e.flush_cache.remote() for e in self.rollout_engines])
            _check(ray.get([e._make_request.remote("begin_weight_update", {"selector": "target"})
                            for e in self.rollout_engines]), "begin_weight_update")
            refs = [e.update_weights_from_tensor.remote(
                serialized_named_tensors=refit_payload(self._request(i, self.weight_version),
                                                       self._engine_gpu_counts[i]),
                load_format=LOADER, flush_cache=False, weight_version=str(self.weight_version))
                for i, e in enumerate(self.rollout_engines)]
        dist.barrier(group=get_gloo_group())
        with torch.no_grad():
            if first:
                self._connect_session()
            stats = self.refit.run()
        if dist.get_rank() == 0:
            _check(ray.get(refs), "update_weights_from_tensor")
            _check(ray.get([e._make_request.remote("end_weight_update", {}) for e in self.rollout_engines]),
                   "end_weight_update")
            ray.get([e.continue_generation.remote() for e in self.rollout_engines])
        dist.barrier(group=get_gloo_group())
        self.update_weight_metrics["reshard/refit_s"] = time.perf_counter() - t0
        self.update_weight_metrics["reshard/run_s"] = stats.seconds

    def _connect_session(self) -> None:
        import torch.distributed as dist

        from . import GlooTransport, NcclTransport, nccl

        rank = self.plan.source_ranks[dist.get_rank()]
        processes = len(self.plan.active_ranks)
        process = self.plan.process_of(rank)
        if self.store:
            transport = GlooTransport(process, processes, store=self.store, timeout_s=self.timeout_s)
        else:
            import base64

            import torch
            world = nccl.Communicator.init(processes, process, base64.b64decode(self._nccl_uid_b64),
                                           device=torch.cuda.current_device())
            transport = NcclTransport(world, world.split(color=self.plan.domains[rank], key=process),
                                      timeout_s=self.timeout_s)
        session = Session(self.plan, rank, transport)
        self.refit = TrainerRefit(session, _Chunks(session, self.model))


def _check(replies: List[Any], what: str) -> None:
    """Raises RuntimeError naming the engines whose reply to `what` was a failure."""
    bad = [f"engine {i}: {r.get('message', r)}" for i, r in enumerate(replies)
           if isinstance(r, dict) and r.get("success") is False]
    if bad:
        raise RuntimeError(f"reshard.slime: {what} failed on " + "; ".join(bad))
