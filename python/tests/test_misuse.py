"""Misuse named for what it is: a run after a failed one, a second session on
a transport that serves one, two threads running one session."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import reshard
from conftest import make_sessions, mesh, run_threads

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def bind_all(s, skip=()):
    for b in s.buffers:
        if b.name not in skip:
            s.bind(b.name, torch.zeros(b.shape, dtype=DTYPES[b.dtype]))


def test_a_failed_transport_says_so_on_its_next_use(plans, tmp_path):
    plan = reshard.Plan.open(plans["tiny-dense"])
    transports = mesh(plan.num_ranks, tmp_path)
    sessions = make_sessions(plan, transports)
    culprit = plan.dest_ranks[0]
    for s in sessions:
        bind_all(s, skip=[sessions[culprit].buffers[0].name] if s.rank == culprit else ())
    errors = {}

    def run(s):
        try:
            s.run()
        except reshard.Error as e:
            errors[s.rank] = e

    t0 = time.monotonic()
    run_threads([lambda s=s: run(s) for s in sessions])
    assert time.monotonic() - t0 < 5  # not the transports' 30 s timeout
    assert isinstance(errors[culprit], reshard.BindError)
    reason = str(errors[culprit])
    for rank, e in errors.items():
        if rank != culprit:
            assert isinstance(e, reshard.PeerError) and "another rank failed first: " + reason in str(e), str(e)
    with pytest.raises(reshard.Error) as e:
        sessions[culprit].run()
    assert str(e.value) == (f"rank {culprit}: this transport failed in run 1 ({reason} (nothing was sent)); its "
                            "connections are closed: make a new transport, and a session on it, for the next refit")


def test_one_session_per_transport_and_one_run_at_a_time(plans, tmp_path):
    plan = reshard.Plan.open(plans["tiny-dense"])
    transports = mesh(plan.num_ranks, tmp_path)
    sessions = make_sessions(plan, transports)
    with pytest.raises(reshard.Error) as e:
        reshard.Session(plan, 0, transports[0])
    assert str(e.value) == ("rank 0: this transport already serves a session: one session per transport at a time (a "
                            "second one would take the first one's messages); close the other session first "
                            "(Session.close()), or make a new transport")
    for s in sessions:
        bind_all(s)
    # Rank 0 waits in run() for peers that have not started: a second run() of
    # the same session, from another thread, is refused at once.
    first = threading.Thread(target=sessions[0].run)
    first.start()
    time.sleep(0.3)
    with pytest.raises(reshard.Error) as e:
        sessions[0].run()
    assert str(e.value) == ("rank 0: run() is already in progress on this session in another thread: a session runs "
                            "one refit at a time (wait for it to return)")
    run_threads([s.run for s in sessions[1:]])
    first.join()
    # The refused run changed nothing: the session runs again.
    run_threads([s.run for s in sessions])
