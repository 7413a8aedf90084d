#!/usr/bin/env python3
"""reshard as verl 0.9.1's checkpoint-engine backend, with real verl and real
vLLM 0.33 on CPU processes of a local Ray cluster.

What runs is verl's own: its Hydra config (``ppo_trainer``), its
``ActorRolloutRefWorker`` with the FSDP2 engine (a tiny Qwen3, fp32 masters,
2 ranks over Gloo) in a ``RayWorkerGroup``, its ``CheckpointEngineWorker``
actors with its vLLM ``ServerAdapter`` (made by ``RolloutReplica``), and its
``CheckpointEngineManager.update_weights``, which finds the backend through
``custom_backend_module=reshard.verl`` and ``CheckpointEngineRegistry``.
The vLLM engine is real (``vllm.LLM``, TP 2, vLLM's own worker class on a
CPU: tests/vllm/cpu_worker.py); what stands in for verl's
``vLLMHttpServer`` and what the CPU shim changes are said in workers.py and
verl_cpu.py.

Checks:
1. the backend verl's registry made on every trainer and rollout worker is
   reshard's; two updates (``manager.update_weights``) with a real optimizer
   step of the trainer between them: after each, every parameter and buffer
   of both vLLM workers equals a fresh vLLM load of the trainer's weights,
   bit for bit, nothing moved in memory; one session per rank for the whole
   job (the same session and transport objects, no re-bind); no trainer
   rank gathered a weight during an update (calls of DTensor.full_tensor and
   all_gather_into_tensor counted on every rank, the counter shown to see
   the check's own gather); the server's weights version is the step;
2. bad input: no plan file, a plan for another model (refused when the
   backend is made); a plan whose training layout is not the trainer's mesh
   (refused on every trainer rank before connecting, naming both); a plan
   whose inference layout is not the rollout's sizes (naming both); verl of
   another version (one line);
3. an update that fails on one rank (one trainer rank's session closed):
   every trainer rank and the rollout end with a named error, and the
   server's weights version says the weights are no step's.

    build/vllm-venv/bin/python tests/verl/refit.py --build build
"""
import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
VLLM_TESTS = os.path.join(ROOT, "tests", "vllm")
sys.path[:0] = [HERE, VLLM_TESTS, os.path.join(ROOT, "tests")]

ENV = {"VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "VERL_PLATFORM": "cpu", "OMP_NUM_THREADS": "1",
       "VLLM_WORKER_MULTIPROC_METHOD": "spawn", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_LOGGING_LEVEL": "WARNING",
       "TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "0", "VERL_LOGGING_LEVEL": "WARNING",
       "PYTHONWARNINGS": "ignore::UserWarning,ignore::DeprecationWarning,ignore::FutureWarning",
       "PYTHONPATH": os.pathsep.join([HERE, VLLM_TESTS, os.path.join(ROOT, "tests")])}
os.environ.update({k: v for k, v in ENV.items() if k != "PYTHONPATH"})

QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "vocab_size": 256, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
         "tie_word_embeddings": False, "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": False,
         "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
TRAINER_RANKS = 2
TP = 2
TIMEOUT_S = 60.0


def check(cond, what):
    if not cond:
        raise SystemExit(f"verl: FAILED: {what}")
    print(f"ok: {what}", flush=True)


def write_model(directory, config, seed):
    """A tiny Qwen3 checkpoint (config.json, model.safetensors of bf16 values) and a word-level tokenizer."""
    import checkpoint
    import reshard
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    spec = reshard.init(config, train="fsdp2:dp_shard=1", infer="hf")["model"]
    tensors = checkpoint.expand(spec)
    checkpoint.write(directory, config, checkpoint.random_values(tensors, seed))
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, config["vocab_size"])}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                            unk_token="<pad>").save_pretrained(directory)
    return directory


