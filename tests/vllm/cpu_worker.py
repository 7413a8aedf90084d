"""vLLM 0.33's own GPU worker class (``v1/worker/gpu_worker.py`` ``Worker``)
run on a CPU, for the weight-transfer doors (tests/vllm/doors.py): named by
``worker_cls`` (vLLM's own setting), built by vLLM's executors in their
worker processes (``WorkerWrapperBase.init_worker``, which loads the
``vllm.general_plugins`` first), and driven by ``collective_rpc``.

Every weight-transfer method is vLLM's, unchanged: ``load_model`` (which
makes the engine named by ``weight_transfer_config`` through
``WeightTransferEngineFactory.create_engine``),
``init_weight_transfer_engine``, ``start_weight_update``,
``update_weights``, ``finish_weight_update``,
``shutdown_weight_transfer_engine``. What is replaced is what needs a GPU
or vLLM's CPU build, which the PyPI wheel is not:

- ``init_device``: the CPU, Gloo process groups
  (``init_worker_distributed_environment``, vLLM's own, with backend
  "gloo"), the kernel selection of engine.py;
- the model runner: ``get_model`` (vLLM's loader, as ``GPUModelRunner.load_model``
  calls it) and no forward pass: nothing here generates tokens;
- the KV-cache and warm-up steps an engine core asks for before serving
  (``determine_available_memory``, ``get_kv_cache_spec``,
  ``initialize_from_config``, ``compile_or_warm_up_model``): an
  attention-free engine to the scheduler, since sizing a KV cache profiles a
  forward pass (``Worker.determine_available_memory``) that needs CUDA or
  vLLM's CPU ops.
"""
import torch
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.worker_base import CompilationTimes

import engine


class CpuModelRunner:
    """What Worker asks of its model runner for loading and weight updates."""

    def __init__(self, vllm_config):
        self.vllm_config = vllm_config
        self.model = None

    def load_model(self, load_dummy_weights=False):
        from vllm.model_executor.model_loader import get_model

        self.model = get_model(vllm_config=self.vllm_config)

    def get_model(self):
        return self.model

    def get_draft_model(self):
        return None

    def reset_lora_state(self):
        pass

    def get_supported_tasks(self):
        return ("generate",)

    def reset_mm_cache(self):
        pass

    def reset_encoder_cache(self):
        pass

    def shutdown(self):
        self.model = None


class CpuWorker(Worker):
    def init_device(self):
        from vllm.utils.torch_utils import set_random_seed

        torch.set_num_threads(1)
        engine.kernel_selection_for_cpu()
        self.device = torch.device("cpu")
        init_worker_distributed_environment(self.vllm_config, self.rank, self.distributed_init_method,
                                            self.local_rank, "gloo")
        set_random_seed(self.model_config.seed)
        self.model_runner = CpuModelRunner(self.vllm_config)

    def determine_available_memory(self):
        return 0

    def get_kv_cache_spec(self):
        return {}

    def initialize_from_config(self, kv_cache_config):
        pass

    def compile_or_warm_up_model(self):
        return CompilationTimes(0.0, 0.0)

    def check_health(self):
        pass

    # What tests/vllm/doors.py asks the workers through collective_rpc (by name: the HTTP server's
    # /collective_rpc takes names and string arguments only, and passes dicts and lists back as JSON,
    # anything else as its str(): entrypoints/serve/dev/rpc/api_router.py).

    def reshard_engine_class(self):
        return {"engine": type(self.weight_transfer_engine).__name__}

    def reshard_worker_rank(self):
        return {"rank": self.rank}

    def reshard_engine_initialized(self):
        return {"initialized": getattr(self.weight_transfer_engine, "refit", None) is not None}

    def _reshard_where(self):
        tensors = engine.all_tensors(self.get_model())
        return {n: (t.data_ptr(), t.untyped_storage().nbytes()) for n, t in tensors.items()}

    def reshard_mark(self):
        """Where every tensor lives now, to check after each refit that none moved."""
        self._reshard_marked = self._reshard_where()

    def reshard_compare(self, checkpoint_dir):
        """Every parameter and buffer against a fresh vLLM load of `checkpoint_dir`, and what moved."""
        import rank_refit

        refit = self.weight_transfer_engine.refit
        state = rank_refit.snapshot(self.get_model())
        fresh = engine.fresh(self.vllm_config, checkpoint_dir)
        diffs = rank_refit.differences(state, engine.all_tensors(fresh))
        del fresh
        where = self._reshard_where()
        marked = getattr(self, "_reshard_marked", where)
        return {"rank": self.rank, "plan_rank": refit.session.rank, "tensors": len(state), "differences": diffs[:20],
                "moved": sorted(n for n in where if where[n] != marked.get(n))[:20], "rebinds": refit.rebinds}

    def reshard_bare_run(self):
        """One bare Session.run() of this worker's session: its seconds."""
        import time

        t0 = time.perf_counter()
        self.weight_transfer_engine.refit.session.run()
        return {"seconds": time.perf_counter() - t0}
