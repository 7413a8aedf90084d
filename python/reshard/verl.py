"""reshard.verl: a verl 0.9.1 checkpoint-engine backend, ``"reshard"``.

verl moves weights from its trainer to its rollout replicas through a
checkpoint engine chosen by name (``verl/checkpoint_engine/base.py``:
``CheckpointEngineRegistry``, ``CheckpointEngineManager.update_weights``).
Its own backends gather every parameter whole on the trainer (FSDP's
``full_tensor()``, Megatron-Bridge's ``export_hf_weights``), broadcast it in
buckets and rebuild the transfer group at every update. This backend replays
one precompiled reshard plan instead: every trainer rank sends its own
shards, straight from the trainer's parameters, into the vLLM workers'
parameters, over one session kept for the whole job. The job's config::

    actor_rollout_ref.rollout.checkpoint_engine.backend=reshard
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=reshard.verl
    +actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.reshard.plan_path=/shared/refit.rsplan
    +actor_rollout_ref.rollout.engine_kwargs.vllm.weight_transfer_config.backend=reshard

(the last is vLLM's own setting: the rollout's engine runs reshard's worker
side, :class:`reshard.vllm.ReshardWeightTransferEngine`). :func:`plan_args`
turns verl's config into ``reshard.init`` arguments and :func:`make_plan`
writes the plan; its model carries a fingerprint that
``engine_kwargs.reshard.model=${actor_rollout_ref.model.path}`` checks when
the backend is made.

Where verl 0.9.1 has no hook, the backend patches two methods when it first
needs them, each named in :data:`PATCHES` with the upstream change it stands
for (docs/verl.md):

- the training engines' ``get_per_tensor_param``
  (``verl/workers/engine/*/transformer_impl.py``), called bare in a process
  where this backend was made, returns the engine itself, so that
  ``ActorRolloutRefWorker.update_weights`` (``verl/workers/engine_workers.py``)
  hands this backend the trainer's model engine, as it does for
  ``delta_sharded``, instead of the stream of full tensors (which, under
  Megatron, also loads the model to the GPU first);
- ``ServerAdapter.update_weights`` (``verl/workers/rollout/vllm_rollout/vllm_rollout.py``)
  takes a wire format ``"reshard"`` whose payload drives vLLM's weight-transfer
  lifecycle through the server's ``collective_rpc`` (init once, then start,
  update, finish per step), as ``_update_delta_weights`` does for verl's
  ``delta_flush``.

The plan's ranks are the job's: the trainer's ranks first (verl's actor
worker group, in its rank order), then every replica's vLLM workers in
replica, DP, PP, TP order. The vLLM workers find their own plan ranks from
the ``rank_offset`` of their replica (:mod:`reshard.vllm`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import socket
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .errors import Error

__all__ = ["VERL_VERSION", "PlanMismatchError", "UpdateFailedError", "plan_args", "make_plan", "config_lines",
           "model_fingerprint", "version_problem"]

VERL_VERSION = "0.9.1"  #: the verl release this backend is proven on (tests/verl)
ANY_VERSION_ENV = "RESHARD_VERL_ANY_VERSION"
BACKEND = "reshard"  #: actor_rollout_ref.rollout.checkpoint_engine.backend
WIRE_FORMAT = "reshard"  #: the payload ServerAdapter.update_weights hands back to this backend
KWARGS_KEY = "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.reshard"
#: the server's weights version (verl tags every generated sample with it, vllm_async_server.py
#: ``extra_fields["global_steps"]``) after an update failed while the workers were being written
NOT_UPDATED = -1

_log = logging.getLogger("reshard.verl")


class PlanMismatchError(Error):
    """The plan is not this job's: another model, training layout or rollout layout."""


class UpdateFailedError(Error):
    """A weight update failed on some rank; the session is closed and later updates are refused."""


def version_problem(version: str) -> Optional[str]:
    """None when `version` is the proven verl, or RESHARD_VERL_ANY_VERSION=1; else one line saying so."""
    if version == VERL_VERSION or os.environ.get(ANY_VERSION_ENV) == "1":
        return None
    return (f"reshard.verl is proven on verl {VERL_VERSION}; this is verl {version}: set {ANY_VERSION_ENV}=1 to use "
            "it anyway (its patches name the verl methods they replace: docs/verl.md)")


# -- plans from verl's config (no verl needed) ----------------------------------------------------------

def _get(cfg: Any, path: str, default: Any = None) -> Any:
    node = cfg
    for key in path.split("."):
        if node is None:
            return default
        try:
            node = node[key]
        except (KeyError, TypeError, IndexError):
            try:
                node = getattr(node, key)
            except AttributeError:
                return default
    return default if node is None else node


def _int(cfg: Any, path: str, default: int) -> int:
    v = _get(cfg, path, default)
    try:
        return int(v)
    except (TypeError, ValueError):
        raise ValueError(f"{path}: expected an integer, got {v!r}") from None


