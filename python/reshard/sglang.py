"""reshard.sglang: refit the weights of a running SGLang 0.5.23 engine in place.

An SGLang TP worker holds its weights in kernel format, the tensors that
``reshard init --infer sglang:...`` describes (fused ``qkv_proj`` /
``gate_up_proj``, stacked experts ``mlp.experts.w13_weight`` / ``w2_weight``
with the shared expert in slot E when SGLang fuses it, MLA's
``fused_qkv_a_proj_with_mqa``, FP8 weights and their block scales), so a
refit writes them in place. What SGLang derived from them at load must then
be made current: MLA's absorbed ``self_attn.w_kc`` / ``w_vc`` (and, under
FP8, the per-tensor requantized copies and their ``w_scale``), computed from
``kv_b_proj`` by the model's ``post_load_weights``
(``models/deepseek_common/deepseek_weight_loader.py``; ``bind_or_assign``
copies into the existing tensors), and every quant method's
``process_weights_after_loading``.

The door. SGLang 0.5.23 runs code inside every TP worker, with the model in
hand, through a *custom weight loader*: a server started with
``--custom-weight-loader reshard.sglang.load_refit`` imports and calls
``load_refit(model, named_tensors)`` when ``/update_weights_from_tensor``
names it as ``load_format``
(``model_executor/model_runner_components/weight_updater.py``
``WeightUpdater.update_weights_from_tensor``: ``dynamic_import(load_format)``).
That call must come inside SGLang's weight-update session
(``managers/scheduler_components/weight_updater.py``
``SchedulerWeightUpdaterManager``), so one refit is::

    POST /begin_weight_update     restore_weights_before_loading on every quant method
    POST /update_weights_from_tensor {"load_format": "reshard.sglang.load_refit", ...}
                                  each TP worker: its part of the plan, in place, then
                                  the model's post_load_weights (w_kc / w_vc / w_scale)
    POST /end_weight_update       every quant method's process_weights_after_loading

A session that loaded tensors skips ``post_load_weights`` at its end
(``end_weight_update(run_post_load=not loaded_weights)``), as a
``model.load_weights()`` runs it itself; :func:`load_refit` therefore runs
it, as SGLang's own loaders that bypass ``load_weights`` do
(``model_loader/loader.py`` ``post_load_weights``). No parameter or buffer
moves in memory.

The request travels in the names of ``serialized_named_tensors`` (one entry
per TP rank, each a list of one ``(name, value)`` that SGLang's
``SafeUnpickler`` reads): :func:`refit_payload`.
One request serves every worker of an engine: each adds its position
(``pp_rank * tp_size + tp_rank``, SGLang's world rank:
``distributed/bootstrap.py`` ``_init_parallel_groups``) to ``rank_offset``.
The first request connects the worker's session; later ones re-bind what
the engine replaced and run.

Refused before any byte moves: an engine whose TP / EP / attention-DP /
PP or shared-expert fusion are not the plan's (:class:`EngineMismatchError`,
naming both); a worker whose plan rank is not the plan's there
(:class:`WorkerRankError`); an engine SGLang itself refuses to update online
because a derived-weight cache would stay stale
(:class:`OnlineUpdateRefusedError`, with SGLang's reason:
``weight_updater.py`` ``_unsupported_derived_weight_cache_error``).

A custom loader's exception is not caught by SGLang 0.5.23 (the scheduler
process would exit); :func:`register`, run in every SGLang process by the
``sglang.srt.plugins`` entry point (SGLang's ``load_plugins``, called by
``managers/scheduler.py`` ``run_scheduler_process``), wraps
``WeightUpdater.update_weights_from_tensor`` so that reshard's error
returns as the call's ``(False, message)``, the way
``load_weights_from_distributed`` reports a failed load.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

#: The SGLang release whose layouts and post-processing reshard was proven against (tests/sglang).
SGLANG_VERSION = "0.5.23"

#: The custom weight loader's import path: ``--custom-weight-loader`` and the ``load_format`` of each refit.
LOADER = "reshard.sglang.load_refit"

#: The prefix of the one tensor name that carries a refit request.
REQUEST_PREFIX = "reshard.refit:"

try:
    import sglang as _sglang
except ImportError as _e:  # one line, what to do
    raise ImportError(f"reshard.sglang needs SGLang {SGLANG_VERSION} in this Python environment "
                      f"(pip install sglang=={SGLANG_VERSION}): {_e}") from None


def version_problem(version: str) -> Optional[str]:
    """Why reshard.sglang must not be used with SGLang `version` (None: it may)."""
    if version.split("+")[0] == SGLANG_VERSION or os.environ.get("RESHARD_SGLANG_ANY_VERSION"):
        return None
    return (f"reshard.sglang was proven against SGLang {SGLANG_VERSION}; this is SGLang {version}, whose parameter "
            "layouts and weight-update session may differ. Check the layout against a dump of a real rank "
            "(`reshard check`) and set RESHARD_SGLANG_ANY_VERSION=1 to use it.")


if version_problem(getattr(_sglang, "__version__", "unknown")) is not None:
    raise ImportError(version_problem(getattr(_sglang, "__version__", "unknown")))

from .errors import Error  # noqa: E402
from .refit import BoundModule  # noqa: E402
from .session import RunStats, Session  # noqa: E402

__all__ = ["SGLANG_VERSION", "LOADER", "EngineMismatchError", "WorkerRankError", "OnlineUpdateRefusedError",
           "EngineSettings", "engine_settings", "plan_settings", "check_engine", "online_update_problem",
           "WorkerRefit", "RefitRequest", "refit_payload", "load_refit", "worker_refits", "register", "refit_over_http",
           "plan_fusion", "worker_position", "worker_plan_rank",
           "version_problem"]

_log = logging.getLogger("reshard.sglang")


class EngineMismatchError(Error):
    """The SGLang engine's parallel settings or shared-expert fusion are not the plan's inference layout."""


class WorkerRankError(EngineMismatchError):
    """A worker's plan rank (``rank_offset`` plus its position) is not an inference rank of the plan there."""


