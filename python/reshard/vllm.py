"""reshard.vllm: refit the weights of a running vLLM 0.33 engine in place.

A vLLM worker holds its weights in *kernel format*: what the weight loaders
and ``process_weights_after_loading`` made of the checkpoint. reshard's plan
(``reshard init --infer vllm:...``) describes exactly those tensors, so a
refit writes them in place; what the engine derived from them at load time
must then be made current. In vLLM 0.33 that is MLA's ``W_UV`` / ``W_UK_T``,
computed from ``kv_b_proj`` by
``layers/attention/mla_attention.py MLAAttention.process_weights_after_loading``
(a separate dequantized BF16 copy under FP8; views of ``kv_b_proj`` under BF16).
:meth:`WorkerRefit.run` re-runs that per-layer post-processing after every
refit; it writes through ``replace_parameter``
(``model_executor/utils.py``: copied into the existing parameter when shape,
stride and dtype match), so no parameter moves in memory. The linear and MoE
post-processing (``quant_method.process_weights_after_loading``) is *not*
re-run: it maps checkpoint format to kernel format, and the plan already wrote
kernel format (running it again would, e.g., transpose CUTLASS's FP8 weights
twice). Proven bit for bit against a fresh vLLM load in CI
(tests/vllm/refit_live.py).

Kernel layouts: only backends whose kernel format was proven equal to the
layout ``reshard init`` writes are bound (:data:`PROVEN_KERNELS`); a
parameter of any other backend (Marlin repacking, FlashInfer / TRT-LLM
block-major MoE weights, DeepGEMM's E8M0 scales, CPU AMX prepacking, ...)
is refused by name before any byte moves (:class:`KernelLayoutError`).

Worker side::

    import reshard, reshard.vllm
    refit = reshard.vllm.WorkerRefit(session, model, vllm_config)   # binds once, checks the engine
    stats = refit.run()                                             # each step

Trainer side: :class:`TrainerRefit` (bind once, re-bind what the framework
replaced, run). As a vLLM weight-transfer engine: :func:`register` adds
``"reshard"`` to ``WeightTransferEngineFactory`` (vllm/distributed/
weight_transfer/factory.py ``register_engine`` takes engine classes from
outside vLLM).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

try:
    import vllm as _vllm
except ImportError as _e:  # one line, what to do
    raise ImportError(f"reshard.vllm needs vLLM 0.33.0 in this Python environment (pip install vllm==0.33.0): "
                      f"{_e}") from None

from .errors import BindError, Error
from .refit import BoundModule, TrainerRefit  # noqa: F401 (the trainer side)
from .session import RunStats, Session

#: The vLLM release whose layouts and post-processing reshard was proven against (tests/vllm).
VLLM_VERSION = "0.33.0"

if _vllm.__version__.split("+")[0] != VLLM_VERSION and not os.environ.get("RESHARD_VLLM_ANY_VERSION"):
    raise ImportError(f"reshard.vllm was proven against vLLM {VLLM_VERSION}; this is vLLM {_vllm.__version__}, whose "
                      "parameter layouts and post-processing may differ. Check the layout against a dump of a real "
                      "rank (tools/dump_state_dict.py, `reshard check`) and set RESHARD_VLLM_ANY_VERSION=1 to use it.")


class KernelLayoutError(BindError):
    """A parameter the plan writes is held by a backend in a layout reshard has not proven."""


class EngineMismatchError(Error):
    """The vLLM engine's parallel sizes are not the plan's inference layout."""


#: Kernel classes whose weights are the layout `reshard init` writes, proven
#: bit for bit on real vLLM ranks (tests/vllm/refit_live.py). Keyed by where
#: vLLM keeps the choice: a linear layer's FP8 kernel (Fp8LinearMethod.fp8_linear,
#: CompressedTensorsW8A8Fp8.fp8_linear) or an MoE method's experts class.
PROVEN_KERNELS = {
    "linear": ("TritonFp8BlockScaledMMKernel",   # keeps the checkpoint's [out, in] + block scales
               "CutlassFP8ScaledMMLinearKernel"),  # weight.t(): a transposed view of [out, in] memory
    "experts": ("TritonExperts",),                # w13 [E, 2I, H], w2 [E, H, I] as loaded
}
_PLAIN_METHODS = ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod", "UnquantizedFusedMoEMethod")


def _kernel_of(module: Any) -> Optional[Tuple[str, str]]:
    """(kind, class name) of the kernel that decides `module`'s weight layout, None when plain."""
    qm = getattr(module, "quant_method", None)
    if qm is None:
        return None
    experts = getattr(qm, "experts_cls", None)
    if experts is not None:
        return "experts", getattr(experts, "__name__", type(experts).__name__)
    for owner in (qm, getattr(module, "scheme", None)):
        k = getattr(owner, "fp8_linear", None) if owner is not None else None
        if k is not None:
            return "linear", type(k).__name__
    name = type(qm).__name__
    if name in _PLAIN_METHODS or name.endswith("KVCacheMethod"):
        return None
    return "method", name


