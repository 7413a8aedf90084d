"""One process of test_boundary.py: a plan rank over Gloo, with numpy
buffers (no torch: a process starts fast).

    boundary_rank.py PLAN PROCESS PROCESSES PLAN_RANK STORE MODE [DELAY_S]

MODE: "hello" (make the session), "run" (bind, fill, run, check), "run-late"
(the same, DELAY_S after the session), "unbound" (as "run-late", with its
first buffer left unbound). Prints markers ("connecting", "session",
"running"), then "ok" or "ERROR <class>: <message>"; after a failed run,
first a line "written: consistent" when every destination element holds
either its old (poisoned) value or the right new one, else "written: WRONG
<n>". On KeyboardInterrupt prints "KeyboardInterrupt <seconds since the last
marker>" and exits 130. RESHARD_TEST_TIMEOUT sets the transport's timeout_s
(default 30).
"""

import os
import signal
import sys
import time

import numpy as np

# As a user's program has it: a launcher that started the tests in the
# background (a script's `&`, CI) passes SIGINT on ignored, and reshard
# leaves an ignored signal ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)

import reshard  # noqa: E402
import reshard.testing as rt  # noqa: E402

plan_path, process, processes, plan_rank, store, mode = sys.argv[1:7]
delay = float(sys.argv[7]) if len(sys.argv) > 7 else 0.0
process, processes, plan_rank = int(process), int(processes), int(plan_rank)
mark = time.monotonic()


def say(what: str) -> None:
    global mark
    mark = time.monotonic()
    print(what, flush=True)


s = None
arrays = {}


def poisoned() -> int:
    return sum(int(np.count_nonzero(arrays[n] == v)) for n, v in poison.items())


def written() -> str:
    """Whether every destination element the run changed holds the right value
    (the others keep their old, poisoned one): as many changed as became right."""
    changed = before[0] - poisoned()
    right = before[1] - rt.check_destinations(s).wrong
    return "written: consistent" if changed == right else f"written: WRONG {changed - right}"


poison = {}
try:
    plan = reshard.Plan.open(plan_path)
    say("connecting")
    t = reshard.GlooTransport(process, processes, store=store, timeout_s=float(os.environ.get("RESHARD_TEST_TIMEOUT", 30)))
    s = reshard.Session(plan, plan_rank, t)
    say("session")
    if mode != "hello":
        dtypes = {b.name: b.dtype for b in s.buffers}
        arrays = rt.allocate(s, like="numpy")  # bf16 as uint16 bits: say the dtype
        skip = s.buffers[0].name if mode == "unbound" else None
        for name, array in arrays.items():
            if name != skip:
                s.bind(name, array, dtype=dtypes[name])
        if skip is None:  # the unbound rank sends nothing: its values do not matter
            rt.poison_destinations(s)
            poison = {b.name: arrays[b.name].flat[0].copy() for b in s.buffers if b.is_destination}
            before = (poisoned(), rt.check_destinations(s).wrong)
            rt.fill_sources(s)
        if mode in ("run-late", "unbound"):
            time.sleep(delay)
        say("running")
        try:
            s.run()
        except reshard.Error:
            if mode != "unbound":
                print(written(), flush=True)
            raise
        c = rt.check_destinations(s)
        assert c.wrong == 0, c.first
    print(f"time {time.monotonic()}", flush=True)
    say("ok")
except KeyboardInterrupt:
    print(f"KeyboardInterrupt {time.monotonic() - mark:.2f}", flush=True)
    sys.exit(130)
except reshard.Error as e:
    print(f"time {time.monotonic()}", flush=True)
    print(f"ERROR {type(e).__name__}: {e}", flush=True)
    sys.exit(1)
