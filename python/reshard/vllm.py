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
stride and dtype match), so no parameter moves in memory. Proven bit for bit
against a fresh vLLM load in CI (tests/vllm/refit_live.py, tests/vllm/kernels.py).

Kernel layouts (docs/kernels.md maps what vLLM 0.33 picks on Hopper and
Blackwell): only kernels proven on real vLLM ranks are bound
(:data:`PROVEN_KERNELS`). Most hold the checkpoint's layout, or a strided view
of it, which the plan writes directly; the linear and MoE post-processing
(``quant_method.process_weights_after_loading``) is then *not* re-run (run
twice it would, e.g., transpose CUTLASS's FP8 weights again). For the kernels
in :data:`ENGINE_FORMATTED` (FlashInfer's experts: halves swapped, rows
permuted) the plan writes the checkpoint format and vLLM's own
post-processing makes the kernel format after every refit, in the
parameters' own memory. A parameter of any other kernel (DeepGEMM's UE8M0
requantization until a GPU run proves it, Marlin repacking, triton_kernels'
MXFP4 swizzling, CPU prepacking, a kernel no table lists, ...) is refused by
name before any byte moves (:class:`KernelLayoutError`).

Worker side::

    import reshard, reshard.vllm
    refit = reshard.vllm.WorkerRefit(session, model, vllm_config)   # binds once, checks the engine
    stats = refit.run()                                             # each step

Trainer side: :class:`TrainerRefit` (bind once, re-bind what the framework
replaced, run).

vLLM's own doors (``vllm/distributed/weight_transfer/``): the worker-side
:class:`ReshardWeightTransferEngine` (``weight_transfer_config.backend =
"reshard"``) and the trainer-side
:class:`reshard.vllm_trainer.ReshardTrainerWeightTransferEngine`
(``WeightTransferTrainerFactory.trainer_init``), registered in every vLLM
process by the ``vllm.general_plugins`` entry point
(:func:`reshard.vllm_plugin.register`) or here by :func:`register`. One
init dict serves every worker of an engine: each worker adds its own
position (DP, PP, TP ranks from vLLM's parallel state) to ``rank_offset``.
"""

from __future__ import annotations

import logging
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
from .vllm_plugin import VLLM_VERSION, version_problem

if version_problem(_vllm.__version__) is not None:
    raise ImportError(version_problem(_vllm.__version__))

_log = logging.getLogger("reshard.vllm")


class KernelLayoutError(BindError):
    """A parameter the plan writes is held by a backend in a layout reshard has not proven."""


class EngineMismatchError(Error):
    """The vLLM engine's parallel sizes are not the plan's inference layout."""


class WorkerRankError(EngineMismatchError):
    """A worker's plan rank (``rank_offset`` plus its DP / PP / TP position,
    or an explicit ``rank``) is not an inference rank of the plan at that
    worker's position, or one explicit ``rank`` was sent to every worker."""


#: Kernel classes whose weights reshard writes, each proven bit for bit against
#: a fresh vLLM load on real vLLM ranks (tests/vllm/refit_live.py,
#: tests/vllm/kernels.py; the map of vLLM 0.33's kernels: docs/kernels.md).
#: Keyed by where vLLM keeps the choice: a linear layer's FP8 kernel
#: (Fp8LinearMethod.fp8_linear, CompressedTensorsW8A8Fp8.fp8_linear) or an
#: MoE method's experts class.
PROVEN_KERNELS = {
    "linear": ("TritonFp8BlockScaledMMKernel",    # keeps the checkpoint's [out, in] + block scales
               "CutlassFP8ScaledMMLinearKernel",  # weight.t(): a transposed view of [out, in] memory
               "CutlassFp8BlockScaledMMKernel"),  # keeps the checkpoint's [out, in] + block scales
    "experts": ("TritonExperts",                  # w13 [E, 2I, H], w2 [E, H, I] as loaded
                "TritonOrCutlassExperts",         # as loaded (per-channel FP8 under compressed-tensors)
                "FlashInferExperts",              # engine-formatted (ENGINE_FORMATTED)
                "TrtLlmBf16ExpertsMonolithic"),   # engine-formatted
}

