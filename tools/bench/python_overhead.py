"""The Python side of tools/bench/python_overhead.sh.

    python python_overhead.py run PLAN RANK STORE_DIR REPS
        rank RANK of PLAN over Gloo through `import reshard`: three warm-up runs,
        then REPS timed run() calls; prints "runs <seconds of each>".
    python python_overhead.py serve PLAN RANK STORE_DIR
        the same rank, set up and warmed up (prints "ready"), then one timed
        run() per "run" line on stdin, answered "<wall seconds> <the runtime's
        own seconds>", until EOF (the C++ side: python_overhead serve).
    python python_overhead.py compare PLAN CPP_BINARY REPS PASSES [control]
        PASSES times: starts a C++ pair (CPP_BINARY serve) and a Python pair
        of ranks, each connected and warmed up, and alternates single runs
        between them (C++ then Python, then Python then C++, ...) REPS times
        each; prints each pass's medians and ratio, then the pooled medians,
        their ratio and the median of the paired ratios. `control`: a second
        C++ pair instead of the Python one (the method's own noise).
    python python_overhead.py bind PLAN REPS
        a one-rank plan: bind_module of a torch module holding every buffer;
        prints "bind <seconds of each>".
    python python_overhead.py alive N REPS
        Session.check_bindings (what run() checks first) on N bound tensors;
        prints "alive N <seconds of each>".
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


WARMUP = 5  # interleaved runs of each pair after both are ready, not counted


def _pass(path, cpp_binary, reps, control):
    """One pass: a fresh C++ pair and a fresh Python pair (each connected and
    warmed up), WARMUP uncounted runs each, then REPS single runs each,
    alternating C++, Python, Python, C++, ... Returns {kind: [(wall, the runtime's own seconds), ...]}, the
    slower rank's figures of each run."""
    out = {"cpp": [], "py": []}
    with tempfile.TemporaryDirectory() as tmp:
        procs = {}
        for kind in ("cpp", "py"):
            store = tempfile.mkdtemp(dir=tmp)
            cmd = [cpp_binary, "serve"] if kind == "cpp" or control else [sys.executable, __file__, "serve"]
            procs[kind] = [subprocess.Popen(cmd + [path, str(r), store], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            text=True, bufsize=1) for r in (0, 1)]
        for kind, pair in procs.items():
            for p in pair:
                line = p.stdout.readline()
                if line.strip() != "ready":
                    raise SystemExit(f"python_overhead: a {kind} rank did not start ({line!r})")

        def one(kind):
            for p in procs[kind]:
                p.stdin.write("run\n")
                p.stdin.flush()
            got = [[float(x) for x in p.stdout.readline().split()] for p in procs[kind]]
            out[kind].append((max(g[0] for g in got), max(g[1] for g in got)))

        for i in range(WARMUP + reps):
            for kind in (("cpp", "py") if i % 2 == 0 else ("py", "cpp")):
                one(kind)
            if i + 1 == WARMUP:  # both pairs settled: from here on, every run counts
                out = {"cpp": [], "py": []}
        for pair in procs.values():
            for p in pair:
                p.stdin.close()
                p.wait()
    return out


def compare(path, cpp_binary, reps, passes, control=False):
    """`passes` passes of _pass; prints each pass's medians and ratio, then
    the pooled figures. `control`: a second C++ pair in the Python pair's
    place (an A/A test: the method's own noise on this machine)."""
    name = "C++ (control)" if control else "Python"
    print(f"run() of {path}: {passes} passes x {reps} runs each, C++ and {name} alternating")
    per_pass, paired, pooled = [], [], {"cpp": [], "py": []}
    for n in range(passes):
        got = _pass(path, cpp_binary, reps, control)
        wall = {k: [w for w, _ in v] for k, v in got.items()}
        med = {k: statistics.median(v) for k, v in wall.items()}
        per_pass.append(med["py"] / med["cpp"])
        paired += [p / c for p, c in zip(wall["py"], wall["cpp"])]
        for k in got:
            pooled[k] += got[k]
        print(f"  pass {n + 1}: median C++ {med['cpp'] * 1e3:.2f} ms, {name} {med['py'] * 1e3:.2f} ms, "
              f"ratio {per_pass[-1]:.4f}; fastest C++ {min(wall['cpp']) * 1e3:.2f} ms, {name} "
              f"{min(wall['py']) * 1e3:.2f} ms")
    med = {k: statistics.median(w for w, _ in v) for k, v in pooled.items()}
    print(f"  all {passes * reps} runs each: median C++ {med['cpp'] * 1e3:.2f} ms, {name} {med['py'] * 1e3:.2f} ms, "
          f"{name} / C++ = {med['py'] / med['cpp']:.4f} ({100 * (med['py'] / med['cpp'] - 1):+.2f}%; target within 5%)")
    print(f"  median of the {len(paired)} paired ratios (each run / the other side's run beside it): "
          f"{statistics.median(paired):.4f}; per-pass ratios {min(per_pass):.4f} .. {max(per_pass):.4f}")
    own = {k: statistics.median(i for _, i in v) for k, v in pooled.items()}
    print(f"  the runtime's own seconds (inside the C++ call), medians: C++ {own['cpp'] * 1e3:.2f} ms, "
          f"{name} {own['py'] * 1e3:.2f} ms")
    around = {k: statistics.median(w - i for w, i in v) for k, v in pooled.items()}
    print(f"  wall minus the runtime's own seconds, medians: C++ {around['cpp'] * 1e6:.0f} us, {name} "
          f"{around['py'] * 1e6:.0f} us (what the {name} layer adds per run: "
          f"{(around['py'] - around['cpp']) * 1e6:.0f} us)")


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


def alive(n, reps):
    """The check run() makes before moving a byte (Session.check_bindings) on
    a rank with `n` bound torch tensors: prints "alive N <seconds of each>"."""
    import json
    import os
    import threading

    import torch

    with tempfile.TemporaryDirectory() as d:
        model = {"format": "reshard.model/1", "name": "many", "dtype": "bf16", "dims": {"i": n},
                 "tensors": [{"name": "w.{i}", "shape": [4]}]}
        layout = {"format": "reshard.layout/1", "name": "one", "model": "many", "ranks": 1,
                  "meshes": {"m": [["x", 1]]}, "placements": [{"match": "*", "mesh": "m", "x": "replicate"}]}
        paths = {}
        for k, v in (("model", model), ("layout", layout)):
            paths[k] = os.path.join(d, k + ".json")
            with open(paths[k], "w") as f:
                json.dump(v, f)
        cluster = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "samples", "clusters",
                               "dgx-h100.json")
        reshard.compile(paths["model"], paths["layout"], paths["layout"], cluster, os.path.join(d, "p.rsplan"))
        plan = reshard.Plan.open(os.path.join(d, "p.rsplan"))
        ts = [None, None]

        def connect(r):
            ts[r] = reshard.GlooTransport(r, 2, store=d)

        th = [threading.Thread(target=connect, args=(r,)) for r in (0, 1)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        s = reshard.Session(plan, 1, ts[1])
        for b in s.buffers:
            s.bind(b.name, torch.zeros(b.shape, dtype=torch.bfloat16))
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            s.check_bindings()
            times.append(time.perf_counter() - t0)
        print(f"alive {len(s.buffers)} " + " ".join(f"{x:.6f}" for x in times))


if __name__ == "__main__":
    if sys.argv[1] == "alive":
        alive(int(sys.argv[2]), int(sys.argv[3]))
        sys.exit(0)
    if sys.argv[1] == "run":
        run(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
    elif sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), control=sys.argv[6:] == ["control"])
    else:
        bind(sys.argv[2], int(sys.argv[3]))