class OnlineUpdateRefusedError(Error):
    """SGLang refuses online weight updates on this engine (a derived-weight cache would keep old values)."""


@dataclass(frozen=True)
class EngineSettings:
    """What decides which tensors an SGLang worker holds: its engine's
    widths (``runtime_context.py`` ``derive_parallel_widths``) and whether
    the shared expert lives in the routed experts' slot E."""

    tp: int
    pp: int = 1
    ep: int = 1
    attn_dp: int = 1
    #: "fused" (slot E of w13_weight / w2_weight), "separate", or "none" (no shared expert)
    shared_experts: str = "none"

    def __str__(self) -> str:
        s = f"TP {self.tp}"
        if self.pp > 1:
            s += f" PP {self.pp}"
        s += f" EP {self.ep} attention-DP {self.attn_dp}"
        if self.shared_experts != "none":
            s += f", shared experts {self.shared_experts}"
        return s


def _has_shared_experts(model: Any) -> bool:
    return any(n.endswith("shared_experts") for n, _ in model.named_modules())


def engine_settings(model: Any) -> EngineSettings:
    """This worker's engine settings, read from SGLang's runtime context
    (``runtime_context.py`` ``get_parallel``; shared-expert fusion:
    ``layers/moe/utils.py`` ``get_num_fused_shared_experts``)."""
    from sglang.srt.layers.moe.utils import get_num_fused_shared_experts
    from sglang.srt.runtime_context import get_parallel

    p = get_parallel()
    fused = get_num_fused_shared_experts() > 0
    shared = "fused" if fused else ("separate" if _has_shared_experts(model) else "none")
    return EngineSettings(tp=p.tp_size, pp=p.pp_size, ep=p.moe_ep_size, attn_dp=p.attn_dp_size,
                          shared_experts=shared)


# `reshard init --infer sglang:...` names its layout after the settings (frameworks/sglang.cc):
# sglang-tp{T}[-attn-dp{A}][-ep{E}][-x{engines}][-{quant}].
_INIT_NAME = re.compile(r"^sglang-tp(\d+)(?:-attn-dp(\d+))?(?:-ep(\d+))?(?:-x(\d+))?(?:-[a-z0-9-]+)?$")


def plan_settings(plan: Any) -> Optional[EngineSettings]:
    """The engine widths the plan's inference layout was written for, read
    from its name as ``reshard init`` writes it; None for a layout written by
    hand. (Its shared-expert fusion is read per rank: :func:`plan_fusion`.)"""
    m = _INIT_NAME.match(plan.inputs["dest_layout"])
    if not m:
        return None
    return EngineSettings(tp=int(m[1]), pp=1, ep=int(m[3] or 1), attn_dp=int(m[2] or 1))