def plan_args(config: Any) -> Dict[str, str]:
    """``reshard.init`` arguments (``hf_config``, ``train``, ``infer``) from a
    verl PPO config (the Hydra config as a DictConfig or nested dicts): the
    actor's parallel settings (FSDP2: ``actor.strategy``,
    ``fsdp_config.fsdp_size`` and ``model_dtype``, over ``trainer.nnodes`` x
    ``trainer.n_gpus_per_node`` ranks, the mesh ``create_device_mesh`` makes in
    ``verl/workers/engine/fsdp/utils.py``; Megatron: ``actor.megatron``'s
    sizes) and the rollout's (``rollout.tensor_model_parallel_size``,
    ``pipeline_model_parallel_size``, ``data_parallel_size``,
    ``expert_parallel_size``; one engine per replica over ``rollout.nnodes``
    x ``rollout.n_gpus_per_node``). Raises ValueError for a setting reshard's
    backend does not serve, naming it."""
    a = "actor_rollout_ref"
    model = _get(config, f"{a}.model.path")
    if not model:
        raise ValueError(f"{a}.model.path: the model's directory (its config.json) is needed")
    world = _int(config, "trainer.nnodes", 1) * _int(config, "trainer.n_gpus_per_node", 8)
    strategy = str(_get(config, f"{a}.actor.strategy", "fsdp"))
    if strategy == "fsdp2":
        fsdp = _int(config, f"{a}.actor.fsdp_config.fsdp_size", -1)
        shard = world if fsdp < 0 or fsdp >= world else fsdp
        if world % shard:
            raise ValueError(f"{a}.actor.fsdp_config.fsdp_size={fsdp} does not divide the trainer's {world} ranks")
        dtype = str(_get(config, f"{a}.actor.fsdp_config.model_dtype", "fp32"))
        master = "fp32" if dtype in ("fp32", "float32", "torch.float32") else "bf16"
        train = f"fsdp2:dp_shard={shard}" + (f",dp_replicate={world // shard}" if world > shard else "") + \
            f",master={master}"
    elif strategy == "megatron":
        m = f"{a}.actor.megatron"
        tp, pp = _int(config, f"{m}.tensor_model_parallel_size", 1), _int(config, f"{m}.pipeline_model_parallel_size", 1)
        cp, ep = _int(config, f"{m}.context_parallel_size", 1), _int(config, f"{m}.expert_model_parallel_size", 1)
        if world % (tp * pp * cp):
            raise ValueError(f"{m}: tp {tp} x pp {pp} x cp {cp} does not divide the trainer's {world} ranks")
        train = f"megatron:tp={tp},pp={pp},dp={world // (tp * pp * cp)}" + (f",cp={cp}" if cp > 1 else "") + \
            (f",ep={ep}" if ep > 1 else "")
        etp = _get(config, f"{m}.expert_tensor_parallel_size")
        if etp is not None and ep > 1:
            train += f",etp={int(etp)}"
        vpp = _get(config, f"{m}.virtual_pipeline_model_parallel_size")
        if vpp is not None and int(vpp) > 1:
            train += f",vpp={int(vpp)}"
    else:
        raise ValueError(f"{a}.actor.strategy={strategy}: reshard binds FSDP2 (DTensor) or Megatron-Core parameters "
                         "in place; FSDP1 holds flattened parameters: use actor.strategy=fsdp2")
    r = f"{a}.rollout"
    name = str(_get(config, f"{r}.name", "vllm"))
    if name != "vllm":
        raise ValueError(f"{r}.name={name}: reshard's verl backend writes vLLM 0.33 rollouts")
    nodes = _int(config, f"{r}.nnodes", 0)
    if nodes <= 0:
        raise ValueError(f"{r}.nnodes=0 is verl's hybrid engine (the rollout in the trainer's processes, whose "
                         "weights verl's 'naive' backend hands over in place); reshard's backend serves separate "
                         f"rollout GPUs: set {r}.nnodes and {r}.n_gpus_per_node")
    gpus = nodes * _int(config, f"{r}.n_gpus_per_node", 8)
    tp, pp = _int(config, f"{r}.tensor_model_parallel_size", 1), _int(config, f"{r}.pipeline_model_parallel_size", 1)
    dp, ep = _int(config, f"{r}.data_parallel_size", 1), _int(config, f"{r}.expert_parallel_size", 1)
    replica = tp * pp * dp
    if gpus % replica:
        raise ValueError(f"{r}: {gpus} rollout GPUs are not a whole number of replicas of tp {tp} x pp {pp} x dp {dp}")
    infer = f"vllm:tp={tp}" + (f",pp={pp}" if pp > 1 else "") + (f",dp={dp}" if dp > 1 else "") + \
        (",ep" if ep > 1 else "") + (f",engines={gpus // replica}" if gpus > replica else "")
    return {"hf_config": os.fspath(model), "train": train, "infer": infer}


def _spec_fingerprint(spec: Mapping[str, Any]) -> str:
    body = {k: v for k, v in spec.items() if k not in ("name", "notes")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]


