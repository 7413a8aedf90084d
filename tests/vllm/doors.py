#!/usr/bin/env python3
"""reshard through vLLM 0.33's own weight-transfer doors, on real vLLM CPU
processes, as an RL trainer meets a vLLM server:

- discovery: the ``vllm.general_plugins`` entry point
  (reshard.vllm_plugin:register), found by vLLM's own
  ``load_general_plugins`` here and in every process vLLM starts (the
  workers are spawned, so each loads the group itself:
  ``v1/worker/worker_base.py`` ``init_worker``); under another vLLM version,
  or one without the trainer factory, one logged line and nothing
  registered. Until the package declares the entry point, a dist-info
  declaring it is put on the path (``probe_dist``);
- the worker side: ``weight_transfer_config={"backend": "reshard"}`` makes
  vLLM's ``Worker.load_model`` create the engine through
  ``WeightTransferEngineFactory``; one init dict, sent once, reaches every
  worker through ``collective_rpc``; each finds its plan rank from
  ``rank_offset`` and its DP / PP / TP ranks. A dict with one ``rank`` for
  a TP engine, and a ``rank_offset`` that is not a first worker, are
  refused naming the workers, and the engine's RPC replies stay in step
  after each refusal;
- the trainer side: ``WeightTransferTrainerFactory.trainer_init`` with
  ``ReshardTrainerInitInfo`` on both ranks of an FSDP2-layout trainer
  (``reshard init --train fsdp2:dp_shard=2``: each rank holds torch.chunk
  row shards of every HF tensor, in a torch module under
  ``ModuleSource``), rank 0 driving the engine through the client;
  ``send_weights()`` on both ranks, twice with new values; after each,
  every parameter and buffer of every vLLM worker equals a fresh vLLM load
  of a checkpoint of the same values, bit for bit, and nothing moved in
  memory.

Doors (--door, repeatable): "http" is ``vllm serve`` (API server, engine
core and worker processes; the RL routes need VLLM_SERVER_DEV_MODE=1,
``entrypoints/launchers/api_server/routers.py``) driven by vLLM's
``HTTPVLLMWeightSyncClient``; "llm" is ``vllm.LLM`` in this process (its
engine core and workers in their own), driven through
``LLM.init_weight_transfer_engine`` / ``start_weight_update`` /
``update_weights`` / ``finish_weight_update`` (``entrypoints/rl/offline.py``).
Both run vLLM's multiprocess executor over ``worker_cls`` =
cpu_worker.CpuWorker: vLLM's GPU worker with the device, model runner and
KV-cache sizing replaced for a CPU (no forward pass runs; cpu_worker.py).

    build/vllm-venv/bin/python tests/vllm/doors.py --build build [--door http] [--door llm] [--tp 2] [--pp 1]
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path[:0] = [HERE, os.path.join(ROOT, "tests")]

import engine  # noqa: E402,F401  (the CPU environment, before vLLM is imported)
import checkpoint  # noqa: E402
import vllm_cases  # noqa: E402
from free_port import free_port  # noqa: E402

CONFIG = "vllm-dense-tp4"  # tests/data/recorded: a Llama with 2 KV heads, 4 layers
TRAIN = "fsdp2:dp_shard=2,master=bf16"
TRAINER_RANKS = 2
ROUNDS = 2
TIMEOUT_S = 120.0
START_TIMEOUT_S = 600.0
ENTRY_POINT = "reshard = reshard.vllm_plugin:register"


def check(cond, what):
    if not cond:
        raise SystemExit(f"doors: FAILED: {what}")
    print(f"ok: {what}", flush=True)


def children_env(extra_path):
    """The environment of every vLLM process this test starts."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([p for p in extra_path + [env.get("PYTHONPATH", "")] if p])
    env.update(VLLM_TARGET_DEVICE="cpu", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
               # each worker a fresh interpreter: it must find the entry point itself
               VLLM_WORKER_MULTIPROC_METHOD="spawn",
               # vLLM's CPU executor binds each worker's OpenMP threads to a NUMA node of its own unless told not to
               # (utils/ompmultiprocessing.py): this machine has one
               VLLM_CPU_OMP_THREADS_BIND="nobind",
               VLLM_SERVER_DEV_MODE="1")
    return env


def probe_dist(work):
    """A folder holding a dist-info that declares reshard's entry point, or
    None when the installed reshard declares it already."""
    from importlib.metadata import entry_points

    if any(ep.value == "reshard.vllm_plugin:register" for ep in entry_points(group="vllm.general_plugins")):
        return None
    d = os.path.join(work, "entry-point", "reshard_vllm_plugin_probe-0.dist-info")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: reshard-vllm-plugin-probe\nVersion: 0\n")
    with open(os.path.join(d, "entry_points.txt"), "w") as f:
        f.write(f"[vllm.general_plugins]\n{ENTRY_POINT}\n")
    return os.path.dirname(d)


