"""What the boundary checks cost and how fast faults end, over
real processes (fork) and Gloo on this machine:

- hello: Session() on every rank of a plan, the transports already
  connected and the ranks released together (a multiprocessing barrier):
  the slowest rank's time, against one run() of the same plan;
- connect with a rank missing: how long GlooTransport() takes to fail at
  --timeout 1 s (the stated timeout is the figure to meet);
- Ctrl-C: SIGINT to a rank waiting to connect, until KeyboardInterrupt.

Medians over REPS repetitions. Needs the package in this interpreter
(tools/python_install.sh). Usage: boundary_bench.py PLAN [REPS, default 5]
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid

import reshard
import reshard.testing as rt


def _hello_rank(plan_path, process, n, store, prefix, barrier, out):
    plan = reshard.Plan.open(plan_path)
    t = reshard.GlooTransport(process, n, store=store, prefix=prefix, timeout_s=60)
    barrier.wait()
    t0 = time.perf_counter()
    s = reshard.Session(plan, plan.active_ranks[process], t)
    hello = time.perf_counter() - t0
    dtypes = {b.name: b.dtype for b in s.buffers}
    for name, a in rt.allocate(s, like="numpy").items():
        s.bind(name, a, dtype=dtypes[name])
    rt.fill_sources(s)
    barrier.wait()
    t0 = time.perf_counter()
    s.run()
    out.put((hello, time.perf_counter() - t0))


def hello(plan_path: str, reps: int):
    plan = reshard.Plan.open(plan_path)
    n = len(plan.active_ranks)
    ctx = mp.get_context("fork")
    hellos, runs = [], []
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as store:
            barrier, out, prefix = ctx.Barrier(n), ctx.Queue(), uuid.uuid4().hex
            procs = [ctx.Process(target=_hello_rank, args=(plan_path, p, n, store, prefix, barrier, out))
                     for p in range(n)]
            for p in procs:
                p.start()
            got = [out.get(timeout=120) for _ in range(n)]
            for p in procs:
                p.join()
        hellos.append(max(h for h, _ in got))
        runs.append(max(r for _, r in got))
    return n, statistics.median(hellos), statistics.median(runs)


def _connect_rank(store, n, prefix, out, interrupt_after):
    if interrupt_after:
        t_sig = [0.0]

        def later():
            time.sleep(interrupt_after)
            t_sig[0] = time.perf_counter()
            os.kill(os.getpid(), signal.SIGINT)

        import threading
        threading.Thread(target=later, daemon=True).start()
    t0 = time.perf_counter()
    try:
        reshard.GlooTransport(0, n, store=store, prefix=prefix, timeout_s=1.0 if not interrupt_after else 30.0)
        out.put(("connected", 0.0))
    except KeyboardInterrupt:
        out.put(("KeyboardInterrupt", time.perf_counter() - t_sig[0]))
    except reshard.PeerError:
        out.put(("PeerError", time.perf_counter() - t0))


def missing(reps: int, interrupt_after: float = 0.0):
    ctx = mp.get_context("fork")
    times = []
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as store:
            out = ctx.Queue()
            p = ctx.Process(target=_connect_rank, args=(store, 4, uuid.uuid4().hex, out, interrupt_after))
            p.start()
            what, secs = out.get(timeout=60)
            p.join()
        times.append(secs)
    return what, statistics.median(times)


def main() -> int:
    plan_path = sys.argv[1]
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    print(f"load average: {os.getloadavg()[0]:.2f}")
    n, h, r = hello(plan_path, reps)
    print(f"hello: {n} processes, Session() {h * 1e3:.2f} ms (slowest rank, median of {reps}); "
          f"run() {r * 1e3:.2f} ms; hello/run {h / r:.2f}")
    what, secs = missing(reps)
    print(f"connect, ranks 1-3 missing, timeout 1.0 s: {what} after {secs:.3f} s (median of {reps})")
    what, secs = missing(reps, interrupt_after=0.5)
    print(f"connect, SIGINT after 0.5 s: {what} {secs * 1e3:.0f} ms after the signal (median of {reps})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
