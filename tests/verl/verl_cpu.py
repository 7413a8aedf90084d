"""verl 0.9.1 on a CPU, for tests/verl/refit.py: what verl lacks to run its
actor workers without an accelerator, set up in every Ray worker process
(``ray.init(runtime_env={"worker_process_setup_hook": "verl_cpu.setup"})``).

verl has no CPU platform: ``verl/plugin/platform/platform_manager.py``
``_detect_platform_name`` falls back to CUDA when it finds no accelerator;
its process groups are ``cpu:gloo,<device>:<nccl backend>``
(``verl/utils/distributed.py`` ``initialize_global_process_group_ray``); its
FSDP engine is registered for the devices "cuda" and "npu" only
(``verl/workers/engine/fsdp/transformer_impl.py``, ``EngineRegistry.register``).
So this module

- registers a platform "cpu" (``PlatformRegistry.register``, selected by
  ``VERL_PLATFORM=cpu``): device "cpu", Gloo, ``torch.cpu`` plus no-ops for
  the memory calls verl logs (``empty_cache``, ``max_memory_allocated``, ...);
- registers verl's own FSDP engines for the device "cpu" (the same classes);
- makes verl's process groups plain "gloo" (its "cpu:gloo,<device>:<backend>"
  names the CPU twice here, which torch refuses);
- turns off verl's value-head patch for TRL
  (``verl/models/transformers/monkey_patch.py`` imports
  ``AutoModelForCausalLMWithValueHead``, which TRL 1.16 removed, whenever
  TRL is installed; the actor here is a causal LM with no value head).

The model's attention is set by the test's config
(``override_config.attn_implementation=eager``; verl defaults to
flash-attention). Nothing here touches how weights are held or moved.
"""
import os
import types
from contextlib import contextmanager


def _device_module():
    import torch

    def zero(*a, **k):
        return 0

    def mem_get_info(*a, **k):
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        free = os.sysconf("SC_AVPHYS_PAGES") * size
        return free, pages * size

    m = types.SimpleNamespace(
        is_available=lambda: True, device_count=lambda: 1, current_device=lambda: "cpu", set_device=lambda *a: None,
        synchronize=lambda *a, **k: None, empty_cache=lambda: None, ipc_collect=lambda: None,
        memory_allocated=zero, memory_reserved=zero, max_memory_allocated=zero, max_memory_reserved=zero,
        reset_peak_memory_stats=lambda *a: None, mem_get_info=mem_get_info,
        manual_seed=torch.manual_seed, manual_seed_all=torch.manual_seed,
        get_rng_state=lambda *a: torch.get_rng_state(), set_rng_state=lambda s, *a: torch.set_rng_state(s),
        get_device_name=lambda *a: "cpu", set_per_process_memory_fraction=lambda *a, **k: None,
        current_stream=torch.cpu.current_stream, stream=torch.cpu.stream, Stream=torch.cpu.Stream,
        Event=torch.cpu.Event)
    return m


def register_platform():
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    if PlatformRegistry.get("cpu") is not None:
        return
    module = _device_module()

    @PlatformRegistry.register(platform="cpu")
    class PlatformCPU(PlatformBase):
        device_name = "cpu"
        vendor_name = "cpu"
        device_module = module

        def is_available(self):
            return True

        def is_platform_available(self, use_smi_check=False):
            return os.environ.get("VERL_PLATFORM") == "cpu"

        def current_device(self):
            return "cpu"

        def device_count(self):
            return 1

        def set_device(self, device_index):
            pass

        def synchronize(self, device_index=None):
            pass

        def manual_seed(self, seed):
            import torch

            torch.manual_seed(seed)

        manual_seed_all = manual_seed

        def set_allocator_settings(self, settings):
            pass

        def empty_cache(self):
            pass

        def get_device_capability(self, device_index=0):
            return None, None

        def communication_backend_name(self):
            return "gloo"

        def visible_devices_envvar(self):
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg):
            yield

        def profiler_start(self):
            pass

        def profiler_stop(self):
            pass

        def ray_resource_name(self):
            return "CPU"

        def ray_noset_envvars(self):
            return []

        def ray_resource_options(self, num_gpus):
            return {}

        def is_ipc_supported(self):
            return False

        def cudart(self):
            return None


def register_engines():
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl as fsdp

    if "cpu" in EngineRegistry._engines.get("language_model", {}).get("fsdp2", {}):
        return
    for model_type, cls in (("language_model", fsdp.FSDPEngineWithLMHead),
                            ("value_model", fsdp.FSDPEngineWithValueHead)):
        EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device="cpu")(cls)


def gloo_process_groups():
    import importlib

    from verl.utils import distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "cpu_shim", False):
        return

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend="gloo")

    initialize_global_process_group_ray.cpu_shim = True
    for name in ("verl.utils.distributed", "verl.workers.engine_workers", "verl.checkpoint_engine.base"):
        mod = importlib.import_module(name)
        mod.initialize_global_process_group_ray = initialize_global_process_group_ray


def no_value_head_patch():
    from verl.models.transformers import monkey_patch

    monkey_patch.is_trl_available = lambda: False


def setup():
    """The worker_process_setup_hook: in every Ray worker process, before verl runs anything."""
    os.environ.setdefault("VERL_PLATFORM", "cpu")
    register_platform()
    try:
        register_engines()
        gloo_process_groups()
        no_value_head_patch()
    except ImportError:
        pass  # a process without verl's trainer (the vLLM server actor)