def model_fingerprint(hf_config: Any) -> str:
    """12 hex digits of the model spec ``reshard init`` derives from `hf_config`
    (every tensor's name, shape and dtype): equal fingerprints, the same tensors."""
    from .compiler import init

    return _spec_fingerprint(init(hf_config, train="fsdp2:dp_shard=1", infer="hf")["model"])


def make_plan(config: Any, out_dir: str, *, cluster: str = "dgx-h100", staging_mb: int = 512) -> str:
    """Writes the specs (``reshard.init``) and the plan (``reshard.compile``)
    of this verl job into `out_dir` from its config (:func:`plan_args`);
    returns the plan's path. The model spec is named after the model and its
    fingerprint (``name@fingerprint``), which the backend checks against
    ``engine_kwargs.reshard.model`` when it is made."""
    from .compiler import compile, init

    args = plan_args(config)
    specs = init(args["hf_config"], train=args["train"], infer=args["infer"], cluster=cluster)
    name = f"{specs['model']['name']}@{_spec_fingerprint(specs['model'])}"
    init(args["hf_config"], train=args["train"], infer=args["infer"], cluster=cluster, out_dir=out_dir, name=name)
    plan = os.path.join(out_dir, "refit.rsplan")
    j = lambda f: os.path.join(out_dir, f)  # noqa: E731
    compile(j("model.json"), j("train.json"), j("infer.json"), j("cluster.json"), plan, staging_mb=staging_mb)
    return plan


def config_lines(plan_path: str) -> List[str]:
    """The Hydra overrides that select this backend with the plan at `plan_path`."""
    return ["actor_rollout_ref.rollout.checkpoint_engine.backend=reshard",
            "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=reshard.verl",
            f"+{KWARGS_KEY}.plan_path={plan_path}",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.weight_transfer_config.backend=reshard",
            f"+{KWARGS_KEY}.model='${{actor_rollout_ref.model.path}}'"]


# -- what the plan's layouts say --------------------------------------------------------------------

_FSDP2_NAME = re.compile(r"^fsdp2(?:-dp_replicate(\d+))?-dp_shard(\d+)(?:-tp(\d+))?(?:-experts-dim1)?(?:-(fp32|bf16))?$")
_VLLM_NAME = re.compile(r"^vllm-tp(\d+)(?:-pp(\d+))?(?:-dp(\d+))?(?:-ep(\d+))?(?:-x(\d+))?")


