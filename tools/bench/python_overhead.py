"""The Python side of tools/bench/python_overhead.sh.

    python python_overhead.py run PLAN RANK STORE_DIR REPS
        rank RANK of PLAN over Gloo through `import reshard`: three warm-up runs,
        then REPS timed run() calls; prints "runs <seconds of each>".
    python python_overhead.py bind PLAN REPS
        a one-rank plan: bind_module of a torch module holding every buffer;
        prints "bind <seconds of each>".
"""

import sys
import tempfile
import time

import reshard


def run(path, rank, store, reps):
    plan = reshard.Plan.open(path)
    t = reshard.GlooTransport(rank, plan.num_ranks, store=store, prefix="py")
    s = reshard.Session(plan, rank, t)
    import numpy as np

    for b in s.buffers:
        s.bind(b.name, np.full(b.shape, 0x3F80, dtype=np.uint16), dtype="bf16")
    for _ in range(3):  # warm-up: the peer may still be starting
        s.run()
    times, inner = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        stats = s.run()
        times.append(time.perf_counter() - t0)
        inner.append(stats.seconds)  # the runtime's own measure, inside the C++ call
    print("runs " + " ".join(f"{x:.6f}" for x in times))
    # What `import reshard` adds around the C++ run: argument checks, the GIL
    # release, the stats conversion (wall time of run() minus the runtime's own).
    print("wrapper " + " ".join(f"{w - i:.6f}" for w, i in zip(times, inner)), file=sys.stderr)


def bind(path, reps):
    import torch

    plan = reshard.Plan.open(path)
    with tempfile.TemporaryDirectory() as store:
        t = reshard.GlooTransport(0, 1, store=store)
        s = reshard.Session(plan, 0, t)
        module = torch.nn.Module()
        for b in s.buffers:
            *path_, leaf = b.name.split(".")
            m = module
            for part in path_:
                if not hasattr(m, part):
                    m.add_module(part, torch.nn.Module())
                m = getattr(m, part)
            m.register_parameter(leaf, torch.nn.Parameter(torch.zeros(b.shape, dtype=torch.bfloat16),
                                                          requires_grad=False))
        times, cpu = [], []
        for _ in range(reps):
            c0, t0 = time.process_time(), time.perf_counter()
            s.bind_module(module)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        assert s.missing() == []
        print(f"bind {len(s.buffers)} " + " ".join(f"{x:.6f}" for x in times))
        print("cpu " + " ".join(f"{x:.6f}" for x in cpu), file=sys.stderr)


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
    else:
        bind(sys.argv[2], int(sys.argv[3]))
