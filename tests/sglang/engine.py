"""Builds one rank of a real SGLang 0.5.23 model on CPU (Gloo), the way
SGLang's scheduler process builds its TP worker's model, and loads it with
SGLang's own loader.

    import engine
    model = engine.build_rank("ckpt/", tp=2, ep=1, attn_dp=1, rank=0, port=29500)

One process per rank (SGLang's process groups are process-wide). What runs
is SGLang's own code, in the order its scheduler process runs it
(managers/scheduler.py run_scheduler_process and Scheduler.__init__,
model_executor/model_runner.py ModelRunner.initialize / load_model):

1. `ServerArgs(device="cpu", ...)`, `runtime_context.publish` with this
   rank's `SpawnRanks` (every rank from the world rank and the configured
   widths), `ModelConfig.from_server_args`;
2. `distributed/bootstrap.py` `init_parallel_runtime` (Gloo world, TP /
   attention-TP / MoE-EP groups, DP attention) and `init_layer_runtime`;
3. `initialize_moe_config` and the FP8 / FP4 / BF16 GEMM configs
   (Scheduler.init_moe_gemm_config);
4. the expert-location metadata (ModelRunner.maybe_init_expert_location_metadata);
5. `load_model_with_memory_saver` (model_runner_components/load_model_utils.py):
   SGLang's DefaultModelLoader, the model's load_weights and post_load_weights,
   every quant method's process_weights_after_loading.

What differs from a GPU rank, and why:

- No platform is detected (SGLANG_USE_CPU_ENGINE unset: SGLang's CPU engine
  needs sgl-kernel's CPU ops, which PyPI does not publish), so every layer
  takes its generic (GPU-side) path on CPU tensors: what a GPU rank holds.
- SGLANG_NCCL_SO_PATH names a file that does not exist: PyNccl is then
  skipped "in a non-GPU environment" (distributed/device_communicators/
  pynccl.py), and the groups are Gloo's.
- One patch, of the rotary embedding's choice only (rope_for_cpu below):
  DeepSeek's attention asks get_rope_wrapper for device="cpu", whose
  get_rope_cpu builds the CPU engine's rope; patched, it builds the generic
  get_rope a GPU rank builds (the other models call get_rope already). Rope
  holds no weights; the loaders are untouched.
- `adjust_config_with_unaligned_cpu_tp` (configs/update_config.py, which
  ModelRunner.load_model applies on a CPU device) is NOT applied: it pads
  heads and MoE intermediate sizes to the AMX kernels' alignment, a layout
  no GPU rank holds.
- sgl-kernel is not installed (GPU-only on PyPI), so SGLang finds no Intel
  AMX backend (utils/common.py cpu_has_amx_support) and never reaches its
  CPU ops (bootstrap._init_cpu_threads_env, the AMX weight packing).

- SGLANG_DISABLED_MODEL_ARCHS keeps SGLang's registry from importing the
  model modules these ranks do not build (MODEL_MODULES below): a faster
  start, the same models.

Nothing calls forward(): these ranks load and hold weights.
"""
import os

