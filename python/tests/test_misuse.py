"""Misuse named for what it is: a run after a failed one, a second session on
a transport that serves one, two threads running one session."""

from __future__ import annotations

import time

import pytest

import reshard
from conftest import bind_zeros, make_sessions, mesh, run_all, run_in_background, run_threads

def test_a_failed_transport_says_so_on_its_next_use(plans, tmp_path):
    plan = reshard.Plan.open(plans["tiny-dense"])
    transports = mesh(plan.num_ranks, tmp_path)
    sessions = make_sessions(plan, transports)
    culprit = plan.dest_ranks[0]
    for s in sessions:
        bind_zeros(s, skip=[sessions[culprit].buffers[0].name] if s.rank == culprit else ())
    t0 = time.monotonic()
    errors = run_all(sessions)
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
        bind_zeros(s)
    # Rank 0 waits in run() for peers that have not started: a second run() of
    # the same session, from another thread, is refused at once.
    first = run_in_background(sessions[0])
    with pytest.raises(reshard.Error) as e:
        sessions[0].run()
    assert str(e.value) == ("rank 0: run() is already in progress on this session in another thread: a session runs "
                            "one refit at a time (wait for it to return)")
    run_threads([s.run for s in sessions[1:]])
    first.join()
    # The refused run changed nothing: the session runs again.
    run_threads([s.run for s in sessions])