def plan_fusion(plan: Any, rank: int, model: Any) -> str:
    """How plan rank `rank` holds the shared experts: "separate" (buffers
    under ``mlp.shared_experts.``), "fused" (no such buffer, and its
    ``w13_weight`` has the engine's extra slot), or "none"."""
    names = {b.name: b for b in plan.buffers(rank)}
    if any(".mlp.shared_experts." in n for n in names):
        return "separate"
    params = dict(model.named_parameters())
    for n, b in names.items():
        p = params.get(n)
        if n.endswith(".mlp.experts.w13_weight") and p is not None and _has_shared_experts_fused(model):
            return "fused" if list(b.shape) == list(p.shape) else "none"
    return "none"


def _has_shared_experts_fused(model: Any) -> bool:
    from sglang.srt.layers.moe.utils import get_num_fused_shared_experts

    return get_num_fused_shared_experts() > 0


def check_engine(plan: Any, settings: EngineSettings, rank: Optional[int] = None, model: Any = None) -> None:
    """Raises EngineMismatchError, naming both, when the engine's widths are
    not those of the plan's inference layout, when (given the worker's plan
    `rank` and `model`) the engine fuses the shared experts and the plan does
    not or the other way round, or when the plan's inference ranks are not
    whole engines of this size."""
    layout = plan.inputs["dest_layout"]
    want = plan_settings(plan)
    if want is not None and (want.tp, want.pp, want.ep, want.attn_dp) != \
            (settings.tp, settings.pp, settings.ep, settings.attn_dp):
        raise EngineMismatchError(
            f"the plan's inference layout '{layout}' is {_settings_words(want)}; this SGLang engine runs "
            f"{_settings_words(settings)}: compile the plan for the engine's settings (reshard init --infer sglang:...)")
    if rank is not None and model is not None and settings.shared_experts != "none":
        held = plan_fusion(plan, rank, model)
        if held != settings.shared_experts and held != "none" or \
                (held == "none" and any(".mlp.experts." in b.name for b in plan.buffers(rank))):
            plan_words = {"separate": "holds the shared experts apart (shared-experts=tp or replicated)",
                          "fused": "holds the shared expert in the routed experts' slot E (shared-experts=fused)",
                          "none": "writes no shared experts"}[held]
            engine_words = ("fuses the shared expert into slot E of w13_weight / w2_weight (start it with "
                            "--disable-shared-experts-fusion)" if settings.shared_experts == "fused" else
                            "holds the shared experts apart (--disable-shared-experts-fusion)")
            raise EngineMismatchError(f"plan rank {rank}: the plan's inference layout '{layout}' {plan_words}; this "
                                      f"SGLang engine {engine_words}: compile the plan for the engine's settings "
                                      "(reshard init --infer sglang:...,shared-experts=...)")
    world = settings.tp * settings.pp
    if len(plan.dest_ranks) % world != 0:
        raise EngineMismatchError(f"the plan has {len(plan.dest_ranks)} inference ranks, not a whole number of "
                                  f"engines of {world} ranks ({_settings_words(settings)})")


def _settings_words(s: EngineSettings) -> str:
    return f"TP {s.tp}" + (f" PP {s.pp}" if s.pp > 1 else "") + f" EP {s.ep} attention-DP {s.attn_dp}"


def online_update_problem(model: Any) -> Optional[str]:
    """SGLang's own reason to refuse updating this engine's weights online,
    or None: an active derived-weight cache (compensated mHC splits, the
    HPC-Ops bf16xfp32 GEMM, a model-declared ``_derived_weight_cache_error``:
    ``weight_updater.py`` ``_unsupported_derived_weight_cache_error``) or the
    CUDA IPC weight cache (``--weight-cache-mode``)."""
    from sglang.srt.model_executor.model_runner_components import weight_updater as wu
    from sglang.srt.runtime_context import get_model

    mode = getattr(get_model(), "weight_cache_mode", "off")
    if mode != "off":
        return (f"the weight cache is active (--weight-cache-mode {mode}): the weights are shared with the daemon "
                "through CUDA IPC; restart with --weight-cache-mode off")
    return wu._unsupported_derived_weight_cache_error(model)