# -- discovery -----------------------------------------------------------------------------------------

class Records:
    def __init__(self):
        import logging

        self.lines = []
        self.handler = logging.Handler()
        self.handler.emit = lambda r: self.lines.append(r.getMessage())

    def __enter__(self):
        import logging

        logging.getLogger("reshard").addHandler(self.handler)
        return self

    def __exit__(self, *exc):
        import logging

        logging.getLogger("reshard").removeHandler(self.handler)


def registered():
    from vllm.distributed.weight_transfer import factory

    return ["reshard" in factory.WeightTransferEngineFactory._registry,
            "reshard" in factory.WeightTransferTrainerFactory._registry]


def load_plugins_again():
    import vllm.plugins

    vllm.plugins.plugins_loaded = False  # one load per process (plugins/__init__.py): this test loads thrice
    vllm.plugins.load_general_plugins()


def discovery_checks():
    import vllm
    from vllm.distributed.weight_transfer import factory

    check(registered() == [False, False], "before vLLM loads its plug-ins, neither factory has 'reshard'")
    saved = vllm.__version__
    vllm.__version__ = "0.34.0"
    try:
        with Records() as r:
            load_plugins_again()
    finally:
        vllm.__version__ = saved
    check(registered() == [False, False] and len(r.lines) == 1 and "\n" not in r.lines[0]
          and "this is vLLM 0.34.0" in r.lines[0],
          f"under another vLLM version the plug-in registers nothing and logs one line: {r.lines}")
    trainer_factory = factory.WeightTransferTrainerFactory
    del factory.WeightTransferTrainerFactory
    try:
        with Records() as r:
            load_plugins_again()
    finally:
        factory.WeightTransferTrainerFactory = trainer_factory
    check(registered() == [False, False] and len(r.lines) == 1 and "WeightTransferTrainerFactory" in r.lines[0],
          f"under a vLLM without the trainer factory it registers neither engine and logs one line: {r.lines}")
    with Records() as r:
        load_plugins_again()
    engines = [factory.WeightTransferEngineFactory._registry["reshard"]().__name__,
               factory.WeightTransferTrainerFactory._registry["reshard"]().__name__]
    check(r.lines == [] and engines == ["ReshardWeightTransferEngine", "ReshardTrainerWeightTransferEngine"],
          f"vLLM's load_general_plugins finds the entry point and registers both engines: {engines}")
    import reshard.vllm_plugin

    check(reshard.vllm_plugin.register() is True, "registering again is a no-op")


# -- specs, values, checkpoints ------------------------------------------------------------------------

def reshard_cli(build, *args):
    subprocess.run([os.path.join(build, "reshard"), *args], check=True, stdout=subprocess.DEVNULL)


def make_plan(build, work, infer):
    config = vllm_cases.config(CONFIG)
    d = os.path.join(work, "specs")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    reshard_cli(build, "init", "-q", "--hf-config", os.path.join(d, "config.json"), "--train", TRAIN, "--infer",
                infer, "-o", d)
    plan = os.path.join(work, "refit.rsplan")
    reshard_cli(build, "compile", "-q", "--model", os.path.join(d, "model.json"), "--from",
                os.path.join(d, "train.json"), "--to", os.path.join(d, "infer.json"), "--cluster",
                os.path.join(ROOT, "samples", "clusters", "dgx-h100.json"), "-o", plan)
    with open(os.path.join(d, "model.json")) as f:
        return config, plan, checkpoint.expand(json.load(f))


def write_checkpoint(path, config, values):
    checkpoint.write(path, config, checkpoint.checkpoint_tensors(config, values))
    return path


def trainer_module(full, rank):
    """This FSDP2 rank's shards (dim 0 in torch.chunk sizes over dp_shard) of every HF tensor, as the
    parameters of a torch module under their HF names."""
    import torch

    root = torch.nn.Module()
    for name, t in full.items():
        *path, leaf = name.split(".")
        m = root
        for p in path:
            if p not in m._modules:
                m.add_module(p, torch.nn.Module())
            m = m._modules[p]
        chunks = torch.chunk(t, TRAINER_RANKS, dim=0)
        local = chunks[rank] if rank < len(chunks) else t[:0]
        m.register_parameter(leaf, torch.nn.Parameter(local.clone(), requires_grad=False))
    return root


