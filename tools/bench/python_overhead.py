"""The Python side of tools/bench/python_overhead.sh.

    python python_overhead.py run PLAN RANK STORE_DIR REPS
        rank RANK of PLAN over Gloo through `import reshard`: three warm-up runs,
        then REPS timed run() calls; prints "runs <seconds of each>".
    python python_overhead.py serve PLAN RANK STORE_DIR
        the same rank, set up and warmed up (prints "ready"), then one timed
        run() per "run" line on stdin, answered "<wall seconds> <the runtime's
        own seconds>", until EOF (the C++ side: python_overhead serve).
    python python_overhead.py compare PLAN CPP_BINARY REPS
        starts a C++ pair (CPP_BINARY serve) and a Python pair of ranks, each
        connected and warmed up, and alternates single runs between them
        (C++ then Python, then Python then C++, ...) REPS times each; prints
        the medians, the ratio and the per-run figures.
    python python_overhead.py bind PLAN REPS
        a one-rank plan: bind_module of a torch module holding every buffer;
        prints "bind <seconds of each>".
"""

import statistics
import subprocess
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


def _bound_session(path, rank, store, prefix):
    import numpy as np

    plan = reshard.Plan.open(path)
    s = reshard.Session(plan, rank, reshard.GlooTransport(rank, plan.num_ranks, store=store, prefix=prefix))
    for b in s.buffers:
        s.bind(b.name, np.full(b.shape, 0x3F80, dtype=np.uint16), dtype="bf16")
    return s


def serve(path, rank, store):
    s = _bound_session(path, rank, store, "py")
    for _ in range(3):  # warm-up: the peer may still be starting
        s.run()
    print("ready", flush=True)
    for _ in sys.stdin:
        t0 = time.perf_counter()
        stats = s.run()
        wall = time.perf_counter() - t0
        print(f"{wall:.6f} {stats.seconds:.6f}", flush=True)


def compare(path, cpp_binary, reps):
    """Interleaved single runs of a C++ pair and a Python pair of the same plan."""
    with tempfile.TemporaryDirectory() as tmp:
        procs = {}
        for kind in ("cpp", "py"):
            store = tempfile.mkdtemp(dir=tmp)
            cmd = [cpp_binary, "serve"] if kind == "cpp" else [sys.executable, __file__, "serve"]
            procs[kind] = [subprocess.Popen(cmd + [path, str(r), store], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            text=True, bufsize=1) for r in (0, 1)]
        for kind, pair in procs.items():
            for p in pair:
                line = p.stdout.readline()
                if line.strip() != "ready":
                    raise SystemExit(f"python_overhead: a {kind} rank did not start ({line!r})")
        wall = {"cpp": [], "py": []}
        inner = {"cpp": [], "py": []}

        def one(kind):
            for p in procs[kind]:
                p.stdin.write("run\n")
                p.stdin.flush()
            out = [p.stdout.readline().split() for p in procs[kind]]
            wall[kind].append(max(float(o[0]) for o in out))  # the slower rank: the refit's time
            inner[kind].append(max(float(o[1]) for o in out))

        for i in range(reps):
            for kind in (("cpp", "py") if i % 2 == 0 else ("py", "cpp")):
                one(kind)
        for pair in procs.values():
            for p in pair:
                p.stdin.close()
                p.wait()
    med = {k: statistics.median(v) for k, v in wall.items()}
    ratios = [p / c for p, c in zip(wall["py"], wall["cpp"])]
    print(f"run() of {path}: {reps} runs each, C++ and Python alternating")
    print(f"  median wall: C++ {med['cpp'] * 1e3:.2f} ms, Python {med['py'] * 1e3:.2f} ms, "
          f"Python / C++ = {med['py'] / med['cpp']:.4f} ({100 * (med['py'] / med['cpp'] - 1):+.2f}%; target within 5%)")
    print(f"  median of the {reps} paired ratios (each Python run / the C++ run beside it): "
          f"{statistics.median(ratios):.4f}")
    print(f"  fastest: C++ {min(wall['cpp']) * 1e3:.2f} ms, Python {min(wall['py']) * 1e3:.2f} ms")
    print(f"  the runtime's own seconds (inside the C++ call), medians: C++ {statistics.median(inner['cpp']) * 1e3:.2f} "
          f"ms, Python {statistics.median(inner['py']) * 1e3:.2f} ms")
    around = {k: statistics.median(w - i for w, i in zip(wall[k], inner[k])) for k in wall}
    print(f"  wall minus the runtime's own seconds, median: C++ {around['cpp'] * 1e6:.0f} us, Python "
          f"{around['py'] * 1e6:.0f} us (what the Python layer adds: {(around['py'] - around['cpp']) * 1e6:.0f} us)")
    print("  C++ runs (ms): " + " ".join(f"{x * 1e3:.1f}" for x in wall["cpp"]))
    print("  Python runs (ms): " + " ".join(f"{x * 1e3:.1f}" for x in wall["py"]))


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
    elif sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        bind(sys.argv[2], int(sys.argv[3]))