def rollout_sizes(plan: Any) -> Optional[Dict[str, int]]:
    """tp, pp, dp, ep (0: none) and engines of the plan's inference layout as
    ``reshard init --infer vllm:...`` names it (frameworks/vllm.cc); None
    for a layout named otherwise."""
    m = _VLLM_NAME.match(plan.inputs["dest_layout"])
    if not m:
        return None
    tp, pp, dp = int(m[1]), int(m[2] or 1), int(m[3] or 1)
    return {"tp": tp, "pp": pp, "dp": dp, "ep": int(m[4] or 0),
            "engines": int(m[5] or len(plan.dest_ranks) // (tp * pp * dp))}


def check_rollout(plan: Any, rollout_config: Any, replicas: int) -> None:
    """PlanMismatchError naming both when the rollout's parallel sizes
    (verl's RolloutConfig) or its replica count are not the plan's."""
    tp, pp = int(rollout_config.tensor_model_parallel_size), int(rollout_config.pipeline_model_parallel_size)
    dp, ep = int(rollout_config.data_parallel_size), int(getattr(rollout_config, "expert_parallel_size", 1) or 1)
    job = f"TP {tp} PP {pp} DP {dp}" + (" EP" if ep > 1 else "") + f", {replicas} replica(s)"
    sizes = rollout_sizes(plan)
    layout = plan.inputs["dest_layout"]
    if sizes is None:
        if len(plan.dest_ranks) != replicas * tp * pp * dp:
            raise PlanMismatchError(f"the plan's inference layout '{layout}' has {len(plan.dest_ranks)} ranks; this "
                                    f"job's rollout is {job}: {replicas * tp * pp * dp} ranks")
        return
    want = (sizes["tp"], sizes["pp"], sizes["dp"], bool(sizes["ep"]), sizes["engines"])
    if want != (tp, pp, dp, ep > 1, replicas):
        raise PlanMismatchError(
            f"the plan's inference layout '{layout}' is TP {want[0]} PP {want[1]} DP {want[2]}"
            + (" EP" if want[3] else "") + f", {want[4]} engine(s); this job's rollout is {job}: make the plan from "
            "this job's config (reshard.verl.make_plan)")


def check_model(plan: Any, hf_config: Any) -> None:
    """PlanMismatchError when the plan's model (named ``name@fingerprint`` by
    :func:`make_plan`) is not the model of `hf_config`; a plan whose model
    name carries no fingerprint is compared by name only."""
    from .compiler import init

    name = plan.inputs["model"]
    spec = init(hf_config, train="fsdp2:dp_shard=1", infer="hf")["model"]
    base, _, fp = name.rpartition("@")
    if base and re.fullmatch(r"[0-9a-f]{12}", fp):
        mine = _spec_fingerprint(spec)
        if fp != mine:
            raise PlanMismatchError(f"the plan {plan.path} is for model '{name}', whose tensors are not those of "
                                    f"{hf_config} ('{spec['name']}@{mine}'): make the plan from this model's config")
    elif name != spec["name"]:
        raise PlanMismatchError(f"the plan {plan.path} is for model '{name}'; {hf_config} is '{spec['name']}'")


def _local(t: Any) -> Any:
    return t.to_local() if hasattr(t, "to_local") and hasattr(t, "device_mesh") else t


def _mesh_text(module: Any) -> Tuple[str, Optional[Tuple[Tuple[str, int], ...]], Optional[str]]:
    """(words, ((dim name, size), ...) or None, "fp32"/"bf16" or None) of a module's DTensor parameters."""
    for _, p in module.named_parameters():
        mesh = getattr(p, "device_mesh", None)
        if mesh is not None:
            names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
            dims = tuple(zip(names, (int(s) for s in mesh.shape)))
            dtype = {"torch.float32": "fp32", "torch.bfloat16": "bf16"}.get(str(p.dtype))
            return (f"a DeviceMesh of {' x '.join(f'{n} {s}' for n, s in dims)}, {dtype or p.dtype} parameters",
                    dims, dtype)
        return f"plain (not DTensor) {p.dtype} parameters", None, None
    return "no parameters", None, None


def check_trainer(plan: Any, rank: int, modules: List[Tuple[str, Any]]) -> None:
    """PlanMismatchError, naming the plan's training layout and this trainer's
    mesh, when the plan's FSDP2 layout is not the module's mesh or a buffer
    of `rank` is not what the module holds (name, shape, dtype)."""
    from ._tensors import strip_wrappers
    from .session import _named_tensors, _unwrapped

    layout = plan.inputs["source_layout"]
    words, dims, dtype = _mesh_text(modules[0][1]) if modules else ("no module", None, None)
    m = _FSDP2_NAME.match(layout)
    if m and dims is not None:
        rep, shard, tp = int(m[1] or 1), int(m[2]), int(m[3] or 1)
        sizes = dict(dims)
        have = (sizes.get("ddp", sizes.get("dp_replicate", 1)), sizes.get("fsdp", sizes.get("dp_shard", 1)),
                sizes.get("tp", 1))
        if have != (rep, shard, tp) or (m[4] and dtype and m[4] != dtype):
            raise PlanMismatchError(
                f"plan rank {rank}: the plan's training layout '{layout}' is FSDP2 dp_replicate {rep} x dp_shard "
                f"{shard}" + (f" x tp {tp}" if tp > 1 else "") + (f", {m[4]} parameters" if m[4] else "")
                + f"; this trainer holds {words}: make the plan from this job's config (reshard.verl.make_plan)")
    held: Dict[str, Any] = {}
    for prefix, module in modules:
        # as bind_module names them: through Float16Module / DDP and wrapper segments
        for n, t in _named_tensors(_unwrapped(module)):
            held.setdefault(prefix + strip_wrappers(n), _local(t))
    torch_names = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32",
                   "torch.float8_e4m3fn": "fp8_e4m3", "torch.float8_e8m0fnu": "e8m0"}
    wrong = []
    for b in plan.buffers(rank):
        if not b.is_source:
            continue
        t = held.get(b.name)
        if t is None:
            wrong.append(f"'{b.name}' ({b.dtype} {list(b.shape)}): the trainer has no such tensor")
        elif tuple(t.shape) != tuple(b.shape) or torch_names.get(str(t.dtype)) != b.dtype:
            wrong.append(f"'{b.name}': the plan has {b.dtype} {list(b.shape)}, the trainer holds "
                         f"{torch_names.get(str(t.dtype), t.dtype)} {list(t.shape)}")
    if wrong:
        more = f"\n  (and {len(wrong) - 6} more)" if len(wrong) > 6 else ""
        raise PlanMismatchError(f"plan rank {rank}: the plan's training layout '{layout}' is not what this trainer "
                                f"holds ({words}); nothing was sent:\n  " + "\n  ".join(wrong[:6]) + more)


def _trainer_modules(engine: Any) -> List[Tuple[str, Any]]:
    """(name prefix, module) of a verl training engine's parameters: the FSDP
    engine's ``module`` (``verl/workers/engine/fsdp/transformer_impl.py``),
    the Megatron engine's list of model chunks (``megatron/transformer_impl.py``
    ``_build_megatron_module``; virtual pipeline chunk c bound as ``model{c}.``)."""
    module = getattr(engine, "module", None)
    if module is None:
        raise TypeError(f"reshard.verl: the training engine {type(engine).__name__} has no module to bind")
    if isinstance(module, (list, tuple)):
        if len(module) == 1:
            return [("", module[0])]
        return [(f"model{c}.", m) for c, m in enumerate(module)]
    return [("", module)]


def _node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address().strip("[]")
    except Exception:  # noqa: BLE001 - outside Ray: this host
        return "127.0.0.1"


def _free_port(host: str) -> int:
    """A port free on `host` now, below the ephemeral range: the kernel never
    hands those to outgoing connections, which the job's other processes
    open in great numbers before the rendezvous binds it."""
    import random

    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            high = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        high = 32768
    rng = random.SystemRandom()
    for _ in range(256):
        port = rng.randrange(max(1024, high - 12768), high)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"reshard.verl: no free TCP port on {host} below the ephemeral range")