#: Kernels whose format vLLM's own post-processing makes from the checkpoint
#: format: the plan writes the checkpoint format (into the parameter's own
#: memory where it has the checkpoint's size, else into a staging tensor of
#: the checkpoint's shape kept for every refit), then WorkerRefit.finish()
#: re-runs the layer's ``quant_method.process_weights_after_loading`` on it
#: and copies what it makes into the parameters' memory. Used only for a
#: kernel in PROVEN_KERNELS. Value: the quant methods it holds for (a method
#: and its settings change what the post-processing does).
ENGINE_FORMATTED = {
    # [gate; up] -> [up; gate] (swap_w13_to_w31), block scales clamped to >= 1e-10
    # (quantization/utils/flashinfer_utils.py prepare_fp8_moe_layer_for_fi): FP8 block MoE on sm90 with EP.
    "FlashInferExperts": ("Fp8MoEMethod:block",),
    # rows permuted in place into FlashInfer's block layout, checkpoint shapes kept
    # (fused_moe/oracle/unquantized.py convert_to_unquantized_kernel_format): BF16 MoE on sm100.
    "TrtLlmBf16ExpertsMonolithic": ("UnquantizedFusedMoEMethod",),
    # Proven only by a GPU run (tools/gpu-check-kernels.sh, which adds them to PROVEN_KERNELS):
    # UE8M0 requantization in place + DeepGEMM's CUDA scale layout (fp8_utils.py deepgemm_post_process_fp8_weight_block)
    "DeepGemmFp8BlockScaledMMKernel": ("Fp8LinearMethod:block",),
    "FlashInferFp8DeepGEMMDynamicBlockScaledKernel": ("Fp8LinearMethod:block",),
    "TritonOrDeepGemmExperts": ("Fp8MoEMethod:block",),
    # [up; gate], then 4-D BlockMajorK (flashinfer_utils.py _shuffle_deepseek_fp8_moe_weights); the kernel
    # object wants a CUDA device (experts/trtllm_fp8_moe.py): FP8 block MoE on sm100.
    "TrtLlmFp8ExpertsMonolithic": ("Fp8MoEMethod:block",),
}

#: Engine-formatted kernels proven where their kernel format has another size
#: or layout than the checkpoint's (the plan writes a staging tensor of the
#: checkpoint's shape). Others are proven only where the parameters' own
#: memory holds the checkpoint format (e.g. FlashInfer's TRT-LLM experts when
#: vLLM pads the intermediate size to a multiple of 128: refused).
STAGING_PROVEN: Tuple[str, ...] = ()

_GPU_RUN = "proven only by a GPU run (tools/gpu-check-kernels.sh)"

#: Kernels vLLM 0.33 picks that reshard refuses, and why (docs/kernels.md).
#: Any kernel in none of these tables is refused too, naming docs/kernels.md.
REFUSED_KERNELS = {
    "DeepGemmFp8BlockScaledMMKernel": "requantizes every block to a power-of-two (UE8M0) scale in place and "
    "re-lays the scales out with DeepGEMM's CUDA op transform_sf_into_required_layout "
    "(quantization/utils/fp8_utils.py deepgemm_post_process_fp8_weight_block): " + _GPU_RUN,
    "FlashInferFp8DeepGEMMDynamicBlockScaledKernel": "DeepGEMM's post-processing (UE8M0 requantization, CUDA "
    "scale layout: kernels/linear/scaled_mm/flashinfer.py): " + _GPU_RUN,
    "TritonOrDeepGemmExperts": "DeepGEMM's post-processing of the experts (fp8_utils.py "
    "prepare_fp8_moe_layer_for_deepgemm: UE8M0 requantization, CUDA scale layout): " + _GPU_RUN,
    "BatchedDeepGemmExperts": "DeepGEMM's post-processing of the experts (UE8M0 requantization, CUDA scale "
    "layout): not proven",
    "TrtLlmFp8ExpertsMonolithic": "w13 as [up; gate] shuffled into 4-D BlockMajorK (quantization/utils/"
    "flashinfer_utils.py prepare_fp8_moe_layer_for_fi); its kernel object wants a CUDA device: " + _GPU_RUN,
    "TrtLlmFp8ExpertsModular": "4-D BlockMajorK experts (flashinfer_utils.py prepare_fp8_moe_layer_for_fi): "
    "not proven",
    "TrtLlmBf16ExpertsModular": "FlashInfer's block layout under all-to-all kernels: not proven",
    "FlashInferFP8ScaledMMLinearKernel": "per-tensor FP8: fused shards requantized to their largest scale by a "
    "CUDA op (quantization/utils/w8a8_utils.py requantize_with_max_scale): not proven",
    "MarlinFP8ScaledMMLinearKernel": "repacked for Marlin (kernels/linear/scaled_mm/marlin.py)",
    "MarlinExperts": "repacked for Marlin (quantization/utils/marlin_utils_fp8.py)",
    "OAITritonMxfp4ExpertsMonolithic": "MXFP4 swizzled by triton_kernels into objects that are not Parameters "
    "(fused_moe/oracle/mxfp4.py _swizzle_mxfp4): nothing to bind by name",
    "OAITritonExperts": "MXFP4 swizzled by triton_kernels into objects that are not Parameters: nothing to bind",
    "CPUExpertsFp8": "prepacked for vLLM's CPU build (fused_moe/experts/cpu_moe.py)",
    "CPUUnquantizedExperts": "prepacked for vLLM's CPU build (fused_moe/experts/cpu_moe.py cpu_prepack_moe_weight)",
    "X86CPUUnquantizedExperts": "prepacked for vLLM's CPU build (fused_moe/experts/cpu_moe.py)",
}
_PLAIN_METHODS = ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod", "UnquantizedFusedMoEMethod")
KERNELS_DOC = "docs/kernels.md"


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