os.environ.setdefault("SGLANG_CPU_OMP_THREADS_BIND", "0-1")
os.environ["SGLANG_NCCL_SO_PATH"] = os.path.join(os.path.dirname(os.path.abspath(__file__)), "no-libnccl.so")
os.environ.pop("SGLANG_USE_CPU_ENGINE", None)
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The model modules SGLang's registry imports (models/registry.py
# import_model_classes imports every module of sglang/srt/models, about two
# hundred, in every process): only the ones these ranks build. SGLang's own
# switch, SGLANG_DISABLED_MODEL_ARCHS; the models themselves are unchanged.
MODEL_MODULES = ("llama", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2")


def _skip_other_model_modules():
    import importlib.util
    import pkgutil

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return
    models = os.path.join(list(spec.submodule_search_locations)[0], "srt", "models")
    others = [m.name for m in pkgutil.iter_modules([models]) if not m.ispkg and m.name not in MODEL_MODULES]
    os.environ.setdefault("SGLANG_DISABLED_MODEL_ARCHS", ",".join(others))


_skip_other_model_modules()

VERSION = "0.5.23"
PATCHED = []  # what the CPU build changed, for the record


def check_version():
    """Raises SystemExit with one line when SGLang is missing or of another version."""
    from importlib import metadata

    try:
        found = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        raise SystemExit(f"tests/sglang: SGLang {VERSION} is not installed; tools/vllm_venv.sh installs it")
    if found != VERSION:
        raise SystemExit(f"tests/sglang: SGLang {VERSION} expected, found {found}")


def rope_for_cpu():
    """DeepSeek's get_rope_wrapper is asked for the GPU path (device=None,
    not "cpu", whose get_rope_cpu is the CPU engine's). Returns what was patched."""
    import sglang.srt.models.deepseek_v2 as deepseek_v2
    from sglang.srt.layers.rotary_embedding import factory

    real_wrapper = factory.get_rope_wrapper

    def get_rope_wrapper(*args, device=None, **kwargs):
        return real_wrapper(*args, device=None, **kwargs)

    deepseek_v2.get_rope_wrapper = get_rope_wrapper
    return ["models/deepseek_v2.py get_rope_wrapper(device=None)"]


def server_args(ckpt_dir, tp, ep=1, attn_dp=1, port=None, shared_experts=None, dense_tp=None, dp_lm_head=False):
    """SGLang's ServerArgs for one engine of `tp` ranks on CPU."""
    from sglang.srt.server_args import ServerArgs

    kw = dict(model_path=ckpt_dir, device="cpu", tp_size=tp, ep_size=ep, attn_dp_size=attn_dp, dtype="bfloat16",
              load_format="safetensors", skip_tokenizer_init=True, disable_cuda_graph=True, random_seed=0)
    if port is not None:
        kw["dist_init_addr"] = f"127.0.0.1:{port}"
    if shared_experts == "fused":
        kw["enforce_shared_experts_fusion"] = True
    elif shared_experts == "tp":
        kw["disable_shared_experts_fusion"] = True
    elif shared_experts is not None:
        raise ValueError(f"shared_experts: expected None, 'fused' or 'tp', got {shared_experts!r}")
    if dense_tp is not None:
        kw["moe_dense_tp_size"] = dense_tp
    if dp_lm_head:
        kw["enable_dp_lm_head"] = True
    return ServerArgs(**kw)


def build_rank(ckpt_dir, tp, ep=1, attn_dp=1, rank=None, port=None, shared_experts=None, dense_tp=None,
               dp_lm_head=False):
    """The model of SGLang rank `rank` (default: RANK from the environment) of
    one engine of `tp` ranks (expert parallel `ep` inside them, attention DP
    `attn_dp`), loaded from the HF checkpoint in `ckpt_dir`. The ranks meet
    over Gloo at 127.0.0.1:`port` (default: MASTER_PORT); every rank of the
    engine must call this at once, each in its own process.

    shared_experts: None (SGLang's default), "fused" (--enforce-shared-experts-fusion)
    or "tp" (--disable-shared-experts-fusion); dense_tp: --moe-dense-tp-size;
    dp_lm_head: --enable-dp-lm-head. Returns the torch module."""
    check_version()
    import torch

    torch.set_num_threads(1)
    if rank is None:
        rank = int(os.environ["RANK"])
    if port is None:
        port = int(os.environ["MASTER_PORT"])
    PATCHED[:] = rope_for_cpu()

    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed import bootstrap
    from sglang.srt.eplb.expert_location import (compute_initial_expert_location_metadata,
                                                 set_global_expert_location_metadata)
    from sglang.srt.layers.moe import initialize_moe_config
    from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
    from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
    from sglang.srt.layers.quantization.unquant import initialize_bf16_gemm_config
    from sglang.srt.model_executor.model_runner_components.load_model_utils import (build_load_config,
                                                                                    load_model_with_memory_saver)
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish
    from sglang.srt.utils.torch_memory_saver_adapter import TorchMemorySaverAdapter

    args = server_args(ckpt_dir, tp, ep, attn_dp, port, shared_experts, dense_tp, dp_lm_head)
    # managers/scheduler.py run_scheduler_process: publish this rank's placement.
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=rank, dp_rank=None, gpu_id=0))
    model_config = ModelConfig.from_server_args(args)
    bootstrap.init_parallel_runtime(server_args=args, device="cpu", dist_port=port)
    bootstrap.init_layer_runtime(model_config=model_config)
    # Scheduler.init_moe_gemm_config
    initialize_moe_config()
    initialize_fp8_gemm_config()
    initialize_fp4_gemm_config()
    initialize_bf16_gemm_config()
    # ModelRunner.maybe_init_expert_location_metadata
    set_global_expert_location_metadata(
        compute_initial_expert_location_metadata(model_config=model_config, moe_ep_rank=get_parallel().moe_ep_rank))
    # ModelRunner.load_model, without adjust_config_with_unaligned_cpu_tp.
    load_config = build_load_config(server_args=args, tp_rank=get_parallel().tp_rank,
                                    remote_instance_weight_transporter_engine=None,
                                    remote_instance_weight_transporter_session_id="", draft_model_idx=None,
                                    weight_cache_mode="off", weight_cache_socket=None)
    loaded = load_model_with_memory_saver(model_config=model_config, load_config=load_config, device="cpu",
                                          gpu_id=0, memory_saver_adapter=TorchMemorySaverAdapter.create(enable=False),
                                          is_draft_worker=False)
    return loaded.model


def coordinates():
    """This rank's coordinates from SGLang's own context: tp, attention tp / dp, MoE ep / tp."""
    from sglang.srt.runtime_context import get_parallel

    p = get_parallel()
    return {"tp": p.tp_rank, "attn_tp": p.attn_tp_rank, "attn_dp": p.attn_dp_rank, "moe_ep": p.moe_ep_rank,
            "moe_tp": p.moe_tp_rank}


MLA_ATTRIBUTES = ("w_kc", "w_vc", "w_scale")


def derived_attributes(model):
    """{name: tensor} of the MLA attributes SGLang derives at load
    (deepseek_common/deepseek_weight_loader.py post_load_weights): `w_kc`,
    `w_vc` and, under FP8, `w_scale` of every attention module that has them.
    Plain tensor attributes, not parameters or buffers."""
    import torch

    out = {}
    for name, module in model.named_modules():
        for attr in MLA_ATTRIBUTES:
            t = getattr(module, attr, None)
            if isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter):
                out[f"{name}.{attr}"] = t
    return out


def all_tensors(model):
    """{name: tensor} of every parameter, every buffer and every derived MLA attribute."""
    out = dict(model.named_parameters())
    out.update({n: b for n, b in model.named_buffers() if n not in out})
    out.update({n: t for n, t in derived_attributes(model).items() if n not in out})
    return out