# -- the backend (verl present) ---------------------------------------------------------------------------

try:
    import verl as _verl
except ImportError:  # the plan helpers above need no verl; the backend does
    _verl = None

if _verl is not None:
    if version_problem(_verl.__version__) is not None:
        raise ImportError(version_problem(_verl.__version__))

    from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

    #: What the backend patches in verl, each with the upstream change it stands for (docs/verl.md).
    PATCHES = {
        "verl.workers.engine.*.<Engine>.get_per_tensor_param":
            "ActorRolloutRefWorker.update_weights hands send_weights the training engine (self.actor.engine) for "
            "any backend that asks (a class attribute), as it already does for delta_sharded, without calling "
            "get_per_tensor_param()",
        "verl.workers.rollout.vllm_rollout.vllm_rollout.ServerAdapter.update_weights":
            "a wire format whose payload drives vLLM's weight-transfer lifecycle (init once; start, update, finish "
            "per step) over collective_rpc, as _update_delta_weights does for delta_flush",
    }
    _applied: Dict[str, Any] = {}

    _HANDOFF: List[bool] = [False]  # a reshard backend that takes the model engine was made in this process

    def _patch_trainer() -> List[str]:
        """The training engines' ``get_per_tensor_param`` (each class of verl's EngineRegistry that defines
        it): called bare, in a process where this backend was made, it returns the engine itself instead of
        the stream of full tensors. ``ActorRolloutRefWorker.update_weights`` calls it bare and hands the result
        to ``send_weights`` (``verl/workers/engine_workers.py``); its other callers pass arguments (the
        hybrid engine's naive path) or belong to another backend (``delta_sharded``). The worker method
        itself cannot be replaced: Ray took its function when it created the actor, before verl imported
        this module."""
        import functools
        import sys

        registry = sys.modules.get("verl.workers.engine.base")
        if registry is None:
            return []
        classes = {c for by_backend in registry.EngineRegistry._engines.values() for by_device in by_backend.values()
                   for c in by_device.values()}
        done = []
        for engine_cls in classes:
            owner = next((c for c in engine_cls.__mro__ if "get_per_tensor_param" in c.__dict__), None)
            if owner is None:
                continue
            key = f"{owner.__module__}.{owner.__qualname__}.get_per_tensor_param"
            if key not in _applied:
                original = owner.__dict__["get_per_tensor_param"]

                @functools.wraps(original)
                def get_per_tensor_param(self, *args, _original=original, **kwargs):
                    if _HANDOFF[0] and not args and not kwargs:
                        return self, None  # the engine, for ReshardCheckpointEngine.send_weights
                    return _original(self, *args, **kwargs)

                owner.get_per_tensor_param = get_per_tensor_param
                _applied[key] = original
            done.append(key)
        return done

    def _patch_rollout() -> bool:
        import functools
        import sys

        mod = sys.modules.get("verl.workers.rollout.vllm_rollout.vllm_rollout")
        key = "verl.workers.rollout.vllm_rollout.vllm_rollout.ServerAdapter.update_weights"
        if mod is None or key in _applied:
            return key in _applied
        cls = mod.ServerAdapter
        original = cls.update_weights

        @functools.wraps(original)
        async def update_weights(self, weights, global_steps: int = None, wire_format: str = "named_tensors",
                                 **kwargs):
            if wire_format == WIRE_FORMAT:
                return await weights.apply(self, global_steps)
            return await original(self, weights, global_steps=global_steps, wire_format=wire_format, **kwargs)

        cls.update_weights = update_weights
        _applied[key] = original
        return True

    def apply_patches() -> List[str]:
        """Applies the patches whose verl modules this process has imported; returns those applied."""
        _patch_trainer()
        _patch_rollout()
        return sorted(_applied)

    class RolloutUpdate:
        """What ``receive_weights`` hands the rollout's ServerAdapter: not tensors,
        but the lifecycle the adapter drives on its vLLM server."""

        def __init__(self, ce: "ReshardCheckpointEngine", global_steps: Optional[int]):
            self.ce = ce
            self.global_steps = global_steps

        async def apply(self, adapter: Any, global_steps: Optional[int]) -> None:
            await self.ce.drive_rollout(adapter, global_steps)

    def _failed_trainer_ranks(rank: int, failed: bool) -> List[int]:
        """The plan ranks of the trainer ranks whose update failed, agreed over torch.distributed's default
        group (verl's trainer group: every actor worker runs send_weights); [] or [rank] without one."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return [rank] if failed else []
        box = [None] * dist.get_world_size()
        dist.all_gather_object(box, (rank, failed))
        return [r for r, f in box if f]

    @CheckpointEngineRegistry.register(BACKEND)
    class ReshardCheckpointEngine(CheckpointEngine):
        """``checkpoint_engine.backend=reshard``: one reshard session per rank for the whole job.

        Trainer ranks (verl's actor workers) bind their own shards of the
        training engine's module and run their part of the plan; rollout
        ranks (verl's CheckpointEngineWorker beside each vLLM server) have
        the server's workers run theirs through vLLM's weight-transfer
        lifecycle. ``prepare`` / ``build_topology`` / ``init_process_group``
        settle the plan ranks and the rendezvous once; later calls find them
        settled; ``finalize`` keeps the session."""

        wire_format = WIRE_FORMAT
        takes_model_engine = True  #: send_weights is handed the training engine (get_per_tensor_param, patched)

        def __init__(self, bucket_size: int = 0, is_master: bool = False, plan_path: Optional[str] = None,
                     model: Optional[str] = None, store: str = "", timeout_s: float = 120.0,
                     hostname: Optional[str] = None, transport: str = "auto") -> None:
            from .plan import Plan

            if not plan_path:
                raise ValueError(f"checkpoint_engine.backend=reshard needs its plan: set +{KWARGS_KEY}.plan_path=FILE "
                                 "(reshard.verl.make_plan writes one from this job's config)")
            self.plan = Plan.open(plan_path)  # PlanError names the file and what is wrong
            if not self.plan.source_ranks or not self.plan.dest_ranks:
                raise PlanMismatchError(f"the plan {plan_path} has {len(self.plan.source_ranks)} training and "
                                        f"{len(self.plan.dest_ranks)} inference ranks: it is no refit plan")
            if model:
                check_model(self.plan, model)
            if transport not in ("auto", "nccl", "gloo"):
                raise ValueError(f"{KWARGS_KEY}.transport={transport!r}: expected auto, nccl or gloo")
            if transport == "auto":
                import torch

                transport = "nccl" if torch.cuda.is_available() else "gloo"
            self.transport = transport
            self.nccl_unique_id_b64 = ""
            self.plan_path = plan_path
            self.is_master = is_master
            self.store = store
            self.timeout_s = float(timeout_s)
            self.hostname = hostname
            self.topology: Optional[Dict[str, Any]] = None
            self.refit: Any = None
            self.failed: Optional[str] = None
            self.stats: Any = None
            self.updates = 0
            self._initialized: Dict[int, Dict[str, Any]] = {}  # replica rank -> the init dict its workers got
            _HANDOFF[0] = True
            apply_patches()

        # -- topology: settled once ------------------------------------------------------------------
        def prepare(self) -> Dict[str, Any]:
            """Trainer rank 0 chooses the rendezvous (once): on CUDA an NCCL unique id (``transport="nccl"``,
            the default where CUDA is available), else Gloo through the configured store or a TCP address of
            its own."""
            if self.is_master and self.transport == "nccl" and not self.nccl_unique_id_b64:
                import base64

                from . import nccl

                self.nccl_unique_id_b64 = base64.b64encode(nccl.unique_id()).decode()
            elif self.is_master and self.transport == "gloo" and not self.store:
                host = self.hostname or _node_ip()
                self.store = f"{host}:{_free_port(host)}"
            return {"plan_path": self.plan_path, "store": self.store, "nccl_unique_id_b64": self.nccl_unique_id_b64,
                    "master": self.is_master, "digest": self.plan.content_digest}

        @classmethod
        def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: List[Dict[str, Any]]):
            """Plan ranks for every worker, from the plan trainer rank 0 reads: the trainer's ranks are the
            plan's training ranks, the rollout's its inference ranks. Raises PlanMismatchError (in the
            driver, before any worker connects) when the job's sizes are not the plan's."""
            from .plan import Plan

            master = next((m for m in metadata[:actor_wg_world_size] if m.get("master")), metadata[0])
            plan = Plan.open(master["plan_path"])
            digests = {m["digest"] for m in metadata}
            if len(digests) > 1:
                raise PlanMismatchError(f"the workers read {len(digests)} different plans at {master['plan_path']}: "
                                        "every process must read the same file")
            if actor_wg_world_size != len(plan.source_ranks) or rollout_world_size != len(plan.dest_ranks):
                raise PlanMismatchError(
                    f"the plan {plan.path} has {len(plan.source_ranks)} training ranks ('{plan.inputs['source_layout']}')"
                    f" and {len(plan.dest_ranks)} inference ranks ('{plan.inputs['dest_layout']}'); this job has "
                    f"{actor_wg_world_size} trainer ranks and {rollout_world_size} rollout ranks")
            store, uid = master["store"], master["nccl_unique_id_b64"]
            actor = {"rank": list(plan.source_ranks), "store": [store] * actor_wg_world_size,
                     "nccl_unique_id_b64": [uid] * actor_wg_world_size}
            rollout = {"rank": list(plan.dest_ranks), "store": [store] * rollout_world_size,
                       "nccl_unique_id_b64": [uid] * rollout_world_size}
            return actor, rollout

        def init_process_group(self, rank: int, store: str, nccl_unique_id_b64: str = "") -> None:
            """Records this worker's plan rank and the rendezvous; nothing connects here (the trainer ranks and
            the vLLM workers meet inside the first update). Later calls must find the same topology."""
            topology = {"rank": int(rank), "store": store, "nccl_unique_id_b64": nccl_unique_id_b64}
            if self.topology is None:
                self.topology = topology
            elif self.topology != topology:
                raise PlanMismatchError(f"reshard keeps one session for the job; the topology changed from "
                                        f"{self.topology} to {topology} (replicas added or removed): restart the job "
                                        "with a plan for the new size")

        def finalize(self) -> None:
            """Keeps the session for the next update (verl's own backends tear their group down here)."""

        def close(self) -> None:
            """Closes this rank's session and transport (the job's end; a closed engine refuses updates)."""
            refit, self.refit = self.refit, None
            if refit is not None:
                refit.session.transport.close()
            self.failed = self.failed or "the engine was closed (ReshardCheckpointEngine.close)"

        def _refuse_after_failure(self) -> None:
            if self.failed is not None:
                raise UpdateFailedError(f"an earlier update failed ({self.failed}); the session is closed and the "
                                        "rollout's weights are not a step's: restart the job from a checkpoint")

        # -- the trainer side ------------------------------------------------------------------------
        async def send_weights(self, weights: Any, global_steps: Optional[int] = None) -> Dict[str, Any]:
            """This trainer rank's part of the plan, from the training engine's own parameters. `weights` must
            be the engine (the patched get_per_tensor_param hands it through ActorRolloutRefWorker.update_weights);
            a tensor stream is refused, never iterated (iterating it is the gather this backend removes).

            Every trainer rank ends the update alike: after its own run, the trainer ranks agree over
            torch.distributed's default group (one integer each); if any failed, every one raises
            UpdateFailedError naming the ranks that failed, closes its session and refuses later updates."""
            if not hasattr(weights, "module"):
                raise TypeError("reshard.verl: send_weights was handed "
                                f"{type(weights).__name__}, not the training engine: reshard binds the trainer's "
                                "tensors in place and never iterates a stream of full tensors (that is the gather "
                                "it removes). The training engines' get_per_tensor_param is patched when this "
                                f"backend is made in the trainer's process; applied here: {apply_patches()}")
            if self.topology is None:
                raise RuntimeError("reshard.verl: send_weights before init_process_group")
            engine = weights
            rank = self.topology["rank"]
            error: Optional[BaseException] = None
            connect_s = 0.0
            offload = bool(getattr(engine, "is_param_offload_enabled", False))
            try:
                self._refuse_after_failure()
                if offload:  # the engine keeps its parameters on the host between steps; bind them on the device
                    from verl.utils.device import get_device_name

                    engine.to(get_device_name(), model=True, optimizer=False, grad=False)
                t0 = time.perf_counter()
                if self.refit is None:
                    modules = _trainer_modules(engine)
                    check_trainer(self.plan, rank, modules)  # before connecting: no byte moves on a mismatch
                    self.refit = await asyncio.to_thread(self._connect_trainer, rank, modules)
                connect_s = time.perf_counter() - t0
                self.stats = await asyncio.to_thread(self.refit.run)
            except BaseException as e:  # noqa: BLE001 - every rank agrees below, then raises
                error = e
                self._fail(f"trainer plan rank {rank}, step {global_steps}: {type(e).__name__}: {e}")
            finally:
                if offload:
                    engine.to("cpu", model=True, optimizer=False, grad=False)
            failed = await asyncio.to_thread(_failed_trainer_ranks, rank, error is not None)
            if error is not None:
                raise UpdateFailedError(f"reshard.verl: the update of step {global_steps} failed on trainer plan "
                                        f"rank {rank}: {type(error).__name__}: {error}") from error
            if failed:
                self._fail(f"step {global_steps}: trainer plan rank(s) {failed} failed")
                raise UpdateFailedError(f"reshard.verl: the update of step {global_steps} failed on trainer plan "
                                        f"rank(s) {failed}; this rank (plan rank {rank}) closed its session too")
            self.updates += 1
            return {"reshard/seconds": self.stats.seconds, "reshard/connect_s": connect_s,
                    "reshard/bytes_sent": self.stats.bytes_sent}

        def describe(self) -> Dict[str, Any]:
            """This worker's state: its plan rank, the rendezvous, the updates done, whether a session is
            open (and which: the same one across updates), and what failed."""
            session = None if self.refit is None else self.refit.session
            return {"plan": self.plan_path, "topology": self.topology, "updates": self.updates,
                    "session": None if session is None else id(session),
                    "transport": None if session is None else id(session.transport),
                    "rebinds": None if self.refit is None else self.refit.rebinds, "failed": self.failed,
                    "initialized_replicas": sorted(self._initialized)}

        def _connect_trainer(self, rank: int, modules: List[Tuple[str, Any]]) -> Any:
            from .refit import TrainerRefit
            from .session import Session
            from .transport import GlooTransport

            process, processes = self.plan.process_of(rank), len(self.plan.active_ranks)
            uid = self.topology["nccl_unique_id_b64"]
            if uid:  # as reshard.vllm.connect makes the workers' side: one world, one NVLink communicator per domain
                import base64

                import torch

                from . import nccl
                from .transport import NcclTransport

                world = nccl.Communicator.init(processes, process, base64.b64decode(uid),
                                               device=torch.cuda.current_device())
                transport = NcclTransport(world, world.split(color=self.plan.domains[rank], key=process),
                                          timeout_s=self.timeout_s)
            else:
                transport = GlooTransport(process, processes, store=self.topology["store"],
                                          hostname=self.hostname or _node_ip(), timeout_s=self.timeout_s)
            session = Session(self.plan, rank, transport)
            if len(modules) == 1 and not modules[0][0]:
                return TrainerRefit(session, modules[0][1])
            tensors: Dict[str, Any] = {}
            for prefix, m in modules:
                tensors.update(session.module_tensors(m, prefix=prefix))
            return TrainerRefit(session, tensors)

        def _fail(self, what: str) -> None:
            self.failed = what
            refit, self.refit = self.refit, None
            if refit is not None:  # the peers hear a closed connection at once instead of waiting for a timeout
                try:
                    refit.session.transport.close()
                except Exception:  # noqa: BLE001 - the error being raised says what failed
                    pass

        # -- the rollout side ------------------------------------------------------------------------
        def receive_weights(self, global_steps: Optional[int] = None) -> RolloutUpdate:
            """Not tensors: the lifecycle the ServerAdapter drives on its vLLM server (wire format
            ``"reshard"``, patched ServerAdapter.update_weights)."""
            apply_patches()
            self._refuse_after_failure()
            return RolloutUpdate(self, global_steps)

        async def drive_rollout(self, adapter: Any, global_steps: Optional[int]) -> None:
            """On the replica's leading adapter (the one that holds the server: ``_has_server``): checks the
            rollout against the plan, sends the init dict once, then start, update (the workers' parts of the
            plan) and finish. Only then are the server's KV cache cleared and its weights version set."""
            if not adapter._ensure_server_handle():
                return  # another rank of the replica drives it
            replica = int(adapter.replica_rank)
            cfg = adapter.config
            world = int(cfg.tensor_model_parallel_size) * int(cfg.pipeline_model_parallel_size) * \
                int(cfg.data_parallel_size)
            written = False
            try:
                if replica not in self._initialized:
                    check_rollout(self.plan, cfg, len(self.plan.dest_ranks) // world)
                    init = {"plan_path": self.plan_path, "rank_offset": self.plan.dest_ranks[replica * world],
                            "store": self.topology["store"], "timeout_s": self.timeout_s}
                    if self.topology["nccl_unique_id_b64"]:
                        init["nccl_unique_id_b64"] = self.topology["nccl_unique_id_b64"]
                    await adapter._execute_method("init_weight_transfer_engine", kwargs={"init_info": init})
                    self._initialized[replica] = init
                await adapter._execute_method("start_weight_update")
                written = True
                await adapter._execute_method("update_weights", kwargs={"update_info": {"step": self.updates}})
                await adapter._execute_method("finish_weight_update")
            except BaseException as e:
                cause = getattr(e, "cause", None) or e  # a Ray task's error carries the worker's own as .cause
                self._fail(f"rollout replica {replica}, step {global_steps}: {type(cause).__name__}: {cause}")
                if written:  # some workers may hold new values: the server's weights are no step's
                    try:
                        await adapter.server_handle.set_global_steps.remote(NOT_UPDATED)
                    except Exception:  # noqa: BLE001 - the error below is the one to report
                        pass
                raise UpdateFailedError(
                    f"reshard.verl: the update of step {global_steps} failed on rollout replica {replica}: "
                    f"{type(cause).__name__}: {cause}" + (f" (the server's global_steps is now {NOT_UPDATED}: its weights "
                                                  "may be partly written)" if written else
                                                  " (no worker was written: the weights are the last step's)")) from e
            self.updates += 1
            await adapter.server_handle.clear_kv_cache.remote()
            if global_steps is not None:
                await adapter.server_handle.set_global_steps.remote(global_steps)

    apply_patches()
