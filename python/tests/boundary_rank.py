"""One process of test_boundary.py: a plan rank over Gloo, with numpy
buffers (no torch: a process starts fast).

    boundary_rank.py PLAN PROCESS PROCESSES PLAN_RANK STORE MODE [DELAY_S]

MODE: "hello" (make the session), "run" (bind, fill, run, check), "run-late"
(the same, DELAY_S after the session). Prints markers ("connecting",
"session", "running"), then "ok" or "ERROR <class>: <message>"; on
KeyboardInterrupt prints "KeyboardInterrupt <seconds since the last marker>"
and exits 130.
"""

import signal
import sys
import time

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


try:
    plan = reshard.Plan.open(plan_path)
    say("connecting")
    t = reshard.GlooTransport(process, processes, store=store, timeout_s=30)
    s = reshard.Session(plan, plan_rank, t)
    say("session")
    if mode != "hello":
        dtypes = {b.name: b.dtype for b in s.buffers}
        for name, array in rt.allocate(s, like="numpy").items():  # bf16 as uint16 bits: say the dtype
            s.bind(name, array, dtype=dtypes[name])
        rt.poison_destinations(s)
        rt.fill_sources(s)
        if mode == "run-late":
            time.sleep(delay)
        say("running")
        s.run()
        c = rt.check_destinations(s)
        assert c.wrong == 0, c.first
    say("ok")
except KeyboardInterrupt:
    print(f"KeyboardInterrupt {time.monotonic() - mark:.2f}", flush=True)
    sys.exit(130)
except reshard.Error as e:
    print(f"ERROR {type(e).__name__}: {e}", flush=True)
    sys.exit(1)
