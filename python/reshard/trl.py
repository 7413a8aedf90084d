"""reshard.trl: TRL 1.16's GRPO trainer refits its vLLM engine with one reshard plan.

TRL syncs the policy into vLLM in ``VLLMGeneration.sync_weights``
(``trl/generation/vllm_generation.py``). In colocate mode (TRL's default:
``vllm.LLM(..., distributed_executor_backend="external_launcher")`` inside
every trainer process) it walks ``model.named_parameters()``, gathers each
FSDP2 parameter whole on every rank (``_iter_fsdp2_params``:
``param.full_tensor()``), and hands it to vLLM's ``load_weights`` one tensor
at a time. Here one colocated plan does it instead: each process is training
rank i and inference rank i of the plan (cluster ``"placement":
"colocated"``), one session binds both sides' tensors (the trainer's FSDP2
shards with ``side="train"``, the vLLM rank's kernel-format parameters with
``side="infer"``), and each sync replays that rank's part: pieces it holds
itself are copied, the rest comes straight from the rank that holds it.
Nothing is gathered.

TRL has no extension point for weight sync, so :func:`attach` replaces
``sync_weights`` on the trainer's one ``VLLMGeneration`` instance (the
instance attribute shadows the class's method; nothing else of TRL is
touched)::

    import reshard.trl
    trainer = GRPOTrainer(model=..., args=GRPOConfig(use_vllm=True, ...), ...)
    reshard.trl.attach(trainer, "refit.rsplan")      # every rank, before train()
    trainer.train()

Server mode (``vllm_mode="server"``) goes through vLLM's own trainer-side
weight-transfer engine (:mod:`reshard.vllm_trainer`): ``vllm serve ...
--weight-transfer-config '{"backend": "reshard"}'``, and :func:`attach`
makes the engine on every rank (``WeightTransferTrainerFactory.trainer_init``
with vLLM's HTTP client). TRL's ``VLLMClient.init_communicator``, which
``VLLMGeneration.__init__`` calls, opens an NCCL group for vLLM's ``"nccl"``
backend; build the trainer inside :func:`server_mode`, which lets it stand
aside for a server whose backend is ``"reshard"``.

Everything that can be refused is refused in :func:`attach`, on every
rank, before any connection: another TRL version (:class:`VersionError`), a
plan that is missing or not colocated, a training layout that is not the
trainer's FSDP2 mesh (:class:`TrainerMismatchError`), an inference layout
that is not the vLLM rank's (:class:`reshard.vllm.EngineMismatchError`),
and, before any byte moves, a plan for another model (its buffers do not fit
the modules: :class:`reshard.BindError`). A sync that fails on any rank
raises :class:`SyncError` on every rank and leaves :attr:`ColocatedSync.weights_current`
False; every later ``sync_weights`` raises it again (the engine holds partly
written weights) and TRL does not advance ``_last_loaded_step``.
"""

from __future__ import annotations

import logging
import os
import re
import time
import types
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple

try:
    import trl as _trl
except ImportError as _e:  # one line, what to do
    raise ImportError(f"reshard.trl needs TRL {'1.16.0'} in this Python environment (pip install trl==1.16.0): "
                      f"{_e}") from None

from .errors import BindError, Error, PlanError

__all__ = ["TRL_VERSION", "VersionError", "TrainerMismatchError", "SyncError", "ColocatedSync", "ServerSync",
           "attach", "detach", "server_mode", "sync_of", "version_problem"]

#: The TRL release whose VLLMGeneration (attributes, sync_weights, the colocated LLM) reshard.trl was proven on.
TRL_VERSION = "1.16.0"

_log = logging.getLogger("reshard.trl")


class VersionError(Error):
    """TRL is not the version reshard.trl was proven on (``RESHARD_TRL_ANY_VERSION=1`` overrides)."""


class TrainerMismatchError(Error):
    """The plan's training layout is not the trainer's: its ranks, FSDP2 mesh or parameter dtype."""


class SyncError(Error):
    """A weight sync failed on some rank: the vLLM engine's weights are not updated (partly written)."""


def version_problem(version: str) -> Optional[str]:
    """Why reshard.trl must not patch TRL `version` (None: it may)."""
    if version.split("+")[0] == TRL_VERSION or os.environ.get("RESHARD_TRL_ANY_VERSION"):
        return None
    return (f"reshard.trl was proven on TRL {TRL_VERSION} (VLLMGeneration.sync_weights and its attributes); this is "
            f"TRL {version}: set RESHARD_TRL_ANY_VERSION=1 to patch it anyway")