#: The quant methods directly written kernels are proven under (the method
#: decides what runs before the kernel's own post-processing: per-tensor FP8
#: requantizes fused shards with a CUDA op, per-channel does not).
#: ENGINE_FORMATTED says the same of the engine-formatted kernels.
PROVEN_UNDER = {
    "CutlassFP8ScaledMMLinearKernel": ("CompressedTensorsLinearMethod:channel",),
    "CutlassFp8BlockScaledMMKernel": ("Fp8LinearMethod:block",),
    "TritonFp8BlockScaledMMKernel": ("Fp8LinearMethod:block",),
    # fused_moe/oracle/fp8.py convert_to_fp8_moe_kernel_format converts nothing for vLLM CUTLASS experts
    "TritonOrCutlassExperts": ("CompressedTensorsW8A8Fp8MoEMethod",),
}


def _method_of(module: Any) -> str:
    """The quant method's class name, with ":block" for block-quantized FP8 and
    ":STRATEGY" for a compressed-tensors scheme's weight strategy."""
    qm = module.quant_method
    name = type(qm).__name__ + (":block" if getattr(qm, "block_quant", False) else "")
    strategy = getattr(getattr(module, "scheme", None), "strategy", None)
    return name + (f":{getattr(strategy, 'value', strategy)}" if strategy is not None else "")


def engine_formatted(module: Any) -> bool:
    """Whether `module`'s kernel format is made by vLLM's post-processing after each refit (ENGINE_FORMATTED)."""
    k = _kernel_of(module)
    return k is not None and k[1] in ENGINE_FORMATTED and k[1] in PROVEN_KERNELS.get(k[0], ())


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
        what = ", ".join(own[:3]) + (f" and {len(own) - 3} more" if len(own) > 3 else "")
        head = f"{what}: held by {cls} ({kind} backend), whose weight layout reshard has not proven"
        if cls in PROVEN_KERNELS.get(kind, ()):
            methods = ENGINE_FORMATTED.get(cls, PROVEN_UNDER.get(cls))
            if methods is None or _method_of(mod) in methods:
                continue
            problems.append(f"{head} under {_method_of(mod)} (proven under {', '.join(methods)}; {KERNELS_DOC})")
        elif cls in REFUSED_KERNELS:
            problems.append(f"{head}: {REFUSED_KERNELS[cls]}")
        else:
            problems.append(f"{head}: a kernel {KERNELS_DOC} does not list (vLLM 0.33's kernels, what each "
                            "does to the weights, which reshard writes)")
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


def _partly_written(model: Any, written: set) -> List[str]:
    """Engine-formatted modules the plan writes only in part: re-running their
    post-processing would process the parameters it does not write twice."""
    out = []
    canonical = {id(p): n for n, p in model.named_parameters()}  # a parameter two modules share: its first name
    for mod_name, mod in model.named_modules():
        if not engine_formatted(mod):
            continue
        own = [canonical[id(p)] for _, p in mod.named_parameters(recurse=False)]
        missing = [n for n in own if n not in written]
        if missing and len(missing) < len(own):
            out.append(f"{', '.join(missing[:3])}: not written by the plan, while vLLM's post-processing of "
                       f"{_kernel_of(mod)[1]} re-derives the whole layer from the checkpoint format ({KERNELS_DOC})")
    return out


