"""The Ray workers of tests/verl/refit.py.

- ``ActorWorker``: verl's own ``ActorRolloutRefWorker``
  (``verl/workers/engine_workers.py``; its ``init_model``, FSDP2 engine,
  optimizer, checkpoint engine and ``update_weights``, unchanged) plus three
  methods the test calls on it: a real optimizer step of the engine's own
  AdamW on a cross-entropy loss (verl's PPO loss needs a rollout batch that
  a CPU vLLM cannot generate), a dump of the trainer's weights as the bf16
  checkpoint a fresh vLLM loads, and reshard.verl's training-layout check
  against another plan on every rank.
- ``CpuVllmServer``: what verl's ``vLLMHttpServer``
  (``verl/workers/rollout/vllm_rollout/vllm_async_server.py``) is to the
  checkpoint engine, named as verl names it (``vllm_server_{replica}_{node}``)
  and with the methods verl calls on it (``collective_rpc``,
  ``set_global_steps``, ``clear_kv_cache``, the KV-cache release and resume,
  abort and resume of generation), over a real vLLM 0.33 engine: ``vllm.LLM``
  with vLLM's multiprocess executor, TP workers of vLLM's own ``Worker``
  class on a CPU (tests/vllm/cpu_worker.py) and
  ``weight_transfer_config={"backend": "reshard"}``. Not verl's class:
  ``vLLMHttpServer`` runs ``AsyncLLM`` behind a uvicorn server and asks for
  GPUs, CUDA graphs and a KV cache.
- ``CpuVllmReplica``: verl's ``RolloutReplica`` whose workers are verl's own
  ``CheckpointEngineWorker`` actors (``RolloutReplica.get_ray_class_with_init_args``,
  each with verl's vLLM ``ServerAdapter``) and whose server is the one above.
"""
import os

import ray
import torch

from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.rollout.replica import RolloutReplica