def verl_config(model_dir, plan_path, extra=()):
    """verl's own ppo_trainer config for this job, composed by Hydra from verl's config directory."""
    import verl
    from hydra import compose, initialize_config_dir

    overrides = [
        f"actor_rollout_ref.model.path={model_dir}",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={TP}",
        "actor_rollout_ref.rollout.nnodes=1",
        f"actor_rollout_ref.rollout.n_gpus_per_node={TP}",
        "trainer.nnodes=1",
        f"trainer.n_gpus_per_node={TRAINER_RANKS}",
        # reshard's backend: the lines a user writes (docs/verl.md)
        "actor_rollout_ref.rollout.checkpoint_engine.backend=reshard",
        "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=reshard.verl",
        f"+actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.reshard.plan_path={plan_path}",
        f"+actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.reshard.model={model_dir}",
        f"+actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.reshard.timeout_s={TIMEOUT_S}",
        *extra]
    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"),
                               version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def bad_input(cfg, work, model_dir, plan_path, actor_wg, replica):
    """The refusals that come before any byte moves."""
    import reshard
    import reshard.verl
    from verl.checkpoint_engine import CheckpointEngineRegistry

    try:
        CheckpointEngineRegistry.new("reshard", bucket_size=1 << 20)
        text = None
    except ValueError as e:
        text = str(e)
    check(text is not None and "engine_kwargs.reshard.plan_path" in text,
          f"backend=reshard without a plan is refused when the backend is made: {text}")
    other = dict(QWEN3, intermediate_size=96)
    other_dir = write_model(os.path.join(work, "other-model"), other, seed=5)
    try:
        CheckpointEngineRegistry.new("reshard", bucket_size=1 << 20, plan_path=plan_path, model=other_dir)
        text = None
    except reshard.verl.PlanMismatchError as e:
        text = str(e)
    check(text is not None and "make the plan from this model's config" in text,
          f"a plan for another model is refused when the backend is made: {text}")

    # A plan for FSDP2 over 2 ranks with dp_replicate 2 (HSDP) has this job's rank count; the trainer is 1-D.
    wrong = make_plan(cfg, work, "plan-hsdp", ["actor_rollout_ref.actor.fsdp_config.fsdp_size=1"], model_dir)
    texts = actor_wg.check_plan(wrong)
    check(len(texts) == TRAINER_RANKS and all("fsdp2-dp_replicate2-dp_shard1-fp32" in t and
                                              "DeviceMesh of fsdp 2" in t for t in texts),
          "a plan whose training layout is not the trainer's mesh is refused on every trainer rank before "
          f"connecting, naming both: {texts[0]}")
    tp1 = make_plan(cfg, work, "plan-tp1", ["actor_rollout_ref.rollout.tensor_model_parallel_size=1"], model_dir)
    try:
        reshard.verl.check_rollout(reshard.Plan.open(tp1), replica.config, 1)
        text = None
    except reshard.verl.PlanMismatchError as e:
        text = str(e)
    check(text is not None and "'vllm-tp1-x2'" in text and "TP 2 PP 1 DP 1, 1 replica" in text,
          f"a plan whose inference layout is not the rollout's sizes is refused, naming both: {text}")
    py = ("import verl; verl.__version__ = '0.9.2'\n"
          "try:\n    import reshard.verl\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", py], capture_output=True, text=True, env=dict(os.environ))
    lines = out.stdout.strip().splitlines()
    check(len(lines) == 1 and "proven on verl 0.9.1" in lines[0] and "RESHARD_VERL_ANY_VERSION=1" in lines[0],
          f"verl of another version: one line saying which is proven and how to override: {lines}")


def make_plan(cfg, work, name, overrides, model_dir):
    """reshard.verl.make_plan from verl's config (with `overrides`)."""
    import reshard.verl
    from omegaconf import OmegaConf

    c = OmegaConf.to_container(cfg, resolve=False)
    c2 = OmegaConf.create(c)
    for o in overrides:
        k, v = o.split("=", 1)
        OmegaConf.update(c2, k, int(v) if v.lstrip("-").isdigit() else v, merge=True)
    OmegaConf.update(c2, "actor_rollout_ref.model.path", model_dir, merge=True)
    return reshard.verl.make_plan(c2, os.path.join(work, name), cluster="dgx-h100")


class Job:
    """The running job: verl's config, the plan, the trainer's and the rollout's worker groups, the manager."""