class _Formatted:
    """A layer whose kernel format vLLM's post-processing makes from the
    checkpoint format: per written parameter, the tensor the plan writes in the
    checkpoint's dtype and shape (a view of the parameter's own memory when it
    has the checkpoint's size and is contiguous, else a staging tensor kept for
    every refit, so no refit derives from bytes a previous one re-encoded)."""

    def __init__(self, name: str, module: Any, buffers: Dict[str, Any]):
        self.name, self.module, self.buffers = name, module, buffers  # local name -> plan Buffer
        self.checkpoint: Dict[str, Any] = {}
        self.over: Dict[str, Tuple[int, int]] = {}  # local name -> (data_ptr, nbytes) of the parameter's memory
        for local in buffers:
            self._make(local)

    def _make(self, local: str) -> None:
        import torch

        from ._tensors import DTYPE_CODES, torch_dtype

        b, live = self.buffers[local], getattr(self.module, local).data
        dtype, shape = torch_dtype(DTYPE_CODES[b.dtype]), tuple(b.shape)
        numel = 1
        for n in shape:
            numel *= n
        if live.is_contiguous() and live.dtype == dtype and live.numel() == numel:
            self.checkpoint[local] = live.view(shape)
        else:
            self.checkpoint[local] = torch.empty(shape, dtype=dtype, device=live.device)
        self.over[local] = (live.data_ptr(), live.untyped_storage().nbytes())

    def current(self, local: str) -> Any:
        """The tensor the plan writes, remade if the engine replaced the parameter's memory."""
        live = getattr(self.module, local).data
        if (live.data_ptr(), live.untyped_storage().nbytes()) != self.over[local]:
            self._make(local)
        return self.checkpoint[local]

    def staged(self) -> List[str]:
        """The parameters whose memory cannot hold the checkpoint format (written through staging)."""
        return [n for n, t in self.checkpoint.items() if t.data_ptr() != self.over[n][0]]

    @property
    def staging_bytes(self) -> int:
        """Bytes of the staging tensors."""
        return sum(self.checkpoint[n].nbytes for n in self.staged())

    def format(self) -> None:
        """Runs the layer's ``quant_method.process_weights_after_loading`` (as vLLM's
        loader does: model_loader/utils.py process_weights_after_loading) on the
        checkpoint format the plan wrote, and copies what it made into the
        parameters' own memory (each Parameter object and its memory are kept)."""
        mod = self.module
        kept = {n: (p, p.data) for n, p in mod.named_parameters(recurse=False)}
        for local in self.buffers:
            kept[local][0].data = self.current(local)
        try:
            mod.quant_method.process_weights_after_loading(mod)
        except BaseException:
            for n, (p, data) in kept.items():  # the parameters' own memory back in place, whatever it holds
                mod._parameters[n] = p
                p.data = data
            raise
        for n, (p, data) in kept.items():
            now = mod._parameters.get(n)
            if now is None:
                raise KernelLayoutError(f"{self.name}.{n}: vLLM's post-processing removed it; the layer cannot be "
                                        "re-formatted in place")
            new = now.data
            if (new.shape, new.stride(), new.dtype) != (data.shape, data.stride(), data.dtype):
                raise KernelLayoutError(
                    f"{self.name}.{n}: vLLM's post-processing made {new.dtype}{list(new.shape)}:{list(new.stride())} "
                    f"where the engine holds {data.dtype}{list(data.shape)}:{list(data.stride())}; nothing can be "
                    "copied in place")
            if new.data_ptr() != data.data_ptr():
                storage = data.untyped_storage()
                lo, hi = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
                if lo <= new.data_ptr() < hi:  # a view into the same memory: read it whole before writing
                    new = new.clone()
                data.copy_(new)
            if now is not p:
                mod._parameters[n] = p
            p.data = data


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
        # A colocated session (this process is a training rank too) binds the engine as its "infer" side;
        # a name both sides use is "infer:NAME" in the plan (docs/specs.md, placement).
        self._side = "infer" if any(b.is_source for b in session.buffers) else None
        dest = {b.name[len("infer:"):] if b.name.startswith("infer:") else b.name: b
                for b in session.buffers if b.is_destination}
        written = set(dest)
        problems = kernel_layout_problems(model, written) + _partly_written(model, written)
        if problems:
            raise KernelLayoutError(f"rank {session.rank}: {len(problems)} module(s) the plan writes keep their "
                                    "weights in a layout reshard has not proven; nothing was bound:\n  "
                                    + "\n  ".join(problems))
        # Layers whose kernel format vLLM's post-processing makes (ENGINE_FORMATTED): the plan writes their
        # checkpoint format, finish() has vLLM make the kernel format from it.
        self._formatted: List[_Formatted] = []
        for mod_name, mod in model.named_modules():
            if engine_formatted(mod):
                pre = mod_name + "." if mod_name else ""
                bufs = {n: dest[pre + n] for n, _ in mod.named_parameters(recurse=False) if pre + n in dest}
                if bufs:
                    self._formatted.append(_Formatted(mod_name, mod, bufs))
        proven = ", ".join(STAGING_PROVEN) or "no kernel yet"
        staged = [f"{f.name}.{n}: held by {_kernel_of(f.module)[1]} in another size or layout than the checkpoint's "
                  f"{self._shape(f.buffers[n])}: writing it through a checkpoint-shaped staging tensor is proven for "
                  f"{proven} ({KERNELS_DOC})"
                  for f in self._formatted for n in f.staged() if _kernel_of(f.module)[1] not in STAGING_PROVEN]
        if staged:
            raise KernelLayoutError(f"rank {session.rank}: nothing was bound:\n  " + "\n  ".join(staged))
        super().__init__(session, model)
        # Only the MLA layers whose kv_b_proj this rank's plan writes (the layer
        # holds it as an attribute; named_modules() names it where it was registered first).
        names = {id(m): n for n, m in model.named_modules()}
        self._derived = [(n, m) for n, m in mla_layers(model)
                         if names.get(id(m.kv_b_proj), "?") + ".weight" in written]
        self.last_finish_s = 0.0
        self.last_format_s: List[float] = []  #: per engine-formatted layer, the last finish()'s seconds

    @staticmethod
    def _shape(b: Any) -> str:
        return f"{b.dtype}[{', '.join(str(n) for n in b.shape)}]"

    @property
    def staging_bytes(self) -> int:
        """Bytes of checkpoint-format staging kept for engine-formatted layers whose
        kernel format has another size or layout than the checkpoint's."""
        return sum(f.staging_bytes for f in self._formatted)

    @property
    def formatted_layers(self) -> List[str]:
        """The layers whose kernel format vLLM's post-processing makes after each refit."""
        return [f.name for f in self._formatted]

    def _tensors(self) -> Dict[str, Any]:
        tensors = dict(self.session.module_tensors(self.module))
        for f in self._formatted:
            pre = f.name + "." if f.name else ""
            for local in f.buffers:
                tensors[pre + local] = f.current(local)
        return tensors

    def _bind(self) -> None:
        if not self._formatted and self._side is None:
            return super()._bind()
        tensors = self._tensors()
        self.session.bind_module(tensors if self._formatted else self.module, side=self._side)
        mine = {b.name[len("infer:"):] if b.name.startswith("infer:") else b.name
                for b in self.session.buffers if b.is_destination}
        self._ids = {n: (id(tensors[n]), tensors[n].data_ptr(), tensors[n].untyped_storage().nbytes())
                     for n in mine if n in tensors}

    def finish(self) -> None:
        """Has vLLM make what it derives from the refit parameters, in place:
        the kernel format of engine-formatted layers (ENGINE_FORMATTED), then
        MLA's W_UV / W_UK_T."""
        import torch
        from vllm.config import set_current_vllm_config

        start = time.perf_counter()
        dtype = self.vllm_config.model_config.dtype
        times = []
        with torch.no_grad(), set_current_vllm_config(self.vllm_config):
            for f in self._formatted:
                t0 = time.perf_counter()
                f.format()
                times.append(time.perf_counter() - t0)
            for _, layer in self._derived:
                layer.process_weights_after_loading(dtype)
        self.last_format_s = times
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
class WorkerPosition:
    """Where a vLLM worker sits in its engine, from vLLM's parallel state."""

    dp: int
    pp: int
    tp: int
    dp_size: int
    pp_size: int
    tp_size: int
    external_dp: int = 0  #: engine index among the independent engines of one torch world (external launcher)

    @property
    def engine_world(self) -> int:
        return self.dp_size * self.pp_size * self.tp_size

    @property
    def in_engine(self) -> int:
        """The worker's index in its engine, in the order of the plan's inference mesh
        (engine, dp, pp, tp: frameworks/vllm.cc) and of vLLM's ranks (ExternalDP x DP x PP x PCP x TP:
        distributed/parallel_state.py initialize_model_parallel)."""
        return (self.dp * self.pp_size + self.pp) * self.tp_size + self.tp

    @property
    def local(self) -> int:
        """The worker's offset from its engine group's first worker (the rank_offset)."""
        return self.external_dp * self.engine_world + self.in_engine

    def __str__(self) -> str:
        s = f"DP {self.dp} PP {self.pp} TP {self.tp}"
        return (f"engine {self.external_dp} " + s) if self.external_dp else s