# -- what TRL and vLLM hold --------------------------------------------------------------------------------

def _generation(trainer: Any) -> Any:
    """The trainer's VLLMGeneration (GRPOTrainer.__init__ makes one when use_vllm: trainer/grpo_trainer.py)."""
    if hasattr(trainer, "sync_weights") and hasattr(trainer, "mode"):
        return trainer  # a VLLMGeneration itself
    g = getattr(trainer, "vllm_generation", None)
    if g is None:
        raise ValueError(f"{type(trainer).__name__} has no vllm_generation: reshard.trl refits the vLLM engine of a "
                         "TRL trainer built with use_vllm=True (GRPOConfig(use_vllm=True, vllm_mode=...))")
    return g


def _colocated_engine(g: Any) -> Tuple[Any, Any]:
    """(vLLM model, vllm_config) of the colocated LLM: the model TRL's own sync_weights loads into
    (``self.llm.llm_engine.model_executor.driver_worker.model_runner.model``) and the engine's config."""
    engine = g.llm.llm_engine
    return engine.model_executor.driver_worker.model_runner.model, engine.vllm_config


def _dtensors(model: Any) -> List[Tuple[str, Any]]:
    from .dtensor import is_dtensor

    return [(n, p) for n, p in model.named_parameters() if is_dtensor(p)]


_FSDP2_NAME = re.compile(r"^fsdp2(?:-dp_replicate(\d+))?-dp_shard(\d+)(?:-tp(\d+))?(?:-experts-dim1)?-(fp32|bf16)$")


def _fsdp2_words(rep: int, shard: int, tp: int, master: str) -> str:
    mesh = (f"dp_replicate {rep} x " if rep > 1 else "") + f"dp_shard {shard}" + (f" x tp {tp}" if tp > 1 else "")
    return f"{mesh}, {'fp32' if master == 'fp32' else 'bf16'} parameters"


def trainer_problem(plan: Any, model: Any, processes: int) -> Optional[str]:
    """What differs between the plan's training layout and the trainer: the
    number of ranks, and for a layout ``reshard init --train fsdp2:...`` named
    the FSDP2 mesh (read from the DTensor parameters' DeviceMesh) and the
    parameters' dtype. None when they agree."""
    layout = plan.inputs["source_layout"]
    ns = len(plan.source_ranks)
    dts = _dtensors(model)
    if dts:
        mesh = dts[0][1].device_mesh
        names = mesh.mesh_dim_names or ()
        sizes = dict(zip(names, mesh.shape)) if names else {}
        if not names or not set(names) <= {"dp_replicate", "dp_shard", "tp"}:
            # accelerate names its FSDP2 mesh after its own dims (dp_shard_cp, ...): a 1-D mesh is dp_shard
            sizes = {"dp_shard": mesh.size()} if mesh.ndim == 1 else {n or f"dim{i}": s
                                                                       for i, (n, s) in enumerate(zip(names, mesh.shape))}
        dtype = str(dts[0][1].dtype).removeprefix("torch.")
        master = "fp32" if dtype == "float32" else "bf16" if dtype == "bfloat16" else dtype
        mine = (sizes.get("dp_replicate", 1), sizes.get("dp_shard", 1), sizes.get("tp", 1), master)
        trainer = f"FSDP2 over {processes} processes, mesh " + (_fsdp2_words(*mine) if set(sizes) <= {
            "dp_replicate", "dp_shard", "tp"} else ", ".join(f"{n} {s}" for n, s in sizes.items()) + f", {dtype}")
    else:
        mine, trainer = None, f"{processes} processes, each holding the whole model (no FSDP2 DTensor parameters)"
    m = _FSDP2_NAME.match(layout)
    if m:
        want = (int(m[1] or 1), int(m[2]), int(m[3] or 1), m[4])
        if mine is None or want != mine:
            opts = ""
            if mine is not None:
                r, s, t, ms = mine
                opts = (f" (reshard init --train fsdp2:dp_shard={s}" + (f",dp_replicate={r}" if r > 1 else "")
                        + (f",tp={t}" if t > 1 else "") + (f",master={ms}" if ms in ("fp32", "bf16") else "") + ")")
            return (f"the plan's training layout '{layout}' is FSDP2 {_fsdp2_words(*want)} on {ns} ranks; this "
                    f"trainer runs {trainer}: compile the plan for the trainer's mesh{opts}")
    if ns != processes:
        return (f"the plan's training layout '{layout}' has {ns} ranks; this trainer runs {trainer}: compile the "
                "plan for the trainer's processes")
    return None