def kernel_layout_problems(model: Any, names: Optional[set] = None) -> List[str]:
    """One line per module whose parameters (those in `names`, or all) a
    backend keeps in a layout reshard has not proven: the parameter and the backend."""
    problems = []
    for mod_name, mod in model.named_modules():
        pre = mod_name + "." if mod_name else ""
        own = [pre + n for n, _ in mod.named_parameters(recurse=False)]
        if names is not None:
            own = [n for n in own if n in names]
        if not own:
            continue
        if getattr(mod, "is_amx_bmm_enabled", False):
            problems.append(f"{own[0]}: MLA with AMX BMM packs W_UK / W_UV and empties kv_b_proj "
                            "(layers/attention/mla_attention.py process_weights_after_loading)")
            continue
        k = _kernel_of(mod)
        if k is None:
            continue
        kind, cls = k
        if cls in PROVEN_KERNELS.get(kind, ()):
            continue
        what = ", ".join(own[:3]) + (f" and {len(own) - 3} more" if len(own) > 3 else "")
        problems.append(f"{what}: held by {cls} ({kind} backend), whose weight layout reshard has not proven "
                        f"(proven: {', '.join(PROVEN_KERNELS['linear'] + PROVEN_KERNELS['experts'])})")
    return problems


_INIT_NAME = re.compile(r"^vllm-tp(\d+)(?:-pp(\d+))?(?:-dp(\d+))?(?:-ep(\d+))?(?:-x(\d+))?")


def check_engine(plan: Any, vllm_config: Any) -> None:
    """Raises EngineMismatchError when the engine's TP / PP / DP / EP differ from
    the plan's inference layout (as `reshard init` names it), or when the
    plan's inference ranks cannot be whole engines of this size."""
    pc = vllm_config.parallel_config
    tp, pp, dp = pc.tensor_parallel_size, pc.pipeline_parallel_size, pc.data_parallel_size
    ep = tp * dp if pc.enable_expert_parallel else 0
    engine = f"TP {tp} PP {pp} DP {dp}" + (f" EP {ep}" if ep else " (no EP)")
    layout = plan.inputs["dest_layout"]
    m = _INIT_NAME.match(layout)
    if m:
        want = (int(m[1]), int(m[2] or 1), int(m[3] or 1), int(m[4] or 0))
        if want != (tp, pp, dp, ep):
            raise EngineMismatchError(
                f"the plan's inference layout '{layout}' is TP {want[0]} PP {want[1]} DP {want[2]}"
                + (f" EP {want[3]}" if want[3] else " (no EP)") + f"; this vLLM engine runs {engine}: compile the "
                "plan for the engine's settings (reshard init --infer vllm:...)")
    world = tp * pp * dp
    if len(plan.dest_ranks) % world != 0:
        raise EngineMismatchError(f"the plan has {len(plan.dest_ranks)} inference ranks, not a whole number of "
                                  f"engines of {world} ranks ({engine})")


def mla_layers(model: Any) -> List[Tuple[str, Any]]:
    """The MLA attention layers whose W_UV / W_UK_T are derived from kv_b_proj."""
    return [(n, m) for n, m in model.named_modules() if hasattr(m, "W_UV") and hasattr(m, "kv_b_proj")
            and callable(getattr(m, "process_weights_after_loading", None))]