def worker_position() -> WorkerPosition:
    """This worker's DP, PP and TP ranks, read from vLLM's parallel state
    (``distributed/parallel_state.py``: ``get_dp_group`` / ``get_pp_group`` /
    ``get_tp_group``), as vLLM's NCCL engine finds its rank in the
    trainer's group (``distributed/weight_transfer/nccl_common.py``
    ``_worker_group_rank``: ``rank_offset`` + DP index x TP x PP + rank in
    the DP replica). Raises EngineMismatchError under context parallelism,
    whose ranks the plan does not have."""
    from vllm.distributed import parallel_state as ps

    tp, pp, dp = ps.get_tp_group(), ps.get_pp_group(), ps.get_dp_group()
    pcp = ps.get_pcp_group().world_size if getattr(ps, "_PCP", None) is not None else 1
    if pcp > 1:
        raise EngineMismatchError(f"this vLLM engine runs prefill context parallel {pcp}; reshard's inference "
                                  "layouts have no context-parallel ranks")
    pos = WorkerPosition(dp.rank_in_group, pp.rank_in_group, tp.rank_in_group, dp.world_size, pp.world_size,
                         tp.world_size)
    # The torch world spans the engine's DP replicas (init_distributed_environment offsets the rank by
    # the DP rank) and, under the external launcher, several independent engines (ExternalDP).
    pos.external_dp = ps.get_world_group().rank // pos.engine_world
    return pos


