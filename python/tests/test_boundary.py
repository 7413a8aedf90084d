"""Faults at the boundary, from Python, over real processes (one per rank,
tests/boundary_rank.py): ranks on different plans, a rank started twice,
Ctrl-C while connecting and during a run, a plan with idle ranks. Every
process ends with the full message, fast, and none is left behind."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

import pytest

import reshard
from conftest import ROOT, SAMPLES

RANK = Path(__file__).with_name("boundary_rank.py")
DGX = SAMPLES / "clusters" / "dgx-h100.json"


def compile_plan(out: Path, model: str, src: str, dst: str, cluster: Path = DGX, strategy: str = "direct") -> Path:
    d = SAMPLES / model
    reshard.compile(d / "model.json", d / src, d / dst, cluster, out, strategy=strategy)
    return out


class Rank:
    """A rank's process; `lines` is what it printed."""

    def __init__(self, plan: Path, process: int, processes: int, plan_rank: int, store: Path, mode: str = "hello",
                 delay_s: float = 0.0):
        self.p = subprocess.Popen([sys.executable, str(RANK), str(plan), str(process), str(processes), str(plan_rank),
                                   str(store), mode, str(delay_s)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
        self.lines: List[str] = []
        self.ended: Optional[float] = None

    def wait_for(self, marker: str, timeout_s: float = 30) -> float:
        """Reads lines until `marker`; returns when it came (time.monotonic())."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            line = self.p.stdout.readline()
            if not line:
                break
            self.lines.append(line.rstrip("\n"))
            if line.startswith(marker):
                return time.monotonic()
        raise AssertionError(f"no '{marker}' from the rank: {self.lines}")

    def finish(self, timeout_s: float = 30) -> str:
        """Waits for the process; returns its last line."""
        # Read through the same buffered file wait_for reads lines from: what
        # it buffered past the marker would be lost to communicate(timeout=),
        # which reads the pipe itself. The ranks print a few lines only, so
        # waiting before reading cannot fill the pipe.
        self.p.wait(timeout=timeout_s)
        self.lines += self.p.stdout.read().splitlines()
        self.ended = time.monotonic()
        return self.lines[-1] if self.lines else ""


@pytest.fixture
def ranks():
    """The rank processes a test starts; none may be left running."""
    started: List[Rank] = []
    yield started
    left = [r for r in started if r.p.poll() is None]
    for r in left:
        r.p.kill()
        r.p.wait()
    assert not left, f"{len(left)} rank processes were left running"


def start(ranks: List[Rank], *args, **kwargs) -> Rank:
    r = Rank(*args, **kwargs)
    ranks.append(r)
    return r


def one_plan_message(rank: int, groups) -> str:
    """The hello's message: groups of (ranks text, plan name, digest, plan ranks), listed by digest."""
    listed = "; ".join(f"ranks {who} run '{name}' (content digest {digest}, {n} plan ranks)"
                       for who, name, digest, n in sorted(groups, key=lambda g: g[2]))
    return (f"ERROR PlanError: rank {rank}: the ranks do not run one plan: {listed}. Every rank must open the same "
            "plan file (compare `reshard show PLAN`'s content digest); nothing was sent")


def test_ranks_on_two_models_all_fail_at_connect(tmp_path, ranks):
    dense = compile_plan(tmp_path / "dense.rsplan", "tiny-dense", "infer-tp2-dp2.json", "infer-tp1-dp4.json")
    moe = compile_plan(tmp_path / "moe.rsplan", "tiny-moe", "infer.json", "infer-ep.json")
    store = tmp_path / "store"
    store.mkdir()
    t0 = time.monotonic()
    for p in range(8):
        start(ranks, dense if p < 4 else moe, p, 8, p, store)
    want = [("0-3", "dense.rsplan", reshard.Plan.open(dense).content_digest, 8),
            ("4-7", "moe.rsplan", reshard.Plan.open(moe).content_digest, 16)]
    for p, r in enumerate(ranks):
        assert r.finish() == one_plan_message(p, want)
        assert r.p.returncode == 1
    assert time.monotonic() - t0 < 15  # 8 Python processes starting on 2 cores; the hello itself is immediate


def test_direct_and_gather_of_the_same_specs_fail_at_connect(tmp_path, ranks):
    direct = compile_plan(tmp_path / "direct.rsplan", "tiny-dense", "infer-tp2-dp2.json", "infer-tp1-dp4.json")
    gather = compile_plan(tmp_path / "gather.rsplan", "tiny-dense", "infer-tp2-dp2.json", "infer-tp1-dp4.json",
                          strategy="gather")
    assert reshard.Plan.open(direct).digest == reshard.Plan.open(gather).digest  # same inputs...
    assert reshard.Plan.open(direct).content_digest != reshard.Plan.open(gather).content_digest  # ...not one plan
    store = tmp_path / "store"
    store.mkdir()
    for p in range(8):
        start(ranks, gather if p in (2, 5) else direct, p, 8, p, store)
    want = [("0, 1, 3, 4, 6, 7", "direct.rsplan", reshard.Plan.open(direct).content_digest, 8),
            ("2, 5", "gather.rsplan", reshard.Plan.open(gather).content_digest, 8)]
    for p, r in enumerate(ranks):
        assert r.finish() == one_plan_message(p, want)


def test_a_rank_started_twice_ends_every_rank(tmp_path, ranks):
    plan = compile_plan(tmp_path / "p.rsplan", "tiny-dense", "infer-tp2-dp2.json", "infer-tp1-dp4.json")
    store = tmp_path / "store"
    store.mkdir()
    for p in range(7):  # rank 7 never starts: nobody connects before the duplicate comes
        start(ranks, plan, p, 8, p, store)
    time.sleep(1.0)
    start(ranks, plan, 6, 8, 6, store)
    t0 = time.monotonic()
    pattern = re.compile(r"ERROR PeerError: rank [0-6]: gloo: cannot connect 8 ranks through '.*': rank 6 has already "
                         r"joined the rendezvous in '.*' \(pid \d+ on .* at .*; this is pid \d+ on .*\): two processes "
                         r"were started as rank 6, or the directory holds an earlier job's rendezvous \(use a fresh "
                         r"directory per job\)")
    for r in ranks:
        last = r.finish()
        assert pattern.fullmatch(last), last
    assert time.monotonic() - t0 < 5  # every rank within 5 s of the duplicate's start (the timeout is 30 s)


def test_sigint_while_connecting(tmp_path, ranks):
    plan = compile_plan(tmp_path / "p.rsplan", "tiny-dense", "infer-tp2-dp2.json", "infer-tp1-dp4.json")
    store = tmp_path / "store"
    store.mkdir()
    for p in range(7):  # rank 7 never starts: everyone waits in connect
        start(ranks, plan, p, 8, p, store)
    for r in ranks:
        r.wait_for("connecting")
    time.sleep(1.0)
    t0 = time.monotonic()
    ranks[3].p.send_signal(signal.SIGINT)
    last = ranks[3].finish()
    assert last.startswith("KeyboardInterrupt "), ranks[3].lines
    # ended at once: within 1 s of the signal on a quiet machine, 2.5 s allowed for a loaded one
    assert float(last.split()[1]) < 3.0 and time.monotonic() - t0 < 2.5, last
    assert ranks[3].p.returncode == 130
    pattern = re.compile(r"ERROR PeerError: rank \d: gloo: cannot connect 8 ranks through '.*': rank 3 left: "
                         r"interrupted \(SIGINT\) while connecting")
    for p, r in enumerate(ranks):
        if p != 3:
            last = r.finish()
            assert pattern.fullmatch(last), last
    assert time.monotonic() - t0 < 6.0  # the peers too, not at their 30 s timeout


def test_sigint_during_run(tmp_path, ranks):
    plan_path = compile_plan(tmp_path / "p.rsplan", "tiny-dense", "infer-tp2-dp2.json", "infer-tp1-dp4.json")
    store = tmp_path / "store"
    store.mkdir()
    victim = 5  # an inference rank: it waits in run() for what the late ranks send
    for p in range(8):
        start(ranks, plan_path, p, 8, p, store, "run" if p == victim else "run-late", 3.0)
    ranks[victim].wait_for("running")
    time.sleep(0.5)
    t0 = time.monotonic()
    ranks[victim].p.send_signal(signal.SIGINT)
    last = ranks[victim].finish()
    assert last.startswith("KeyboardInterrupt") and time.monotonic() - t0 < 2.5, (last, time.monotonic() - t0)
    assert ranks[victim].p.returncode == 130
    named = 0
    for p, r in enumerate(ranks):
        if p == victim:
            continue
        last = r.finish()
        assert "timed out" not in last, last
        if last != "ok":  # it talked to the victim, or to a rank that failed because of it and left
            m = re.fullmatch(rf"ERROR PeerError: rank {p}: step \d+ \(\w+\) of round \d+ (to|from) peer (\d+) "
                             r"failed: .*", last)
            assert m, last
            named += int(m.group(2)) == victim
    assert named > 0  # the victim's own peers name it
    assert time.monotonic() - t0 < 8.0  # the late ranks run 3 s after their sessions, then fail at once


def test_a_plan_with_idle_ranks_launches_only_the_active_ones(tmp_path, ranks):
    plan_path = compile_plan(tmp_path / "idle.rsplan", "tiny-dense", "infer-tp2-dp2.json", "infer-tp1-dp4.json",
                             cluster=ROOT / "tests" / "data" / "nvl8-spares.json")
    plan = reshard.Plan.open(plan_path)
    assert plan.num_ranks == 12 and plan.active_ranks == (0, 1, 2, 3, 8, 9, 10, 11)
    assert plan.process_of(9) == 5
    with pytest.raises(ValueError, match="plan rank 5 is idle"):
        plan.process_of(5)
    store = tmp_path / "store"
    store.mkdir()
    for i, rank in enumerate(plan.active_ranks):
        start(ranks, plan_path, i, len(plan.active_ranks), rank, store, "run")
    for r in ranks:
        assert r.finish() == "ok", r.lines
