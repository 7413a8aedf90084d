"""One process of tests/trl/run.py: a GRPOTrainer rank (TRL 1.16, FSDP2
through accelerate, Gloo) and, in the same process, one vLLM 0.33 rank, as
TRL's colocate mode runs them.

What is TRL's and vLLM's own here: GRPOTrainer and its training step
(generation by the HF policy: use_vllm=False, since a colocated
``vllm.LLM`` cannot be built on this CPU: the PyPI wheel has no CPU ops),
VLLMGeneration (its real ``__init__`` and ``sync_weights``), and vLLM's
model classes, loaders and parallel state. What stands in: ``_init_vllm``,
which would build ``vllm.LLM``, instead builds the vLLM model as
tests/vllm/engine.py does and hands VLLMGeneration an object with the
attributes its ``sync_weights`` reads of an ``LLM``
(``llm.llm_engine.model_executor.driver_worker.model_runner.model``,
``llm_engine.vllm_config``, ``reset_prefix_cache()``). The trainer calls
``sync_weights`` after each optimizer step from a TrainerCallback, where
GRPOTrainer calls it before the next generation.

Checks, each on both ranks: after every step the vLLM rank equals a fresh
vLLM load of the trainer's current weights, bit for bit, and no vLLM tensor
moved; TRL's own sync_weights gives the same engine; the refusals at setup
(plan missing, not colocated, another FSDP2 mesh, another engine, another
model, another TRL version); a sync that fails on one rank fails on every
rank, by name, and leaves the engine marked not updated. Writes
WORK/rank{R}.json.
"""
import json
import os
import statistics
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "tests", "vllm")]

import engine  # noqa: E402  (sets the CPU environment before vLLM is imported)

os.environ.setdefault("ACCELERATE_USE_CPU", "true")


class Checks:
    def __init__(self, rank):
        self.rank = rank
        self.failures = []
        self.log = []

    def expect(self, ok, what):
        if not ok:
            self.failures.append(what)
        return ok

    def note(self, line):
        self.log.append(line)
        print(f"rank {self.rank}: {line}", flush=True)


def build_vllm(model_dir, rank, world):
    """This process's vLLM rank as TRL's colocate mode sets it up (VLLMGeneration._init_vllm: TP 1, the
    external launcher over the trainer's processes, seed process_index // TP), on the trainer's torch
    world (init_distributed_environment keeps an initialized default group)."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model

    engine.kernel_selection_for_cpu()
    args = EngineArgs(model=model_dir, tensor_parallel_size=1, distributed_executor_backend="external_launcher",
                      seed=rank, max_num_batched_tokens=4096, logprobs_mode="processed_logprobs",
                      skip_tokenizer_init=True, enforce_eager=True)
    config = args.create_engine_config()
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=world, rank=rank, distributed_init_method="env://",
                                     local_rank=rank, backend="gloo")
        initialize_model_parallel(1, 1)
        model = get_model(vllm_config=config)
    torch.set_num_threads(1)
    return model, config


class ColocatedLLM:
    """What VLLMGeneration.sync_weights reads of a colocated vllm.LLM
    (trl/generation/vllm_generation.py sync_weights), over a real vLLM model."""

    def __init__(self, model, config):
        runner = types.SimpleNamespace(model=model)
        executor = types.SimpleNamespace(driver_worker=types.SimpleNamespace(model_runner=runner))
        self.llm_engine = types.SimpleNamespace(model_executor=executor, vllm_config=config,
                                                model_config=config.model_config)
        self.prefix_cache_resets = 0

    def reset_prefix_cache(self):
        self.prefix_cache_resets += 1
        return True


def generation_for(trainer, llm):
    """TRL's VLLMGeneration, its own __init__ run, with the LLM of this process instead of vllm.LLM."""
    from trl.generation.vllm_generation import VLLMGeneration

    g = VLLMGeneration.__new__(VLLMGeneration)

    def init_vllm():
        g.llm = llm
        g._llm_weights_sleeping = False
        trainer.accelerator.wait_for_everyone()

    g._init_vllm = init_vllm
    VLLMGeneration.__init__(g, model=trainer.model, accelerator=trainer.accelerator,
                            processing_class=trainer.processing_class, mode="colocate",
                            max_completion_length=trainer.max_completion_length)
    return g