def worker_plan_rank(plan: Any, pos: WorkerPosition, rank_offset: int) -> int:
    """The plan rank of the worker at `pos`: `rank_offset` (the plan rank of
    its engine group's first worker) + its offset. Raises WorkerRankError,
    naming the worker, when that rank is not an inference rank of the plan,
    or is one at another position of the plan's inference mesh (an offset
    that is not a first worker would give TP rank 0 the shard of TP rank 1:
    same shapes, other values)."""
    rank = rank_offset + pos.local
    where = f"vLLM worker {pos} (rank_offset {rank_offset} + {pos.local} = plan rank {rank})"
    dest = plan.dest_ranks
    if not 0 <= rank < plan.num_ranks:
        raise WorkerRankError(f"{where}: the plan has ranks 0..{plan.num_ranks - 1}; its inference ranks are "
                              f"{_ranges(dest)}")
    layout_rank = plan.program(rank).dst_rank
    if layout_rank < 0:
        raise WorkerRankError(f"{where}: plan rank {rank} is not an inference rank (the plan's inference ranks are "
                              f"{_ranges(dest)}): rank_offset is the plan rank of the engine's first worker")
    if layout_rank % pos.engine_world != pos.in_engine:
        at = layout_rank % pos.engine_world
        t, p, d = at % pos.tp_size, at // pos.tp_size % pos.pp_size, at // (pos.tp_size * pos.pp_size)
        raise WorkerRankError(f"{where}: plan rank {rank} is the plan's DP {d} PP {p} TP {t} of an engine of "
                              f"{pos.engine_world} ranks, not this worker's position: rank_offset must be the plan "
                              f"rank of an engine's first worker (the plan's inference ranks are {_ranges(dest)})")
    return rank


def _ranges(ranks: List[int]) -> str:
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ", ".join(out) or "none"


def connect(plan: Any, rank: int, *, store: str = "", nccl_unique_id: bytes = b"", timeout_s: float = 120.0,
            device: int = 0) -> Any:
    """The transport of plan rank `rank` over the plan's active ranks
    (process i plays plan rank active_ranks[i]): Gloo through `store`, or
    NCCL from `nccl_unique_id` (made by process 0) on CUDA `device`, with
    one NVLink communicator per NVLink domain. Blocks until every process connected."""
    from . import GlooTransport

    process, processes = plan.process_of(rank), len(plan.active_ranks)
    if nccl_unique_id:
        from . import NcclTransport, nccl

        world = nccl.Communicator.init(processes, process, nccl_unique_id, device=device)
        return NcclTransport(world, world.split(color=plan.domains[rank], key=process), timeout_s=timeout_s)
    if not store:
        raise ValueError("the init info has neither a Gloo store (a fresh directory every process sees, or "
                         "HOST:PORT) nor an NCCL unique id")
    return GlooTransport(process, processes, store=store, timeout_s=timeout_s)


def decode_unique_id(b64: str, what: str) -> bytes:
    """An NCCL unique id shipped as standard base64 (JSON carries no bytes: the HTTP routes), as vLLM's
    NCCL engine ships it (``nccl_common.py`` ``decode_nccl_unique_id``)."""
    import base64
    import binascii

    try:
        return base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{what}: nccl_unique_id_b64 is not standard base64") from None