class WorkerRefit(BoundModule):
    """One SGLang worker's side of each refit: its model bound once, then
    :meth:`run` per step (re-bind what the engine replaced, run the plan,
    re-derive what SGLang derives from the weights). Meant to run inside
    SGLang's weight-update session (:func:`load_refit` does). Raises before
    any byte moves on an engine whose settings are not the plan's
    (:class:`EngineMismatchError`) or that SGLang refuses to update online
    (:class:`OnlineUpdateRefusedError`)."""

    def __init__(self, session: Session, model: Any, settings: Optional[EngineSettings] = None):
        settings = settings or engine_settings(model)
        check_engine(session.plan, settings, session.rank, model)
        reason = online_update_problem(model)
        if reason is not None:
            raise OnlineUpdateRefusedError(f"plan rank {session.rank}: SGLang refuses online weight updates on this "
                                           f"engine: {reason}")
        self.settings = settings
        super().__init__(session, model)
        self.last_run_s = 0.0
        self.last_finish_s = 0.0

    def finish(self) -> None:
        """Re-derives what SGLang derives from the weights at load: the model's
        ``post_load_weights`` (MLA's w_kc / w_vc / w_scale), as SGLang's own
        loaders that bypass ``load_weights`` call it (``model_loader/loader.py``)."""
        import torch
        from sglang.srt.model_loader.loader import post_load_weights

        start = time.perf_counter()
        with torch.no_grad():
            post_load_weights(self.module)
        self.last_finish_s = time.perf_counter() - start

    def run(self) -> RunStats:
        self.rebind_if_replaced()
        start = time.perf_counter()
        stats = self.session.run()
        self.last_run_s = time.perf_counter() - start
        self.finish()
        return stats


# -- the door: SGLang's custom weight loader ---------------------------------------------------------------


@dataclass
class RefitRequest:
    """What every worker of an engine gets with each refit, the same for all."""

    plan_path: str  #: the compiled plan, readable by every worker
    #: the plan rank of the engine's first worker; each worker adds pp_rank * tp_size + tp_rank.
    #: None: the plan's first inference rank.
    rank_offset: Optional[int] = None
    store: str = ""  #: Gloo rendezvous (a fresh shared directory or HOST:PORT); "" with an NCCL unique id
    nccl_unique_id_b64: str = ""  #: made by process 0 (reshard.nccl.unique_id()), standard base64
    timeout_s: float = 120.0
    step: int = 0  #: for logs only: the plan says what moves

    def connection(self) -> Tuple:
        """What decides the session: a request that differs in it reconnects."""
        return (self.plan_path, self.rank_offset, self.store, self.nccl_unique_id_b64, self.timeout_s)

    def to_name(self) -> str:
        return REQUEST_PREFIX + json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_named_tensors(named_tensors: Any) -> "RefitRequest":
        entries = list(named_tensors or [])
        names = [n for n, _ in entries if isinstance(n, str) and n.startswith(REQUEST_PREFIX)]
        if len(entries) != 1 or len(names) != 1:
            got = ", ".join(repr(n)[:60] for n, _ in entries[:3]) or "nothing"
            raise ValueError(f"{LOADER}: expected one refit request made by reshard.sglang.refit_payload(), got "
                             f"{len(entries)} tensor(s) ({got}): this loader writes the plan's shards, not tensors "
                             "sent with the request")
        try:
            d = json.loads(names[0][len(REQUEST_PREFIX):])
            return RefitRequest(**d)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{LOADER}: the refit request cannot be read: {e}") from None


def refit_payload(request: RefitRequest, tp_size: int) -> List[str]:
    """``serialized_named_tensors`` for ``/update_weights_from_tensor`` (or
    ``Engine.update_weights_from_tensor``): one entry per TP rank of the engine
    (each worker reads its own: ``managers/tp_worker.py``
    ``deserialize_own_rank``), each a list of one ``(name, value)`` whose
    name is the request, base64 for JSON.

    SGLang calls ``.to(device)`` on every value before the loader sees it
    (``weight_updater.py`` ``_unwrap_tensor``) and reads the entries with
    its ``SafeUnpickler``. The value is ``types.SimpleNamespace(to=str)``,
    made of globals that unpickler allows: no tensor, so nothing depends on
    how the sending process pickles tensors (SGLang's CUDA-only tensor
    reduction, ``utils/patch_torch.py``; Megatron-Core's replacement of
    ``torch.storage._load_from_bytes``, ``core/safe_globals.py``, which that
    unpickler refuses)."""
    import base64
    import pickle
    import types

    if tp_size < 1:
        raise ValueError(f"tp_size={tp_size}: expected the engine's TP size (at least 1)")
    one = base64.b64encode(pickle.dumps([(request.to_name(), types.SimpleNamespace(to=str))],
                                        protocol=pickle.HIGHEST_PROTOCOL)).decode()
    return [one] * tp_size


