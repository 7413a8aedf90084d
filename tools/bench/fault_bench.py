"""How fast a failure anywhere ends every rank, and what the binding checks
cost, over real processes (fork) and Gloo on this machine.

Faults, on tiny-dense (train TP2 DP2 -> infer TP1 DP4: 4 sources, 4
destinations, 8 processes), every transport at timeout_s 60. Every rank but
one is in run(), waiting for it or for a rank that waits for it:
- kill-destination / kill-source: the one rank is late (it sleeps before
  its run(), as a rank still preparing its weights) and is SIGKILLed (the
  OOM killer); the figure is the time from the kill to the last error of
  the others: its own peers see its connections close, the rest (ranks that
  never talk to it) hear it from them;
- bind-failure: the one rank runs with a buffer left unbound; from its
  BindError to the last error of the others;
- missing-rank: rank 7 never starts, timeout_s 5; the figure is how long
  after the timeout the last rank ends.
Binding checks: bind_module of 10,000 destination tensors ([64, 32] bf16),
with the Python-side overlap check and with it switched off (the runtime's
own check is in both), and one run() of that plan.

Medians over REPS repetitions. Needs the package in this interpreter
(tools/python_install.sh). Usage: fault_bench.py [REPS, default 5]
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np

import reshard
import reshard.testing as rt

ROOT = Path(__file__).resolve().parents[2]
FAR_SLEEP_S = 30.0  # the late rank: killed long before it would run


def _rank(plan_path, process, n, store, prefix, mode, out, timeout_s):
    """One rank: mode "run" (at once), "late" (after FAR_SLEEP_S), "unbound" (at once, a buffer unbound)."""
    try:
        plan = reshard.Plan.open(plan_path)
        t = reshard.GlooTransport(process, n, store=store, prefix=prefix, timeout_s=timeout_s)
        s = reshard.Session(plan, plan.active_ranks[process], t)
        dtypes = {b.name: b.dtype for b in s.buffers}
        arrays = rt.allocate(s, like="numpy")
        skip = s.buffers[0].name if mode == "unbound" else None
        for name, a in arrays.items():
            if name != skip:
                s.bind(name, a, dtype=dtypes[name])
        rt.fill_sources(s)
        if mode == "late":
            time.sleep(FAR_SLEEP_S)
        out.put((process, "running", time.monotonic()))
        s.run()
        out.put((process, "ok", time.monotonic()))
    except reshard.Error as e:
        out.put((process, f"error {type(e).__name__}", time.monotonic()))


def fault(plan_path: str, kind: str, reps: int) -> float:
    plan = reshard.Plan.open(plan_path)
    n = len(plan.active_ranks)
    victim = plan.source_ranks[1] if kind == "kill-source" else plan.dest_ranks[1]
    ctx = mp.get_context("fork")
    figures = []
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as store:
            out = ctx.Queue()
            modes = ["run"] * n
            modes[victim] = "unbound" if kind == "bind-failure" else "late"
            procs = [ctx.Process(target=_rank, args=(plan_path, p, n, store, "reshard", modes[p], out, 60.0))
                     for p in range(n)]
            for p in procs:
                p.start()
            running, ends = set(), {}
            others = [p for p in range(n) if p != victim]
            while not running.issuperset(others):
                p, what, t = out.get(timeout=120)
                if what == "running":
                    running.add(p)
                else:
                    ends[p] = (what, t)
            time.sleep(0.3)  # the others in run(), waiting
            if kind == "bind-failure":
                while victim not in ends:
                    p, what, t = out.get(timeout=90)
                    if what != "running":
                        ends[p] = (what, t)
                t_fail = ends[victim][1]
            else:
                t_fail = time.monotonic()
                os.kill(procs[victim].pid, signal.SIGKILL)
            while any(p not in ends for p in others):
                p, what, t = out.get(timeout=90)
                if what != "running":
                    ends[p] = (what, t)
            figures.append(max(ends[p][1] for p in others) - t_fail)
            for p in procs:
                if p.is_alive():
                    p.kill()
                p.join()
    return statistics.median(figures)


def _missing_rank(plan_path, process, n, store, out, timeout_s):
    t0 = time.monotonic()
    try:
        reshard.GlooTransport(process, n, store=store, timeout_s=timeout_s)
    except reshard.Error:
        pass
    out.put(time.monotonic() - t0)


def missing_rank(plan_path: str, reps: int, timeout_s: float = 5.0) -> float:
    n = len(reshard.Plan.open(plan_path).active_ranks)
    ctx = mp.get_context("fork")
    figures = []
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as store:
            out = ctx.Queue()
            procs = [ctx.Process(target=_missing_rank, args=(plan_path, p, n, store, out, timeout_s))
                     for p in range(n - 1)]
            for p in procs:
                p.start()
            figures.append(max(out.get(timeout=120) for _ in procs) - timeout_s)
            for p in procs:
                p.join()
    return statistics.median(figures)


def bind_checks(reps: int, tensors: int = 10000):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        json.dump({"format": "reshard.model/1", "name": "many", "dtype": "bf16",
                   "tensors": [{"name": f"t{i}.weight", "shape": [64, 32]} for i in range(tensors)]},
                  open(tmp / "model.json", "w"))
        for name in ("train", "infer"):
            json.dump({"format": "reshard.layout/1", "name": name, "model": "many", "ranks": 1,
                       "meshes": {"m": [["tp", 1]]}, "placements": [{"match": "*"}]}, open(tmp / f"{name}.json", "w"))
        reshard.compile(tmp / "model.json", tmp / "train.json", tmp / "infer.json",
                        ROOT / "samples" / "clusters" / "dgx-h100.json", tmp / "p.rsplan")
        plan = reshard.Plan.open(tmp / "p.rsplan")
        store = tmp / "store"
        store.mkdir()
        transports = [None, None]

        def connect(r):
            transports[r] = reshard.GlooTransport(r, 2, store=store, timeout_s=60)

        threads = [threading.Thread(target=connect, args=(r,)) for r in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        sessions = [None, None]

        def make(r):
            sessions[r] = reshard.Session(plan, r, transports[r])

        threads = [threading.Thread(target=make, args=(r,)) for r in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        src, dst = sorted(sessions, key=lambda s: not s.buffers[0].is_source)
        import torch

        state = {b.name: torch.zeros(b.shape, dtype=torch.bfloat16) for b in dst.buffers}
        src.bind_module({b.name: torch.ones(b.shape, dtype=torch.bfloat16) for b in src.buffers})
        with_check, without = [], []
        original = reshard.Session._overlaps
        for _ in range(reps):
            t0 = time.perf_counter()
            dst.bind_module(state)
            with_check.append(time.perf_counter() - t0)
            reshard.Session._overlaps = lambda self, checked: []
            try:
                t0 = time.perf_counter()
                dst.bind_module(state)
                without.append(time.perf_counter() - t0)
            finally:
                reshard.Session._overlaps = original
        # bind() one at a time: a destination's binding goes through the
        # runtime's overlap check, a source's does not (same shapes, same count).
        sources = {b.name: torch.ones(b.shape, dtype=torch.bfloat16) for b in src.buffers}
        by_bind = {"source": [], "destination": []}
        for _ in range(reps):
            for kind, session, given in (("source", src, sources), ("destination", dst, state)):
                t0 = time.perf_counter()
                for name, t in given.items():
                    session.bind(name, t)
                by_bind[kind].append(time.perf_counter() - t0)
        # The Python-side overlap check alone, on the 10,000 bindings.
        from reshard._tensors import describe

        checked = [(i, describe(state[b.name]), 0, state[b.name]) for i, b in enumerate(dst.buffers)]
        alone = []
        for _ in range(reps):
            t0 = time.perf_counter()
            dst._overlaps(checked)
            alone.append(time.perf_counter() - t0)
        runs = []
        for _ in range(reps):
            times = [0.0, 0.0]

            def run(i, s):
                t0 = time.perf_counter()
                s.run()
                times[i] = time.perf_counter() - t0

            threads = [threading.Thread(target=run, args=(i, s)) for i, s in enumerate((src, dst))]
            [t.start() for t in threads]
            [t.join() for t in threads]
            runs.append(times[1])
        return (tensors, statistics.median(with_check), statistics.median(without), statistics.median(alone),
                statistics.median(runs), statistics.median(by_bind["source"]), statistics.median(by_bind["destination"]))


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    with tempfile.TemporaryDirectory() as tmp:
        d = ROOT / "samples" / "tiny-dense"
        plan = os.path.join(tmp, "p.rsplan")
        reshard.compile(d / "model.json", d / "infer-tp2-dp2.json", d / "infer-tp1-dp4.json",
                        ROOT / "samples" / "clusters" / "dgx-h100.json", plan)
        print(f"fault_bench: medians of {reps}, timeout_s 60, 8 processes (tiny-dense)")
        for kind in ("kill-destination", "kill-source", "bind-failure"):
            print(f"  {kind:18s} last surviving rank's error {fault(plan, kind, reps) * 1000:8.0f} ms after the failure")
        print(f"  {'missing-rank':18s} last rank ends {missing_rank(plan, reps) * 1000:8.0f} ms after timeout_s (5 s)")
    n, w, wo, alone, run, bind_src, bind_dst = bind_checks(reps)
    print(f"  bind() of {n} tensors one at a time: sources {bind_src * 1000:.1f} ms, destinations (the runtime's "
          f"overlap check) {bind_dst * 1000:.1f} ms")
    print(f"  bind_module of {n} destination tensors: {w * 1000:.1f} ms with the Python overlap check, "
          f"{wo * 1000:.1f} ms without; the check alone {alone * 1000:.1f} ms ({alone / n * 1e6:.2f} us a binding); "
          f"one run() of the plan {run * 1000:.1f} ms")


if __name__ == "__main__":
    main()