@dataclass
class ReshardInitInfo(WeightTransferInitInfo):
    """What every worker of an engine gets, the same dict for all
    (``LLM.init_weight_transfer_engine`` and ``/init_weight_transfer_engine``
    send one dict to every worker through ``collective_rpc``:
    ``entrypoints/rl/offline.py``, ``v1/engine/async_llm.py``)."""

    plan_path: str  #: the compiled plan, readable by every worker
    #: the plan rank of the engine's first worker (DP 0, PP 0, TP 0); each worker adds its own position.
    #: None: the plan's first inference rank.
    rank_offset: Optional[int] = None
    #: this worker's plan rank, for a dict sent to one worker alone (a one-rank engine, or the external
    #: launcher, where each process's collective_rpc reaches its own worker only)
    rank: Optional[int] = None
    store: str = ""  #: Gloo rendezvous (a fresh shared directory or HOST:PORT); "" with an NCCL unique id
    nccl_unique_id_b64: str = ""  #: made by process 0 (reshard.nccl.unique_id()), standard base64
    nccl_unique_id: bytes = b""  #: the same as bytes (in-process and Ray callers; JSON has no bytes)
    timeout_s: float = 120.0


@dataclass
class ReshardUpdateInfo(WeightTransferUpdateInfo):
    step: int = 0  #: for logs only: the plan says what moves