@contextlib.contextmanager
def job(work):
    """A local Ray cluster running this job (the tiny model, its plan from verl's config, verl's actor workers,
    the rollout replica and verl's CheckpointEngineManager); Ray is shut down on the way out, whatever happens."""
    import ray

    import reshard

    j = Job()
    t_start = time.time()
    j.model_dir = write_model(os.path.join(work, "model"), QWEN3, seed=1)
    j.plan_path = make_plan(verl_config(j.model_dir, "unset"), work, "plan", [], j.model_dir)
    j.cfg = verl_config(j.model_dir, j.plan_path)
    j.plan = reshard.Plan.open(j.plan_path)
    print(f"verl: plan {j.plan.inputs} from reshard.verl.make_plan", flush=True)
    ray.init(num_cpus=16, num_gpus=0, include_dashboard=False,
             runtime_env={"env_vars": ENV, "worker_process_setup_hook": "verl_cpu.setup"})
    try:
        start(j)
        j.startup_s = time.time() - t_start
        print(f"verl: trainer ({TRAINER_RANKS} FSDP2 ranks) and rollout (vLLM TP {TP}) up in {j.startup_s:.0f} s",
              flush=True)
        yield j
    finally:
        try:
            if getattr(j, "server", None) is not None:
                ray.get(j.server.shutdown.remote(), timeout=60)
        except Exception:  # noqa: BLE001 - the cluster goes down next
            pass
        ray.shutdown()


def start(j):
    import asyncio

    import ray
    import verl_cpu

    verl_cpu.setup()
    from verl.checkpoint_engine import CheckpointEngineManager
    from verl.checkpoint_engine.base import CheckpointEngineWorker
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.utils.config import omega_conf_to_dataclass

    import workers

    pool = RayResourcePool(process_on_nodes=[TRAINER_RANKS], use_gpu=False, name_prefix="actor_pool",
                           max_colocate_count=1)
    j.actor_wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(
        cls=ray.remote(workers.ActorWorker), config=j.cfg.actor_rollout_ref, role="actor"), device_name="cpu")
    j.actor_wg.init_model()
    model_config = omega_conf_to_dataclass(j.cfg.actor_rollout_ref.model)
    j.replica = workers.CpuVllmReplica(replica_rank=0, config=j.cfg.actor_rollout_ref.rollout,
                                       model_config=model_config, gpus_per_node=TP, model_dir=j.model_dir, env=ENV)
    asyncio.run(j.replica.init_cpu())
    j.server = j.replica.servers[0]
    j.manager = CheckpointEngineManager(
        config=omega_conf_to_dataclass(j.cfg.actor_rollout_ref.rollout.checkpoint_engine), actor_wg=j.actor_wg,
        replicas=[j.replica])
    # verl's manager makes the same group from the replica's workers at every update
    j.rollout_wg = RayWorkerGroup(worker_handles=j.replica.workers,
                                  ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(CheckpointEngineWorker)))
    j.parameters = sum(n for n in j.actor_wg.parameter_count())


def describe(wg):
    import ray

    return ray.get(wg.execute_checkpoint_engine(["describe"] * wg.world_size))