def fsdp2_on_cpu():
    """accelerate 1.16 turns FSDP on for GPU-like devices only (``state.py``
    ``AcceleratorState.__init__``: the FSDP branch is under MULTI_GPU, MULTI_NPU, ...;
    a MULTI_CPU state gets DDP), and every ``AcceleratorState()`` call copies
    the process state's distributed type back in. Here each one ends with FSDP
    and the plugin the Trainer gave its Accelerator
    (``Trainer.create_accelerator_and_postprocess``), so that ``Accelerator.prepare``
    shards the model with FSDP2's ``fully_shard`` over the Gloo world and TRL's
    DistributedBackend reads ``fsdp_version`` 2. Returns what it changed."""
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    plugin = []
    original = AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None:
            plugin[:] = [fsdp_plugin]
        if plugin and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = plugin[0]

    AcceleratorState.__init__ = init
    return "accelerate.state.AcceleratorState.__init__: FSDP on a MULTI_CPU state"


def keep_fsdp2(trainer):
    """What the trainer's accelerator says right before train() prepares the model."""
    return (f"accelerate state {trainer.accelerator.state.distributed_type}, FSDP2 {trainer.accelerator.is_fsdp2}, "
            f"Trainer.is_fsdp_enabled {trainer.is_fsdp_enabled}")


def trainer_for(a, rank, steps):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(a["model"])
    model = AutoModelForCausalLM.from_pretrained(a["model"], dtype=torch.float32)
    prompts = [" ".join(f"w{4 + (7 * i + j) % 200}" for j in range(3)) for i in range(16)]

    def reward(completions, **kwargs):  # varied, so that advantages and gradients are not zero
        return [float(sum(map(ord, c)) % 7) for c in completions]

    args = GRPOConfig(
        output_dir=os.path.join(a["work"], f"out{rank}"), use_cpu=True, per_device_train_batch_size=2,
        num_generations=4, max_completion_length=6, max_steps=steps, learning_rate=5e-3, beta=0.0,
        logging_steps=1, save_strategy="no", report_to="none", seed=0, bf16=False, use_vllm=False,
        fsdp="full_shard", fsdp_config={"version": 2, "reshard_after_forward": True},
        dataloader_num_workers=0)
    return GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_dict(
        {"prompt": prompts}), processing_class=tok)