_REFITS: Dict[int, Tuple[Tuple, WorkerRefit]] = {}  # id(model) -> (connection, refit): one session per worker


def worker_refits() -> List[WorkerRefit]:
    """The refits this process made through :func:`load_refit` (one per model)."""
    return [r for _, r in _REFITS.values()]


def worker_position(settings: EngineSettings) -> int:
    """This worker's offset from its engine's first worker: SGLang's world
    rank ``tp_size * pp_rank + tp_rank`` (``distributed/bootstrap.py``
    ``_init_parallel_groups``)."""
    from sglang.srt.runtime_context import get_parallel

    p = get_parallel()
    return settings.tp * p.pp_rank + p.tp_rank


def worker_plan_rank(plan: Any, settings: EngineSettings, position: int, rank_offset: Optional[int]) -> int:
    """The plan rank of the worker at `position`; WorkerRankError when it is
    not an inference rank of the plan at that position of an engine."""
    offset = plan.dest_ranks[0] if rank_offset is None else rank_offset
    rank = offset + position
    where = f"SGLang worker {position} (rank_offset {offset} + {position} = plan rank {rank})"
    dest = plan.dest_ranks
    if not 0 <= rank < plan.num_ranks or plan.program(rank).dst_rank < 0:
        raise WorkerRankError(f"{where}: plan rank {rank} is not an inference rank (the plan's inference ranks are "
                              f"{dest[0]}-{dest[-1]}): rank_offset is the plan rank of the engine's first worker")
    world = settings.tp * settings.pp
    at = plan.program(rank).dst_rank % world
    if at != position:
        raise WorkerRankError(f"{where}: plan rank {rank} is worker {at} of an engine of {world}, not this worker's "
                              "position: rank_offset must be the plan rank of an engine's first worker")
    return rank


def _connect(plan: Any, rank: int, request: RefitRequest) -> Any:
    from . import GlooTransport

    process, processes = plan.process_of(rank), len(plan.active_ranks)
    if request.nccl_unique_id_b64:
        import base64

        import torch

        from . import NcclTransport, nccl

        uid = base64.b64decode(request.nccl_unique_id_b64, validate=True)
        device = torch.cuda.current_device()
        world = nccl.Communicator.init(processes, process, uid, device=device)
        return NcclTransport(world, world.split(color=plan.domains[rank], key=process),
                             timeout_s=request.timeout_s)
    if not request.store:
        raise ValueError(f"{LOADER}: the refit request has neither a Gloo store (a fresh directory every process "
                         "sees, or HOST:PORT) nor an NCCL unique id (nccl_unique_id_b64)")
    return GlooTransport(process, processes, store=request.store, timeout_s=request.timeout_s)