class WorkerRefit(BoundModule):
    """One vLLM worker's side of each refit: its model bound once, then
    :meth:`run` per step (re-bind replaced parameters, run the plan, finish
    the engine's post-processing). Raises before any byte moves on an engine
    whose parallel sizes are not the plan's (:class:`EngineMismatchError`) or a
    backend whose layout is not proven (:class:`KernelLayoutError`)."""

    def __init__(self, session: Session, model: Any, vllm_config: Any = None):
        if vllm_config is None:
            from vllm.config import get_current_vllm_config

            vllm_config = get_current_vllm_config()
        self.vllm_config = vllm_config
        check_engine(session.plan, vllm_config)
        written = {b.name for b in session.buffers if b.is_destination}
        problems = kernel_layout_problems(model, written)
        if problems:
            raise KernelLayoutError(f"rank {session.rank}: {len(problems)} module(s) the plan writes keep their "
                                    "weights in a layout reshard has not proven; nothing was bound:\n  "
                                    + "\n  ".join(problems))
        super().__init__(session, model)
        # Only the MLA layers whose kv_b_proj this rank's plan writes (the layer
        # holds it as an attribute; named_modules() names it where it was registered first).
        names = {id(m): n for n, m in model.named_modules()}
        self._derived = [(n, m) for n, m in mla_layers(model)
                         if names.get(id(m.kv_b_proj), "?") + ".weight" in written]
        self.last_finish_s = 0.0

    def finish(self) -> None:
        """Recomputes what vLLM derives from the refit parameters (MLA's W_UV / W_UK_T), in place."""
        import torch
        from vllm.config import set_current_vllm_config

        start = time.perf_counter()
        dtype = self.vllm_config.model_config.dtype
        with torch.no_grad(), set_current_vllm_config(self.vllm_config):
            for _, layer in self._derived:
                layer.process_weights_after_loading(dtype)
        self.last_finish_s = time.perf_counter() - start

    def run(self) -> RunStats:
        self.rebind_if_replaced()
        stats = self.session.run()
        self.finish()
        return stats


# -- vLLM's weight-transfer engine interface ------------------------------------------------------------

from vllm.distributed.weight_transfer.base import (  # noqa: E402
    WeightTransferEngine, WeightTransferInitInfo, WeightTransferUpdateInfo)


@dataclass
class ReshardInitInfo(WeightTransferInitInfo):
    plan_path: str  #: the compiled plan, readable by every worker
    rank: int  #: this worker's global rank in the plan (an inference rank)
    store: str = ""  #: Gloo rendezvous (a shared directory or HOST:PORT); "" with an NCCL unique id
    nccl_unique_id: bytes = b""  #: made by process 0 (plan rank active_ranks[0]: reshard.nccl.unique_id()), shipped by the trainer
    timeout_s: float = 120.0


@dataclass
class ReshardUpdateInfo(WeightTransferUpdateInfo):
    step: int = 0  #: for logs only: the plan says what moves


class ReshardWeightTransferEngine(WeightTransferEngine):
    """``weight_transfer_config.backend = "reshard"`` after :func:`register`:
    each worker replays its part of one precompiled plan in place."""

    init_info_cls = ReshardInitInfo
    update_info_cls = ReshardUpdateInfo

    def init_transfer_engine(self, init_info: ReshardInitInfo) -> None:
        from . import GlooTransport, Plan

        plan = Plan.open(init_info.plan_path)
        # Transports over the plan's active ranks: process i plays plan rank active_ranks[i].
        process, processes = plan.process_of(init_info.rank), len(plan.active_ranks)
        if init_info.nccl_unique_id:
            from . import NcclTransport, nccl

            device = self.device.index or 0
            world = nccl.Communicator.init(processes, process, init_info.nccl_unique_id, device=device)
            transport = NcclTransport(world, world.split(color=plan.domains[init_info.rank], key=process),
                                      timeout_s=init_info.timeout_s)
        else:
            transport = GlooTransport(process, processes, store=init_info.store, timeout_s=init_info.timeout_s)
        self.refit = WorkerRefit(Session(plan, init_info.rank, transport), self.model, self.vllm_config)
        self.stats: Optional[RunStats] = None

    def start_weight_update(self) -> None:
        self.refit.rebind_if_replaced()

    def receive_weights(self, update_info: ReshardUpdateInfo) -> None:
        self.stats = self.refit.session.run()

    def update_weights(self, update_info: Dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))  # run() returns once every byte is written

    def finish_weight_update(self) -> None:
        self.refit.finish()

    def shutdown(self) -> None:
        self.refit = None

    @staticmethod
    def trainer_send_weights(iterator: Any, trainer_args: Dict[str, Any]) -> None:
        """Trainer side: each training rank runs its own TrainerRefit (trainer_args["refit"])."""
        trainer_args["refit"].run()


def register(name: str = "reshard") -> None:
    """Registers the engine with vLLM's WeightTransferEngineFactory (once per process)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if name not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(name, ReshardWeightTransferEngine)