class ActorWorker(ActorRolloutRefWorker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def optimizer_step(self, seed: int) -> float:
        """One step of the engine's own optimizer (AdamW over the FSDP2 shards) on random tokens."""
        engine = self.actor.engine
        module, optimizer = engine.module, engine.optimizer
        g = torch.Generator().manual_seed(seed)
        vocab = module.config.vocab_size
        ids = torch.randint(0, vocab, (2, 16), generator=g)
        module.train()
        out = module(input_ids=ids, labels=ids)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(out.loss.detach())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weight_gathers(self) -> int:
        """Calls, on this rank, of what gathers a sharded weight (DTensor.full_tensor, FSDP2's all-gather through
        torch.distributed.all_gather_into_tensor) since the previous call; the first call starts counting."""
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        if not hasattr(self, "_gathers"):
            self._gathers = [0]

            def counted(fn):
                def wrapper(*a, **k):
                    self._gathers[0] += 1
                    return fn(*a, **k)
                return wrapper

            DTensor.full_tensor = counted(DTensor.full_tensor)
            dist.all_gather_into_tensor = counted(dist.all_gather_into_tensor)
        n, self._gathers[0] = self._gathers[0], 0
        return n

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def parameter_count(self) -> int:
        """The model's parameters (whole tensors), on this rank's count."""
        return sum(p.numel() for p in self.actor.engine.module.parameters()) if torch.distributed.get_rank() == 0 \
            else 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def dump_bf16(self, directory: str) -> int:
        """The trainer's weights as bf16 (what the plan sends: the fp32 masters converted by the senders), written
        by rank 0 as an HF checkpoint of the model's config. A gather: the check's, not the refit's."""
        from safetensors.torch import save_file

        module = self.actor.engine.module
        full = {}
        for name, p in module.named_parameters():
            t = p.full_tensor() if hasattr(p, "full_tensor") else p
            full[name.replace("_fsdp_wrapped_module.", "")] = t.detach().to(torch.bfloat16).contiguous()
        if torch.distributed.get_rank() == 0:
            os.makedirs(directory, exist_ok=True)
            src = self.config.model.path
            for f in os.listdir(src):
                if f.endswith(".json") and f != "model.safetensors.index.json":
                    with open(os.path.join(src, f)) as a, open(os.path.join(directory, f), "w") as b:
                        b.write(a.read())
            save_file(full, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
        torch.distributed.barrier()
        return len(full)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def check_plan(self, plan_path: str) -> str:
        """reshard.verl's check of this rank's live module against `plan_path` (as the first update runs it,
        before connecting): the error's text, or "" when the plan fits."""
        import reshard
        import reshard.verl

        plan = reshard.Plan.open(plan_path)
        rank = plan.source_ranks[torch.distributed.get_rank()]
        try:
            reshard.verl.check_trainer(plan, rank, reshard.verl._trainer_modules(self.actor.engine))
        except reshard.verl.PlanMismatchError as e:
            return f"{type(e).__name__}: {e}"
        return ""


    # -- for tools/bench/verl_bench.py ---------------------------------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def bare_run(self) -> float:
        """One bare Session.run() of this rank's reshard session (no verl around it): seconds."""
        import time

        t0 = time.perf_counter()
        self.checkpoint_engine.refit.session.run()
        return time.perf_counter() - t0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def verl_stream(self, bucket_size: int) -> float:
        """verl's own path on this rank, the part a CPU runs: get_per_tensor_param() consumed (FSDP2's
        full_tensor() of every parameter) and packed into buckets by split_weight_chunks, as the nccl backend's
        sender fills its buffer before each broadcast (nccl_checkpoint_engine.py send_weights); seconds."""
        import time

        from verl.checkpoint_engine.base import split_weight_chunks

        async def pack():
            buf = torch.empty(bucket_size, dtype=torch.uint8)
            offset = 0
            # with an argument: verl's own stream (called bare, reshard's backend gets the engine instead)
            per_tensor_param, _ = self.actor.engine.get_per_tensor_param(layered_summon=False)
            async for meta, chunk in split_weight_chunks(per_tensor_param, bucket_size):
                if offset + meta.chunk_size > bucket_size:
                    offset = 0  # the broadcast of the full bucket would go here
                buf[offset:offset + meta.chunk_size].copy_(chunk)
                offset += meta.chunk_size

        t0 = time.perf_counter()
        await pack()
        return time.perf_counter() - t0


class CpuVllmServer:
    """A real vLLM 0.33 engine (vllm.LLM, multiprocess executor, CPU workers) behind the methods verl's
    checkpoint engine and ServerAdapter call on vLLMHttpServer."""

    def __init__(self, model_dir: str, tp: int):
        import doors  # tests/vllm: the CPU engine's settings (engine.py sets the CPU environment first)
        from vllm import LLM

        self.llm = LLM(model=model_dir, **doors.engine_args({"tp": tp, "pp": 1}, cli=False))
        self.global_steps = None
        self.calls = []

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append(method if isinstance(method, str) else getattr(method, "__name__", "callable"))
        return self.llm.collective_rpc(method, timeout=timeout, args=tuple(args), kwargs=kwargs or {})

    def set_global_steps(self, global_steps):
        self.global_steps = global_steps

    def get_global_steps(self):
        return self.global_steps

    def get_calls(self):
        return list(self.calls)

    def _record(self, name):
        self.calls.append(name)

    def clear_kv_cache(self):
        self._record("clear_kv_cache")

    def release_kv_cache(self):
        self._record("release_kv_cache")

    def resume_kv_cache(self):
        self._record("resume_kv_cache")

    def abort_all_requests(self, reset_prefix_cache=True, reject_request=False):
        self._record("abort_all_requests")
        return {}

    def resume_generation(self):
        self._record("resume_generation")

    def wake_up(self, tags=None):
        self._record("wake_up")

    def sleep(self):
        self._record("sleep")

    def shutdown(self):
        self.llm.llm_engine.engine_core.shutdown()


class CpuVllmReplica(RolloutReplica):
    """One rollout replica: verl's CheckpointEngineWorker actors (one per vLLM worker) and the server."""

    def __init__(self, *args, model_dir: str, env: dict, **kwargs):
        super().__init__(*args, **kwargs)
        self.model_dir = model_dir
        self.env = env

    async def init_cpu(self):
        from verl.single_controller.ray import RayResourcePool, RayWorkerGroup

        pool = RayResourcePool(process_on_nodes=[self.world_size], use_gpu=False, name_prefix="rollout_pool",
                               max_colocate_count=1)
        wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=self.get_ray_class_with_init_args(),
                            bin_pack=False, name_prefix=f"rollout_{self.replica_rank}", device_name="cpu")
        self.workers = wg.workers
        await self.launch_servers()

    async def launch_servers(self):
        name = f"vllm_server_{self.replica_rank}_0"  # ServerAdapter._ensure_server_handle's name
        server = ray.remote(CpuVllmServer).options(name=name, num_cpus=0, runtime_env={"env_vars": self.env}).remote(
            self.model_dir, self.config.tensor_model_parallel_size)
        ray.get(server.get_global_steps.remote())  # up
        self.servers = [server]
        self._server_handle = server