def load_refit(model: Any, named_tensors: Any) -> None:
    """SGLang's custom weight loader (``--custom-weight-loader
    reshard.sglang.load_refit``): this worker's part of one refit, in place,
    then SGLang's post-load derivations. The first request (or one naming
    another plan or rendezvous) checks the engine and connects; every one
    re-binds what the engine replaced and runs the plan."""
    from . import Plan

    request = RefitRequest.from_named_tensors(named_tensors)
    known = _REFITS.get(id(model))
    if known is None or known[0] != request.connection():
        _REFITS.pop(id(model), None)
        plan = Plan.open(request.plan_path)
        settings = engine_settings(model)
        # Everything that can be refused is refused before connecting: the trainer's call fails at once.
        check_engine(plan, settings)
        rank = worker_plan_rank(plan, settings, worker_position(settings), request.rank_offset)
        check_engine(plan, settings, rank, model)
        reason = online_update_problem(model)
        if reason is not None:
            raise OnlineUpdateRefusedError(f"plan rank {rank}: SGLang refuses online weight updates on this "
                                           f"engine: {reason}")
        refit = WorkerRefit(Session(plan, rank, _connect(plan, rank, request)), model, settings)
        _REFITS[id(model)] = (request.connection(), refit)
    refit = _REFITS[id(model)][1]
    stats = refit.run()
    _log.info("reshard: refit step %d on plan rank %d: %.3f s transfer, %.3f s post_load_weights (%d bytes in)",
              request.step, refit.session.rank, refit.last_run_s, refit.last_finish_s,
              getattr(stats, "bytes_received", 0))


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: wraps SGLang's
    ``WeightUpdater.update_weights_from_tensor`` so that an error of
    :func:`load_refit` returns as the call's ``(False, message)`` (SGLang
    0.5.23 lets a custom loader's exception end the scheduler process).
    Calls with another ``load_format`` pass through untouched. Never raises."""
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except ImportError as e:  # pragma: no cover - another SGLang
        _log.warning("reshard: SGLang's hook registry is missing (%s); a refused refit ends the scheduler", e)
        return
    target = ("sglang.srt.model_executor.model_runner_components.weight_updater.WeightUpdater."
              "update_weights_from_tensor")
    if any(fn is _report_refit_errors for _, fn, _ in HookRegistry._hooks.get(target, [])):
        return
    HookRegistry.register(target, _report_refit_errors, HookType.AROUND)


def _report_refit_errors(original, self, named_tensors, load_format=None, *args, **kwargs):
    if load_format != LOADER:
        return original(self, named_tensors, load_format, *args, **kwargs)
    try:
        return original(self, named_tensors, load_format, *args, **kwargs)
    except Exception as e:  # noqa: BLE001 - returned to the caller, as SGLang returns a failed load
        _log.error("reshard: refit refused or failed: %s", e)
        return False, f"{type(e).__name__}: {e}"


# -- the trainer side: one refit of an SGLang server over HTTP ---------------------------------------------


def _post(url: str, route: str, body: Dict[str, Any], timeout_s: float) -> Dict[str, Any]:
    """POSTs JSON to an SGLang server route; its JSON reply ({"success", "message"}) or a RuntimeError."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url.rstrip("/") + "/" + route, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:  # SGLang answers a failed update with 400 and its message
        try:
            return json.loads(e.read() or b"{}")
        except ValueError:
            raise RuntimeError(f"{url}/{route}: HTTP {e.code}") from None
    except urllib.error.URLError as e:
        raise RuntimeError(f"{url}/{route}: {e.reason}") from None


def refit_over_http(url: str, request: RefitRequest, tp_size: int, run_local: Any = None, *,
                    weight_version: Optional[str] = None, timeout_s: float = 600.0) -> Dict[str, Any]:
    """One refit of the SGLang server at `url` (one engine of `tp_size`
    workers started with ``--custom-weight-loader reshard.sglang.load_refit``),
    driven by one trainer rank: ``/begin_weight_update``, then
    ``/update_weights_from_tensor`` with reshard's loader while
    ``run_local()`` (this rank's part of the plan, e.g. a
    ``TrainerRefit.run``) runs, then ``/end_weight_update``. Returns the
    update's reply; raises RuntimeError with SGLang's (or reshard's) message
    when a call fails. The session is closed even when the update failed."""
    import threading

    out = _post(url, "begin_weight_update", {"selector": "target"}, timeout_s)
    if not out.get("success", False):
        raise RuntimeError(f"{url}: begin_weight_update failed: {out.get('message', out)}")
    reply: Dict[str, Any] = {}

    def update() -> None:
        try:
            reply.update(_post(url, "update_weights_from_tensor", {
                "serialized_named_tensors": refit_payload(request, tp_size), "load_format": LOADER,
                "flush_cache": True, "selector": "target", "weight_version": weight_version}, timeout_s))
        except RuntimeError as e:
            reply.update(success=False, message=str(e))

    t = threading.Thread(target=update, daemon=True)
    t.start()
    try:
        if run_local is not None:
            run_local()
    finally:
        t.join()
        end = _post(url, "end_weight_update", {}, timeout_s)
    if not reply.get("success", False):
        raise RuntimeError(f"{url}: the refit failed: {reply.get('message', reply)}")
    if not end.get("success", False):
        raise RuntimeError(f"{url}: end_weight_update failed: {end.get('message', end)}")
    return reply