def truth_checkpoint(trainer, directory, rank, model_dir):
    """The trainer's current weights, gathered (the test's oracle only), as a bf16 HF checkpoint on rank 0."""
    import torch
    import torch.distributed as dist
    from safetensors.torch import save_file

    from reshard.dtensor import is_dtensor

    full = {}
    for n, p in trainer.model.named_parameters():
        t = p.full_tensor() if is_dtensor(p) else p.detach()
        full[n.replace("_checkpoint_wrapped_module.", "")] = t.detach().to(torch.bfloat16).contiguous()
    if rank == 0:
        import shutil

        os.makedirs(directory, exist_ok=True)
        save_file(full, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
        shutil.copy(os.path.join(model_dir, "config.json"), directory)
    dist.barrier()


def compare(c, vllm_model, config, ckpt, label, where):
    import rank_refit

    state = rank_refit.snapshot(vllm_model)
    fresh = engine.fresh(config, ckpt)
    diffs = rank_refit.differences(state, engine.all_tensors(fresh))
    del fresh
    moved = sorted(n for n, t in engine.all_tensors(vllm_model).items()
                   if (t.data_ptr(), t.untyped_storage().nbytes()) != where.get(n))
    c.expect(not diffs, f"{label}: the vLLM rank differs from a fresh vLLM load of the trainer's weights: {diffs[:5]}")
    c.expect(not moved, f"{label}: vLLM tensors moved in memory: {moved[:5]}")
    c.note(f"{label}: {len(state)} vLLM tensors equal a fresh vLLM load of the trainer's weights, bit for bit"
           if not diffs else f"{label}: {len(diffs)} differences")
    return state


def expect_error(c, label, fn, kind, *words):
    """fn() must raise `kind` whose message holds every one of `words`."""
    try:
        fn()
    except kind as e:
        msg = str(e)
        missing = [w for w in words if w not in msg]
        c.expect(not missing, f"{label}: the message lacks {missing}: {msg}")
        c.note(f"{label}: {type(e).__name__}: {msg.splitlines()[0][:300]}")
        return e
    except Exception as e:  # noqa: BLE001
        c.expect(False, f"{label}: expected {kind.__name__}, got {type(e).__name__}: {e}")
        return e
    c.expect(False, f"{label}: nothing was raised")
    return None


def main():
    a = json.loads(sys.argv[1])
    rank = int(os.environ["RANK"])
    c = Checks(rank)
    out = {"rank": rank}
    t0 = time.time()
    try:
        checks(a, c, out)
    except BaseException:
        import traceback

        c.expect(False, "raised:\n" + traceback.format_exc())
        raise
    finally:
        out["failures"], out["log"] = c.failures, c.log
        out["total_s"] = time.time() - t0
        with open(os.path.join(a["work"], f"rank{rank}.json"), "w") as f:
            json.dump(out, f, indent=1)


def checks(a, c, out):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    t0 = time.time()
    import torch
    from transformers import TrainerCallback

    import reshard
    import reshard.trl
    import reshard.vllm
    import rank_refit

    c.note(fsdp2_on_cpu())
    trainer = trainer_for(a, rank, a["steps"])
    vllm_model, config = build_vllm(a["model"], rank, world)
    llm = ColocatedLLM(vllm_model, config)
    trainer.vllm_generation = generation_for(trainer, llm)
    out["setup_s"] = time.time() - t0
    c.note(f"trainer and vLLM rank built in {out['setup_s']:.1f} s (FSDP2 version "
           f"{trainer.vllm_generation._dist.fsdp_version})")

    # Bad input at setup, before the good plan: each refused by attach on every rank, nothing connected.
    import trl

    saved = trl.__version__
    trl.__version__ = "1.15.0"
    expect_error(c, "another TRL", lambda: reshard.trl.attach(trainer, a["plans"]["good"]), reshard.trl.VersionError,
                 "proven on TRL 1.16.0", "TRL 1.15.0", "RESHARD_TRL_ANY_VERSION=1")
    trl.__version__ = saved
    expect_error(c, "no plan", lambda: reshard.trl.attach(trainer, os.path.join(a["work"], "none.rsplan")),
                 reshard.PlanError, "no plan at", "none.rsplan")
    expect_error(c, "not colocated", lambda: reshard.trl.attach(trainer, a["plans"]["disjoint"]),
                 reshard.trl.TrainerMismatchError, "not colocated", "\"placement\" is \"colocated\"")
    expect_error(c, "another engine", lambda: reshard.trl.attach(trainer, a["plans"]["infer_tp"]),
                 reshard.vllm.EngineMismatchError, "'vllm-tp2", "TP 2", "this vLLM engine runs TP 1")
    expect_error(c, "another model", lambda: reshard.trl.attach(trainer, a["plans"]["other_model"]),
                 reshard.BindError, "is not for this trainer's model", "the plan's shape", "the vLLM model's")
    c.expect(reshard.trl.sync_of(trainer) is None, "a refused attach left a sync attached")

    sync = reshard.trl.attach(trainer, a["plans"]["good"])
    c.expect(sync.session is None, "attach before train() connected before FSDP2 sharded the model")
    where = {n: (t.data_ptr(), t.untyped_storage().nbytes()) for n, t in engine.all_tensors(vllm_model).items()}
    steps = []

    class SyncEachStep(TrainerCallback):
        """GRPOTrainer syncs before each generation when the step changed (_generate_single_turn); here after each
        optimizer step, through the same method of the same object."""

        def on_step_end(self, args, state, control, **kwargs):
            before = rank_refit.snapshot(vllm_model)
            t = time.perf_counter()
            trainer.vllm_generation.sync_weights()
            sync_s = time.perf_counter() - t
            ckpt = os.path.join(a["work"], f"step{state.global_step}", "model")
            truth_checkpoint(trainer, ckpt, rank, a["model"])
            after = compare(c, vllm_model, config, ckpt, f"step {state.global_step}", where)
            changed = sum(1 for n in after if not torch.equal(rank_refit.bits(after[n][0]),
                                                                 rank_refit.bits(before[n][0])))
            steps.append({"step": state.global_step, "sync_s": sync_s, "run_s": sync.stats.seconds,
                          "changed": changed, "tensors": len(after)})
            c.note(f"step {state.global_step}: sync_weights {sync_s * 1e3:.1f} ms (run {sync.stats.seconds * 1e3:.1f} "
                   f"ms), {changed} of {len(after)} vLLM tensors changed")

    trainer.add_callback(SyncEachStep())
    c.note(keep_fsdp2(trainer))
    t = time.time()
    trainer.train()
    out["train_s"] = time.time() - t
    out["steps"] = steps
    c.expect(len(steps) == a["steps"], f"{len(steps)} syncs for {a['steps']} steps")
    c.expect(all(s["changed"] > 0 for s in steps), "a step changed no vLLM weight: the check proves nothing")
    c.expect(llm.prefix_cache_resets == len(steps), f"{llm.prefix_cache_resets} prefix-cache resets")
    c.expect(sync.train is not None and any(isinstance(p, torch.distributed.tensor.DTensor)
                                            for p in trainer.model.parameters()),
             "the trainer's parameters are not FSDP2 DTensors")
    c.note(f"GRPO: {len(steps)} steps in {out['train_s']:.1f} s")

    # TRL's own path (full_tensor() + load_weights per parameter) on the same objects gives the same engine.
    from trl.generation.vllm_generation import VLLMGeneration

    ckpt = os.path.join(a["work"], f"step{steps[-1]['step']}", "model") if steps else None
    t = time.perf_counter()
    VLLMGeneration.sync_weights(trainer.vllm_generation)
    out["trl_sync_s"] = time.perf_counter() - t
    if ckpt:
        compare(c, vllm_model, config, ckpt, "TRL's own sync_weights", where)

    # A refused training layout: the same ranks, another FSDP2 mesh (the model is sharded now: refused in attach).
    reshard.trl.detach(trainer)
    expect_error(c, "another FSDP2 mesh", lambda: reshard.trl.attach(trainer, a["plans"]["train_mesh"]),
                 reshard.trl.TrainerMismatchError, "fsdp2-dp_replicate2-dp_shard1-fp32", "dp_replicate 2 x dp_shard 1",
                 "this trainer runs FSDP2 over 2 processes, mesh dp_shard 2", "fsdp2:dp_shard=2")

    if a["bench"]:
        out["bench"] = bench(c, trainer, a)

    # A sync that fails on one rank: rank 1's vLLM rank holds a parameter in another dtype (re-bound by
    # name, refused), so rank 1 fails before its run and rank 0's run hears it.
    sync = reshard.trl.attach(trainer, a["plans"]["good"])
    c.expect(sync.session is not None, "attach after train() did not connect")
    if rank == 1:
        p = dict(vllm_model.named_parameters())["model.norm.weight"]
        p.data = p.data.float()
    t = time.perf_counter()
    e = expect_error(c, "a sync failing on rank 1", trainer.vllm_generation.sync_weights, reshard.trl.SyncError,
                     f"rank {rank}: reshard.trl: weight sync 1 failed", "not updated (partly written)")
    out["failure_heard_s"] = time.perf_counter() - t
    c.expect(out["failure_heard_s"] < 30, f"the failure took {out['failure_heard_s']:.1f} s to reach rank {rank}")
    c.expect(sync.weights_current is False and sync.error is not None, "the engine is not marked as not updated")
    expect_error(c, "the sync after a failure", trainer.vllm_generation.sync_weights, reshard.trl.SyncError,
                 "an earlier weight sync failed", "partly written")
    c.note(f"a failure on rank 1 reached rank {rank} in {out['failure_heard_s']:.2f} s: "
           f"{type(e.__cause__).__name__ if e is not None else None}")

    import torch.distributed as dist

    dist.barrier()


def bench(c, trainer, a):
    """Per sync on this model and layout: the plug-in's sync_weights, a bare Session.run() of its session, and TRL's
    own sync_weights (full_tensor() + load_weights per parameter), a warm-up each, then the median of N."""
    import torch.distributed as dist
    from trl.generation.vllm_generation import VLLMGeneration

    import reshard.trl

    sync = reshard.trl.attach(trainer, a["plans"]["good"])
    g = trainer.vllm_generation
    paths = {"reshard.trl sync_weights": g.sync_weights, "bare Session.run()": sync.session.run,
             "TRL sync_weights (full_tensor + load_weights)": lambda: VLLMGeneration.sync_weights(g)}
    res = {}
    for name, fn in paths.items():
        times = []
        for i in range(a["bench"] + 1):
            dist.barrier()
            t = time.perf_counter()
            fn()
            if i:
                times.append(time.perf_counter() - t)
        res[name] = {"median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3, "n": len(times)}
        c.note(f"bench: {name}: median {res[name]['median_ms']:.2f} ms, min {res[name]['min_ms']:.2f} ms")
    res["bytes_sent"] = {"net": sync.stats.net.bytes_sent, "nvlink": sync.stats.nvlink.bytes_sent}
    reshard.trl.detach(trainer)
    return res


if __name__ == "__main__":
    ok = False
    try:
        main()
        ok = True
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # No teardown of vLLM's and torch's groups at exit: the record is written, the launcher reads the status.
        os._exit(0 if ok else 1)