class ReshardWeightTransferEngine(WeightTransferEngine):
    """``weight_transfer_config.backend = "reshard"``: each worker replays
    its part of one precompiled plan in place. ``start_weight_update``
    re-binds what the engine replaced, ``update_weights`` runs the plan,
    ``finish_weight_update`` recomputes what vLLM derives (:class:`WorkerRefit`).

    Refusals every worker of an engine reaches alike (a rank the plan does
    not have there, parallel sizes not the plan's, no init) are raised by
    the executor's last worker only, naming every worker concerned; the
    others stand down. vLLM 0.33's ``MultiprocExecutor.collective_rpc``
    raises at the first failed reply and leaves the other workers' replies
    queued (``v1/executor/multiproc_executor.py`` ``get_response``), so an
    error raised by every worker would answer the engine's next call with
    this one's leftover replies, one call late, from then on."""

    init_info_cls = ReshardInitInfo
    update_info_cls = ReshardUpdateInfo
    # The plan writes the target model's parameters only (Worker._start_weight_update refuses a draft
    # update for an engine that says so: v1/worker/gpu_worker.py).
    supports_draft_weight_update = False

    refit: Optional[WorkerRefit] = None
    stats: Optional[RunStats] = None

    def _refuse(self, error: Exception) -> None:
        """Raises `error`, reached by every worker of this executor alike, on its last worker; the others return."""
        pc = self.vllm_config.parallel_config
        if pc.distributed_executor_backend == "mp" and pc.rank != pc.world_size - 1:
            _log.warning("reshard: worker %d stands down (the executor's last worker raises for all): %s", pc.rank,
                         str(error).splitlines()[0])
            return
        raise error

    def plan_rank(self, plan: Any, init_info: ReshardInitInfo, pos: Optional[WorkerPosition] = None) -> int:
        """The plan rank of the worker at `pos` (default: this one); WorkerRankError names a worker whose rank is not
        the plan's (see ReshardInitInfo)."""
        pc = self.vllm_config.parallel_config
        pos = pos or worker_position()
        if init_info.rank is not None:
            if init_info.rank_offset is not None:
                raise WorkerRankError(f"vLLM worker {pos}: the init info has both rank {init_info.rank} and "
                                      f"rank_offset {init_info.rank_offset}; give rank_offset only")
            if pc.distributed_executor_backend != "external_launcher" and pos.engine_world > 1:
                raise WorkerRankError(
                    f"vLLM worker {pos}: the init info names one plan rank ({init_info.rank}) and this engine has "
                    f"{pos.engine_world} workers, which all get the same dict (collective_rpc): give rank_offset "
                    "(the plan rank of the engine's first worker) instead; each worker adds its position")
            return worker_plan_rank(plan, pos, init_info.rank - pos.local)
        offset = plan.dest_ranks[0] if init_info.rank_offset is None else init_info.rank_offset
        return worker_plan_rank(plan, pos, offset)

    def _engine_problem(self, plan: Any, init_info: ReshardInitInfo, pos: WorkerPosition) -> Optional[Exception]:
        """What refuses this executor's workers (this worker's DP replica), decided alike on each of them."""
        try:
            check_engine(plan, self.vllm_config)
        except EngineMismatchError as e:
            return e
        if not init_info.store and not (init_info.nccl_unique_id or init_info.nccl_unique_id_b64):
            return ValueError("the init info has neither a Gloo store (a fresh directory every process sees, or "
                              "HOST:PORT) nor an NCCL unique id (nccl_unique_id_b64)")
        # An explicit rank in a dict that reaches this worker alone places it alone; otherwise every worker of
        # the replica got the same dict.
        alone = self.vllm_config.parallel_config.distributed_executor_backend == "external_launcher" \
            or pos.engine_world == 1
        others = [pos] if init_info.rank is not None and alone else [
            WorkerPosition(pos.dp, pp, tp, pos.dp_size, pos.pp_size, pos.tp_size, pos.external_dp)
            for pp in range(pos.pp_size) for tp in range(pos.tp_size)]
        errors = []
        for other in others:
            try:
                self.plan_rank(plan, init_info, other)
            except WorkerRankError as e:
                errors.append(str(e))
        if not errors:
            return None
        more = f"\n  (and {len(errors) - 4} more workers)" if len(errors) > 4 else ""
        return WorkerRankError("\n  ".join(errors[:4]) + more)

    def parse_init_info(self, init_dict: Dict[str, Any]) -> Optional[ReshardInitInfo]:
        """The typed init info; a dict every worker got alike and none can read is refused engine-wide (None
        where this worker stands down)."""
        try:
            return super().parse_init_info(init_dict)
        except ValueError as e:
            self._refuse(e)
            return None

    def init_transfer_engine(self, init_info: Optional[ReshardInitInfo]) -> None:
        from . import Plan, PlanError

        self.shutdown()
        if init_info is None:  # stood down in parse_init_info
            return
        try:
            plan = Plan.open(init_info.plan_path)
            pos = worker_position()
        except (PlanError, EngineMismatchError) as e:
            return self._refuse(e)
        # Everything that can be refused is refused before connecting: the trainer's RPC then fails at
        # once instead of its ranks waiting for this one until their timeout.
        problem = self._engine_problem(plan, init_info, pos)
        if problem is not None:
            return self._refuse(problem)
        rank = self.plan_rank(plan, init_info, pos)
        written = {b.name for b in plan.buffers(rank) if b.is_destination}
        problems = kernel_layout_problems(self.model, written)
        if problems:
            raise KernelLayoutError(f"rank {rank}: {len(problems)} module(s) the plan writes keep their weights in "
                                    "a layout reshard has not proven; nothing was bound:\n  " + "\n  ".join(problems))
        uid = init_info.nccl_unique_id or (decode_unique_id(init_info.nccl_unique_id_b64, "ReshardInitInfo")
                                           if init_info.nccl_unique_id_b64 else b"")
        transport = connect(plan, rank, store=init_info.store, nccl_unique_id=uid, timeout_s=init_info.timeout_s,
                            device=self.device.index or 0)
        self.refit = WorkerRefit(Session(plan, rank, transport), self.model, self.vllm_config)

    def _ready(self) -> Optional[WorkerRefit]:
        if self.refit is None:
            self._refuse(RuntimeError("the reshard weight-transfer engine is not initialized: call "
                                      "init_weight_transfer_engine first"))
        return self.refit

    def start_weight_update(self) -> None:
        refit = self._ready()
        if refit is not None:
            refit.rebind_if_replaced()

    def receive_weights(self, update_info: ReshardUpdateInfo) -> None:
        refit = self._ready()
        if refit is not None:
            self.stats = refit.session.run()

    def update_weights(self, update_info: Dict[str, Any]) -> None:
        # Not the base class's: run() returns once every byte is written (no device-wide synchronize).
        self.receive_weights(self.parse_update_info(update_info))

    def finish_weight_update(self) -> None:
        refit = self._ready()
        if refit is not None:
            refit.finish()

    def shutdown(self) -> None:
        self.refit = None  # the session and its transport go with it


def register(name: str = "reshard") -> None:
    """Registers both engines, worker side and trainer side, with vLLM's
    factories (``distributed/weight_transfer/factory.py``), once per process.
    The ``vllm.general_plugins`` entry point does the same in every vLLM
    process (:func:`reshard.vllm_plugin.register`)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    from .vllm_trainer import ReshardTrainerWeightTransferEngine

    if name not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(name, ReshardWeightTransferEngine)
    if name not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(name, ReshardTrainerWeightTransferEngine)
