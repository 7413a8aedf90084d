"""A failure anywhere ends every rank within about a second, over real
processes (one per rank, tests/boundary_rank.py): a rank SIGKILLed mid-run
(a source or a destination), a rank that fails its own checks before
sending, a rank that never starts. Every surviving rank names the failed
rank and its reason, none waits out its timeout, and every destination
element is either its old value or the right new one."""

from __future__ import annotations

import os
import re
import signal
import sys
import time

import pytest

import reshard
from conftest import ROOT
from test_boundary import Rank, compile_plan, ranks, start  # noqa: F401 (the fixture)

# Late ranks run DELAY_S after their session; the far rank FAR_S after it.
# Without the failure reaching every rank, the ranks waiting for the far one
# would end only once it runs.
DELAY_S, FAR_S = 2.0, 9.0
# How long after the failure (or, for late ranks, their own start of run())
# a surviving rank may take to end: a second, and a margin for this loaded
# 2-core machine.
BOUND_S = 1.5


def plan_of(tmp_path):
    path = compile_plan(tmp_path / "p.rsplan", "tiny-dense", "infer-tp2-dp2.json", "infer-tp1-dp4.json")
    return path, reshard.Plan.open(path)


def ended(r: Rank) -> float:
    """When the rank's process ended (its own clock reading: time.monotonic()
    is the host's monotonic clock in every process)."""
    return float(next(line for line in reversed(r.lines) if line.startswith("time "))[5:])


def survivors(ranks, gone: int):
    """(process, rank, last line) of every rank but `gone`, once each has ended."""
    for p, r in enumerate(ranks):
        if p != gone:
            r.finish()
            yield p, r, failed_line(r)


def failed_line(r: Rank) -> str:
    """The rank's last line, after checking that a failed run wrote nothing wrong."""
    last = r.lines[-1]
    if last.startswith("ERROR PeerError"):
        assert "written: consistent" in r.lines, r.lines
    assert "timed out" not in last, last
    return last


@pytest.mark.parametrize("side", ["destination", "source"])
def test_a_rank_killed_while_its_peers_wait_ends_every_rank(tmp_path, ranks, side):  # noqa: F811
    # The victim is late (an OOM kill while it still prepares its weights):
    # every other rank is in run(), waiting for it or for a rank that waits
    # for it. Its peers see its connections close; the rest learn it from them.
    path, plan = plan_of(tmp_path)
    victim = plan.dest_ranks[1] if side == "destination" else plan.source_ranks[1]
    store = tmp_path / "store"
    store.mkdir()
    for p in range(8):
        start(ranks, path, p, 8, p, store, "run-late" if p == victim else "run", FAR_S if p == victim else 0.0)
    for p, r in enumerate(ranks):
        if p != victim:
            r.wait_for("running")
    time.sleep(0.5)
    t0 = time.monotonic()
    ranks[victim].p.send_signal(signal.SIGKILL)
    ranks[victim].p.wait()
    named = 0
    for p, r, last in survivors(ranks, victim):
        if last == "ok":
            assert ended(r) - t0 < BOUND_S  # it needed nothing of the victim's
            continue
        assert ended(r) - t0 < BOUND_S, (p, ended(r) - t0, last)
        assert re.fullmatch(rf"ERROR PeerError: rank {p}: step \d+ \(\w+\) of round \d+ (to|from) peer \d+ "
                            r"failed: .*", last), last
        named += "closed its connections without saying why" in last
    assert named > 0  # the ranks that talked to the victim say what they saw, the rest repeat it


def test_a_rank_that_fails_its_own_checks_ends_every_rank(tmp_path, ranks):  # noqa: F811
    path, plan = plan_of(tmp_path)
    culprit, far = plan.dest_ranks[2], plan.source_ranks[0]
    store = tmp_path / "store"
    store.mkdir()
    for p in range(8):
        mode = "unbound" if p == culprit else "run-late"
        start(ranks, path, p, 8, p, store, mode, 0.0 if p == culprit else FAR_S if p == far else DELAY_S)
    ranks[culprit].wait_for("running")
    t0 = time.monotonic()
    last = ranks[culprit].finish()
    assert re.fullmatch(rf"ERROR BindError: rank {culprit}: buffer '.*' is not bound", last), last
    told = 0
    for p, r, last in survivors(ranks, culprit):
        assert ended(r) - t0 < (FAR_S if p == far else DELAY_S) + BOUND_S, (p, ended(r) - t0, last)
        if last != "ok":
            assert f"rank {culprit}: buffer '" in last and "is not bound (nothing was sent)" in last, last
            told += 1
    assert told > 0


@pytest.mark.parametrize("store_kind", ["directory", "host:port"])
def test_a_rank_that_never_starts_ends_every_rank_at_the_timeout(tmp_path, ranks, store_kind):  # noqa: F811
    sys.path.insert(0, str(ROOT / "tests"))
    from free_port import free_port

    path, plan = plan_of(tmp_path)
    store = tmp_path / "store"
    store.mkdir()
    where = store if store_kind == "directory" else f"127.0.0.1:{free_port()}"
    timeout = 3.0
    os.environ["RESHARD_TEST_TIMEOUT"] = str(timeout)
    try:
        t0 = time.monotonic()
        for p in range(7):  # rank 7 never starts
            start(ranks, path, p, 8, p, where)
    finally:
        del os.environ["RESHARD_TEST_TIMEOUT"]
    for p, r in enumerate(ranks):
        last = r.finish()
        assert "rank 7 never" in last, (p, last)
        assert ended(r) - t0 < timeout + 2.5, (p, ended(r) - t0)  # the processes start, then the timeout