def fill(module, full, rank):
    """New values in place (an optimizer step's effect): the bound memory."""
    import torch

    with torch.no_grad():
        for name, p in module.named_parameters():
            chunks = torch.chunk(full[name], TRAINER_RANKS, dim=0)
            if rank < len(chunks):
                p.copy_(chunks[rank])


# -- the doors -----------------------------------------------------------------------------------------

class HttpDoor:
    """`vllm serve` in its own processes; vLLM's HTTP client."""

    name = "http"

    def __init__(self, model, settings, env, log):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        cmd = [os.path.join(os.path.dirname(sys.executable), "vllm"), "serve", model, "--host", "127.0.0.1",
               "--port", str(self.port), *engine_args(settings, cli=True)]
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_die_with_parent)
        import requests

        t0 = time.time()
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"doors: vllm serve exited with {self.proc.returncode}:\n{self.tail()}")
            if time.time() - t0 > START_TIMEOUT_S:
                raise SystemExit(f"doors: vllm serve did not answer /health in {START_TIMEOUT_S:.0f} s:\n{self.tail()}")
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(1)
        from vllm.distributed.weight_transfer import HTTPVLLMWeightSyncClient

        self.client = HTTPVLLMWeightSyncClient(self.url, timeout=TIMEOUT_S * 2)

    def tail(self):
        self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-40:])

    def rpc(self, method, *args):
        import requests

        r = requests.post(self.url + "/collective_rpc", json={"method": method, "args": list(args)},
                          timeout=TIMEOUT_S * 2)
        r.raise_for_status()
        return r.json()["results"]

    @staticmethod
    def error_text(e):
        resp = getattr(e, "response", None)
        return resp.text if resp is not None else str(e)

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def _die_with_parent():
    """In the server's process: SIGKILL when this test's process dies, however it dies, so no server outlives
    the test (its engine core and workers then exit by themselves; after a SIGTERM the API server waited for
    its background tasks without end)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class LLMClient:
    """vLLM's four-method client protocol (VLLMWeightSyncClient, base.py) over a vllm.LLM in this
    process, as RayVLLMWeightSyncClient wraps LLM actors (clients.py)."""

    def __init__(self, llm):
        self.llm = llm

    def init_weight_transfer_engine(self, init_info):
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        self.llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info))

    def start_weight_update(self):
        self.llm.start_weight_update()

    def update_weights(self, update_info):
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        self.llm.update_weights(WeightTransferUpdateRequest(update_info=update_info))

    def finish_weight_update(self, weight_version=None):
        self.llm.finish_weight_update(weight_version)

    def shutdown_weight_transfer_engine(self):
        self.llm.shutdown_weight_transfer_engine()


class LLMDoor:
    """vllm.LLM here (engine core and workers in their own processes)."""

    name = "llm"

    def __init__(self, model, settings, env, log):
        from vllm import LLM

        os.environ.update({k: v for k, v in env.items() if k.startswith("VLLM_") or k == "PYTHONPATH"})
        self.llm = LLM(model=model, **engine_args(settings, cli=False))
        self.client = LLMClient(self.llm)

    def rpc(self, method, *args):
        return self.llm.collective_rpc(method, args=args)

    @staticmethod
    def error_text(e):
        return str(e)

    def close(self):
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm


def engine_args(settings, cli):
    """vLLM's settings for a CPU engine of `settings` (tp, pp) with reshard's weight transfer."""
    a = dict(tensor_parallel_size=settings["tp"], pipeline_parallel_size=settings["pp"],
             distributed_executor_backend="mp", worker_cls="cpu_worker.CpuWorker",
             weight_transfer_config={"backend": "reshard"}, moe_backend="triton", enforce_eager=True,
             skip_tokenizer_init=True, dtype="bfloat16", seed=0,
             # no prefix cache: the scheduler of an engine without KV-cache groups (cpu_worker.py) needs none
             enable_prefix_caching=False)
    if not cli:
        return a
    out = []
    for k, v in a.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            out.append(flag)
        elif v is False:
            out.append("--no-" + flag[2:])
        else:
            out += [flag, json.dumps(v) if isinstance(v, dict) else str(v)]
    return out


def run_ranks(fns):
    """Calls every function on a thread of its own (the trainer's ranks); returns their results or raises the
    first error."""
    out, errors = [None] * len(fns), []

    def call(i, fn):
        try:
            out[i] = fn()
        except BaseException as e:  # noqa: BLE001 - raised below
            errors.append(e)

    threads = [threading.Thread(target=call, args=(i, fn), daemon=True) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S * 3)
    if errors:
        raise errors[0]
    if any(t.is_alive() for t in threads):
        raise SystemExit("doors: a trainer rank did not return")
    return out


def refusals(door, plan_path, plan, work, world):
    """One init dict with one plan rank for a TP engine, and a rank_offset that is not a first worker: refused
    naming the workers, and the engine's RPC replies in step after each (rpc 'reshard_worker_rank')."""
    first = plan.dest_ranks[0]
    cases = [({"rank": first}, f"the init info names one plan rank ({first}) and this engine has {world} workers"),
             ({"rank_offset": first + 1}, "rank_offset must be the plan rank of an engine's first worker")]
    for k, (fields, want) in enumerate(cases):
        store = os.path.join(work, f"refused-store{k}")
        os.makedirs(store)
        try:
            door.client.init_weight_transfer_engine(dict(fields, plan_path=plan_path, store=store, timeout_s=10.0))
            text = None
        except Exception as e:  # noqa: BLE001 - the refusal under test
            text = door.error_text(e)
        check(text is not None and "vLLM worker DP 0 PP 0 TP 0" in text and want in text,
              f"{door.name}: {fields} is refused before any connection, naming the workers: "
              f"{(text or 'accepted')[:300]}")
        check([x["rank"] for x in door.rpc("reshard_worker_rank")] == list(range(world)),
              f"{door.name}: after the refusal every worker's reply comes back in step with its call")


def run_door(door_cls, args, work, plan_path, config, tensors, env):
    import reshard
    import torch  # noqa: F401
    from vllm.distributed.weight_transfer.base import ModuleSource
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    from reshard.vllm_trainer import ReshardTrainerInitInfo

    settings = {"tp": args.tp, "pp": args.pp}
    world = args.tp * args.pp
    plan = reshard.Plan.open(plan_path)
    dwork = os.path.join(work, door_cls.name)
    os.makedirs(dwork)
    initial = write_checkpoint(os.path.join(dwork, "initial"), config, checkpoint.random_values(tensors, 1))
    t0 = time.time()
    door = door_cls(initial, settings, env, os.path.join(dwork, "vllm.log"))
    started = time.time() - t0
    print(f"{door.name}: vLLM engine of TP {args.tp} PP {args.pp} up in {started:.0f} s", flush=True)
    engines = None
    try:
        check([x["engine"] for x in door.rpc("reshard_engine_class")] == ["ReshardWeightTransferEngine"] * world,
              f"{door.name}: each of the {world} workers made its engine through WeightTransferEngineFactory, from "
              "the 'reshard' that the entry point registered in that worker's own process")
        refusals(door, plan_path, plan, dwork, world)
        full = checkpoint.random_values(tensors, 100)
        modules = [trainer_module(full, r) for r in range(TRAINER_RANKS)]
        # A refusal reaches trainer_init at once, not after the transport's timeout (the trainer ranks'
        # connect threads are left to it).
        store = os.path.join(dwork, "refused-store-trainer")
        os.makedirs(store)
        t0 = time.time()
        try:
            WeightTransferTrainerFactory.trainer_init(
                ReshardTrainerInitInfo(rank=0, plan_path=plan_path, store=store, rank_offset=plan.dest_ranks[0] + 1,
                                       timeout_s=30.0), client=door.client, source=ModuleSource(modules[0]))
            text = None
        except Exception as e:  # noqa: BLE001 - the refusal under test
            text = door.error_text(e)
        check(text is not None and "rank_offset must be the plan rank of an engine's first worker" in text
              and time.time() - t0 < 30.0,
              f"{door.name}: trainer_init raises the workers' refusal in {time.time() - t0:.1f} s, within the 30 s "
              "its transport would wait")
        store = os.path.join(dwork, "store")
        os.makedirs(store)
        t0 = time.time()
        engines = run_ranks([
            (lambda r=r: WeightTransferTrainerFactory.trainer_init(
                ReshardTrainerInitInfo(rank=r, plan_path=plan_path, store=store, timeout_s=TIMEOUT_S),
                client=door.client, source=ModuleSource(modules[r])))
            for r in range(TRAINER_RANKS)])
        init_s = time.time() - t0
        check(engines[0].worker_init == {"plan_path": plan_path, "rank_offset": plan.dest_ranks[0], "store": store,
                                         "timeout_s": TIMEOUT_S},
              f"{door.name}: trainer_init on both trainer ranks; rank 0 sent one init dict to every worker: "
              f"{engines[0].worker_init}")
        door.rpc("reshard_mark")
        for k in range(ROUNDS):
            full = checkpoint.random_values(tensors, 100 + k)
            for r in range(TRAINER_RANKS):
                fill(modules[r], full, r)
            ckpt = write_checkpoint(os.path.join(dwork, f"round{k}"), config, full)
            t0 = time.time()
            run_ranks([lambda e=e: e.send_weights() for e in engines])
            send_s = time.time() - t0
            results = door.rpc("reshard_compare", ckpt)
            bad = [f"worker {x['rank']}: {d}" for x in results for d in x["differences"]]
            bad += [f"worker {x['rank']}: moved {x['moved']}" for x in results if x["moved"]]
            ranks = [x["plan_rank"] for x in results]
            check(not bad and ranks == [plan.dest_ranks[0] + i for i in range(world)],
                  f"{door.name}: round {k}: send_weights() on both trainer ranks ({send_s:.2f} s); every parameter "
                  f"and buffer of the {world} workers (plan ranks {ranks}, {results[0]['tensors']} tensors on "
                  "worker 0) equals a fresh vLLM load of the round's checkpoint, bit for bit; nothing moved"
                  + ("" if not bad else ":\n  " + "\n  ".join(bad[:20])))
        timings = timed(door, engines, args.timed_runs)
        door.client.shutdown_weight_transfer_engine()
        check([x["initialized"] for x in door.rpc("reshard_engine_initialized")] == [False] * world,
              f"{door.name}: shutdown_weight_transfer_engine releases every worker's session")
        return {"door": door.name, "tp": args.tp, "pp": args.pp, "start_s": round(started, 1),
                "trainer_init_s": round(init_s, 2), **timings}
    finally:
        for e in engines or ():
            e.shutdown()
        door.close()


def timed(door, engines, n):
    """Medians of n updates each way: send_weights() through the door (rank 0's wall time: the engine's start,
    update and finish RPCs around every rank's run, each RPC also timed), and bare Session.run() on every rank at
    once (the workers' through collective_rpc 'reshard_bare_run', which returns each worker's own run time)."""
    send, bare_trainer, bare_worker = [], [], []
    calls = {"start_weight_update": [], "update_weights": [], "finish_weight_update": []}
    client = engines[0].client
    engines[0].client = Timed(client, calls)
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            run_ranks([lambda e=e: e.send_weights() for e in engines])
            send.append(time.perf_counter() - t0)
    finally:
        engines[0].client = client
    for _ in range(n):
        def trainer(e):
            t0 = time.perf_counter()
            e.refit.session.run()
            return time.perf_counter() - t0

        out = run_ranks([lambda: door.rpc("reshard_bare_run")] + [lambda e=e: trainer(e) for e in engines])
        bare_worker.append(max(x["seconds"] for x in out[0]))
        bare_trainer.append(max(out[1:]))
    med = lambda xs: round(statistics.median(xs), 4) if xs else None  # noqa: E731
    return {"timed_runs": n, "send_weights_s": med(send), **{k + "_s": med(v) for k, v in calls.items()},
            "bare_run_trainer_s": med(bare_trainer), "bare_run_worker_s": med(bare_worker)}


class Timed:
    """A client that times each call it passes on (update_weights includes every rank's run)."""

    def __init__(self, client, calls):
        self.client, self.calls = client, calls

    def __getattr__(self, name):
        fn = getattr(self.client, name)
        if name not in self.calls:
            return fn

        def timed_call(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.calls[name].append(time.perf_counter() - t0)
        return timed_call


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--door", action="append", choices=["http", "llm"], help="default: http")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--timed-runs", type=int, default=3)
    ap.add_argument("--work", help="keep checkpoints, plans and the vLLM logs here (default: a temporary folder)")
    ap.add_argument("--json", metavar="FILE", help="write the measurements here")
    a = ap.parse_args(argv)
    work = a.work or tempfile.mkdtemp(prefix="reshard-doors-")
    os.makedirs(work, exist_ok=True)
    t0 = time.time()
    probe = probe_dist(work)
    if probe:
        sys.path.insert(0, probe)
    discovery_checks()
    env = children_env(([probe] if probe else []) + [HERE])
    infer = f"vllm:tp={a.tp}" + (f",pp={a.pp}" if a.pp > 1 else "")
    config, plan, tensors = make_plan(a.build, work, infer)
    out = [run_door({"http": HttpDoor, "llm": LLMDoor}[d], a, work, plan, config, tensors, env)
           for d in (a.door or ["http"])]
    for o in out:
        print("  " + json.dumps(o), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    print(f"doors: all checks passed in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
