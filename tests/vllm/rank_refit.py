"""One real vLLM rank (engine.py) of a live refit: built from a checkpoint
with other values, its model bound once by reshard.vllm.WorkerRefit, then
for each round: one refit (the plan's run plus the engine's post-processing),
and a comparison, bit for bit, of every parameter and buffer with a fresh
vLLM model loaded from that round's checkpoint (written by refit_live.py).
Then the cost of WorkerRefit.run against a bare Session.run. Writes
WORK/vllm-rank{R}.json.

    RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python rank_refit.py ARGS_JSON
"""
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE]

import engine  # noqa: E402  (sets the CPU environment before vLLM is imported)


def wait_for(path, timeout_s):
    t0 = time.time()
    while not os.path.exists(path):
        if time.time() - t0 > timeout_s:
            raise TimeoutError(f"{path} did not appear within {timeout_s:.0f} s")
        time.sleep(0.1)


def bits(t):
    import torch
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def differences(state, fresh):
    """Names whose dtype, shape, strides or bits differ, and names only one side has."""
    import torch
    out = [f"only in the refit engine: {n}" for n in sorted(set(state) - set(fresh))]
    out += [f"only in the fresh engine: {n}" for n in sorted(set(fresh) - set(state))]
    for n in sorted(set(state) & set(fresh)):
        (a, stride), b = state[n], fresh[n]
        if a.dtype != b.dtype or a.shape != b.shape or stride != b.stride():
            out.append(f"{n}: {a.dtype}{list(a.shape)}:{list(stride)} vs fresh {b.dtype}{list(b.shape)}:"
                       f"{list(b.stride())}")
        elif not torch.equal(bits(a), bits(b)):
            out.append(f"{n}: values differ")
    return out


def snapshot(model):
    """{name: (a copy of the values, the live tensor's strides)}: a copy of a
    view that covers part of its storage (MLA's W_UV) gets other strides."""
    import engine
    return {n: (t.detach().clone(), t.stride()) for n, t in engine.all_tensors(model).items()}


def main():
    a = json.loads(sys.argv[1])
    rank = int(os.environ["RANK"])
    model, config = engine.build(a["initial"], **a["settings"])
    import torch
    import reshard
    import reshard.vllm

    plan = reshard.Plan.open(a["plan"])
    g = a["first"] + rank
    session = None if a.get("via") == "weight-transfer-engine" else reshard.Session(
        plan, g, reshard.GlooTransport(g, plan.num_ranks, store=a["store"], timeout_s=a["timeout_s"]))
    engine_api = None
    if a.get("via") == "weight-transfer-engine":
        # vLLM's own interface: the engine registered in WeightTransferEngineFactory
        # and made by it, as a worker does for weight_transfer_config.backend = "reshard".
        from vllm.config.weight_transfer import WeightTransferConfig
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

        reshard.vllm.register()
        engine_api = WeightTransferEngineFactory.create_engine(WeightTransferConfig(backend="reshard"), config,
                                                               torch.device("cpu"), model)
        assert isinstance(engine_api, reshard.vllm.ReshardWeightTransferEngine), type(engine_api)
        # One dict for every rank, as collective_rpc sends it: each rank finds its plan rank from
        # rank_offset and its DP / PP / TP ranks in vLLM's parallel state.
        engine_api.init_transfer_engine(engine_api.parse_init_info(
            {"plan_path": a["plan"], "rank_offset": a["first"], "store": a["store"], "timeout_s": a["timeout_s"]}))
        if engine_api.refit.session.rank != g:
            raise SystemExit(f"rank {rank}: the engine took plan rank {engine_api.refit.session.rank} from "
                             f"rank_offset {a['first']}, expected {g}")
        refit = engine_api.refit
        session = refit.session
    else:
        refit = reshard.vllm.WorkerRefit(session, model, config)
    written = sorted(b.name for b in session.buffers if b.is_destination)
    derived = [n + "." + w for n, _ in refit._derived for w in ("W_UV", "W_UK_T")]
    where = {n: (t.data_ptr(), t.untyped_storage().nbytes()) for n, t in engine.all_tensors(model).items()}
    result = {"rank": rank, "global_rank": g, "written": len(written), "derived": derived, "rounds": []}
    before = snapshot(model)
    for k in range(a["rounds"]):
        # refit.run() in its steps, to also compare the engine between the two:
        # without the post-processing, exactly the derived tensors must be stale.
        t0 = time.perf_counter()
        if engine_api is not None:  # start, update, finish as a vLLM worker calls them
            engine_api.start_weight_update()
            engine_api.update_weights({"step": k})
            stats = engine_api.stats
            unfinished = snapshot(model)
            engine_api.finish_weight_update()
        else:
            refit.rebind_if_replaced()
            stats = session.run()
            unfinished = snapshot(model)
            refit.finish()
        total = time.perf_counter() - t0
        state = snapshot(model)
        changed = [n for n in written + derived if not torch.equal(bits(state[n][0]), bits(before[n][0]))]
        unchanged = sorted(set(written + derived) - set(changed))
        ckpt = os.path.join(a["work"], f"round{k}", "model")
        wait_for(os.path.join(ckpt, "READY"), a["timeout_s"])
        fresh = engine.fresh(config, ckpt)
        diffs = differences(state, engine.all_tensors(fresh))
        stale = sorted(d.split(":")[0] for d in differences(unfinished, engine.all_tensors(fresh)))
        del fresh
        result["rounds"].append({"run_s": stats.seconds, "refit_s": total, "finish_s": refit.last_finish_s,
                                 "tensors": len(state), "differences": diffs, "changed": len(changed),
                                 "stale_without_finish": stale,
                                 "unchanged": unchanged})
        before = state
    moved = [n for n, t in engine.all_tensors(model).items() if (t.data_ptr(), t.untyped_storage().nbytes()) != where.get(n)]
    result["moved"] = moved
    # The cost of going through reshard.vllm: bare Session.run() then WorkerRefit.run(), as many each.
    bare, full = [], []
    for _ in range(a["timed_runs"]):
        t0 = time.perf_counter()
        session.run()
        bare.append(time.perf_counter() - t0)
    check = []
    for _ in range(a["timed_runs"]):
        t0 = time.perf_counter()
        refit.run()
        full.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        refit.rebind_if_replaced()  # the per-run check alone (nothing replaced: no re-bind)
        check.append(time.perf_counter() - t0)
    result["rebind_check_s"] = statistics.median(check)
    result["bare_run_s"] = statistics.median(bare) if bare else None
    result["worker_refit_run_s"] = statistics.median(full) if full else None
    with open(os.path.join(a["work"], f"vllm-rank{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