def colocation_problem(plan: Any, processes: int) -> Optional[str]:
    """Why the plan cannot serve TRL's colocate mode, where process i is
    training rank i and runs one vLLM rank (inference rank i)."""
    ns, nd = len(plan.source_ranks), len(plan.dest_ranks)
    if plan.num_ranks != ns or list(plan.dest_ranks) != list(range(nd)):
        return (f"the plan is not colocated (training ranks {_span(plan.source_ranks)}, inference ranks "
                f"{_span(plan.dest_ranks)}): TRL's colocate mode runs training rank i and inference rank i in one "
                "process; compile with a cluster whose \"placement\" is \"colocated\"")
    if nd != processes:
        return (f"the plan's inference layout '{plan.inputs['dest_layout']}' has {nd} ranks; TRL's colocate mode runs "
                f"one vLLM rank in each of the trainer's {processes} processes")
    return None


def _span(ranks: Any) -> str:
    ranks = list(ranks)
    return "none" if not ranks else f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])


def _agree(problem: Optional[str], what: str, error: type) -> None:
    """Raises `error` on every rank when any rank has a problem, naming the
    ranks (torch.distributed's default group: the trainer's own)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        everyone: List[Optional[str]] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, problem)
    else:
        everyone = [problem]
    bad = [(r, p) for r, p in enumerate(everyone) if p is not None]
    if not bad:
        return
    first = bad[0][1]
    if all(p == first for _, p in bad) and len(bad) == len(everyone):
        raise error(f"reshard.trl: {what}: {first}")
    lines = "\n  ".join(f"rank {r}: {p}" for r, p in bad)
    raise error(f"reshard.trl: {what} on {len(bad)} of {len(everyone)} ranks:\n  {lines}")


def _transport(plan: Any, rank: int, store: Optional[str], timeout_s: float, cuda: bool) -> Any:
    """The refit's transport: NCCL (a unique id made by rank 0, shared over
    the trainer's default group) when the trainer is on CUDA, else Gloo
    through `store` (default: a fresh directory made by rank 0, shared the
    same way: one host)."""
    import tempfile

    import torch.distributed as dist

    from .vllm import connect

    multi = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def shared(make):
        box = [make() if not multi or dist.get_rank() == 0 else None]
        if multi:
            dist.broadcast_object_list(box, src=0)
        return box[0]

    if cuda and not store:
        import torch

        from . import nccl

        return connect(plan, rank, nccl_unique_id=shared(nccl.unique_id), timeout_s=timeout_s,
                       device=torch.cuda.current_device())
    if not store:
        store = shared(lambda: tempfile.mkdtemp(prefix="reshard-trl-"))
    return connect(plan, rank, store=store, timeout_s=timeout_s)


def _identity(t: Any) -> Tuple[int, int, int]:
    return id(t), t.data_ptr(), t.untyped_storage().nbytes()


class _Side:
    """One side's module bound in a colocated session, re-bound by name when
    the framework replaced a bound tensor (a new Parameter, new storage)."""

    def __init__(self, session: Any, module: Any, side: str):
        self.session, self.module, self.side = session, module, side
        tag = side + ":"
        is_mine = (lambda b: b.is_source) if side == "train" else (lambda b: b.is_destination)
        self.names = {b.name[len(tag):] if b.name.startswith(tag) else b.name
                      for b in session.buffers if is_mine(b)}
        self.bind()

    def tensors(self) -> Dict[str, Any]:
        return {n: t for n, t in self.session.module_tensors(self.module) if n in self.names}

    def bind(self) -> None:
        self.session.bind_module(self.module, side=self.side)
        self.ids = {n: _identity(t) for n, t in self.tensors().items()}

    def rebind_if_replaced(self) -> List[str]:
        now = self.tensors()
        gone = sorted(set(self.ids) - set(now))
        if gone:
            raise BindError(f"rank {self.session.rank}: the {self.side} side no longer holds '{gone[0]}'"
                            + (f" (and {len(gone) - 1} more)" if len(gone) > 1 else "") + ", bound at attach")
        replaced = [n for n, t in now.items() if _identity(t) != self.ids.get(n)]
        if replaced:
            self.bind()
        return replaced


# -- colocate mode ------------------------------------------------------------------------------------------

class ColocatedSync:
    """TRL's colocate mode: one session per process, bound to the trainer's
    FSDP2 shards (``side="train"``) and to the process's vLLM rank
    (``side="infer"``); :meth:`sync_weights` replaces
    ``VLLMGeneration.sync_weights`` on the instance.

    :meth:`connect` checks the training layout against the trainer's FSDP2
    mesh, connects and binds both sides. The trainer shards its model when
    ``train()`` starts (transformers' ``Trainer`` prepares it there), so an
    :func:`attach` before ``train()`` connects from the trainer's
    ``on_train_begin`` callback; one after it, at once."""

    def __init__(self, generation: Any, plan: Any, rank: int, vllm_model: Any, vllm_config: Any,
                 derived: List[Tuple[str, Any]], store: Optional[str], timeout_s: float):
        self.generation = generation
        self.plan = plan
        self.rank = rank
        self.vllm_model = vllm_model
        self.vllm_config = vllm_config
        self._derived = derived
        self._store, self._timeout_s = store, timeout_s
        self.session: Any = None  #: the refit's reshard.Session, from connect() on
        self.train: Optional[_Side] = None
        self.infer: Optional[_Side] = None
        self.weights_current = True  #: False from a failed sync on: the engine holds partly written weights
        self.error: Optional[SyncError] = None  #: the failure that left the weights partly written
        self.syncs = 0  #: completed syncs
        self.stats: Any = None  #: the last run's reshard.RunStats
        self.last_seconds = 0.0  #: the last sync_weights, wall clock
        self.rebinds = 0

    def connect(self) -> None:
        """Checks the plan's training layout against the trainer (every rank
        alike), connects every process's session and binds both sides; any
        rank's binding failure is raised on every rank. Again: no-op."""
        if self.session is not None:
            return
        from . import Session

        g, plan = self.generation, self.plan
        model = g.model
        problem = trainer_problem(plan, model, g.accelerator.num_processes)
        if problem:
            raise TrainerMismatchError(f"reshard.trl: {problem}")
        cuda = any(p.is_cuda for _, p in model.named_parameters())
        session = Session(plan, self.rank, _transport(plan, self.rank, self._store, self._timeout_s, cuda))
        problem = None
        try:
            train, infer = _Side(session, model, "train"), _Side(session, self.vllm_model, "infer")
        except BindError as e:
            problem = str(e)
        try:
            _agree(problem, f"the plan '{plan.path}' (model '{plan.inputs['model']}') does not fit the trainer's "
                   "model or its vLLM rank; nothing was bound", BindError)
        except BindError:
            session.transport.close()
            raise
        self.session, self.train, self.infer = session, train, infer

    def finish(self) -> None:
        """Recomputes what vLLM derives from refit parameters (MLA's W_UV /
        W_UK_T: ``MLAAttention.process_weights_after_loading``), as
        :meth:`reshard.vllm.WorkerRefit.finish` does."""
        if not self._derived:
            return
        import torch
        from vllm.config import set_current_vllm_config

        dtype = self.vllm_config.model_config.dtype
        with torch.no_grad(), set_current_vllm_config(self.vllm_config):
            for _, layer in self._derived:
                layer.process_weights_after_loading(dtype)

    def sync_weights(self) -> None:
        """One refit of this process's vLLM rank from the trainer's shards (every rank calls it, as TRL does)."""
        if self.error is not None:
            raise SyncError(f"rank {self.rank}: reshard.trl: an earlier weight sync failed, so this vLLM engine "
                            f"holds partly written weights; build a new engine and attach again ({self.error})")
        self.connect()
        g = self.generation
        start = time.perf_counter()
        try:
            # TRL's own first step (sync_weights, vllm_generation.py): wake sleeping weights before writing them.
            if getattr(g, "enable_sleep_mode", False):
                from trl.generation.vllm_generation import empty_cache

                empty_cache()
                g.llm.wake_up(tags=["weights"])
                g._llm_weights_sleeping = False
            replaced = self.train.rebind_if_replaced() + self.infer.rebind_if_replaced()
            if replaced:
                self.rebinds += 1
            self.stats = self.session.run()
            self.finish()
        except BaseException as e:
            self._fail(e)
            raise self.error from e
        # TRL's own last step: cached prefixes were computed with the old weights.
        g.llm.reset_prefix_cache()
        self.syncs += 1
        self.last_seconds = time.perf_counter() - start

    def _fail(self, e: BaseException) -> None:
        self.weights_current = False
        self.error = SyncError(f"rank {self.rank}: reshard.trl: weight sync {self.syncs + 1} failed, the vLLM "
                               f"engine's weights are not updated (partly written): {type(e).__name__}: "
                               + (str(e).splitlines()[0] if str(e) else ""))
        # Closing tells every peer at once (their run() hears a closed connection) instead of after its timeout.
        try:
            self.session.transport.close()
        except Exception:  # noqa: BLE001 - the original failure is what matters
            pass
        _log.error("%s", self.error)

    def close(self) -> None:
        if self.session is not None:
            self.session.transport.close()


