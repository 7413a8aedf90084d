"""Runs one process per rank (torchrun-style environment: RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT), waits for all, and fails as a whole:
when one rank fails or the time runs out, every other rank is killed, so no
process outlives a test."""
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from free_port import free_port  # noqa: E402  (tests/free_port.py: below the ephemeral range)


def run(world, argv, timeout_s=600.0, env=None, python=sys.executable, label="ranks", log_dir=None, abort=None):
    """Runs `python argv...` on `world` ranks; returns the ranks' outputs.
    Raises RuntimeError naming the first failing rank and its output tail, or
    what `abort()` returned once it returns something (the ranks are killed)."""
    port = free_port()
    procs, logs = [], []
    for r in range(world):
        e = dict(os.environ, **(env or {}), RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        path = os.path.join(log_dir, f"{label}.rank{r}.log") if log_dir else None
        f = open(path, "w+") if path else subprocess.PIPE
        logs.append(f)
        procs.append(subprocess.Popen([python] + argv, env=e, stdout=f if path else subprocess.PIPE,
                                      stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.time() + timeout_s
    failed = aborted = None
    try:
        while any(p.poll() is None for p in procs):
            for r, p in enumerate(procs):
                if p.poll() not in (None, 0) and failed is None:
                    failed = r
            aborted = abort() if abort else None
            if failed is not None or aborted or time.time() > deadline:
                break
            time.sleep(0.2)
        for r, p in enumerate(procs):
            if failed is None and p.poll() not in (None, 0):
                failed = r
    finally:
        timed_out = any(p.poll() is None for p in procs) and failed is None and not aborted
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    outs = []
    for f, p in zip(logs, procs):
        if hasattr(f, "seek"):
            f.seek(0)
            outs.append(f.read())
            f.close()
        else:
            outs.append(p.stdout.read().decode(errors="replace"))
    if aborted:
        raise RuntimeError(f"{label}: stopped: {aborted}")
    if timed_out:
        raise RuntimeError(f"{label}: timed out after {timeout_s:.0f} s; rank 0 said:\n{outs[0][-3000:]}")
    if failed is not None:
        raise RuntimeError(f"{label}: rank {failed} exited with {procs[failed].returncode}:\n{outs[failed][-4000:]}")
    return outs
