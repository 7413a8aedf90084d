"""One real SGLang rank (engine.py) of a live refit through SGLang's own
door: its weight-update session (update_session.py) and reshard's custom
weight loader, with reshard's error hook applied as SGLang's load_plugins
applies a plug-in's hooks. Built from a checkpoint with other values; for
each round: begin_weight_update, update_weights_from_tensor naming
reshard.sglang.load_refit (the plan's run, then post_load_weights),
end_weight_update; then every parameter, buffer and derived MLA attribute
(w_kc, w_vc, w_scale) compared, bit for bit (values and strides), with a
fresh SGLang load of that round's checkpoint (written by refit_live.py).
Then timed refits: the transfer against SGLang's post-processing. Writes
WORK/sglang-rank{R}.json.

    RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python rank_refit.py ARGS_JSON
"""
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE]

import engine  # noqa: E402  (sets the CPU environment before SGLang is imported)
import update_session  # noqa: E402


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
    """{name: (a copy of the values, the live tensor's strides)}."""
    return {n: (t.detach().clone(), t.stride()) for n, t in engine.all_tensors(model).items()}


def where(model):
    """{name: (address, storage bytes)} of every parameter and buffer, and of every derived attribute."""
    import torch
    tensors = dict(model.named_parameters())
    tensors.update(dict(model.named_buffers()))
    tensors.update(engine.derived_attributes(model))
    return {n: (t.data_ptr(), t.untyped_storage().nbytes()) for n, t in tensors.items() if isinstance(t, torch.Tensor)}


def main():
    a = json.loads(sys.argv[1])
    rank = int(os.environ["RANK"])
    s = a["settings"]
    model = engine.build_rank(a["initial"], tp=s["tp"], ep=s.get("ep", 1), attn_dp=s.get("attn_dp", 1),
                              shared_experts=s.get("shared_experts"))
    import torch
    from sglang.srt.managers.io_struct import (BeginWeightUpdateReqInput, EndWeightUpdateReqInput,
                                               UpdateWeightsFromTensorReqInput)
    from sglang.srt.plugins.hook_registry import HookRegistry

    import reshard.sglang as rs

    rs.register()  # what the sglang.srt.plugins entry point does in a scheduler process, then:
    HookRegistry.apply_hooks()
    manager, _ = update_session.weight_updaters(model, [rs.LOADER])
    request = rs.RefitRequest(plan_path=a["plan"], rank_offset=a["first"], store=a["store"],
                              timeout_s=a["timeout_s"])

    # The control: SGLang's derived tensors as the plan's run left them, before reshard re-derives them.
    unfinished = {}
    real_finish = rs.WorkerRefit.finish

    def finish_after_snapshot(self):
        unfinished["state"] = snapshot(self.module)
        real_finish(self)

    rs.WorkerRefit.finish = finish_after_snapshot

    def refit(step):
        """One refit through the session; (update reply, seconds of each call)."""
        t = [time.perf_counter()]
        out = manager.begin_weight_update(BeginWeightUpdateReqInput(selector="target"))
        assert out.success, out.message
        t.append(time.perf_counter())
        req = rs.RefitRequest(**dict(vars(request), step=step))
        reply = manager.update_weights_from_tensor(UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=rs.refit_payload(req, s["tp"]), load_format=rs.LOADER,
            flush_cache=False, selector="target", weight_version=str(step)))
        t.append(time.perf_counter())
        out = manager.end_weight_update(EndWeightUpdateReqInput())
        assert out.success, out.message
        t.append(time.perf_counter())
        return reply, [t[i + 1] - t[i] for i in range(3)]

    result = {"rank": rank, "global_rank": a["first"] + rank}
    at_start = where(model)
    before = snapshot(model)
    result["rounds"] = []
    for k in range(a["rounds"]):
        reply, seconds = refit(k)
        if not reply.success:
            raise SystemExit(f"rank {rank} round {k}: the refit failed: {reply.message}")
        refit_obj = rs.worker_refits()[0]
        state = snapshot(model)
        written = sorted(b.name for b in refit_obj.session.buffers if b.is_destination)
        derived = sorted(engine.derived_attributes(model))
        changed = {n for n in written + derived if not torch.equal(bits(state[n][0]), bits(before[n][0]))}
        ckpt = os.path.join(a["work"], f"round{k}", "model")
        wait_for(os.path.join(ckpt, "READY"), a["timeout_s"])
        fresh = update_session.fresh(ckpt, s["tp"], s.get("ep", 1), s.get("attn_dp", 1), s.get("shared_experts"))
        fresh_tensors = engine.all_tensors(fresh)
        diffs = differences(state, fresh_tensors)
        stale = sorted(d.split(":")[0] for d in differences(unfinished.pop("state"), fresh_tensors))
        del fresh, fresh_tensors
        result["rounds"].append({"tensors": len(state), "written": len(written), "derived": derived,
                                 "differences": diffs, "stale_without_post_load": stale,
                                 "unchanged": sorted(set(written + derived) - changed),
                                 "begin_s": seconds[0], "update_s": seconds[1], "end_s": seconds[2],
                                 "run_s": refit_obj.last_run_s, "post_load_s": refit_obj.last_finish_s})
        before = state
    now = where(model)
    moved = sorted(n for n in set(at_start) | set(now) if at_start.get(n) != now.get(n))
    derived = set(engine.derived_attributes(model))
    result["moved"] = [n for n in moved if n not in derived]  # parameters and buffers: never
    # SGLang's post_load_weights copies w_kc / w_vc into the tensors it made at load (bind_or_assign) and
    # assigns a new 0-dim w_scale under FP8 (deepseek_weight_loader.py): what SGLang itself does.
    result["derived_reassigned"] = [n for n in moved if n in derived]
    # Timed refits (the source ranks send the same weights again): the plan's run against SGLang's
    # post-processing (post_load_weights in the loader, then end_weight_update's quant methods).
    runs, post, ends, totals = [], [], [], []
    for k in range(a["timed_runs"]):
        t0 = time.perf_counter()
        reply, seconds = refit(a["rounds"] + k)
        assert reply.success, reply.message
        totals.append(time.perf_counter() - t0)
        r = rs.worker_refits()[0]
        runs.append(r.last_run_s)
        post.append(r.last_finish_s)
        ends.append(seconds[2])
        unfinished.pop("state", None)
    result.update(run_s=statistics.median(runs), post_load_s=statistics.median(post),
                  end_s=statistics.median(ends), refit_s=statistics.median(totals),
                  rebinds=rs.worker_refits()[0].rebinds)
    with open(os.path.join(a["work"], f"sglang-rank{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