def _connect_callback(sync: Any) -> Any:
    """A TrainerCallback that connects `sync` when train() begins: transformers' Trainer has then prepared
    (FSDP2-sharded) the model (``Trainer._inner_training_loop`` calls ``on_train_begin`` after
    ``accelerator.prepare``)."""
    from transformers import TrainerCallback

    class ReshardConnect(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            sync.connect()

    return ReshardConnect()


def fit_problems(plan: Any, rank: int, model: Any, vllm_model: Any) -> List[str]:
    """Plan buffers of `rank` that the modules do not have: an inference
    buffer the vLLM rank lacks or holds in another shape, a training buffer
    the trainer's model has no parameter for (its local shapes are checked
    when it binds: before FSDP2 shards it, the model holds whole tensors)."""
    from ._tensors import strip_wrappers

    vllm_tensors = dict(vllm_model.named_parameters())
    vllm_tensors.update({n: b for n, b in vllm_model.named_buffers() if n not in vllm_tensors})
    train_names = {strip_wrappers(n) for n, _ in model.named_parameters()}
    train_names |= {strip_wrappers(n) for n, _ in model.named_buffers()}
    out = []
    for b in plan.buffers(rank):
        if b.is_destination:
            name = b.name.removeprefix("infer:")
            t = vllm_tensors.get(name)
            shape = tuple(reversed(b.shape)) if b.held_transposed else tuple(b.shape)
            if t is None:
                out.append(f"inference buffer '{name}': the vLLM model has no tensor of that name")
            elif tuple(t.shape) != shape:
                out.append(f"inference buffer '{name}': the plan's shape [{','.join(map(str, shape))}], the vLLM "
                           f"model's [{','.join(map(str, t.shape))}]")
        if b.is_source:
            name = b.name.removeprefix("train:")
            if name not in train_names:
                out.append(f"training buffer '{name}': the trainer's model has no parameter of that name")
    return out


def _attach_colocated(g: Any, plan_path: Any, store: Optional[str], timeout_s: float) -> "ColocatedSync":
    from .vllm import EngineMismatchError, check_engine, kernel_layout_problems, mla_layers

    processes = g.accelerator.num_processes
    plan = _open_plan(plan_path)
    vllm_model, vllm_config = _colocated_engine(g)

    # Refused alike on every rank, from what every rank sees alike: before any connection.
    problem = colocation_problem(plan, processes)
    if problem:
        raise TrainerMismatchError(f"reshard.trl: {problem}")
    try:
        check_engine(plan, vllm_config)
    except EngineMismatchError as e:
        raise EngineMismatchError(f"reshard.trl: {e}") from None
    rank = g.accelerator.process_index  # colocated: training rank i and inference rank i are plan rank i
    misfit = fit_problems(plan, rank, g.model, vllm_model)
    more = f"\n    (and {len(misfit) - 6} more)" if len(misfit) > 6 else ""
    _agree(f"{len(misfit)} of its buffers do not fit:\n    " + "\n    ".join(misfit[:6]) + more if misfit else None,
           f"the plan '{os.fspath(plan_path)}' (model '{plan.inputs['model']}') is not for this trainer's model and "
           "its vLLM rank; compile it for this model", BindError)
    written = {b.name.removeprefix("infer:") for b in plan.buffers(rank) if b.is_destination}
    kernels = kernel_layout_problems(vllm_model, written)
    _agree("; ".join(kernels) if kernels else None, "the vLLM rank keeps weights in a layout reshard has not proven",
           BindError)
    names = {id(m): n for n, m in vllm_model.named_modules()}
    derived = [(n, m) for n, m in mla_layers(vllm_model)
               if names.get(id(m.kv_b_proj), "?") + ".weight" in written]
    return ColocatedSync(g, plan, rank, vllm_model, vllm_config, derived, store, timeout_s)


def _open_plan(plan_path: Any) -> Any:
    from . import Plan

    if plan_path is None or plan_path == "":
        raise ValueError("reshard.trl.attach needs the plan (a file compiled with reshard compile for this trainer "
                         "and its vLLM engine)")
    if not os.path.exists(os.fspath(plan_path)):
        raise PlanError(f"reshard.trl: no plan at '{os.fspath(plan_path)}': compile one for this trainer and engine "
                        "(reshard init ..., reshard compile ... -o PLAN)")
    return Plan.open(plan_path)


# -- server mode --------------------------------------------------------------------------------------------

class ServerSync:
    """TRL's server mode: vLLM's trainer-side weight-transfer engine
    (:class:`reshard.vllm_trainer.ReshardTrainerWeightTransferEngine`) on
    every trainer rank; rank 0 drives ``vllm serve`` through vLLM's HTTP
    client. :meth:`connect` (at ``on_train_begin`` for a model FSDP2 has yet
    to shard) makes the engine, which binds this rank's shards."""

    def __init__(self, generation: Any, plan: Any, plan_path: str, store: Optional[str], timeout_s: float):
        self.generation = generation
        self.plan = plan
        self._plan_path, self._store, self._timeout_s = plan_path, store, timeout_s
        self.engine: Any = None
        self.weights_current = True
        self.error: Optional[SyncError] = None
        self.syncs = 0
        self.last_seconds = 0.0

    @property
    def stats(self) -> Any:
        return None if self.engine is None else self.engine.stats

    def connect(self) -> None:
        if self.engine is not None:
            return
        from vllm.distributed.weight_transfer import HTTPVLLMWeightSyncClient, ModuleSource
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        from . import vllm as _rvllm
        from .vllm_trainer import ReshardTrainerInitInfo

        g = self.generation
        acc = g.accelerator
        problem = trainer_problem(self.plan, g.model, acc.num_processes)
        if problem:
            raise TrainerMismatchError(f"reshard.trl: {problem}")
        _rvllm.register()
        # Every trainer rank makes its engine; rank 0 (is_sender) also sends the workers their init dict.
        self.engine = WeightTransferTrainerFactory.trainer_init(
            ReshardTrainerInitInfo(rank=acc.process_index, plan_path=self._plan_path, store=self._store or "",
                                   timeout_s=self._timeout_s),
            client=HTTPVLLMWeightSyncClient(_server_url(g)), source=ModuleSource(g.model))

    def sync_weights(self) -> None:
        if self.error is not None:
            raise SyncError(f"reshard.trl: an earlier weight sync failed, so the vLLM server holds partly written "
                            f"weights ({self.error})")
        self.connect()
        g = self.generation
        start = time.perf_counter()
        try:
            self.engine.send_weights(weight_version=str(self.syncs + 1))
        except BaseException as e:
            self.weights_current = False
            self.error = SyncError(f"reshard.trl: weight sync {self.syncs + 1} failed, the vLLM server's weights are "
                                   f"not updated (partly written): {type(e).__name__}: "
                                   + (str(e).splitlines()[0] if str(e) else ""))
            raise self.error from e
        # TRL's own last step (sync_weights): the main process resets the server's prefix cache.
        if g.accelerator.is_main_process:
            g.vllm_client.reset_prefix_cache()
        self.syncs += 1
        self.last_seconds = time.perf_counter() - start

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()


def _server_url(g: Any) -> str:
    """The server VLLMGeneration talks to (``_init_vllm``: server_base_url, else http://host:port)."""
    return g.server_base_url or f"http://{g.server_host}:{g.server_port}"


@contextmanager
def server_mode() -> Iterator[None]:
    """Build a server-mode trainer inside this block: TRL's
    ``VLLMClient.init_communicator`` (``trl/generation/vllm_client.py``,
    called by ``VLLMGeneration._init_vllm``) opens vLLM's ``"nccl"`` group
    and would send its init dict to a server whose backend is ``"reshard"``;
    inside the block it only checks that the server runs ``"reshard"``
    (:func:`attach` then initializes the engine). Other backends go TRL's way."""
    from trl.generation.vllm_client import VLLMClient

    original = VLLMClient.init_communicator

    def init_communicator(self: Any, device: Any = 0) -> None:
        config = self.get_server_info().get("weight_transfer_config") or {}
        if (config.get("backend") if isinstance(config, dict) else getattr(config, "backend", None)) == "reshard":
            self.communicator = None
            return
        original(self, device)

    VLLMClient.init_communicator = init_communicator
    try:
        yield
    finally:
        VLLMClient.init_communicator = original


# -- the patch ------------------------------------------------------------------------------------------------

_ATTR = "_reshard_sync"


def attach(trainer: Any, plan: Any, *, store: Optional[str] = None, timeout_s: float = 120.0) -> Any:
    """Replaces ``sync_weights`` of the trainer's ``VLLMGeneration`` (on
    every rank, before ``train()``) with a reshard refit through `plan`, and
    returns the :class:`ColocatedSync` (colocate mode) or
    :class:`ServerSync` (server mode) that runs it.

    `store`: Gloo's rendezvous, a directory every process sees or
    ``HOST:PORT`` (default: a fresh directory made by rank 0, one host);
    ignored for NCCL, used when the trainer's parameters are on CUDA (the
    unique id is shared over the trainer's default group). Everything that
    can be refused is raised here, on every rank."""
    problem = version_problem(getattr(_trl, "__version__", "unknown"))
    if problem:
        raise VersionError(problem)
    g = _generation(trainer)
    if getattr(g, _ATTR, None) is not None:
        raise ValueError("reshard.trl.attach: this trainer's VLLMGeneration is attached already")
    from accelerate.utils import is_peft_model

    if is_peft_model(g.model):
        raise ValueError("reshard.trl: a PEFT model: TRL merges the adapters into the gathered weights before each "
                         "sync, which a plan of the base weights does not do; use TRL's own sync_weights")
    if g.mode == "colocate":
        sync: Any = _attach_colocated(g, plan, store, timeout_s)
        # FSDP2 shards the model when train() starts (TRL's DistributedBackend reads accelerate's plugin).
        unsharded = getattr(getattr(g, "_dist", None), "fsdp_version", None) == 2 and not _dtensors(g.model)
    elif g.mode == "server":
        sync = ServerSync(g, _open_plan(plan), os.fspath(plan), store, timeout_s)
    else:
        raise ValueError(f"reshard.trl: VLLMGeneration.mode {g.mode!r}: expected 'colocate' or 'server'")
    # FSDP2 shards the model when train() starts (TRL's DistributedBackend reads accelerate's plugin): connect then.
    unsharded = getattr(getattr(g, "_dist", None), "fsdp_version", None) == 2 and not _dtensors(g.model)
    if unsharded and g is not trainer and hasattr(trainer, "add_callback"):
        trainer.add_callback(_connect_callback(sync))
    elif not unsharded:
        sync.connect()
    setattr(g, _ATTR, sync)
    # The named patch: this one instance's sync_weights (GRPOTrainer calls self.vllm_generation.sync_weights()).
    g.sync_weights = types.MethodType(lambda self: getattr(self, _ATTR).sync_weights(), g)
    _log.info("reshard.trl: %s sync_weights of this trainer's VLLMGeneration replaced by a reshard refit (%s)",
              g.mode, os.fspath(plan))
    return sync


def sync_of(trainer: Any) -> Any:
    """The :class:`ColocatedSync` / :class:`ServerSync` :func:`attach` put on the trainer (None if none)."""
    return getattr(_generation(trainer), _ATTR, None)


def detach(trainer: Any) -> None:
    """Gives the trainer TRL's own sync_weights back and closes the refit's transport."""
    g = _generation(trainer)
    sync = getattr(g, _ATTR, None)
    g.__dict__.pop("sync_weights", None)
    setattr(g, _ATTR, None)
    if sync is not None:
        sync.close()
