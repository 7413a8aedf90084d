"""Builds one rank of a real vLLM 0.33 model on CPU (Gloo), the way a vLLM
worker builds it, and loads it with vLLM's own loaders.

Runs in build/vllm-venv (tools/vllm_venv.sh), one process per rank, with
torchrun-style RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (launch.py sets
them). The model classes, weight loaders, create_weights and
process_weights_after_loading are vLLM's own; the only thing changed is
kernel *selection* (kernel_selection_for_cpu below), because the CUDA wheel
has no CPU MoE op and vLLM's CPU FP8 kernels need AMX:

- moe_backend="triton" (vLLM's own setting) instead of the CPU MoE kernel;
- the Triton / CUTLASS kernel classes' device and FP8-support checks answer
  "supported" so that selection picks them on a CPU. No kernel runs: these
  ranks load and hold weights; nothing calls forward();
- the CPU reads as one without AMX (cpu_without_amx below): on an AMX CPU
  (Sapphire Rapids and later) vLLM's CPU paths prepack weights with its CPU
  build's own ops (torch.ops._C.convert_weight_packed in
  vllm/model_executor/layers/utils.py dispatch_cpu_unquantized_gemm, the
  AMX_MLA backend chosen in vllm/platforms/cpu.py), which the CUDA wheel
  does not have: the load failed there (AttributeError: '_OpNamespace' '_C'
  object has no attribute 'convert_weight_packed'), and a GPU engine never
  takes those paths at all.
"""
import os
import sys
import time

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("OMP_NUM_THREADS", "1")


PATCHED = []  # what kernel_selection_for_cpu changed, for the record


def cpu_without_amx():
    """Makes torch report no AMX tiles (nor AMX-FP16), so that vLLM keeps the
    weights as loaded (oneDNN or torch linear; the reference CPU_MLA backend)
    on every x86 CPU, AMX or not, as the recorded dumps were made. Returns
    the names patched."""
    import torch

    torch.cpu._is_amx_tile_supported = lambda: False
    torch.cpu._is_amx_fp16_supported = lambda: False
    return ["torch.cpu._is_amx_tile_supported", "torch.cpu._is_amx_fp16_supported"]


def kernel_selection_for_cpu():
    """Lets vLLM's kernel selection pick its Triton / CUTLASS MoE and FP8
    kernel classes on a CPU (their is_supported / _supports_* checks only).
    Returns the names patched, for the log."""
    import contextlib

    from vllm.model_executor.layers.fused_moe.experts import triton_moe
    from vllm.platforms import current_platform

    @contextlib.contextmanager
    def fp8_capable():
        cls = type(current_platform)
        saved = cls.__dict__.get("supports_fp8")
        cls.supports_fp8 = classmethod(lambda c: True)
        try:
            yield
        finally:
            if saved is None:
                del cls.supports_fp8
            else:
                cls.supports_fp8 = saved

    def with_fp8(check):
        def wrapped(*a, **k):
            with fp8_capable():
                return check(*a, **k)
        return staticmethod(wrapped)

    from vllm.model_executor.kernels import linear as linear_kernels
    from vllm.model_executor.kernels.linear.scaled_mm.cutlass import CutlassFP8ScaledMMLinearKernel
    from vllm.model_executor.kernels.linear.scaled_mm.triton import TritonFp8BlockScaledMMKernel
    from vllm.platforms import PlatformEnum

    # The CUDA lists' kernels a GPU would pick for these checkpoints:
    # per-channel FP8 -> CUTLASS (FlashInfer first where installed; both
    # keep weight.t()); block FP8 -> Triton (CUTLASS block needs 128-wide
    # activation groups, which the tiny models' 16x16 blocks are not).
    patched = cpu_without_amx()
    linear_kernels._POSSIBLE_FP8_KERNELS[PlatformEnum.CPU] = [CutlassFP8ScaledMMLinearKernel]
    linear_kernels._POSSIBLE_FP8_BLOCK_KERNELS[PlatformEnum.CPU] = [TritonFp8BlockScaledMMKernel]
    patched += ["_POSSIBLE_FP8_KERNELS[CPU]", "_POSSIBLE_FP8_BLOCK_KERNELS[CPU]"]
    for cls in (CutlassFP8ScaledMMLinearKernel, TritonFp8BlockScaledMMKernel):
        cls.is_supported = classmethod(lambda c, compute_capability=None: (True, None))
        patched.append(cls.__name__ + ".is_supported")
    for cls in (triton_moe.TritonExperts,):
        cls._supports_current_device = staticmethod(lambda: True)
        cls._supports_quant_scheme = with_fp8(cls._supports_quant_scheme)
        patched.append(cls.__name__ + "._supports_current_device / _supports_quant_scheme")
    PATCHED[:] = patched
    return patched


def build(model_dir, tp=1, pp=1, dp=1, ep=False, seed=0, load_format="safetensors"):
    """(model, vllm_config) of this process's rank (RANK in the environment)."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model

    torch.set_num_threads(1)
    kernel_selection_for_cpu()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if world != tp * pp * dp:
        raise SystemExit(f"engine: WORLD_SIZE {world} != tp {tp} x pp {pp} x dp {dp}")
    args = EngineArgs(model=model_dir, skip_tokenizer_init=True, dtype="bfloat16", enforce_eager=True,
                      load_format=load_format, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                      data_parallel_size=dp, enable_expert_parallel=ep, seed=seed,
                      distributed_executor_backend="external_launcher", moe_backend="triton")
    config = args.create_engine_config()
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=world, rank=rank,
                                     distributed_init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                                     local_rank=rank, backend="gloo")
        initialize_model_parallel(tp, pp)
        model = get_model(vllm_config=config)
    return model, config


def fresh(config, model_dir):
    """A second model of the same engine (same ranks, same settings), loaded
    by vLLM from `model_dir`: what a freshly started engine would hold. The
    attention layers of the first model leave vLLM's forward context while it
    is built (layer names must be unique there) and are put back after."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model

    ctx = config.compilation_config.static_forward_context
    saved_ctx, saved_model = dict(ctx), config.model_config.model
    ctx.clear()
    config.model_config.model = model_dir
    try:
        with set_current_vllm_config(config):
            return get_model(vllm_config=config)
    finally:
        config.model_config.model = saved_model
        ctx.clear()
        ctx.update(saved_ctx)


def all_tensors(model):
    """{name: tensor} of every parameter and every buffer (persistent or not)."""
    out = dict(model.named_parameters())
    out.update({n: b for n, b in model.named_buffers() if n not in out})
    return out