def run(j, work):
    import ray

    plan, server = j.plan, j.server
    check(all(d["plan"] == j.plan_path for d in describe(j.actor_wg) + describe(j.rollout_wg)),
          "verl's CheckpointEngineRegistry made reshard's backend from the config on every trainer and rollout worker")
    ray.get(server.collective_rpc.remote("reshard_mark"))
    timings = {"startup_s": round(j.startup_s, 1), "updates": []}
    sessions = None
    for step in (1, 2):
        if step == 2:
            losses = j.actor_wg.optimizer_step(seed=step)
            check(len(losses) == TRAINER_RANKS, f"a real optimizer step of the trainer (AdamW, loss {losses[0]:.4f})")
        j.actor_wg.weight_gathers()
        t0 = time.perf_counter()
        metrics = j.manager.update_weights(global_steps=step)
        update_s = time.perf_counter() - t0
        gathers = j.actor_wg.weight_gathers()
        check(gathers == [0] * TRAINER_RANKS, f"update {step}: no trainer rank gathered a weight (DTensor.full_tensor, "
              f"all_gather_into_tensor: {gathers} calls)")
        ckpt = os.path.join(work, f"step{step}")
        n = j.actor_wg.dump_bf16(ckpt)
        gathers = j.actor_wg.weight_gathers()
        check(all(g >= n[0] for g in gathers), f"the counter sees a gather: the check's own dump of the trainer's "
              f"weights (full_tensor of {n[0]} parameters) counted {gathers} calls")
        results = ray.get(server.collective_rpc.remote("reshard_compare", args=(ckpt,)))
        bad = [f"worker {r['rank']}: {d}" for r in results for d in r["differences"]]
        bad += [f"worker {r['rank']}: moved {r['moved']}" for r in results if r["moved"]]
        check(not bad and [r["plan_rank"] for r in results] == plan.dest_ranks,
              f"update {step} ({update_s:.2f} s through CheckpointEngineManager.update_weights): every parameter and "
              f"buffer of the {TP} vLLM workers ({results[0]['tensors']} tensors each) equals a fresh vLLM load of "
              "the trainer's weights, bit for bit; nothing moved" + ("" if not bad else ":\n  " + "\n  ".join(bad)))
        d = describe(j.actor_wg)
        now = [(x["session"], x["transport"]) for x in d]
        check(all(x["updates"] == step and x["rebinds"] == 0 for x in d) and (sessions is None or now == sessions),
              f"update {step}: one session per trainer rank for the job (the same session and transport, no re-bind)")
        sessions = now
        check(ray.get(server.get_global_steps.remote()) == step, f"update {step}: the server's weights version is {step}")
        timings["updates"].append({"step": step, "update_s": round(update_s, 3), "metrics": metrics})

    bad_input(j.cfg, work, j.model_dir, j.plan_path, j.actor_wg, j.replica)

    # An update that fails on one rank: trainer rank 1's session closed (as if its transport died).
    ray.get(j.actor_wg.execute_checkpoint_engine(["describe", "close"]))
    try:
        j.manager.update_weights(global_steps=3)
        text = None
    except Exception as e:  # noqa: BLE001 - the failure under test
        text = str(e)
    named = [line for line in (text or "").splitlines() if "UpdateFailedError:" in line]
    check(bool(named), f"update 3 with one trainer rank closed raises a named error: {(named or ['none'])[0][:300]}")
    deadline = time.time() + TIMEOUT_S * 2
    while True:
        d_actor, d_rollout = describe(j.actor_wg), describe(j.rollout_wg)
        if (all(x["failed"] for x in d_actor) and d_rollout[0]["failed"]) or time.time() > deadline:
            break
        time.sleep(1)
    check(all(x["failed"] and x["session"] is None for x in d_actor),
          "every trainer rank ended with a named error and closed its session: "
          + "; ".join((x["failed"] or "none")[:160] for x in d_actor))
    check(d_rollout[0]["failed"] is not None, "the rollout ended with a named error: "
          f"{(d_rollout[0]['failed'] or '')[:300]}")
    steps = ray.get(server.get_global_steps.remote())
    check(steps == -1, f"the server's weights version is -1 (no step's weights), not 2: {steps}")
    try:
        j.manager.update_weights(global_steps=4)
        text = None
    except Exception as e:  # noqa: BLE001
        text = str(e)
    check(text is not None and "an earlier update failed" in text, "later updates are refused, saying why")
    return timings


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--work", help="keep checkpoints, plans and logs here (default: a temporary folder)")
    ap.add_argument("--json", metavar="FILE", help="write the timings here")
    a = ap.parse_args(argv)
    work = a.work or tempfile.mkdtemp(prefix="reshard-verl-")
    os.makedirs(work, exist_ok=True)
    t_start = time.time()
    with job(work) as j:
        timings = run(j, work)
    timings["total_s"] = round(time.time() - t_start, 1)
    print("  " + json.dumps(timings), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(timings, f, indent=1)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    print(f"verl: all checks passed in {time.time() - t_start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
